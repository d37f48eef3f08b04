"""What every subcommand shares: one-line errors, terminal-safe text and byte formatting."""

from __future__ import annotations

import sys
from typing import TextIO

from ..errors import CrossrtError

# What a terminal acts on instead of showing: the C0 and C1 control characters (ESC starts
# the sequences that recolour, retitle or clear it; CR and BS overwrite what was printed),
# DEL, and the invisible marks that reorder or split lines (bidirectional overrides, as in
# "Trojan Source"; line and paragraph separators).
_UNSAFE = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (
        *range(0x00, 0x20),
        *range(0x7F, 0xA0),
        0x061C,
        0x200E,
        0x200F,
        *range(0x2028, 0x202F),
        *range(0x2066, 0x206A),
    )
}


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (ESC as
    ``\\x1b``, a newline as ``\\x0a``, U+202E as ``\\u202e``): names and strings read from
    files (models, containers, caches) reach the terminal as text, never as control."""
    return text.translate(_UNSAFE)


def say(*lines: str, file: TextIO | None = None) -> None:
    """Print ``lines``, one per line, each made :func:`printable` (every CLI prints so)."""
    print("\n".join(map(printable, lines)), file=file or sys.stdout)


def fail(command: str, exc: CrossrtError) -> int:
    """Print ``crossrt COMMAND: error [CODE (n)]: message`` on one line; return exit code 1."""
    message = " ".join(exc.message.split())
    say(f"crossrt {command}: error [{exc.code.describe()}]: {message}", file=sys.stderr)
    return 1


def human_bytes(n: int) -> str:
    """``25.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
