"""What dynamic batching (``Runtime.load(max_batch_size=)``) gives many callers of one model.

``clients`` threads each call ``model.run`` on a batch-1 input in a loop, as the daemon's
request threads do, for ``seconds``; requests per second and each request's latency. Three
variants of the same model in the same process, in alternating rounds (paired: this machine
is shared and noisy):

- ``raw onnxruntime``: one ``InferenceSession`` the threads share (ORT's own thread safety);
- ``crossrt``: ``Runtime.load(path)``, one instance, requests run one by one;
- ``crossrt batched``: the same with ``max_batch_size``: the requests that queue while the
  instance runs are run together as one batch;
- ``crossrt N instances``: no batching, one instance per core (at most ``clients``), the
  other way to serve many callers.

Models: ``tiny`` (a 16x16 MatMul, [N, 16]: per-call costs dominate) and ResNet-50 ([N, 3, 224,
224], compute dominates); both with a dynamic first dimension.

    python benchmarks/batching.py                 # ~2 min on 2 cores
    python benchmarks/batching.py --seconds 1 --rounds 1

Writes ``results/batching.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import crossrt
from crossrt.host import cpu_model, usable_cores

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {  # model: (clients, max_batch_size)
    "tiny": (8, 32),
    "resnet50": (4, 4),
}


def tiny_batched(path: Path) -> Path:
    """benchmarks/models.py's tiny with a dynamic first dimension, saved at ``path``."""
    if not path.is_file():
        rng = np.random.default_rng(models.SEED)
        b = crossrt.GraphBuilder("tiny_n")
        x = b.input("x", "float32", ["N", 16])
        w = b.constant(rng.standard_normal((16, 16), dtype=np.float32) / 4, "W")
        bias = b.constant(rng.standard_normal(16, dtype=np.float32) / 10, "b")
        b.output(b.op("Add", [b.op("MatMul", [x, w]), bias], outputs=["y"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        b.finish().save(path)
    return path


def model_path(name: str) -> Path:
    if name == "tiny":
        return tiny_batched(models.MODELS_DIR / "tiny_n.onnx")
    return models.get(name)  # resnet50's batch is dynamic already


def drive(run: Callable[[], object], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads calling ``run`` for ``seconds``: requests/s, latency p50/p99."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(mine: list[float]) -> None:
        start.wait()
        while not stop.is_set():
            began = time.perf_counter()
            run()
            mine.append(time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(m,)) for m in latencies]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    every = sorted(v for m in latencies for v in m)
    return {
        "per_s": len(every) / elapsed,
        "p50_ms": every[len(every) // 2] * 1e3,
        "p99_ms": every[min(len(every) - 1, math.ceil(len(every) * 0.99) - 1)] * 1e3,
    }


def measure(name: str, seconds: float, rounds: int) -> dict[str, Any]:
    clients, batch = CASES[name]
    path = model_path(name)
    feed = models.example_input("tiny" if name == "tiny" else name)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with crossrt.Runtime() as rt:
        plain = rt.load(str(path))
        batched = rt.load(str(path), max_batch_size=batch)
        copies = min(clients, len(rt.cores))
        spread = rt.load(str(path), instances=copies)
        variants: dict[str, Callable[[], object]] = {
            "raw onnxruntime": lambda: session.run(None, feed),
            "crossrt": lambda: plain.run(feed),
            "crossrt batched": lambda: batched.run(feed),
            f"crossrt {copies} instances": lambda: spread.run(feed),
        }
        for run in variants.values():  # warm-up
            drive(run, clients, min(seconds, 1.0))
        results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for _ in range(rounds):
            for variant, run in variants.items():
                results[variant].append(drive(run, clients, seconds))
        runs = batched.statistics()
        executions = sum(d.count for d in runs.instances)
    raw = results["raw onnxruntime"]
    rows = []
    for variant, measured in results.items():
        ratios = [m["per_s"] / r["per_s"] for m, r in zip(measured, raw, strict=True)]
        rows.append(
            {
                "variant": variant,
                "per_s": round(statistics.median(m["per_s"] for m in measured), 1),
                "p50_ms": round(statistics.median(m["p50_ms"] for m in measured), 3),
                "p99_ms": round(statistics.median(m["p99_ms"] for m in measured), 3),
                "vs_raw_paired": round(statistics.median(ratios), 3),
            }
        )
    return {
        "model": name,
        "clients": clients,
        "max_batch_size": batch,
        "mean_batch": round(runs.success / max(1, executions), 2),
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Dynamic batching ({report['date']}, {report['machine']})",
        "",
        f"Clients call run() on batch-1 inputs for {report['seconds']} s, {report['rounds']} "
        "alternating rounds; medians; throughput against raw onnxruntime, paired per round.",
        "",
        "| model | clients | variant | requests/s | p50 ms | p99 ms | vs raw ORT |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in report["cases"]:
        for r in case["rows"]:
            label = r["variant"]
            if label == "crossrt batched":
                label += f" (max {case['max_batch_size']}, mean batch {case['mean_batch']})"
            lines.append(
                f"| {case['model']} | {case['clients']} | {label} | {r['per_s']:.1f} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['vs_raw_paired']:.2f}x |"
            )
    return "\n".join([*lines, ""])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--out", type=Path, default=RESULTS / "batching.json")
    args = p.parse_args(argv)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{' '.join(cpu_model()).strip()}, {len(usable_cores())} CPUs",
        "seconds": args.seconds,
        "rounds": args.rounds,
        "cases": [measure(m, args.seconds, args.rounds) for m in args.models],
    }
    table = markdown(report)
    reporting.save(args.out, report, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
