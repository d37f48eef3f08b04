"""crossrt end to end on a small trained model: handwritten digits, 8x8 pixels.

Lists the devices, compiles ``digits.onnx`` for the CPU, loads it, classifies every test image
one at a time (batch 1) and then all of them as one batch, and prints the accuracy and the
latency. Needs only numpy and crossrt; ``make demo`` runs it. Exits 1 when the accuracy is
below 0.9 or the two ways of running disagree.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import crossrt

HERE = Path(__file__).resolve().parent
MODEL = HERE / "digits.onnx"
MIN_ACCURACY = 0.9
CORES = 1  # a model this small runs fastest on one engine thread
BATCH_REPEATS = 20


def us(seconds: float) -> str:
    """A duration in µs, or ms from 10 ms up."""
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e6:.1f} µs"


def signature(specs: tuple[crossrt.TensorSpec, ...]) -> str:
    """``name dtype [shape]`` for each tensor; ``?`` is a dynamic (batch) dimension."""
    return ", ".join(f"{s.name} {s.describe()}" for s in specs)


def main() -> int:
    images = np.load(HERE / "test_images.npy")  # float32 [N, 64], pixels scaled to [0, 1]
    labels = np.load(HERE / "test_labels.npy")  # int64 [N], the true digits
    n = len(images)

    print(f"crossrt demo: classify {n} handwritten digits (8x8 pixels) with a small trained MLP")
    with crossrt.Runtime() as rt:
        print("devices:")
        for d in rt.devices():
            mem = d.memory_bytes / 2**30
            print(
                f"  {d.id:<6} {d.driver:<12} {d.kind.value:<4} {d.cores:>3} cores "
                f"{mem:7.1f} GiB  {d.name}"
            )

        exe = crossrt.compile(MODEL, device="cpu")
        node = exe.nodes[0]
        ops = ", ".join(f"{op}×{k}" if k > 1 else op for op, k in node.op_types.items())
        print(f"model:    {MODEL.name}: {signature(exe.inputs)} -> {signature(exe.outputs)}")
        print(
            f"compiled: for {exe.device} by driver {node.driver} {node.driver_version}, "
            f"{len(exe.nodes)} node of {sum(node.op_types.values())} operators:"
        )
        print(f"          {ops}")

        model = rt.load(exe, cores=CORES)
        print(f"loaded:   on {model.device.id}, {len(model.cores)} core(s)")

        # Batch 1: one image per call, as an interactive application would.
        for i in range(min(n, 20)):  # warm-up
            model.run({"input": images[i : i + 1]})
        single = np.empty(n, dtype=np.int64)
        times = np.empty(n)
        for i in range(n):
            start = time.perf_counter()
            out = model.run({"input": images[i : i + 1]})
            times[i] = time.perf_counter() - start
            single[i] = out["label"][0]

        # One batch of every image, repeated to time it.
        batch_times = []
        for _ in range(BATCH_REPEATS):
            start = time.perf_counter()
            out = model.run({"input": images})
            batch_times.append(time.perf_counter() - start)
        batched = out["label"]

    median, p90 = np.percentile(times, [50, 90])
    best = min(batch_times)
    print(f"batch 1:  {n} runs, {us(median)} median, {us(p90)} p90 per image")
    print(f"batch {n}: {us(best)} per batch (best of {BATCH_REPEATS}), {n / best:,.0f} images/s")

    correct = int(np.sum(single == labels))
    accuracy = correct / n
    print(f"accuracy: {accuracy:.4f} ({correct}/{n})")
    p = out["probabilities"][0]
    print(f"example:  image 0 is a {labels[0]}; the model says {batched[0]} (p={p.max():.2f})")

    if not np.array_equal(single, batched):
        diff = int(np.sum(single != batched))
        print(f"FAIL: batch 1 and batch {n} disagree on {diff} images", file=sys.stderr)
        return 1
    if accuracy < MIN_ACCURACY:
        print(f"FAIL: accuracy {accuracy:.4f} is below {MIN_ACCURACY}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except crossrt.CrossrtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
