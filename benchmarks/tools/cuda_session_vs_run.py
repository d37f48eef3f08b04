"""Whether crossrt's time on a GPU is its ONNX Runtime session or its run path.

Raw ORT on the original model, raw ORT on crossrt's own artifact (with ORT's default threads
and with one), and crossrt's run, each timed alike, twice. Run on the device machine after the
``check`` of cuda_device.sh has installed onnxruntime-gpu in /tmp/site:

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/tools/cuda_session_vs_run.py

Measured 2026-11-26 on an H200: docs/drivers.md, "Run on a GPU".
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort

import crossrt
from crossrt.drivers.onnxruntime import artifact as ort_artifact

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # benchmarks/ is not a package

PROVIDERS = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]


def median_ms(call: Callable[[], Any], calls: int = 300, blocks: int = 6) -> float:
    for _ in range(20):
        call()
    samples = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls // blocks):
            call()
        samples.append((time.perf_counter() - start) / (calls // blocks) * 1e3)
    return statistics.median(samples)


def session(path: Path, unpacked: Any = None, threads: int = 0) -> ort.InferenceSession:
    """Raw ORT on ``path``, or on crossrt's artifact (``unpacked``) with its weights beside."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if unpacked is None:
        return ort.InferenceSession(str(path), so, providers=PROVIDERS)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in unpacked.arrays]
    so.add_external_initializers(unpacked.names, values)
    graph = ort_artifact.graph_in_memory(unpacked)
    return ort.InferenceSession(graph, so, providers=PROVIDERS)


def main() -> None:
    for name in ("resnet50", "bert"):
        path, feed = models.get(name), models.example_input(name)
        exe = crossrt.compile(path, "cuda:0")
        unpacked = ort_artifact.unpack(exe.nodes[0].artifact)
        sessions = {
            "raw": session(path),
            "artifact": session(path, unpacked),
            "artifact 1 thread": session(path, unpacked, threads=1),
        }
        with crossrt.Runtime() as rt:
            model = rt.load(exe)
            calls: dict[str, Callable[[], Any]] = {
                k: (lambda s=s, f=feed: s.run(None, f)) for k, s in sessions.items()
            }
            calls["crossrt"] = lambda m=model, f=feed: m.run(f)
            for round_ in range(2):
                for key, call in calls.items():
                    print(f"{name} {round_} {key} {median_ms(call):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
