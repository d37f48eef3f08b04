"""What every subcommand shares: one-line errors and byte formatting."""

from __future__ import annotations

import sys

from ..errors import CrossrtError


def fail(command: str, exc: CrossrtError) -> int:
    """Print ``crossrt COMMAND: error [CODE (n)]: message`` on one line; return exit code 1."""
    message = " ".join(exc.message.split())
    print(f"crossrt {command}: error [{exc.code.describe()}]: {message}", file=sys.stderr)
    return 1


def human_bytes(n: int) -> str:
    """``25.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
