"""docs/seed-checklist.md: parse its table, count it, resolve the names it gives as crossrt's,
and rewrite the counts it and docs/compat.md show.

    python tests/seed_checklist.py           # rewrite the counts in both pages
    python tests/seed_checklist.py --check   # exit 1 (saying what differs) when they are stale

The table is the source (each cell is a judgement read from the code); only the counts are
generated. ``tests/unit/test_seed_checklist.py`` checks the rest.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "seed-checklist.md"
COMPAT = REPO / "docs" / "compat.md"
SRC = REPO / "src" / "crossrt"

ROWS = 176
SEEDS = ("N", "A", "S")
SEED_NAMES = {"N": "OpenHarmony NNRt", "A": "AWS Neuron", "S": "Sophgo BMRuntime"}
LAYERS = {"N": "crossrt.compat.nnrt", "A": "crossrt.compat.neuron", "S": "crossrt.compat.bmruntime"}
STATUSES = ("yes", "diff", "refused", "missing")
NOT_OFFERED = "—"
# Issue 27's count of the same checklist, three sessions before this page.
ISSUE_27 = {"yes": 123, "diff": 32}
# The rows issue 27's deliverables touched: neuron-monitor's output, the daemon's rtd-like core
# groups and queues, collectives, the seeds' settings made real or loud, NNRt's API-9 path,
# API-12 operations, cache names, stable IDs and offline-model options, Sophgo's tools, facts,
# logging and variables.
ISSUE_27_ROWS = frozenset(
    {1, 2, 4, 6, 7, 8, 11, 13, 14, 16, 17, 19, 23, 33, 37, 42, 44, 46, 47, 48, 49, 50, 51, 58}
    | {82, 86, 104, 110, 126, 130, 132, 133, 135, 136, 137, 138, 139, 141, 148, 149, 150}
    | set(range(156, 168))
    | {173, 174, 175}
)

BEGIN = "<!-- seed-checklist counts: begin -->"
END = "<!-- seed-checklist counts: end -->"

ROW = re.compile(r"^\| (\d+) \| (.+?) \| (.*) \| (.*) \| (.*) \|$")
CELL = re.compile(r"^\*\*(yes|diff|refused|missing)\*\*: \S")
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+")


@dataclass(frozen=True)
class Row:
    """One checklist row: its number, capability and a cell per seed."""

    number: int
    capability: str
    cells: dict[str, str]

    def status(self, seed: str) -> str | None:
        """``yes`` / ``diff`` / ``refused`` / ``missing``, or None where the seed lacks it."""
        cell = self.cells[seed]
        if cell == NOT_OFFERED:
            return None
        match = CELL.match(cell)
        return match.group(1) if match else "?"

    def offered(self) -> list[str]:
        return [s for s in SEEDS if self.status(s) is not None]

    def best(self) -> str:
        """The row's status through the best of the layers that offer it."""
        return min((self.status(s) or "?" for s in self.offered()), key=_rank, default="?")

    def worst(self) -> str:
        """The row's status through the worst of them (every seed's program ports)."""
        return max((self.status(s) or "?" for s in self.offered()), key=_rank, default="?")


def _rank(status: str | None) -> int:
    return STATUSES.index(status) if status in STATUSES else len(STATUSES)


def parse(text: str | None = None) -> list[Row]:
    """Every table row of the page whose first cell is a number."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    rows = []
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            number, capability, *cells = match.groups()
            rows.append(Row(int(number), capability, dict(zip(SEEDS, cells, strict=True))))
    return rows


def counts(rows: list[Row]) -> dict[str, Counter[str]]:
    """Per seed (over the rows it offers), and per row by its best and its worst cell."""
    result: dict[str, Counter[str]] = {s: Counter() for s in SEEDS}
    result["best"], result["worst"] = Counter(), Counter()
    for row in rows:
        for seed in row.offered():
            result[seed][row.status(seed) or "?"] += 1
        result["best"][row.best()] += 1
        result["worst"][row.worst()] += 1
    return result


def summary(rows: list[Row]) -> str:
    """The counts block both pages show (between the BEGIN and END markers)."""
    c = counts(rows)
    lines = [
        BEGIN,
        "| over | yes | diff | refused | missing | rows |",
        "|---|---|---|---|---|---|",
    ]

    def line(label: str, counter: Counter[str]) -> str:
        cells = " | ".join(str(counter[s]) for s in STATUSES)
        return f"| {label} | {cells} | {sum(counter.values())} |"

    for seed in SEEDS:
        lines.append(line(f"{SEED_NAMES[seed]} ({seed}): the rows it offers", c[seed]))
    lines.append(line("every row, by its best layer", c["best"]))
    lines.append(line("every row, by its worst layer", c["worst"]))
    best = c["best"]
    lines += [
        "",
        f"By its best layer crossrt now covers {best['yes']} of the {len(rows)} capabilities "
        f"fully and {best['diff']} with a stated difference ({best['yes'] + best['diff']}); "
        f"issue 27 counted {ISSUE_27['yes']} fully and {ISSUE_27['diff']} partly "
        f"({ISSUE_27['yes'] + ISSUE_27['diff']}). {best['refused']} are refused by name and "
        f"{best['missing']} missing.",
        "",
        _moved(rows),
        END,
    ]
    return "\n".join(lines)


def _moved(rows: list[Row]) -> str:
    """The rows issue 27 touched, by their best layer's status now."""
    by: dict[str, list[int]] = {s: [] for s in STATUSES}
    for row in rows:
        if row.number in ISSUE_27_ROWS:
            by.setdefault(row.best(), []).append(row.number)
    parts = [f"{s} {len(by[s])} ({', '.join(map(str, by[s]))})" for s in STATUSES if by[s]]
    return f"The {len(ISSUE_27_ROWS)} rows issue 27's work moved, by their best layer: " + (
        "; ".join(parts) + "."
    )


