"""crossrt on an NVIDIA GPU (onnxruntime-gpu, ``make cuda``) against raw ONNX Runtime with the
CUDA provider, on the ResNet-50-like and BERT-like models: median ms per call of each, their
ratio, and the largest output difference; fp32, and fp16 (``precision="fp16"``) against raw
fp32; and with the tensors resident on the GPU (crossrt ``Tensor(device="cuda:0")`` inputs and
outputs left there, against ORT's IOBinding with OrtValues on the GPU). Alternating blocks, as
the other benchmarks.

    python benchmarks/cuda.py            # prints "no CUDA device: skipped" without a GPU

Writes ``results/cuda.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
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

import crossrt
from crossrt.drivers import get_driver

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"


def measure(calls: dict[str, Callable[[], Any]], rounds: int, per_block: int) -> dict[str, float]:
    for call in calls.values():
        for _ in range(3):
            call()
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = random.Random(0)
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for key in names:
            start = time.perf_counter()
            for _ in range(per_block):
                calls[key]()
            samples[key].append((time.perf_counter() - start) / per_block * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def _raw_resident(session: ort.InferenceSession, feed: dict[str, np.ndarray]) -> Any:
    """ORT's fastest GPU path: inputs copied to the GPU once, outputs left there by ORT."""
    binding = session.io_binding()
    for name, array in feed.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for out in session.get_outputs():
        binding.bind_output(out.name, "cuda", 0)
    return lambda: session.run_with_iobinding(binding)


def _crossrt_resident(model: crossrt.LoadedModel, feed: dict[str, np.ndarray]) -> Any:
    """crossrt with the inputs in cuda:0 tensors and the outputs left on the GPU."""
    inputs = {}
    for name, array in feed.items():
        inputs[name] = crossrt.Tensor(list(array.shape), str(array.dtype), device="cuda:0")
        inputs[name].write(array)
    outputs = {spec.name: None for spec in model.outputs}

    def call() -> None:
        for tensor in model.run(inputs, outputs=outputs).values():
            tensor.free()

    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="resnet50,bert")
    p.add_argument("--out", type=Path, default=RESULTS / "cuda.json")
    args = p.parse_args(argv)
    gpus = [d for d in get_driver("onnxruntime").devices() if d.id.startswith("cuda:")]
    if not gpus:
        print("no CUDA device: skipped (install onnxruntime-gpu with `make cuda` on a GPU machine)")
        return 0
    rows = []
    with crossrt.Runtime() as rt:
        for name in args.models.split(","):
            path, feed = models.get(name), models.example_input(name)
            session = ort.InferenceSession(
                str(path), providers=[("CUDAExecutionProvider", {"device_id": 0})]
            )
            fp32 = rt.load(crossrt.compile(path, "cuda:0"))
            fp16 = rt.load(crossrt.compile(path, "cuda:0", precision="fp16"))
            calls = {
                "raw onnxruntime cuda": lambda s=session, f=feed: s.run(None, f),
                "crossrt cuda": lambda m=fp32, f=feed: m.run(f),
                "crossrt cuda fp16": lambda m=fp16, f=feed: m.run(f),
                # Tensors resident on the GPU: no host copies on either side.
                "raw onnxruntime cuda iobinding": _raw_resident(session, feed),
                "crossrt cuda resident": _crossrt_resident(fp32, feed),
            }
            median = measure(calls, rounds=10, per_block=20)
            want = session.run(None, feed)
            errors = {
                label: max(
                    float(np.max(np.abs(np.asarray(g, np.float64) - w)))
                    for g, w in zip(m.run(feed).values(), want, strict=True)
                )
                for label, m in (("crossrt cuda", fp32), ("crossrt cuda fp16", fp16))
            }
            raw = median["raw onnxruntime cuda"]
            resident = median["crossrt cuda resident"] / median["raw onnxruntime cuda iobinding"]
            rows.append(
                {
                    "model": name,
                    "median_ms": {k: round(v, 3) for k, v in median.items()},
                    "crossrt_vs_raw": round(median["crossrt cuda"] / raw, 3),
                    "resident_vs_raw_iobinding": round(resident, 3),
                    "fp16_speedup_vs_raw_fp32": round(raw / median["crossrt cuda fp16"], 2),
                    "max_abs_error": errors,
                }
            )
    doc = {
        "benchmark": "cuda",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": gpus[0].name,
        "onnxruntime": ort.__version__,
        "rows": rows,
    }
    lines = [
        f"crossrt on {gpus[0].name} against raw ONNX Runtime CUDA ({doc['date']})",
        "",
        "| model | raw ms | crossrt ms | ratio | resident: raw iobinding ms | crossrt ms | ratio "
        "| crossrt fp16 ms | fp16 x raw fp32 | fp16 err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["median_ms"]
        lines.append(
            f"| {r['model']} | {m['raw onnxruntime cuda']:.3f} | {m['crossrt cuda']:.3f} | "
            f"{r['crossrt_vs_raw']:.3f} | {m['raw onnxruntime cuda iobinding']:.3f} | "
            f"{m['crossrt cuda resident']:.3f} | {r['resident_vs_raw_iobinding']:.3f} | "
            f"{m['crossrt cuda fp16']:.3f} | "
            f"{r['fp16_speedup_vs_raw_fp32']:.2f} | {r['max_abs_error']['crossrt cuda fp16']:.1e} |"
        )
    table = "\n".join(lines) + "\n"
    reporting.save(args.out, doc, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
