"""The onnxruntime driver's artifact: ORT's optimized graph with its large weights beside it.

Layout (all integers little-endian, every offset from the artifact's first byte)::

    magic "CRORTART" | version u32 | reserved u32 (zero) | index length N u64
    | JSON index (N bytes) | zero padding | ONNX graph | weights, each at a multiple of 64

The index is ``{"target": {"level", "features"}, "graph": {"offset", "length"}, "weights":
[{"name", "dtype", "shape", "offset", "length"}, ...]}``. The graph is ORT's optimized model
in which every initializer of :data:`THRESHOLD` bytes or more is a stub marked as external
data; its bytes follow as raw little-endian tensors, in index order. ``target.level`` says how
far ORT optimized the graph: ``"all"`` includes layouts tied to the CPU's vector extensions
(ORT's NCHWc blocks), so such an artifact loads only on a CPU with ``target.features`` (the
compiling host's architecture and extensions) and is loaded without optimizing again;
``"extended"`` is portable, and ORT applies the rest at load. Nothing in the index is
trusted: every field, offset and length is checked before a view is made.

Loading parses only the small graph. When the artifact lies in a file, the stubs are pointed
at the file and ORT maps the weights itself (:func:`graph_reading`), shared between sessions
and processes through the page cache; otherwise each weight becomes a NumPy view of the
artifact that ORT takes as an external initializer (and copies).

Version 1 (no ``target``: always ``"extended"``) still loads. Artifacts written before this
format are the optimized model's plain ONNX bytes. A serialized ModelProto from ORT starts
with its ``ir_version`` field (byte ``0x08``), never with ``C``, so the magic tells them apart.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import InvalidContainerError, StatusCode, UnsupportedError

MAGIC = b"CRORTART"
VERSION = 2
THRESHOLD = 1024
"""Initializers of this many bytes or more are stored outside the graph."""

ALIGN = 64
LEVELS = ("all", "extended")
"""How far ORT optimized the graph; see the module docstring."""
_PRELUDE = struct.Struct("<8sIIQ")
_LOCATION = "crossrt-artifact"  # never opened: ORT receives these tensors in memory

# The element types ORT can take from NumPy in place; others (strings, bfloat16, float8,
# int4...) stay inside the graph.
_DTYPES = {
    np.dtype(name).name: (np.dtype(name).newbyteorder("<"), onnx_type)
    for name, onnx_type in [
        ("float32", onnx.TensorProto.FLOAT),
        ("float64", onnx.TensorProto.DOUBLE),
        ("float16", onnx.TensorProto.FLOAT16),
        ("int8", onnx.TensorProto.INT8),
        ("int16", onnx.TensorProto.INT16),
        ("int32", onnx.TensorProto.INT32),
        ("int64", onnx.TensorProto.INT64),
        ("uint8", onnx.TensorProto.UINT8),
        ("uint16", onnx.TensorProto.UINT16),
        ("uint32", onnx.TensorProto.UINT32),
        ("uint64", onnx.TensorProto.UINT64),
        ("bool", onnx.TensorProto.BOOL),
    ]
}
_BY_ONNX = {onnx_type: name for name, (_, onnx_type) in _DTYPES.items()}


@dataclass(frozen=True)
class Unpacked:
    """A validated artifact.

    Attributes:
        graph: the ONNX graph's bytes, its large initializers stubs (a view, not a copy).
        names: the external initializers' names.
        arrays: their values, NumPy views of the artifact (read-only when it is), in
            ``names`` order.
        offsets: where each lies in the artifact, in ``names`` order.
        level: ``"all"`` (optimized for CPUs with ``features`` only) or ``"extended"``.
        features: for ``"all"``: the compiling host's architecture and vector extensions.
    """

    graph: memoryview
    names: list[str]
    arrays: list[np.ndarray]
    offsets: list[int]
    level: str = "extended"
    features: tuple[str, ...] = ()


def is_packed(artifact: bytes | memoryview) -> bool:
    """Whether ``artifact`` is in this format (else it is a plain ONNX model)."""
    return bytes(artifact[: len(MAGIC)]) == MAGIC


def pack(
    model: bytes | memoryview,
    threshold: int = THRESHOLD,
    *,
    level: str = "extended",
    features: tuple[str, ...] = (),
) -> bytes:
    """The artifact for ``model``, ORT's optimized ONNX model (its serialized bytes).

    ``level`` and ``features`` record how far ORT optimized it and, for ``"all"``, on which
    CPU (see the module docstring). Every initializer of the main graph of ``threshold``
    bytes or more whose type NumPy and ORT exchange in place is moved out of the graph; the
    rest of the model is unchanged.
    """
    proto = onnx.ModelProto.FromString(model)
    blobs: list[bytes] = []
    entries: list[dict[str, Any]] = []
    for init in proto.graph.initializer:
        dtype_name = _BY_ONNX.get(init.data_type)
        if dtype_name is None or init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        dtype = _DTYPES[dtype_name][0]
        nbytes = math.prod(init.dims) * dtype.itemsize
        if nbytes < threshold:
            continue
        if len(init.raw_data) == nbytes:
            blob = init.raw_data  # ONNX raw data is little-endian, as the artifact stores it
        else:  # the typed fields (float_data...)
            try:
                blob = numpy_helper.to_array(init).astype(dtype, copy=False).tobytes()
            except (ValueError, TypeError):
                continue  # inconsistent with its dims: left in the graph for ORT to judge
            if len(blob) != nbytes:
                continue
        stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", _LOCATION), ("offset", "0"), ("length", str(nbytes))):
            stub.external_data.add(key=key, value=value)
        init.CopyFrom(stub)
        blobs.append(blob)
        entries.append({"name": stub.name, "dtype": dtype_name, "shape": list(stub.dims)})
    graph = proto.SerializeToString()
    index: dict[str, Any] = {
        "target": {"level": level, "features": list(features)},
        "graph": {"offset": 0, "length": len(graph)},
        "weights": entries,
    }
    # Offsets are absolute, so they depend on the index's length, which depends on them: grow
    # the start of the data until the index fits before it (it only grows, so this ends).
    start = 0
    while True:
        index["graph"]["offset"] = start
        end = start + len(graph)
        for entry, blob in zip(entries, blobs, strict=True):
            entry["offset"] = _align(end)
            entry["length"] = len(blob)
            end = entry["offset"] + len(blob)
        text = json.dumps(index, separators=(",", ":")).encode()
        if _align(_PRELUDE.size + len(text)) <= start:
            break
        start = _align(_PRELUDE.size + len(text))
    chunks: list[bytes] = [_PRELUDE.pack(MAGIC, VERSION, 0, len(text)), text]
    at = _PRELUDE.size + len(text)
    offsets = [start, *(e["offset"] for e in entries)]
    for offset, data in zip(offsets, [graph, *blobs], strict=True):
        chunks += [bytes(offset - at), data]
        at = offset + len(data)
    return b"".join(chunks)


def unpack(artifact: bytes | memoryview) -> Unpacked:
    """Validate an artifact and view its parts in place.

    Raises:
        InvalidContainerError: the artifact is truncated or its index is malformed or
            inconsistent (an offset or a length outside the artifact, overlapping weights...).
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) a newer version of this format.
    """
    view = memoryview(artifact).cast("B") if not isinstance(artifact, bytes) else artifact
    size = len(view)
    if size < _PRELUDE.size:
        raise _corrupt(f"it is truncated: {size} bytes, less than its {_PRELUDE.size}-byte prelude")
    magic, version, reserved, length = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise _corrupt(f"it does not start with {MAGIC!r}")
    if version > VERSION:
        raise UnsupportedError(
            f"the onnxruntime artifact is version {version}; this crossrt reads version "
            f"{VERSION}; upgrade crossrt, or recompile the model with `crossrt compile`",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"artifact_version": version, "supported": VERSION},
        )
    if version < 1 or reserved:
        raise _corrupt(f"its prelude is damaged (version {version}, reserved {reserved})")
    if length > size - _PRELUDE.size:
        raise _corrupt(
            f"it is truncated: its index needs {length} bytes, {size - _PRELUDE.size} follow"
        )
    index = _decode(bytes(view[_PRELUDE.size : _PRELUDE.size + length]))
    level: str = "extended"
    features: tuple[str, ...] = ()
    if version >= 2:
        target = _field(index, "target", "", dict)
        level = _field(target, "level", "target", str)
        features = tuple(_field(target, "features", "target", list))
        if level not in LEVELS or not all(type(f) is str for f in features):
            raise _corrupt("index field target has an unknown level or features not strings")
    graph = _field(index, "graph", "", dict)
    start = _count(graph, "offset", "graph")
    graph_length = _count(graph, "length", "graph")
    end = _inside(start, graph_length, _PRELUDE.size + length, size, "the graph")
    entries = _field(index, "weights", "", list)
    names: list[str] = []
    seen: set[str] = set()
    arrays: list[np.ndarray] = []
    offsets: list[int] = []
    for i, entry in enumerate(entries):
        where = f"weights[{i}]"
        if not isinstance(entry, dict):
            raise _corrupt(f"index field {where} is not an object")
        name = _field(entry, "name", where, str)
        if not name or name in seen:
            raise _corrupt(f"index field {where}.name is empty or repeats an earlier name")
        seen.add(name)
        known = _DTYPES.get(_field(entry, "dtype", where, str))
        if known is None:
            shown = repr(entry["dtype"])[:40]
            raise _corrupt(f"index field {where}.dtype {shown} is not one it stores")
        dtype = known[0]
        shape = _field(entry, "shape", where, list)
        if not all(type(d) is int and d >= 0 for d in shape):
            raise _corrupt(f"index field {where}.shape is not a list of sizes")
        offset = _count(entry, "offset", where)
        nbytes = _count(entry, "length", where)
        if offset % ALIGN:
            raise _corrupt(f"{where} starts at {offset}, not a multiple of {ALIGN}")
        count = math.prod(shape)
        if nbytes != count * dtype.itemsize:
            raise _corrupt(f"{where} is {nbytes} bytes, its shape and dtype need a different size")
        end = _inside(offset, nbytes, end, size, where)
        array = np.frombuffer(view, dtype, count, offset).reshape(shape)
        if not array.flags.aligned or sys.byteorder != "little":
            array = array.astype(dtype.newbyteorder("="))  # a copy ORT can read natively
        names.append(name)
        arrays.append(array)
        offsets.append(offset)
    graph_view = memoryview(view)[start : start + graph_length]
    return Unpacked(graph_view, names, arrays, offsets, level, features)


def graph_reading(unpacked: Unpacked, location: str, base: int) -> bytes:
    """The graph with each weight stub pointing into the file ``location``.

    Args:
        unpacked: the artifact, validated.
        location: the file's name, relative to the folder ORT is told to read weights from.
        base: where the artifact's first byte lies in that file.

    Raises:
        InvalidContainerError: the graph's external initializers and the index disagree (a
            stub no weight fills, a weight no stub names, or another type or shape).
    """
    try:
        proto = onnx.ModelProto.FromString(unpacked.graph)
    except Exception:  # protobuf's DecodeError, or worse on hostile bytes
        raise _corrupt("its graph is not a valid ONNX model") from None
    stored = {
        name: (offset, array)
        for name, offset, array in zip(
            unpacked.names, unpacked.offsets, unpacked.arrays, strict=True
        )
    }
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        found = stored.pop(init.name, None)
        if found is None:
            raise _corrupt(f"the graph's initializer {init.name!r} has no stored bytes")
        offset, array = found
        if _BY_ONNX.get(init.data_type) != array.dtype.name or list(init.dims) != list(array.shape):
            raise _corrupt(f"the graph's initializer {init.name!r} and its stored bytes differ")
        del init.external_data[:]
        for key, value in (
            ("location", location),
            ("offset", str(base + offset)),
            ("length", str(array.nbytes)),
        ):
            init.external_data.add(key=key, value=value)
    if stored:
        raise _corrupt(f"the stored weight {next(iter(stored))!r} is in no initializer")
    return bytes(proto.SerializeToString())


def _align(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _inside(offset: int, length: int, after: int, size: int, what: str) -> int:
    """The end of ``length`` bytes at ``offset``, checked to lie in ``[after, size]``."""
    if offset < after:
        raise _corrupt(f"{what} at byte {offset} overlaps what precedes it (up to byte {after})")
    if offset + length > size:
        raise _corrupt(f"it is truncated: {what} ends at byte {offset + length} of {size}")
    return offset + length


def _decode(text: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(text.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _corrupt(f"its index is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise _corrupt("its index is not a JSON object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_KINDS = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _field(obj: dict[str, Any], key: str, where: str, kind: type) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        path = f"{where}.{key}" if where else key
        raise _corrupt(f"index field {path} is missing or not {_KINDS[kind]}")
    return value


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where, int)
    if value < 0:
        raise _corrupt(f"index field {where}.{key} is negative")
    return int(value)


def _corrupt(why: str) -> InvalidContainerError:
    return InvalidContainerError(
        f"the onnxruntime artifact is corrupt: {why}; recompile the model with `crossrt compile`",
        details={"driver": "onnxruntime"},
    )
