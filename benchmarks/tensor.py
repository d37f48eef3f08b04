"""What making a small tensor costs: ``crossrt.Tensor((4, 10))`` against ``np.empty``.

Every row makes a tensor and lets it go (crossrt books each allocation and free in its
allocator and memory log). The rows run in alternating blocks, the order rotated every round,
and the medians of the blocks' per-call means are compared with NumPy's in the same run.

    python benchmarks/tensor.py                  # ~20 s
    python benchmarks/tensor.py --quick --out /tmp/tensor.json

Writes a JSON file (``--out``, default ``results/tensor.json``) and a Markdown table next to
it, and prints the table. The issue's target: ``Tensor((4, 10))`` at most 5 µs.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import timeit
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import crossrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # benchmarks/ is not a package: found through sys.path

from crossrt.memory import Placement

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_US = 5.0

ROWS = {
    "np.empty": "np.empty((4, 10), np.float32)",
    "Tensor((4, 10))": "crossrt.Tensor((4, 10))",
    "Tensor((4, 10), device='cpu')": "crossrt.Tensor((4, 10), device='cpu')",
    "Tensor((4, 10), placement=HOST)": "crossrt.Tensor((4, 10), placement=HOST)",
    "Tensor((4, 10)).numpy()": "crossrt.Tensor((4, 10)).numpy()",
    "Tensor((256, 1024))": "crossrt.Tensor((256, 1024))",
}


def measure(calls: int, rounds: int) -> dict[str, list[float]]:
    namespace = {"np": np, "crossrt": crossrt, "HOST": Placement.HOST}
    timers = {name: timeit.Timer(stmt, globals=namespace) for name, stmt in ROWS.items()}
    for timer in timers.values():
        timer.timeit(calls)  # warm-up: drivers, allocators and caches made once
    samples: dict[str, list[float]] = {name: [] for name in ROWS}
    names = list(ROWS)
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(timers[name].timeit(calls) / calls * 1e6)
    finally:
        gc.enable()
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    p.add_argument("--out", type=Path, help="the JSON file to write")
    args = p.parse_args(argv)
    calls, rounds = (2000, 5) if args.quick else (20000, 15)
    started = time.perf_counter()
    samples = measure(calls, rounds)
    base = statistics.median(samples["np.empty"])
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append(
            {
                "row": name,
                "median_us": round(median, 3),
                "min_us": round(min(values), 3),
                "ratio_to_np_empty": round(median / base, 1),
            }
        )
    headline = next(r for r in rows if r["row"] == "Tensor((4, 10))")
    doc = {
        "benchmark": "tensor",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "crossrt": crossrt.__version__,
            "numpy": np.__version__,
        },
        "plan": {"calls_per_block": calls, "rounds": rounds},
        "target_us": TARGET_US,
        "target_met": headline["median_us"] <= TARGET_US,
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }
    out = args.out or RESULTS / ("tensor-quick.json" if args.quick else "tensor.json")
    lines = [
        f"Tensor creation and release, {calls} calls x {rounds} alternating rounds "
        f"({doc['date']}, {doc['machine']['cores']} cores)",
        "",
        "| row | median µs | min µs | x np.empty |",
        "|---|---:|---:|---:|",
        *(
            f"| {r['row']} | {r['median_us']:.2f} | {r['min_us']:.2f} | "
            f"{r['ratio_to_np_empty']:.1f} |"
            for r in rows
        ),
        "",
        f"Target: Tensor((4, 10)) <= {TARGET_US} µs: "
        f"{'met' if doc['target_met'] else 'MISSED'} ({headline['median_us']:.2f} µs).",
    ]
    table = "\n".join(lines) + "\n"
    reporting.save(out, doc, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
