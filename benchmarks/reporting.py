"""What every benchmark leaves behind: its numbers as JSON, the same as a Markdown table next
to it (``.md``), and the table printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(out: Path, doc: Any, table: str, printed: str | None = None, indent: int = 2) -> None:
    """Write ``doc`` as JSON to ``out`` (its folder made if need be) and ``table`` to
    ``out`` with the suffix ``.md``, then print ``printed`` (default: the table)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=indent) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table if printed is None else printed)