def with_summary(text: str, block: str) -> str:
    """``text`` with the block between its markers replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} ... {END!r} are missing")
    return text[:start] + block + text[end + len(END) :]


# -- names ------------------------------------------------------------------------------


@cache
def commands() -> frozenset[str]:
    from crossrt.tools.cli import COMMANDS

    return frozenset(COMMANDS)


@cache
def source_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py")))


def _attr_chain(root: Any, names: list[str]) -> bool:
    obj = root
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _dotted(name: str) -> bool:
    """``crossrt.a.b.c``: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("crossrt"):
                continue  # not a module: a shorter prefix is
            # the module needs an extra that is not installed (grpc for crossrt.server): read
            # its source instead
            return _defined_in_source(parts[1:])
        except Exception:  # an extra's own import error (tritonclient without grpc)
            return _defined_in_source(parts[1:])
        return _attr_chain(module, parts[cut:])
    return False


def _defined_in_source(parts: list[str]) -> bool:
    """``a.b.Name.attr`` under src/crossrt: the longest prefix that is a source file, each
    name after it defined there (def, class or assignment)."""
    for cut in range(len(parts), 0, -1):
        path = SRC.joinpath(*parts[:cut]).with_suffix(".py")
        if not path.is_file():
            path = SRC.joinpath(*parts[:cut], "__init__.py")
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            return all(
                re.search(rf"^\s*(?:def|class) {n}\b|^\s*{n}\s*[:=]", text, re.MULTILINE)
                for n in parts[cut:]
            )
    return False


def unresolved(span: str, seed: str) -> str | None:
    """Why the backticked ``span`` in ``seed``'s column names nothing real; None if it does."""
    if span.startswith("crossrt "):
        command = span.split()[1]
        return None if command in commands() else f"no `crossrt {command}` in COMMANDS"
    if "/" in span:
        return None if (REPO / span).exists() else f"no file {span}"
    if re.fullmatch(r"\.\w+", span):  # a file type: `.crm`
        return None
    if not DOTTED.fullmatch(span):
        return "not a name (write values without backticks)"
    if span.startswith("crossrt."):
        return None if _dotted(span) else f"{span} does not exist"
    layer = importlib.import_module(LAYERS[seed])
    if _attr_chain(layer, span.split(".")) or _dotted(f"crossrt.{span}"):
        return None
    if ENV_NAME.fullmatch(span) and f'"{span}"' in source_text():
        return None  # a variable the source reads by this name
    return f"{span} is neither in {LAYERS[seed]}, nor crossrt's, nor a variable src/ reads"


def bad_names(rows: list[Row]) -> list[str]:
    """``#row seed: span: why`` for each backticked name that resolves to nothing."""
    problems = []
    for row in rows:
        for seed in row.offered():
            for span in SPAN.findall(row.cells[seed]):
                why = unresolved(span, seed)
                if why:
                    problems.append(f"#{row.number} {seed}: `{span}`: {why}")
    return problems


def main(argv: list[str]) -> int:
    block = summary(parse())
    stale = []
    for page in (PAGE, COMPAT):
        text = page.read_text(encoding="utf-8")
        new = with_summary(text, block)
        if new != text:
            stale.append(page)
            if "--check" not in argv:
                page.write_text(new, encoding="utf-8")
    if "--check" in argv and stale:
        print("stale counts in: " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
