"""Throughput and latency under concurrency: crossrt instances and queues vs raw ONNX Runtime.

In the spirit of ``bmrt_test`` and OpenVINO's ``benchmark_app``: each model runs, in one
process and on the same input, as

- **crossrt latency**: 1 instance on every core, ``run()`` called from one thread;
- **crossrt throughput**: K instances x C cores (K*C = the cores), requests kept in flight
  through ``run_async`` (the queue never empty, never past its depth);
- **raw ORT, 1 thread**: one ``InferenceSession`` (default options) called from one thread;
- **raw ORT, K threads**: the same session called from K threads at once (ORT's documented
  way to serve concurrent requests: ``run`` is thread-safe).

For each: requests per second, p50/p90/p99 latency (from submission to result), and CPU
utilisation (process user+system time from ``resource.getrusage`` over wall time x cores).

    python benchmarks/throughput.py            # resnet50 and bert, ~10 s per variant
    python benchmarks/throughput.py --quick    # ~3 s per variant

Writes ``results/throughput.json`` and ``results/throughput.md`` and prints the table. Target
(from the issue): crossrt throughput mode >= 1.0x raw ORT's best.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import crossrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def summary(
    name: str, latencies: list[float], wall: float, cpu: float, cores: int
) -> dict[str, Any]:
    """One table row: throughput, latency percentiles (ms) and CPU utilisation."""
    ms = np.array(latencies) * 1e3
    return {
        "variant": name,
        "requests": int(ms.size),
        "throughput": ms.size / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "cpu_util": cpu / (wall * cores),
    }


def run_threads(
    k: int, call: Callable[[], Any], seconds: float, cores: int, name: str
) -> dict[str, Any]:
    """``k`` threads each calling ``call`` in a loop for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(k)]
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while (start := time.perf_counter()) < stop:
            call()
            latencies[i].append(time.perf_counter() - start)

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for lat in latencies for x in lat]
    return summary(name, flat, time.perf_counter() - t0, cpu_seconds() - cpu0, cores)


def run_async_loop(
    model: crossrt.LoadedModel, feed: dict[str, Any], seconds: float, cores: int, name: str
) -> dict[str, Any]:
    """Keep ``model``'s queue full through ``run_async`` for ``seconds``."""
    latencies: list[float] = []
    room = threading.Semaphore(model.instances.queue_depth)
    stop = time.perf_counter() + seconds
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    pending = []
    while time.perf_counter() < stop:
        room.acquire()
        start = time.perf_counter()

        def finished(outcome: Any, started: float) -> None:
            latencies.append(time.perf_counter() - started)
            room.release()

        pending.append(model.run_async(feed, block=True, callback=finished, user_data=start))
    for future in pending:
        future.result()
    return summary(name, latencies, time.perf_counter() - t0, cpu_seconds() - cpu0, cores)


def bench_model(name: str, seconds: float, instances: int | None) -> list[dict[str, Any]]:
    path = models.get(name)
    feed = models.example_input(name)
    rows = []
    with crossrt.Runtime() as rt:
        cores = len(rt.cores)
        k = instances or cores
        exe = crossrt.compile(path, device="cpu")
        latency = rt.load(exe)
        for _ in range(3):
            latency.run(feed)
        rows.append(
            run_threads(
                1, lambda: latency.run(feed), seconds, cores, f"crossrt latency (1x{cores})"
            )
        )
        latency.unload()
        per = max(1, cores // k)
        throughput = rt.load(exe, instances=k, cores_per_instance=per)
        for _ in range(2):
            throughput.run_async(feed, block=True).result()
        rows.append(
            run_async_loop(
                throughput, feed, seconds, cores, f"crossrt throughput ({k}x{per}, async)"
            )
        )
        throughput.unload()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feed)
    rows.append(
        run_threads(1, lambda: session.run(None, feed), seconds, cores, "raw ORT, 1 thread")
    )
    rows.append(
        run_threads(k, lambda: session.run(None, feed), seconds, cores, f"raw ORT, {k} threads")
    )
    best_raw = max(r["throughput"] for r in rows if r["variant"].startswith("raw"))
    for r in rows:
        r["model"] = name
        r["vs_best_raw"] = r["throughput"] / best_raw
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | variant | req/s | vs best raw | p50 ms | p90 ms | p99 ms | CPU util |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['throughput']:.2f} | {r['vs_best_raw']:.2f}x | "
            f"{r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['cpu_util']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~3 s per variant")
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--seconds", type=float, default=None, help="per variant")
    parser.add_argument("--instances", type=int, default=None, help="default: one per core")
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput.json")
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name.strip(), seconds, args.instances)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "onnxruntime": ort.__version__,
        "crossrt": crossrt.__version__,
        "seconds_per_variant": seconds,
        "command": "python benchmarks/throughput.py" + (" --quick" if args.quick else ""),
    }
    text = table(rows)
    header = (
        f"Throughput ({meta['command']}, {meta['date']}, {meta['cpus']} CPUs, "
        f"ORT {meta['onnxruntime']})\n\n"
    )
    reporting.save(args.out, {"meta": meta, "rows": rows}, header + text + "\n", printed=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
