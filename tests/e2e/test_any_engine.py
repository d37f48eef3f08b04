"""``examples/any_engine.py``: the same calls on every available driver and ``auto``, the
same answers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import crossrt

ROOT = Path(__file__).resolve().parents[2]


def test_every_driver_and_auto_give_the_references_answer() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "any_engine.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {
        m[1]: (m[2], float(m[3]), float(m[4]))
        for m in re.finditer(r"^(\S+) +(.+?) +([0-9.e+-]+) +([0-9.]+)$", proc.stdout, re.M)
    }
    available = [s.name for s in crossrt.drivers.driver_statuses() if s.driver is not None]
    assert set(rows) == {*available, "auto"}, proc.stdout
    for target, (placement, diff, ms) in rows.items():
        assert diff <= 1e-5, (target, diff)
        assert ms > 0
        if target != "auto":
            assert placement.startswith(target), (target, placement)
    assert "chose" in proc.stderr  # auto's progress lines
