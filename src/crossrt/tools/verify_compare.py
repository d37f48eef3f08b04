"""``crossrt verify MODEL --compare DIR``: check a model against reference data files, as
Sophgo's ``bmrt_test --compare`` checks a bmodel.

``DIR`` holds ``input_ref_data.dat`` and ``output_ref_data.dat`` (bmrt_test's names), or the
``input_ref_data.dat.bmrt`` / ``output_ref_data.dat.bmrt`` that ``BMRT_SAVE_IO_TENSORS=1``
writes (crossrt.compat.bmruntime does too): each is the raw little-endian bytes of every
tensor, one after another, inputs in the model's input order and outputs in its output order.
The inputs' shapes are the model's static ones, or ``--shape``; the outputs are cut from the
output file at the shapes the run gives, so the file must hold exactly their bytes.

MODEL may be an ONNX model (each driver of the device is compiled and checked, as ``verify``
does) or a compiled ``.crm`` (run as it was compiled, as bmrt_test runs a bmodel). Floating
outputs pass within ``--tolerance`` of the reference data (relative to max(1, |reference|),
default 1e-2: bmrt_test's ``--accuracy_f``); integer and boolean outputs must be equal
(``--accuracy_i`` 0).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..choice import compile as compile_model
from ..choice.oracle import compare
from ..compiler import Executable, load_executable
from ..drivers import driver_statuses
from ..drivers.registry import parse_device
from ..errors import CrossrtError, InvalidArgumentError, InvalidInputError, UnsupportedError
from ..model import TensorSpec, load_model
from ..runtime import Runtime
from .common import parse_shapes

INPUT_FILES = ("input_ref_data.dat", "input_ref_data.dat.bmrt")
OUTPUT_FILES = ("output_ref_data.dat", "output_ref_data.dat.bmrt")
FLOAT_TOLERANCE = 1e-2
"""bmrt_test's ``--accuracy_f`` default."""


def report(args: argparse.Namespace) -> dict[str, Any]:
    """Every target's outputs against the reference data in ``args.compare``."""
    folder = Path(args.compare)
    if not folder.is_dir():
        raise InvalidArgumentError(
            f"--compare {args.compare!r} is not a folder: give the folder that holds "
            f"{INPUT_FILES[0]} and {OUTPUT_FILES[0]}"
        )
    input_file, output_file = _find(folder, INPUT_FILES), _find(folder, OUTPUT_FILES)
    compiled = args.model.endswith(".crm")
    specs = load_executable(args.model).inputs if compiled else load_model(args.model).inputs
    feed = read_tensors(input_file, specs, parse_shapes(args.shape, "--shape"))
    expected = output_file.read_bytes()
    allowed = FLOAT_TOLERANCE if args.tolerance is None else args.tolerance
    rows = []
    with Runtime() as rt:
        for target, exe in _targets(args, compiled):
            rows.append(_check(rt, target, exe, feed, expected, allowed))
    return {
        "model": args.model,
        "device": args.device,
        "precision": args.precision,
        "tolerance": allowed,
        "fallback": args.fallback,
        "oracle": f"reference data in {folder}",
        "oracle_why": None,  # the first line names the folder
        "reference_files": [str(input_file), str(output_file)],
        "inputs": {name: list(value.shape) for name, value in feed.items()},
        "targets": rows,
    }


