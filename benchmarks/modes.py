"""What each performance mode does, per CPU driver: latency and CPU time per call against
the NONE mode, measured in the same run.

Per model and driver, one loaded model per mode (NONE, LOW, MEDIUM: the modes the CPU
drivers honour), run in alternating blocks in a new random order every round. Reported: the
median milliseconds per call, the CPU seconds the process spent per call (every thread's,
spinning included: what a mode saves in power), and both as ratios to NONE.

    python benchmarks/modes.py                 # ~2 min on 2 cores
    python benchmarks/modes.py --quick --models resnet50

Writes ``results/modes.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import crossrt
from crossrt import host

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

from crossrt.drivers import PerformanceMode

RESULTS = Path(__file__).resolve().parent / "results"
MODES = (PerformanceMode.NONE, PerformanceMode.LOW, PerformanceMode.MEDIUM)
DRIVERS = ("onnxruntime", "openvino")
BLOCK_S = 0.2


def measure(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, tuple[float, float]]:
    """Median (ms per call, CPU ms per call) of each variant over alternating blocks."""
    per_block = {}
    for key, call in calls.items():
        call()
        start = time.perf_counter()
        call()
        per_block[key] = max(1, int(BLOCK_S / max(time.perf_counter() - start, 1e-6)))
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    order = random.Random(0)
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for key in names:
            time.sleep(0.05)  # the previous variant's threads go idle
            w, c = time.perf_counter(), time.process_time()
            for _ in range(per_block[key]):
                calls[key]()
            wall[key].append((time.perf_counter() - w) / per_block[key] * 1e3)
            cpu[key].append((time.process_time() - c) / per_block[key] * 1e3)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in calls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="tiny,resnet50,bert")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rounds = 3 if args.quick else 8
    available = {s.name for s in crossrt.drivers.driver_statuses() if s.driver is not None}
    rows = []
    with crossrt.Runtime() as rt:
        for name in args.models.split(","):
            path, feed = models.get(name), models.example_input(name)
            for driver in (d for d in DRIVERS if d in available):
                calls = {}
                for mode in MODES:
                    exe = crossrt.compile(path, "cpu", driver=driver, performance_mode=mode)
                    loaded = rt.load(exe)
                    calls[mode.name] = lambda loaded=loaded, feed=feed: loaded.run(feed)
                result = measure(calls, rounds)
                base_ms, base_cpu = result["NONE"]
                for mode_name, (ms, cpu_ms) in result.items():
                    rows.append(
                        {
                            "model": name,
                            "driver": driver,
                            "mode": mode_name,
                            "median_ms": round(ms, 3),
                            "cpu_ms_per_call": round(cpu_ms, 3),
                            "latency_vs_none": round(ms / base_ms, 3),
                            "cpu_vs_none": round(cpu_ms / base_cpu, 3) if base_cpu else None,
                        }
                    )
    threads = len(host.usable_cores())
    doc = {
        "benchmark": "modes",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {"cpu": " ".join(host.cpu_model()).strip(), "threads": threads},
        "rows": rows,
    }
    out = args.out or RESULTS / ("modes-quick.json" if args.quick else "modes.json")
    lines = [
        f"Performance modes, {threads} cores, {doc['machine']['cpu']} ({doc['date']})",
        "",
        "| model | driver | mode | median ms | CPU ms per call | latency vs NONE | CPU vs NONE |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['driver']} | {r['mode']} | {r['median_ms']:.3f} | "
            f"{r['cpu_ms_per_call']:.3f} | {r['latency_vs_none']:.2f} | "
            f"{r['cpu_vs_none'] if r['cpu_vs_none'] is not None else '-'} |"
        )
    table = "\n".join(lines) + "\n"
    reporting.save(out, doc, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
