"""``crossrt bench``: how fast a model runs here, as OpenVINO's ``benchmark_app`` or
TensorRT's ``trtexec`` say it.

The model (ONNX, compiled here, or a ``.crm``) is loaded on the device, given seeded random
inputs (floats standard normal, integers and booleans zero: valid indices for any table) of
its input shapes, each dynamic dimension 1 unless ``--shape`` names it, run a few times
untimed, then by ``--clients`` threads for ``--seconds``, every call timed. Printed:
requests, throughput and latency percentiles; ``--json`` prints the same numbers as JSON
instead, ``--output FILE`` writes them to FILE.

``--endpoint`` times a model the daemon serves instead, through ``crossrt.connect`` as its
clients call it (the direct lane, or ``--grpc``; ``--shm`` for every tensor through shared
memory): the same table, transport included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..choice.probe import random_tensor
from ..compiler import load_executable
from ..errors import CrossrtError, InvalidArgumentError
from ..model import TensorSpec
from ..runtime import LoadedModel, Runtime
from ..runtime.runnable import RunnableModel
from . import flags
from .common import fail, parse_shapes, say

WARMUP = 3
"""Untimed runs before the clock starts (first runs allocate and tune)."""
LOAD_FLAGS = ("instances", "max_batch_size", "batch_delay")
"""``crossrt bench``'s options that go to ``Runtime.load`` as they are named."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt bench",
        description="Load MODEL on a device and time it on random inputs: requests, "
        "throughput and latency percentiles.",
        epilog="examples: crossrt bench model.onnx --shape x=1x3x224x224 --clients 2; "
        "crossrt bench resnet --endpoint unix:/run/crossrt/crossrt.sock --clients 4 (MODEL is "
        "then the name the daemon serves it under)",
    )
    add_model_arguments(p)
    flags.add(p, "--seconds", "--clients", "--json")
    p.add_argument(
        "--output",
        "-o",
        default=None,
        metavar="FILE",
        help="also write the numbers to FILE as JSON",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=None,
        metavar="N",
        help="copies of the model run in parallel (default 1)",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="batch the requests that queue, up to N rows (dynamic batching; with --clients)",
    )
    p.add_argument(
        "--batch-delay",
        type=float,
        default=None,
        metavar="S",
        help="with --max-batch-size: how long to wait for more requests (default 0)",
    )
    p.add_argument(
        "--endpoint",
        metavar="ENDPOINT",
        help="time MODEL (a model name) on the daemon at ENDPOINT (unix:PATH or HOST:PORT, "
        "as crossrt serve -g takes it) through crossrt.connect, as its clients call it",
    )
    p.add_argument(
        "--grpc",
        action="store_true",
        help="with --endpoint unix:...: gRPC rather than the direct lane",
    )
    p.add_argument(
        "--shm",
        action="store_true",
        help="with --endpoint: every tensor through shared memory (default: from 64 KiB)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt bench``."""
    args = parse(parser(), argv)
    try:
        if not args.seconds > 0 or args.clients < 1:
            raise InvalidArgumentError(
                f"--seconds {args.seconds} and --clients {args.clients}: give seconds > 0 "
                "and at least 1 client"
            )
        shapes = parse_shapes(args.shape, "--shape")
        if args.endpoint is not None:
            report, feed, where = remote(args, shapes)
        else:
            if args.grpc or args.shm:
                raise InvalidArgumentError("--grpc and --shm apply with --endpoint only")
            with Runtime() as rt:
                model, feed = load_warm(rt, args, shapes)
                before = model.statistics()
                report = measure(model, feed, args.seconds, args.clients)
                after = model.statistics()
            drivers = ", ".join(dict.fromkeys(n.driver for n in model.executable.nodes))
            report |= {
                "model": model.name,
                "device": model.device.id,
                "drivers": drivers,
                "instances": len(model.instances),
            }
            where = f"{model.name!r} on {model.device.id} ({drivers})"
            if model.instances.batching is not None:
                runs = sum(d.count for d in after.instances) - sum(
                    d.count for d in before.instances
                )
                report["max_batch_size"] = model.instances.batching.max_size
                report["mean_batch"] = (after.success - before.success) / max(1, runs)
                where += f", batches of {report['mean_batch']:.2f} on average"
    except CrossrtError as exc:
        return fail("bench", exc)
    shapes_text = ", ".join(f"{n} {list(a.shape)}" for n, a in feed.items()) or "no inputs"
    report["inputs"] = {n: list(a.shape) for n, a in feed.items()}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        say(
            f"{where}, {shapes_text}, {args.clients} client(s), {report['seconds']:.1f} s:",
            f"  requests    {report['requests']}",
            f"  throughput  {report['throughput_per_s']:.1f}/s",
            "  latency ms  "
            + "  ".join(
                f"{k} {report[k + '_ms']:.3f}" for k in ("min", "p50", "p90", "p99", "max")
            ),
        )
    if args.output:
        try:
            Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            return fail(
                "bench",
                InvalidArgumentError(f"cannot write {args.output!r}: {exc.strerror or exc}"),
            )
    return 0


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p.parse_args(argv)``, saying what to write instead of the old ``--json FILE``."""
    args, extra = p.parse_known_args(argv)
    if extra:
        hint = ""
        if args.json and extra[0].endswith(".json"):
            hint = (
                " (--json prints the numbers as JSON on stdout and takes no value; write them "
                f"to a file with --output {extra[0]})"
            )
        p.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def remote(
    args: argparse.Namespace, shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    """``--endpoint``: the report, the inputs and what was timed, for the daemon's model
    ``args.model`` called as a client of ``crossrt.connect`` calls it."""
    loading = [
        "--" + name.replace("_", "-")
        for name in ("device", "driver", "network", *LOAD_FLAGS)
        if getattr(args, name) is not None
    ]
    if loading:
        raise InvalidArgumentError(
            f"{', '.join(loading)} choose how MODEL loads here; with --endpoint the daemon "
            "has loaded it (crossrt serve's repository, or its load parameters of the same "
            "names)"
        )
    try:
        from ..server.client import SHM_THRESHOLD, connect
    except ImportError as exc:
        raise InvalidArgumentError(
            f"--endpoint needs the serve extra ({exc}): pip install 'crossrt[serve]'"
        ) from None
    with connect(
        args.endpoint, lane=not args.grpc, shm_threshold=0 if args.shm else SHM_THRESHOLD
    ) as rt:
        model = rt.load(args.model)
        feed = random_inputs(model.inputs, shapes)
        for _ in range(WARMUP):
            model.run(feed)
        report = measure(model, feed, args.seconds, args.clients)
        transport = "gRPC" if args.grpc or not rt.lane else "lane"
    transport += ", shared memory" if args.shm else ""
    report |= {"model": model.name, "endpoint": args.endpoint, "transport": transport}
    return report, feed, f"{model.name!r} at {args.endpoint} ({transport})"


def add_model_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """MODEL (optional unless ``required``), ``--device``, ``--driver``, ``--network``,
    ``--shape``: what to load and feed (``crossrt bench`` and ``crossrt profile``)."""
    p.add_argument(
        "model",
        nargs=None if required else "?",
        help="an ONNX model file, or a compiled .crm container",
    )
    flags.add(p, "--device", "--driver", "--network", "--shape")


def load_warm(
    rt: Runtime, args: argparse.Namespace, shapes: dict[str, tuple[int, ...]]
) -> tuple[LoadedModel, dict[str, np.ndarray]]:
    """Load ``args.model`` as :func:`add_model_arguments` describes it, make its random
    inputs and run it :data:`WARMUP` times."""
    options = {k: v for k in LOAD_FLAGS if (v := getattr(args, k, None)) is not None}
    if args.model.endswith(".crm"):
        exe = load_executable(args.model, args.network)
        model = rt.load(exe, args.device, driver=args.driver, **options)
    else:
        model = rt.load(args.model, args.device, driver=args.driver, **options)
    feed = random_inputs(model.inputs, shapes)
    for _ in range(WARMUP):
        model.run(feed)
    return model, feed


def random_inputs(
    specs: Sequence[TensorSpec], shapes: dict[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Seeded random inputs of ``specs``: the shapes given, else each dynamic dimension 1.

    Raises:
        InvalidArgumentError: a shape names no input, contradicts a static dimension, or an
            input is not a tensor of a known type.
    """
    names = {s.name for s in specs}
    for name in shapes:
        if name not in names:
            raise InvalidArgumentError(
                f"--shape {name}: the model has no input {name!r}; its inputs: "
                f"{', '.join(sorted(names)) or 'none'}"
            )
    rng = np.random.default_rng(0)
    feed = {}
    for spec in specs:
        if spec.kind != "tensor" or spec.dtype is None or spec.dtype.numpy.kind in "OUS":
            raise InvalidArgumentError(
                f"input {spec.name!r} is {spec.describe()}: crossrt bench makes numeric "
                "tensors only; time this model with `crossrt run` and inputs from files"
            )
        given = shapes.get(spec.name)
        if spec.shape is None and given is None:
            raise InvalidArgumentError(
                f"input {spec.name!r} has no known rank; give its shape: --shape {spec.name}=DxD..."
            )
        want = spec.shape or ()
        if (
            given is not None
            and spec.shape is not None
            and (
                len(given) != len(want)
                or any(isinstance(w, int) and w != g for w, g in zip(want, given, strict=False))
            )
        ):
            raise InvalidArgumentError(
                f"--shape {spec.name}={'x'.join(map(str, given))} does not fit input "
                f"{spec.describe()}"
            )
        shape = given if given is not None else tuple(d if isinstance(d, int) else 1 for d in want)
        feed[spec.name] = random_tensor(spec.dtype, shape, rng)
    return feed


def measure(
    model: RunnableModel, feed: dict[str, np.ndarray], seconds: float, clients: int
) -> dict[str, Any]:
    """Every call's latency from ``clients`` threads running ``model`` (any
    :class:`~crossrt.RunnableModel`: a :class:`LoadedModel`, or a daemon's model) for
    ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + seconds

    def client(mine: list[float]) -> None:
        try:
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                model.run(feed)
                mine.append(time.perf_counter() - began)
        except BaseException as exc:  # reported by the caller, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(mine,)) for mine in latencies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    calls = sorted(x for mine in latencies for x in mine)
    ms = [x * 1e3 for x in calls]

    def pct(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return {
        "requests": len(ms),
        "seconds": elapsed,
        "clients": clients,
        "throughput_per_s": len(ms) / elapsed,
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
        "p50_ms": pct(0.5),
        "p90_ms": pct(0.9),
        "p99_ms": pct(0.99),
        "max_ms": ms[-1],
    }
