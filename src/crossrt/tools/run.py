"""``crossrt run``: run a model once on inputs from files and save each output to a file.

Seed 002's "first application": an input that is not given is zero-filled (with a warning),
so any model can be smoke-tested with no data at all. A tensor is written as ``.npy``; any
other value (a sequence, a map, a sequence of maps such as a scikit-learn classifier's
ZipMap probabilities) as ``.json``. Each file is written beside its final name and renamed,
so an output file is whole or absent.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler import load_executable
from ..errors import CrossrtError, InvalidArgumentError, InvalidInputError, UnsupportedError
from ..model import TensorSpec
from ..runtime import Runtime
from . import flags
from .common import fail, say


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt run",
        description="Compile MODEL for a device, run it once and save every output to its own "
        "file: DIR/<name>.npy for a tensor, DIR/<name>.json for a sequence or a map. Inputs "
        "not given are filled with zeros.",
        epilog="example: crossrt run model.onnx --input x=image.npy -o out/",
    )
    p.add_argument("model", help="an ONNX model file, or a compiled .crm container")
    flags.add(p, "--input", "--device", "--driver", "--fallback", "--network")
    p.add_argument(
        "--output",
        "--output-dir",
        "-o",
        dest="output_dir",
        default="outputs",
        metavar="DIR",
        help="the folder to write the outputs to (default: outputs)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt run``."""
    args = parser().parse_args(argv)
    # One device is passed as a string, as `crossrt compile` passes it.
    fallback = args.fallback[0] if args.fallback and len(args.fallback) == 1 else args.fallback
    try:
        with Runtime() as rt:
            if args.model.endswith(".crm"):
                if fallback:
                    raise InvalidArgumentError(
                        f"--fallback places nodes when a model is compiled, and {args.model!r} "
                        "is compiled already (its placement is in the file); compile the ONNX "
                        "model again with `crossrt compile --fallback DEVICE`, or run the ONNX "
                        "model with `crossrt run MODEL.onnx --fallback DEVICE`"
                    )
                # Already compiled: the container's drivers are checked, nothing is compiled.
                exe = load_executable(args.model, args.network)
                model = rt.load(exe, args.device, driver=args.driver)
            else:
                options = {"fallback": fallback} if fallback else {}
                model = rt.load(args.model, args.device, driver=args.driver, **options)
            given = read_inputs(args.input, model.inputs)
            feed = {s.name: given[s.name] if s.name in given else _zeros(s) for s in model.inputs}
            start = time.perf_counter()
            outputs = model.run(feed)
            elapsed = time.perf_counter() - start
    except CrossrtError as exc:
        return fail("run", exc)
    try:
        written = _save_outputs(outputs, Path(args.output_dir))
    except CrossrtError as exc:
        return fail("run", exc)
    except OSError as exc:
        return fail(
            "run",
            InvalidArgumentError(
                f"cannot write outputs to {args.output_dir!r}: {exc.strerror or exc}; give a "
                "writable directory with -o DIR"
            ),
        )
    for name, path in written.items():
        say(f"{name}: {_describe(outputs[name])} -> {path}")
    drivers = ", ".join(dict.fromkeys(n.driver for n in model.executable.nodes))
    say(f"ran {model.name!r} on {model.device.id} ({drivers}) in {elapsed * 1e3:.2f} ms")
    return 0


def _save_outputs(outputs: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write each output to its own file: a tensor to .npy, anything else to .json.

    Every file's bytes are made before it is opened, then written to a temporary file in
    ``out_dir`` and renamed, so a failure leaves no partial file. Names that sanitize alike
    get a numeric suffix.
    """
    encoded = {name: _encode(name, value) for name, value in outputs.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    used: set[str] = set()
    for name, (suffix, data) in encoded.items():
        stem = base = _file_name(name)
        n = 1
        while stem in used:
            n += 1
            stem = f"{base}-{n}"
        used.add(stem)
        path = out_dir / f"{stem}{suffix}"
        _write_whole(path, data)
        written[name] = path
    return written


def _encode(name: str, value: Any) -> tuple[str, bytes]:
    """``(".npy", bytes)`` for a tensor, ``(".json", bytes)`` for any other value."""
    if isinstance(value, np.ndarray):
        array = _plain_array(value)
        if array is not None:
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            return ".npy", buffer.getvalue()
    try:
        text = json.dumps(_jsonable(value), indent=1, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnsupportedError(
            f"output {name!r} is a {type(value).__name__} that crossrt run cannot write as "
            f".npy or .json ({exc}); run the model from Python with crossrt.Runtime().load",
            details={"output": name},
        ) from None
    return ".json", (text + "\n").encode()


def _plain_array(value: np.ndarray) -> np.ndarray | None:
    """The array as .npy stores it without pickle: a string tensor (objects that are all
    str) as fixed-width unicode; ``None`` for other object arrays."""
    if value.dtype.kind != "O":
        return value
    if all(isinstance(v, str) for v in value.flat):
        return value.astype(str)
    return None


def _jsonable(value: Any) -> Any:
    """Sequences to lists, maps to objects with keys as strings (JSON has no other keys),
    NumPy scalars and arrays to Python's; NaN and infinities as the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has no such numbers)."""
    if isinstance(value, dict):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"a {type(value).__name__} has no JSON form")


def _key(key: Any) -> str:
    if isinstance(key, np.generic):
        key = key.item()
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return str(key)


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # 0o666: the umask decides the mode, as for any file the user writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def _describe(value: Any) -> str:
    """``float32 [2, 3]``, ``sequence of 2 maps`` or ``map of 3 entries``."""
    if isinstance(value, np.ndarray):
        array = _plain_array(value)
        dtype = "string" if value.dtype.kind == "O" and array is not None else value.dtype
        return f"{dtype} {list(value.shape)}"
    if isinstance(value, dict):
        return f"map of {len(value)} entr{'y' if len(value) == 1 else 'ies'}"
    if isinstance(value, list | tuple):
        kinds = {_kind(v) for v in value}
        what = f"{kinds.pop()}{'s' * (len(value) != 1)}" if len(kinds) == 1 else "values"
        return f"sequence of {len(value)} {what}"
    return type(value).__name__


def read_inputs(items: Sequence[str], specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """The ``--input NAME=FILE`` values (``.npy``, or raw bytes of a static input) by name.

    Raises:
        InvalidArgumentError: a malformed item, a name given twice, a missing file.
        InvalidInputError: no such input, or a file that does not fit it.
    """
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
    say(
        f"crossrt run: warning: input {spec.name!r} not given; using zeros "
        f"{spec.dtype} {list(shape)}{note}",
        file=sys.stderr,
    )
    return np.zeros(shape, dtype=spec.dtype.numpy)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list | tuple):
        return "sequence"
    return "tensor" if isinstance(value, np.ndarray) else type(value).__name__


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"
