"""Each driver against its raw engine, fp32, on tiny, ResNet-50-like and BERT-like models.

Per model, in one process and on the same input, four variants run in alternating blocks (in
a new random order every round, after a short pause, so that a noisy machine and the previous
engine's spinning threads slow them alike):

- ``crossrt openvino``: ``crossrt.compile(model, "cpu", driver="openvino")`` loaded on every
  core, ``LoadedModel.run(feed)``;
- ``raw openvino``: ``ov.Core().compile_model`` with the same settings (f32, one stream of
  one thread per core, latency hint), an infer request reused, inputs set as tensors over
  the caller's arrays, ``infer()``, outputs copied out;
- ``crossrt onnxruntime`` and ``raw onnxruntime`` (``InferenceSession.run``).

Reported: the median per call of each, crossrt/raw ratios per engine, the fastest engine, and
the largest difference of each output from onnxruntime's; where the CPU has bfloat16
arithmetic, also ``crossrt openvino bf16`` (``precision="bf16"``): its speed-up over raw
onnxruntime fp32 and its largest difference from fp32. ``auto`` joins with issue 10.

    python benchmarks/drivers.py              # ~2 min on 2 cores
    python benchmarks/drivers.py --quick --models tiny

Writes ``results/drivers.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import openvino as ov

import crossrt
from crossrt.drivers import get_driver

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = {"tiny": (2000, 20), "resnet50": (3, 20), "bert": (2, 15)}  # calls per block, rounds
QUICK = {"tiny": (300, 4), "resnet50": (1, 4), "bert": (1, 3)}


def variants(name: str, threads: int) -> dict[str, Callable[[], Any]]:
    path = models.get(name)
    feed = models.example_input(name)
    rt = crossrt.Runtime()
    crossrt_ov = rt.load(crossrt.compile(path, "cpu", driver="openvino"))
    crossrt_ort = rt.load(crossrt.compile(path, "cpu", driver="onnxruntime"))
    bf16 = None
    if _bf16_capable():
        bf16 = rt.load(crossrt.compile(path, "cpu", driver="openvino", precision="bf16"))
    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    request = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    ordered = list(feed.values())
    outputs = len(request.model_outputs)

    def raw_openvino() -> list[np.ndarray]:
        # OpenVINO's fastest path from Python: tensors over the caller's memory (the dict
        # `infer()` costs ~80 µs more per call here), results copied out as crossrt returns them
        for i, x in enumerate(ordered):
            request.set_input_tensor(i, ov.Tensor(x, shared_memory=True))
        request.infer()
        return [request.get_output_tensor(i).data.copy() for i in range(outputs)]

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    found: dict[str, Callable[[], Any]] = {
        "crossrt openvino": lambda: crossrt_ov.run(feed),
        "raw openvino": raw_openvino,
        "crossrt onnxruntime": lambda: crossrt_ort.run(feed),
        "raw onnxruntime": lambda: session.run(None, feed),
    }
    if bf16 is not None:
        found["crossrt openvino bf16"] = lambda: bf16.run(feed)
    return found


def _bf16_capable() -> bool:
    device = next(d for d in get_driver("openvino").devices() if d.id == "cpu:0")
    return bool(device.capabilities.bf16)


def outputs_differ(name: str, precision: str | None = None) -> float:
    """Largest difference of crossrt openvino's outputs (at ``precision``) from crossrt
    onnxruntime's (fp32)."""
    path, feed = models.get(name), models.example_input(name)
    with crossrt.Runtime() as rt:
        exe = crossrt.compile(path, "cpu", driver="openvino", precision=precision)
        a = rt.load(exe).run(feed)
        b = rt.load(crossrt.compile(path, "cpu", driver="onnxruntime")).run(feed)
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in b)


def measure(calls: dict[str, Callable[[], Any]], per_block: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call of each variant over alternating blocks."""
    for call in calls.values():
        for _ in range(max(per_block, 2)):
            call()  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = random.Random(0)
    for _ in range(rounds):
        # A new order each round: a rotation keeps each variant behind the same one, and
        # ONNX Runtime's threads spin for a while after a run, slowing whatever runs next.
        names = list(calls)
        order.shuffle(names)
        for key in names:
            time.sleep(0.02)  # let the previous engine's threads go idle
            start = time.perf_counter()
            for _ in range(per_block):
                calls[key]()
            samples[key].append((time.perf_counter() - start) / per_block * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def _maybe(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="tiny,resnet50,bert")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    threads = len(os.sched_getaffinity(0))
    plan = QUICK if args.quick else ROUNDS
    rows = []
    for name in args.models.split(","):
        per_block, rounds = plan[name]
        median = measure(variants(name, threads), per_block, rounds)
        fastest_raw = min(median["raw openvino"], median["raw onnxruntime"])
        rows.append(
            {
                "model": name,
                "median_us": {k: round(v, 1) for k, v in median.items()},
                "openvino_ratio": round(median["crossrt openvino"] / median["raw openvino"], 3),
                "openvino_above_raw_us": round(
                    median["crossrt openvino"] - median["raw openvino"], 1
                ),
                "onnxruntime_ratio": round(
                    median["crossrt onnxruntime"] / median["raw onnxruntime"], 3
                ),
                "fastest_raw": "openvino"
                if fastest_raw == median["raw openvino"]
                else "onnxruntime",
                "openvino_vs_onnxruntime": round(
                    median["raw onnxruntime"] / median["raw openvino"], 2
                ),
                "max_abs_diff_openvino_vs_onnxruntime": outputs_differ(name),
                "bf16_speedup_vs_onnxruntime_fp32": (
                    round(median["raw onnxruntime"] / median["crossrt openvino bf16"], 2)
                    if "crossrt openvino bf16" in median
                    else None
                ),
                "max_abs_diff_bf16_vs_fp32": outputs_differ(name, "bf16")
                if _bf16_capable()
                else None,
            }
        )
    doc = {
        "benchmark": "drivers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": threads,
            "openvino": ov.__version__,
            "onnxruntime": ort.__version__,
            "crossrt": crossrt.__version__,
        },
        "rows": rows,
    }
    out = args.out or RESULTS / ("drivers-quick.json" if args.quick else "drivers.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"Drivers against their raw engines, fp32, {threads} threads ({doc['date']})",
        "",
        "| model | crossrt openvino | raw openvino | ratio | crossrt onnxruntime | raw onnxruntime "
        "| ratio | raw ORT / raw OV | max abs diff OV vs ORT | OV bf16: x raw ORT fp32 "
        "| bf16 max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["median_us"]
        lines.append(
            f"| {r['model']} | {m['crossrt openvino']:.1f} µs | {m['raw openvino']:.1f} µs | "
            f"{r['openvino_ratio']:.3f} | {m['crossrt onnxruntime']:.1f} µs | "
            f"{m['raw onnxruntime']:.1f} µs | {r['onnxruntime_ratio']:.3f} | "
            f"{r['openvino_vs_onnxruntime']:.2f} | "
            f"{r['max_abs_diff_openvino_vs_onnxruntime']:.1e} | "
            f"{_maybe(r['bf16_speedup_vs_onnxruntime_fp32'], '.2f')} | "
            f"{_maybe(r['max_abs_diff_bf16_vs_fp32'], '.1e')} |"
        )
    table = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