def read_tensors(
    path: Path, specs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The tensors of ``specs``, in order, from the raw bytes of ``path``.

    Raises:
        InvalidInputError: an input whose shape is not known (dynamic, no ``--shape``), a
            type with no fixed size, or a file whose size is not the sum of the tensors'.
    """
    data = path.read_bytes()
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        given = shapes.get(spec.name) or spec.shape
        shape = tuple(d for d in given or () if isinstance(d, int) and d >= 0)
        if given is None or len(shape) != len(given):
            raise InvalidInputError(
                f"input {spec.name!r} has dynamic dimensions {list(spec.shape or [])}: give "
                f"its shape in the reference data as --shape {spec.name}=DxD..."
            )
        if spec.dtype is None or spec.dtype.numpy.kind not in "biuf":
            raise InvalidInputError(
                f"input {spec.name!r} is {spec.dtype}: reference data files hold numbers only"
            )
        dtype = spec.dtype.numpy.newbyteorder("<")
        count = int(np.prod(shape, dtype=np.int64))
        end = offset + count * dtype.itemsize
        if end > len(data):
            break
        tensors[spec.name] = np.frombuffer(data, dtype, count, offset).reshape(shape).copy()
        offset = end
    if len(tensors) != len(specs) or offset != len(data):
        sizes = ", ".join(f"{s.name} {list(shapes.get(s.name) or s.shape or [])}" for s in specs)
        raise InvalidInputError(
            f"{path} holds {len(data)} bytes; the inputs at these shapes ({sizes}) take "
            f"{offset if len(tensors) == len(specs) else 'more'}: give the shapes the data "
            "was saved at with --shape NAME=DxD..."
        )
    return tensors


def _find(folder: Path, names: Sequence[str]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise InvalidArgumentError(
        f"{folder} holds none of {', '.join(names)}: --compare takes the folder bmrt_test "
        "reads (or where BMRT_SAVE_IO_TENSORS=1 saved a run's tensors)"
    )


def _targets(args: argparse.Namespace, compiled: bool) -> list[tuple[str, Executable | str]]:
    """``(name, executable or why not)`` per target: the .crm itself, or each driver."""
    if compiled:
        return [("crm", load_executable(args.model))]
    model = load_model(args.model)
    kind = parse_device(args.device)[0]
    names = (
        [args.driver]
        if args.driver
        else [
            s.name
            for s in driver_statuses()
            if s.driver is not None
            and any(parse_device(d.id)[0] == kind for d in s.driver.devices())
        ]
    )
    targets: list[tuple[str, Executable | str]] = []
    for name in names:
        try:
            targets.append(
                (
                    name,
                    compile_model(
                        model,
                        args.device,
                        driver=name,
                        fallback=args.fallback,
                        precision=args.precision,
                    ),
                )
            )
        except UnsupportedError as exc:
            targets.append((name, exc.message))
    return targets


def _check(
    rt: Runtime,
    target: str,
    exe: Executable | str,
    feed: Mapping[str, np.ndarray],
    expected: bytes,
    allowed: float,
) -> dict[str, Any]:
    row: dict[str, Any] = {"target": target, "placement": None, "error": None, "reason": ""}
    if isinstance(exe, str):
        row.update(result="SKIP", reason=exe)
        return row
    row["placement"] = exe.placement_summary()
    try:
        got = rt.load(exe).run(dict(feed))
    except CrossrtError as exc:
        row.update(result="FAIL", reason=f"{exc.code.name}: {exc.message}")
        return row
    reference, why = _cut(expected, got)
    if reference is None:
        row.update(result="FAIL", reason=why)
        return row
    floats = {n: v for n, v in got.items() if np.asarray(v).dtype.kind in "fc"}
    exact = [n for n in got if n not in floats and not np.array_equal(got[n], reference[n])]
    worst, scale = compare(floats, {n: reference[n] for n in floats}) if floats else (0.0, 1.0)
    row["error"] = worst / scale if np.isfinite(worst) else None
    row["max_abs"] = worst if np.isfinite(worst) else None
    if exact:
        row.update(result="FAIL", reason=f"integer outputs differ: {', '.join(exact)}")
    elif row["error"] is None:
        row.update(result="FAIL", reason="an output holds NaNs or infinities")
    elif row["error"] > allowed:
        row.update(result="FAIL", reason=f"error {row['error']:.3g} > tolerance {allowed:g}")
    else:
        row["result"] = "PASS"
    return row


def _cut(expected: bytes, got: Mapping[str, Any]) -> tuple[dict[str, np.ndarray] | None, str]:
    """The reference outputs cut from ``expected`` at the shapes and types of ``got``."""
    arrays = {n: np.asarray(v) for n, v in got.items()}
    if any(a.dtype == object for a in arrays.values()):
        return None, "an output is a sequence or map: reference data files hold tensors only"
    need = sum(a.nbytes for a in arrays.values())
    if need != len(expected):
        shapes = ", ".join(f"{n} {list(a.shape)} {a.dtype}" for n, a in arrays.items())
        return None, (
            f"the output reference data holds {len(expected)} bytes; the outputs ({shapes}) "
            f"take {need}"
        )
    cut: dict[str, np.ndarray] = {}
    offset = 0
    for name, a in arrays.items():
        cut[name] = np.frombuffer(expected, a.dtype.newbyteorder("<"), a.size, offset).reshape(
            a.shape
        )
        offset += a.nbytes
    return cut, ""
