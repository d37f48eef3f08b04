"""``crossrt run``: run a model once on inputs from files and save each output to a file.

Seed 002's "first application": an input that is not given is zero-filled (with a warning),
so any model can be smoke-tested with no data at all.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler import load_executable
from ..errors import CrossrtError, InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from ..runtime import Runtime
from .common import fail


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt run",
        description="Compile MODEL for a device, run it once and save every output to its own "
        "file (OUTPUT_DIR/<name>.npy). Inputs not given are filled with zeros.",
        epilog="example: crossrt run model.onnx --input x=image.npy --output-dir out/",
    )
    p.add_argument("model", help="an ONNX model file, or a compiled .crm container")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="an input from a .npy file, or a raw .bin file read with the input's dtype and "
        "static shape; repeat for each input",
    )
    p.add_argument("--device", "-d", default=None, help="device to run on (default: cpu)")
    p.add_argument("--driver", default=None, help="driver to use (default: the preferred one)")
    p.add_argument(
        "--network", default=None, help="for a .crm holding several networks, which one to run"
    )
    p.add_argument(
        "--output-dir", "-o", default="outputs", help="where to write outputs (default: outputs)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt run``."""
    args = parser().parse_args(argv)
    try:
        with Runtime() as rt:
            if args.model.endswith(".crm"):
                # Already compiled: the container's drivers are checked, nothing is compiled.
                exe = load_executable(args.model, args.network)
                model = rt.load(exe, args.device, driver=args.driver)
            else:
                model = rt.load(args.model, args.device, driver=args.driver)
            given = _read_inputs(args.input, model.inputs)
            feed = {s.name: given[s.name] if s.name in given else _zeros(s) for s in model.inputs}
            start = time.perf_counter()
            outputs = model.run(feed)
            elapsed = time.perf_counter() - start
    except CrossrtError as exc:
        return fail("run", exc)
    try:
        written = _save_outputs(outputs, Path(args.output_dir))
    except OSError as exc:
        return fail(
            "run",
            InvalidArgumentError(f"cannot write outputs to {args.output_dir!r}: {exc.strerror}"),
        )
    for name, path in written.items():
        value = outputs[name]
        print(f"{name}: {np.asarray(value).dtype} {list(np.shape(value))} -> {path}")
    print(
        f"ran {model.name!r} on {model.device.id} ({model.executable.nodes[0].driver}) "
        f"in {elapsed * 1e3:.2f} ms"
    )
    return 0


def _save_outputs(outputs: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write each output to its own .npy; names that sanitize alike get a numeric suffix."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    used: set[str] = set()
    for name, value in outputs.items():
        stem = base = _file_name(name)
        n = 1
        while stem in used:
            n += 1
            stem = f"{base}-{n}"
        used.add(stem)
        path = out_dir / f"{stem}.npy"
        np.save(path, np.asarray(value), allow_pickle=False)
        written[name] = path
    return written


def _read_inputs(items: Sequence[str], specs: Sequence[TensorSpec]) -> dict[str, Any]:
    by_name = {s.name: s for s in specs}
    values: dict[str, Any] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InvalidArgumentError(f"--input {item!r}: write it as NAME=FILE")
        if name in values:
            raise InvalidArgumentError(f"--input {name} is given twice; give each input once")
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise InvalidInputError(f"--input {name}: the model has no such input; inputs: {known}")
        values[name] = _read_file(Path(file), by_name[name])
    return values


def _read_file(path: Path, spec: TensorSpec) -> np.ndarray:
    if not path.is_file():
        raise InvalidArgumentError(f"--input {spec.name}: file {str(path)!r} does not exist")
    if path.suffix == ".npy":
        try:
            array: np.ndarray = np.load(path, allow_pickle=False)
            return array
        except (ValueError, OSError, EOFError) as exc:
            raise InvalidInputError(
                f"--input {spec.name}: {str(path)!r} is not a readable .npy file ({exc})"
            ) from None
    if spec.dtype is None or not spec.is_static:
        raise InvalidInputError(
            f"--input {spec.name}: a raw file needs a static shape and dtype, and the input is "
            f"{spec.describe()}; save it as .npy instead"
        )
    shape = tuple(d for d in spec.shape or () if isinstance(d, int))
    data = path.read_bytes()
    want = int(np.prod(shape)) * spec.dtype.itemsize
    if len(data) != want:
        raise InvalidInputError(
            f"--input {spec.name}: {str(path)!r} has {len(data)} bytes, {spec.describe()} "
            f"needs {want}; check the file or save it as .npy"
        )
    return np.frombuffer(data, dtype=spec.dtype.numpy).reshape(shape)


def _zeros(spec: TensorSpec) -> np.ndarray:
    if spec.dtype is None or spec.shape is None:
        raise InvalidInputError(
            f"input {spec.name!r} ({spec.describe()}) cannot be zero-filled; give it with --input"
        )
    shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
    note = " (dynamic dimensions set to 1)" if spec.dynamic_axes else ""
    print(
        f"crossrt run: warning: input {spec.name!r} not given; using zeros "
        f"{spec.dtype} {list(shape)}{note}",
        file=sys.stderr,
    )
    return np.zeros(shape, dtype=spec.dtype.numpy)


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"
