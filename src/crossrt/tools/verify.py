"""``crossrt verify``: does each engine give this model's answers? Checked against the
``reference`` driver (ONNX's own evaluator, in NumPy), within a stated tolerance; where the
reference cannot answer within its memory and time bounds, or fails, against ONNX Runtime at
fp32, and the output says so and why (``choice/oracle.py``).

The model is compiled for each driver that serves the device (or each ``--driver``), loaded
and run on the same inputs (``--input`` files, else seeded random ones as ``crossrt bench``
makes them); each output is compared with the reference's. The error is judged as ``device
="auto"`` judges its candidates (``choice/probe.py``): the largest absolute difference
relative to ``max(1, max |reference|)`` of its output (sequences and maps element by
element), against the tolerance of the precision
(1e-4 for the model's own, 6e-2 for bf16...), the model's ``crossrt.tolerance`` metadata,
or ``--tolerance``. Exit status 1 when a target differs beyond it or fails to run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..choice import compile as compile_model
from ..choice.oracle import compare, expected_outputs
from ..choice.probe import spelled_as, tolerance
from ..drivers import CompileOptions, driver_statuses, parse_device
from ..errors import CrossrtError, InvalidArgumentError, InvalidOptionError, UnsupportedError
from ..model import load_model
from ..runtime import Runtime
from . import flags, verify_compare
from .bench import random_inputs
from .common import AUTO_FLAGS, fail, parse_shapes, say
from .run import read_inputs

VERIFY_FLAGS = {
    **AUTO_FLAGS,
    "probe": "the inputs as --input NAME=FILE.npy, or their shapes as --shape NAME=DxD...",
    "probe_shapes_advice": "the shapes that will run as --shape NAME=DxD...",
}
"""``-d auto``'s messages in verify's flags: its probe is verify's inputs."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt verify",
        description="Run an ONNX model on each driver of a device and check every output "
        "against the reference driver within a tolerance: PASS, FAIL (beyond it) or SKIP "
        "(the driver cannot run the model). Exit status 1 on any FAIL. A reduced --precision "
        "brings its own tolerance; with --fallback, a driver that cannot run every node "
        "places the rest there instead of being skipped.",
        epilog="example: crossrt verify model.onnx --precision bf16 --shape x=1x3x224x224",
    )
    p.add_argument("model", help="an ONNX model file")
    flags.add(p, "--device", "--driver", "--fallback", "--precision", "--shape", "--input")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="T",
        help="the largest error allowed, relative to max(1, max |reference|) of each output",
    )
    p.add_argument(
        "--compare",
        default=None,
        metavar="DIR",
        help="check against reference data files in DIR instead (bmrt_test --compare: "
        "input_ref_data.dat and output_ref_data.dat, or the .dat.bmrt ones "
        "BMRT_SAVE_IO_TENSORS=1 writes); MODEL may then be a .crm; tolerance 1e-2",
    )
    flags.add(p, "--json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt verify``."""
    args = parser().parse_args(argv)
    args.device = args.device or "cpu"  # every tool's --device defaults to cpu
    try:
        report = verify_compare.report(args) if args.compare else verify(args)
    except CrossrtError as exc:
        return fail("verify", exc)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        say(*table(report))
    return 0 if all(row["result"] != "FAIL" for row in report["targets"]) else 1


def verify(args: argparse.Namespace) -> dict[str, Any]:
    """Every target's outputs against the reference's, as one JSON-friendly document."""
    if args.model.endswith(".crm"):
        raise InvalidArgumentError(
            f"{args.model!r} is compiled already; verify the ONNX model it was compiled from "
            "(the reference driver runs the model's graph, not a compiled artifact)"
        )
    if args.tolerance is not None and not args.tolerance >= 0:
        raise InvalidArgumentError(f"--tolerance {args.tolerance}: give a number >= 0")
    model = load_model(args.model)
    opts = CompileOptions(precision=args.precision)
    allowed = tolerance(model, opts) if args.tolerance is None else args.tolerance
    feed = inputs(model, args.input, parse_shapes(args.shape, "--shape"))
    kind = parse_device(args.device)[0]
    drivers = (
        [args.driver]
        if args.driver
        else [
            s.name
            for s in driver_statuses()
            if s.driver is not None
            and s.name != "reference"
            and (kind == "auto" or any(parse_device(d.id)[0] == kind for d in s.driver.devices()))
        ]
    )
    if kind == "auto":
        drivers = ["auto"]
    try:
        oracle = expected_outputs(model, feed, args.fallback)
    except CrossrtError as exc:
        # Both the reference and ONNX Runtime failed: now the inputs are the likely cause (one
        # engine's failure alone blames that engine, never the inputs).
        given = "the inputs given" if args.input else "random inputs (integers zero)"
        raise type(exc)(
            f"{exc.message}. Both failed on {given}: give inputs the model accepts with "
            "--input NAME=FILE.npy",
            exc.code,
            exc.details,
        ) from None
    with Runtime() as rt, spelled_as(VERIFY_FLAGS):
        rows = [
            check(rt, model, target, args, feed, oracle.outputs, allowed, bool(args.driver))
            for target in drivers
        ]
    return {
        "model": model.name,
        "device": args.device,
        "precision": args.precision,
        "tolerance": allowed,
        "fallback": args.fallback,
        "oracle": oracle.name,
        "oracle_why": oracle.why,
        "inputs": {name: list(np.shape(value)) for name, value in feed.items()},
        "targets": rows,
    }


def inputs(
    model: Any, items: Sequence[str], shapes: dict[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """``--input`` files where given, seeded random values for the rest."""
    given = read_inputs(items, model.inputs)
    missing = [s for s in model.inputs if s.name not in given]
    return {**given, **random_inputs(missing, shapes)}


def check(
    rt: Runtime,
    model: Any,
    target: str,
    args: argparse.Namespace,
    feed: dict[str, np.ndarray],
    reference: dict[str, Any],
    allowed: float,
    explicit: bool,
) -> dict[str, Any]:
    """One target's row: its placement, error, and PASS / FAIL / SKIP with the reason."""
    row: dict[str, Any] = {"target": target, "placement": None, "error": None, "reason": ""}
    where: dict[str, Any] = {"fallback": args.fallback, "precision": args.precision}
    if target == "auto":
        where["probe"] = feed
    else:
        where["driver"] = target
    device = "sim" if target == "sim" and args.device == "cpu" else args.device
    try:
        exe = compile_model(model, device, **where)
    except (UnsupportedError, InvalidOptionError) as exc:
        # A driver that cannot run the model (or not in that precision) says nothing of its
        # answers: skipped, unless it was asked for by name.
        row.update(result="FAIL" if explicit else "SKIP", reason=exc.message)
        return row
    except CrossrtError as exc:
        row.update(result="FAIL", reason=f"{exc.code.name}: {exc.message}")
        return row
    row["placement"] = exe.placement_summary()
    row["precision"] = exe.options.precision
    try:
        got = rt.load(exe).run(feed)
    except CrossrtError as exc:
        row.update(result="FAIL", reason=f"{exc.code.name}: {exc.message}")
        return row
    worst, scale = compare(got, reference)
    row["error"] = worst / scale if np.isfinite(worst) else None
    row["max_abs"] = worst if np.isfinite(worst) else None
    if row["error"] is None:
        row.update(result="FAIL", reason="an output differs in shape, NaNs or exact values")
    elif row["error"] > allowed:
        row.update(result="FAIL", reason=f"error {row['error']:.3g} > tolerance {allowed:g}")
    else:
        row["result"] = "PASS"
    return row


def table(report: dict[str, Any]) -> list[str]:
    """The report as text: a line per target."""
    shapes = ", ".join(f"{n} {s}" for n, s in report["inputs"].items()) or "no inputs"
    oracle = "the reference driver" if report["oracle"] == "reference" else report["oracle"]
    lines = [
        f"{report['model']!r} on {report['device']}, inputs {shapes}, against {oracle}; "
        f"tolerance {report['tolerance']:g} (relative to max(1, |reference|))",
        f"  {'target':<12} {'result':<6} {'error':>10} {'max abs':>10}  placement / reason",
    ]
    for row in report["targets"]:
        error = "-" if row["error"] is None else f"{row['error']:.3g}"
        absolute = "-" if row.get("max_abs") is None else f"{row['max_abs']:.3g}"
        what = row["reason"] or row["placement"] or ""
        lines.append(f"  {row['target']:<12} {row['result']:<6} {error:>10} {absolute:>10}  {what}")
    if report.get("oracle_why"):
        lines.append(f"  (not the reference driver: {report['oracle_why']})")
    return lines
