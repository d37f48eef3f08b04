"""What observing costs a request: ``run()`` with a :class:`crossrt.profiling.Profile` recording
against without, and with a ``crossrt top``-like observer asking for a snapshot every 0.1 s.

On ``benchmarks/models.py``'s tiny model (a 16x16 MatMul, where per-call costs show most),
after a warm-up, the variants run in alternating blocks of 2,000 calls, 15 rounds; each
block's mean per call, then the median over blocks, and its ratio to the plain block of the
same round (paired: this machine is shared and noisy).

    python benchmarks/profile_overhead.py        # ~30 s on 2 cores

Writes ``results/profile_overhead.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import crossrt
from crossrt.host import cpu_model, usable_cores
from crossrt.runtime import observer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"
CALLS, ROUNDS = 2_000, 15


def block(run: Callable[[], object]) -> float:
    """Mean seconds per call of ``CALLS`` calls."""
    started = time.perf_counter()
    for _ in range(CALLS):
        run()
    return (time.perf_counter() - started) / CALLS


def measure() -> dict[str, Any]:
    with crossrt.Runtime() as rt:
        model = rt.load(str(models.get("tiny")))
        feed = models.example_input("tiny")

        def call() -> object:
            return model.run(feed)

        for _ in range(3):
            block(call)
        stop = threading.Event()

        def watch() -> None:  # what `crossrt top` does, ten times as often
            while not stop.wait(0.1):
                observer.ask(os.getpid(), {"op": "snapshot"})

        times: dict[str, list[float]] = {"plain": [], "profiled": [], "observed": []}
        for _ in range(ROUNDS):
            times["plain"].append(block(call))
            with crossrt.profiling.Profile(model, max_requests=10**7):
                times["profiled"].append(block(call))
            watcher = threading.Thread(target=watch)
            watcher.start()
            times["observed"].append(block(call))
            stop.set()
            watcher.join()
            stop.clear()
    plain = times["plain"]
    rows = []
    for name, values in times.items():
        ratios = [v / p for v, p in zip(values, plain, strict=True)]
        rows.append(
            {
                "variant": name,
                "per_call_us": round(statistics.median(values) * 1e6, 3),
                "vs_plain_paired": round(statistics.median(ratios), 3),
            }
        )
    return {"calls_per_block": CALLS, "rounds": ROUNDS, "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# What observing costs run() (tiny model, {report['date']}, {report['machine']})",
        "",
        "| variant | per call us (median of blocks) | against plain (paired median) |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {r['variant']} | {r['per_call_us']:.2f} | {r['vs_plain_paired']:.3f} |"
        for r in report["rows"]
    ]
    return "\n".join([*lines, ""])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / "profile_overhead.json")
    args = p.parse_args(argv)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{' '.join(cpu_model()).strip()}, {len(usable_cores())} CPUs",
        **measure(),
    }
    table = markdown(report)
    reporting.save(args.out, report, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
