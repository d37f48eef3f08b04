"""What every subcommand shares: one-line errors, terminal-safe text and byte formatting."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ..errors import CrossrtError, InvalidOptionError

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


AUTO_FLAGS = {
    "auto": "--device auto",
    "auto_options": "--probe-shape and --auto-seconds",
    "auto_seconds": "--auto-seconds {}",
    "device": "a device such as --device cpu",
    "driver": "--driver {}",
    "fallback": "--fallback cpu",
    "probe": "the shapes to measure with as --probe-shape NAME=DxD...",
    "probe_shapes": "--probe-shape {}=...",
    "probe_shapes_advice": "the shapes that will run as --probe-shape NAME=DxD...",
}
"""How ``device="auto"``'s messages name its options on ``crossrt compile``'s command line
(:func:`crossrt.choice.probe.spelled_as`): flags, not Python keyword arguments."""


def fail(command: str, exc: CrossrtError) -> int:
    """Print ``crossrt COMMAND: error [CODE (n)]: message`` on one line; return exit code 1."""
    message = " ".join(exc.message.split())
    say(f"crossrt {command}: error [{exc.code.describe()}]: {message}", file=sys.stderr)
    return 1


def parse_shapes(given: Sequence[str], flag: str) -> dict[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` arguments of ``flag`` as ``{name: shape}``.

    Raises:
        InvalidOptionError: an argument of another form, or a size below 1.
    """
    shapes = {}
    for text in given:
        name, _, dims = text.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not name or not shape or min(shape) < 1:
            raise InvalidOptionError(
                f"{flag} {text!r}: give NAME=DxD... of positive sizes, such as x=1x3x224x224",
                details={"option": flag},
            )
        shapes[name] = shape
    return shapes


def human_bytes(n: int) -> str:
    """``25.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def decision_lines(decision: Mapping[str, Any]) -> list[str]:
    """``device="auto"``'s decision as a table: a line per candidate (driver, device, status,
    median latency, latency relative to each round's fastest, time against the default's
    with the spread of the rounds, runs, error against the reference, why), then the choice.

    The decision may come from a file: any field may be missing or of another type.
    """

    def cell(row: Mapping[str, Any], key: str, form: str) -> str:
        value = row.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return format(value, form) if ok else "-"

    def against(row: Mapping[str, Any]) -> str:
        ratio, spread = cell(row, "vs_default", ".3f"), cell(row, "spread", ".3f")
        return "-" if ratio == "-" else f"{ratio}±{spread}"

    listed = decision.get("candidates")
    rows = [r for r in listed if isinstance(r, Mapping)] if isinstance(listed, list) else []
    # A precision column when a reduced precision was allowed: a driver may then be measured
    # in it and in the model's own.
    with_precision = any("precision" in r for r in rows)
    precision = f"{'precision':<11} " if with_precision else ""
    lines = [
        f"  {'driver':<12} {'device':<8} {precision}{'status':<13} {'median ms':>10} "
        f"{'relative':>8} {'vs default':>13} {'runs':>5} {'max abs err':>11}  why"
    ]
    for row in rows:
        precision = f"{row.get('precision', '-')!s:<11} " if with_precision else ""
        lines.append(
            f"  {row.get('driver', '?')!s:<12} {row.get('device', '?')!s:<8} {precision}"
            f"{row.get('status', '?')!s:<13} {cell(row, 'median_ms', '10.3f'):>10} "
            f"{cell(row, 'relative', '8.3f'):>8} {against(row):>13} "
            f"{cell(row, 'runs', 'd'):>5} {cell(row, 'max_abs_error', '11.2g'):>11}  "
            f"{row.get('why', row.get('placement', ''))}"
        )
    chosen = decision.get("chosen")
    chosen = chosen if isinstance(chosen, Mapping) else {}
    cached = " (decided before: from the compile cache)" if decision.get("cached") else ""
    lines.append(
        f"  chose {chosen.get('driver', '?')} on {chosen.get('device', '?')}{cached}: "
        f"{decision.get('why', '')}"
    )
    return [printable(line) for line in lines]


TOOLS_EXTRA = "pip install 'crossrt[tools]'"


def require_psutil() -> Any:
    """The ``psutil`` module (``monitor``, ``top``).

    Raises:
        CrossrtError: it is not installed (the ``tools`` extra brings it).
    """
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CrossrtError(
            f"psutil is missing ({exc}); install the tools extra: {TOOLS_EXTRA}"
        ) from None
    return psutil
