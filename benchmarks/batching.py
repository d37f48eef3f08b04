"""What dynamic batching (``Runtime.load(max_batch_size=)``) gives many callers of one model.

``clients`` threads each call ``model.run`` on a batch-1 input in a loop, as the daemon's
request threads do, for ``seconds`` (``crossrt bench``'s timing loop): requests per second
and each request's latency. Four variants of the same model in the same process, in
alternating rounds (paired: this machine is shared and noisy):

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
import statistics
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import crossrt
from crossrt.host import cpu_model, usable_cores
from crossrt.tools.bench import measure as timed  # clients calling run(), every call timed

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


class _Raw:
    """An ONNX Runtime session with ``run(feed)``, as ``crossrt bench`` times a model."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session

    def run(self, feed: dict[str, Any]) -> object:
        return self._session.run(None, feed)


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
        variants: dict[str, Any] = {
            "raw onnxruntime": _Raw(session),
            "crossrt": plain,
            "crossrt batched": batched,
            f"crossrt {copies} instances": spread,
        }
        for model in variants.values():  # warm-up
            timed(model, feed, min(seconds, 1.0), clients)
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(rounds):
            for variant, model in variants.items():
                results[variant].append(timed(model, feed, seconds, clients))
        runs = batched.statistics()
        executions = sum(d.count for d in runs.instances)
    raw = results["raw onnxruntime"]
    rows = []
    for variant, measured in results.items():
        ratios = [
            m["throughput_per_s"] / r["throughput_per_s"]
            for m, r in zip(measured, raw, strict=True)
        ]
        rows.append(
            {
                "variant": variant,
                "per_s": round(statistics.median(m["throughput_per_s"] for m in measured), 1),
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
