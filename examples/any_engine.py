"""Same calls, same answers: one model through every available driver and ``device="auto"``.

    python examples/any_engine.py [MODEL.onnx] [--fallback] [--shape NAME=D,D..] [--scalar NAME=V]

The same four lines run the model on each engine (compile, load, run, compare); the table
shows each one's placement, its largest difference from the ``reference`` driver (NumPy, the
oracle) and its median latency. Default model: the digits classifier beside this file.
``--fallback`` places the nodes a driver cannot run on the CPU's other drivers instead of
skipping that driver. ``--shape`` sets an input's shape (else dynamic dimensions are 1),
``--scalar`` an input's value. silero-vad, for one::

    python examples/any_engine.py silero_vad.onnx --fallback --shape input=1,512 --scalar sr=16000
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import crossrt

HERE = Path(__file__).resolve().parent
RUNS = 20


def example_inputs(
    model: crossrt.Model, shapes: dict[str, tuple[int, ...]], scalars: dict[str, float]
) -> dict[str, np.ndarray]:
    """Seeded inputs of the model's shapes (dynamic dimensions 1 unless ``shapes`` says;
    integers zero; ``scalars`` as given)."""
    rng = np.random.default_rng(0)
    feed = {}
    for spec in model.inputs:
        assert spec.dtype is not None and spec.shape is not None, spec.describe()
        shape = shapes.get(spec.name) or tuple(d if isinstance(d, int) else 1 for d in spec.shape)
        if spec.name in scalars:
            feed[spec.name] = np.full(shape, scalars[spec.name], spec.dtype.numpy)
        elif spec.dtype.numpy.kind == "f":
            feed[spec.name] = rng.uniform(0, 1, shape).astype(spec.dtype.numpy)
        else:
            feed[spec.name] = np.zeros(shape, spec.dtype.numpy)
    return feed


def run_on(exe: crossrt.Executable, feed: dict[str, np.ndarray]) -> tuple[dict, float]:
    """Outputs and median latency (ms) of ``exe`` on ``feed``: the same calls on any engine."""
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        outputs = model.run(feed)
        times = []
        for _ in range(RUNS):
            started = time.perf_counter()
            model.run(feed)
            times.append(time.perf_counter() - started)
    return outputs, statistics.median(times) * 1e3


def max_abs_diff(got: dict, want: dict) -> float:
    return max(
        (float(np.max(np.abs(got[n].astype(np.float64) - w))) for n, w in want.items() if w.size),
        default=0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=str(HERE / "digits" / "digits.onnx"))
    parser.add_argument("--fallback", action="store_true", help="place what a driver cannot run")
    parser.add_argument("--shape", action="append", default=[], help="NAME=D,D,...")
    parser.add_argument("--scalar", action="append", default=[], help="NAME=VALUE")
    args = parser.parse_args()
    shapes = {
        name: tuple(int(d) for d in dims.split(","))
        for name, dims in (item.split("=", 1) for item in args.shape)
    }
    scalars = {name: float(v) for name, v in (item.split("=", 1) for item in args.scalar)}
    model = crossrt.load_model(args.model)
    feed = example_inputs(model, shapes, scalars)
    fallback = "cpu" if args.fallback else None

    reference, _ = run_on(crossrt.compile(model, "cpu", driver="reference"), feed)
    drivers = [s.name for s in crossrt.drivers.driver_statuses() if s.driver is not None]
    targets = [(name, dict(device="cpu", driver=name, fallback=fallback)) for name in drivers]
    targets.append(("auto", dict(device="auto", fallback=fallback, probe=feed)))

    print(f"{model.name}: {', '.join(f'{n} {list(a.shape)}' for n, a in feed.items())}")
    print(f"{'target':<12} {'placement':<48} {'max abs diff':>12} {'median ms':>10}")
    for label, where in targets:
        if where.get("driver") == "sim":
            where["device"] = "sim"  # the simulated accelerator's own device
        try:
            exe = crossrt.compile(model, **where)
            outputs, ms = run_on(exe, feed)
        except crossrt.CrossrtError as exc:
            print(f"{label:<12} {exc.code.name}: {exc.message[:90]}")
            continue
        diff = max_abs_diff(outputs, reference)
        print(f"{label:<12} {exe.placement_summary()[:48]:<48} {diff:>12.3g} {ms:>10.3f}")


if __name__ == "__main__":
    main()
