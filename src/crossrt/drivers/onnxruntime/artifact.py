"""The onnxruntime driver's artifact: ORT's optimized graph with its large weights beside it.

Layout (all integers little-endian, every offset from the artifact's first byte)::

    magic "CRORTART" | version u32 | reserved u32 (zero) | index length N u64
    | JSON index (N bytes) | zero padding | ONNX graph | weights, each at a multiple of 64,
    each followed by its pre-packed buffers, each at a multiple of 4096

The index is ``{"target": {"level", "features"}, "graph": {"offset", "length"}, "weights":
[{"name", "dtype", "shape", "offset", "length", "prepacked"?}, ...]}``, ``prepacked`` being
``[{"key", "buffers": [{"offset", "length"}, ...]}, ...]``: the forms ORT's kernels packed the
weight into. The graph is ORT's optimized model
in which every initializer of :data:`THRESHOLD` bytes or more is a stub marked as external
data; its bytes follow as raw little-endian tensors, in index order. ``target.level`` says how
far ORT optimized the graph: ``"all"`` includes layouts tied to the CPU's vector extensions
(ORT's NCHWc blocks), so such an artifact loads only on a CPU with ``target.features`` (the
compiling host's architecture and extensions) and is loaded without optimizing again;
``"extended"`` is portable across CPUs, and ORT applies the rest at load; ``"basic"`` (a GPU's)
holds no fusion made for ORT's CPU kernels, and the session's providers make their own at
load. Nothing in the index is
trusted: every field, offset and length is checked before a view is made.

Loading parses only the small graph. When the artifact lies in a file, the stubs are pointed
at the file and ORT maps the weights itself (:func:`graph_reading`), shared between sessions
and processes through the page cache; otherwise each weight becomes a NumPy view of the
artifact that ORT takes as an external initializer (and copies). ORT 1.32 maps a pre-packed
buffer only at a file offset that is a multiple of 256 (it copies it into each session
otherwise, silently): the buffers start at pages, and the container starts every section at
a page. Artifacts written with the buffers at multiples of 64 still load, unshared.

Only this version loads: version 1 (before ``target``) and the plain ONNX bytes crossrt
wrote before this format are refused, with a message to compile again.

The graph names no file (:func:`parse_graph`): its only tensors marked as external data are
the stubs of its stored weights, exactly as :func:`pack` writes them, and the driver says
where their bytes are. Any other tensor marked so (an initializer without stored bytes, a
sparse initializer, ``Constant(value=...)`` or ``Constant(sparse_value=...)``, in the main
graph, a subgraph or a function) would make ORT read the file it names beside the ``.crm`` or
in the working directory: the artifact is refused before ORT sees it, and ORT is handed the
graph as checked (unknown protobuf fields dropped), never the artifact's own bytes.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...dtypes import TABLE
from ...errors import InvalidContainerError, StatusCode, UnsupportedError
from ...model import tensors, wire

MAGIC = b"CRORTART"
VERSION = 2
THRESHOLD = 1024
"""Initializers of this many bytes or more are stored outside the graph."""

ALIGN = 64
PAGE = 4096
"""Pre-packed buffers start at a multiple of this (see the module docstring): any alignment
ORT asks of their file offsets up to a page, wherever a page-aligned artifact lies."""
PREPACKED_FILE_ALIGN = 256
"""ORT maps a pre-packed buffer at a file offset that is a multiple of this, else copies it."""
LEVELS = ("all", "extended", "basic")
"""How far ORT optimized the graph; see the module docstring."""
_PRELUDE = struct.Struct("<8sIIQ")
_LOCATION = "crossrt-artifact"  # never opened: ORT receives these tensors in memory

# The element types ORT can take from NumPy in place: NumPy's own numbers and bool. Others
# (strings, complex, bfloat16, float8, int4...) stay inside the graph.
_DTYPES = {
    d.numpy.name: (d.numpy.newbyteorder("<"), d.onnx)
    for d in TABLE
    if d.native and d.numpy.kind in "biuf"
}
_BY_ONNX: dict[int, str] = {onnx_type: name for name, (_, onnx_type) in _DTYPES.items()}


@dataclass(frozen=True)
class Unpacked:
    """A validated artifact.

    Attributes:
        graph: the ONNX graph's bytes, its large initializers stubs (a view, not a copy).
        names: the external initializers' names.
        arrays: their values, NumPy views of the artifact (read-only when it is), in
            ``names`` order.
        offsets: where each lies in the artifact, in ``names`` order.
        prepacked: per weight, in ``names`` order: the forms ORT's kernels pre-packed it into,
            as ``(key, [(offset, length), ...])`` in the artifact (read from a file only).
        level: ``"all"`` (optimized for CPUs with ``features`` only), ``"extended"`` or
            ``"basic"`` (see the module docstring).
        features: for ``"all"``: the compiling host's architecture and vector extensions.
    """

    graph: memoryview
    names: list[str]
    arrays: list[np.ndarray]
    offsets: list[int]
    prepacked: list[list[tuple[str, list[tuple[int, int]]]]] = field(default_factory=list)
    level: str = "extended"
    features: tuple[str, ...] = ()

    @property
    def stored_bytes(self) -> int:
        """The bytes of the graph and its weights (not counting their pre-packed forms)."""
        return len(self.graph) + sum(a.nbytes for a in self.arrays)


def numpy_dtype(onnx_type: int) -> np.dtype[Any] | None:
    """The NumPy dtype ORT exchanges in place for an ONNX element type, or ``None``."""
    name = _BY_ONNX.get(onnx_type)
    return None if name is None else _DTYPES[name][0]


def pack(
    model: bytes | memoryview,
    threshold: int = THRESHOLD,
    *,
    data: bytes | memoryview | None = None,
    level: str = "extended",
    features: tuple[str, ...] = (),
) -> bytes:
    """The artifact for ``model``, ORT's optimized ONNX model (its serialized bytes).

    Every initializer of the main graph of ``threshold`` bytes or more whose type NumPy and
    ORT exchange in place is moved out of the graph; the rest of the model is unchanged.
    ``data`` is the external initializers file ORT wrote beside the model, if it wrote one:
    the initializers it holds are moved too, with the weights ORT pre-packed for its kernels
    (``prepacked_N`` entries, ORT's ``key|offset;length;checksum|...``), and the others are
    put back into the graph. ``level`` and ``features`` record how far ORT optimized the
    model and, for ``"all"``, on which CPU (see the module docstring).
    """
    if data is None and _nothing_moves(model, threshold):
        # ORT's bytes as they are: parsing and serializing them again to change nothing cost
        # 1.1 s of a 160 MB tree ensemble (its bulk in node attributes, no weight to move).
        graph: bytes | memoryview = model
        entries: list[dict[str, Any]] = []
        parts: list[list[bytes | memoryview]] = []
    else:
        graph, entries, parts = _moved(model, threshold, data)
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
        for entry, blobs in zip(entries, parts, strict=True):
            places = [entry] + [b for p in entry.get("prepacked", []) for b in p["buffers"]]
            for k, (place, blob) in enumerate(zip(places, blobs, strict=True)):
                place["offset"] = _align(end, PAGE if k else ALIGN)
                place["length"] = len(blob)
                end = place["offset"] + len(blob)
        text = json.dumps(index, separators=(",", ":")).encode()
        if _align(_PRELUDE.size + len(text)) <= start:
            break
        start = _align(_PRELUDE.size + len(text))
    chunks: list[bytes | memoryview] = [_PRELUDE.pack(MAGIC, VERSION, 0, len(text)), text]
    at = _PRELUDE.size + len(text)
    placed: list[tuple[int, bytes | memoryview]] = [(start, graph)]
    for entry, blobs in zip(entries, parts, strict=True):
        places = [entry] + [b for p in entry.get("prepacked", []) for b in p["buffers"]]
        placed += [(place["offset"], blob) for place, blob in zip(places, blobs, strict=True)]
    for offset, blob in placed:
        chunks += [bytes(offset - at), blob]
        at = offset + len(blob)
    return b"".join(chunks)


def _nothing_moves(model: bytes | memoryview, threshold: int) -> bool:
    """Whether no initializer of ``model``'s main graph moves out of it and none names a
    file (read from its initializers alone, not its nodes)."""
    try:
        found = wire.graph_fields(model, frozenset({wire.INITIALIZER}))
    except ValueError:
        return False
    return all(
        init.data_location != onnx.TensorProto.EXTERNAL and _embedded(init, threshold) is None
        for init in found.initializer
    )


def _moved(
    model: bytes | memoryview, threshold: int, data: bytes | memoryview | None
) -> tuple[bytes, list[dict[str, Any]], list[list[bytes | memoryview]]]:
    """``model``'s graph with its large weights moved out: the graph's bytes, and per weight
    its index entry and its bytes followed by its pre-packed buffers'."""
    proto = onnx.ModelProto.FromString(model)
    parts: list[list[bytes | memoryview]] = []  # per weight: its bytes, then its packs'
    entries: list[dict[str, Any]] = []
    for init in proto.graph.initializer:
        blob: bytes | memoryview
        packs: list[tuple[str, list[memoryview]]] = []
        if init.data_location == onnx.TensorProto.EXTERNAL:
            if data is None:
                continue
            blob, packs = _external(init, memoryview(data))
            if init.data_type not in _BY_ONNX or len(blob) < threshold:
                _embed(init, blob)  # a type NumPy cannot view, or small: back into the graph
                continue
        else:
            found = _embedded(init, threshold)
            if found is None:
                continue
            blob = found
        dtype_name = _BY_ONNX[init.data_type]
        stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in _stub_entries(len(blob)):
            stub.external_data.add(key=key, value=value)
        init.CopyFrom(stub)
        parts.append([blob, *(b for _, buffers in packs for b in buffers)])
        entry: dict[str, Any] = {"name": stub.name, "dtype": dtype_name, "shape": list(stub.dims)}
        if packs:
            entry["prepacked"] = [
                {"key": key, "buffers": [{} for _ in buffers]} for key, buffers in packs
            ]
        entries.append(entry)
    if data is not None:  # tensors of subgraphs and attributes ORT also wrote out: back in
        for nested in list(tensors.files_named(proto)):
            if not nested.main_initializer:
                _embed(nested.tensor, _external(nested.tensor, memoryview(data))[0])
    return bytes(proto.SerializeToString()), entries, parts


def _embedded(init: onnx.TensorProto, threshold: int) -> bytes | None:
    """The little-endian bytes of an initializer stored in the graph, when it moves out."""
    dtype_name = _BY_ONNX.get(init.data_type)
    if dtype_name is None:
        return None
    dtype = _DTYPES[dtype_name][0]
    nbytes = math.prod(init.dims) * dtype.itemsize
    if nbytes < threshold:
        return None
    if len(init.raw_data) == nbytes:
        return bytes(init.raw_data)  # ONNX raw data is little-endian, as the artifact stores it
    try:  # the typed fields (float_data...)
        blob = bytes(numpy_helper.to_array(init).astype(dtype, copy=False).tobytes())
    except (ValueError, TypeError):
        return None  # inconsistent with its dims: left in the graph for ORT to judge
    return blob if len(blob) == nbytes else None


def _external(
    init: onnx.TensorProto, data: memoryview
) -> tuple[memoryview, list[tuple[str, list[memoryview]]]]:
    """An initializer ORT wrote to its data file: its bytes and its pre-packed buffers."""
    fields = {e.key: e.value for e in init.external_data}
    offset, length = int(fields.get("offset", "0")), int(fields["length"])
    packs = []
    for key, value in fields.items():
        if key.startswith("prepacked_"):
            name, *buffers = value.split("|")
            spans = [tuple(int(n) for n in b.split(";")[:2]) for b in buffers]
            packs.append((name, [data[o : o + n] for o, n in spans]))
    return data[offset : offset + length], packs


def _embed(init: onnx.TensorProto, blob: memoryview) -> None:
    del init.external_data[:]
    init.data_location = onnx.TensorProto.DEFAULT
    init.raw_data = bytes(blob)


def unpack(artifact: bytes | memoryview) -> Unpacked:
    """Validate an artifact and view its parts in place.

    Raises:
        InvalidContainerError: the artifact is not in this format, is truncated, or its index
            is malformed or inconsistent (an offset or a length outside the artifact,
            overlapping weights...).
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) another version of this format.
    """
    view = memoryview(artifact).cast("B") if not isinstance(artifact, bytes) else artifact
    size = len(view)
    if size < _PRELUDE.size:
        raise _corrupt(f"it is truncated: {size} bytes, less than its {_PRELUDE.size}-byte prelude")
    magic, version, reserved, length = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise _corrupt(
            f"it does not start with {MAGIC!r} (a plain ONNX model, as crossrt wrote before "
            "it packed artifacts, or another driver's artifact)"
        )
    if version < 1 or reserved:
        raise _corrupt(f"its prelude is damaged (version {version}, reserved {reserved})")
    if version != VERSION:
        newer = version > VERSION
        raise UnsupportedError(
            f"the onnxruntime artifact is version {version}; this crossrt reads version "
            f"{VERSION} only; "
            + ("upgrade crossrt, or " if newer else "")
            + "recompile the model with `crossrt compile`",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"artifact_version": version, "supported": VERSION},
        )
    if length > size - _PRELUDE.size:
        raise _corrupt(
            f"it is truncated: its index needs {length} bytes, {size - _PRELUDE.size} follow"
        )
    index = _decode(bytes(view[_PRELUDE.size : _PRELUDE.size + length]))
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
    prepacked: list[list[tuple[str, list[tuple[int, int]]]]] = []
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
        packs, end = _packs(entry, where, end, size)
        array = np.frombuffer(view, dtype, count, offset).reshape(shape)
        if not array.flags.aligned or sys.byteorder != "little":
            array = array.astype(dtype.newbyteorder("="))  # a copy ORT can read natively
        names.append(name)
        arrays.append(array)
        offsets.append(offset)
        prepacked.append(packs)
    graph_view = memoryview(view)[start : start + graph_length]
    return Unpacked(graph_view, names, arrays, offsets, prepacked, level, features)


def _packs(
    entry: dict[str, Any], where: str, end: int, size: int
) -> tuple[list[tuple[str, list[tuple[int, int]]]], int]:
    """A weight's pre-packed forms, checked to follow it in order; and where they end."""
    packs: list[tuple[str, list[tuple[int, int]]]] = []
    for j, pack in enumerate(
        _field(entry, "prepacked", where, list) if "prepacked" in entry else []
    ):
        at = f"{where}.prepacked[{j}]"
        if not isinstance(pack, dict):
            raise _corrupt(f"index field {at} is not an object")
        key = _field(pack, "key", at, str)
        if not key or "|" in key or ";" in key:  # ORT's separators: the key is written as is
            raise _corrupt(f"index field {at}.key is empty or holds '|' or ';'")
        buffers = _field(pack, "buffers", at, list)
        if not buffers or not all(isinstance(b, dict) for b in buffers):
            raise _corrupt(f"index field {at}.buffers is not a non-empty list of objects")
        spans = []
        for k, buffer in enumerate(buffers):
            offset = _count(buffer, "offset", f"{at}.buffers[{k}]")
            length = _count(buffer, "length", f"{at}.buffers[{k}]")
            if offset % ALIGN:
                raise _corrupt(f"{at}.buffers[{k}] starts at {offset}, not a multiple of {ALIGN}")
            end = _inside(offset, length, end, size, f"{at}.buffers[{k}]")
            spans.append((offset, length))
        packs.append((key, spans))
    return packs, end


def parse_graph(unpacked: Unpacked) -> onnx.ModelProto:
    """The artifact's graph, checked to name no file (see the module docstring).

    Each tensor marked as external data must be a main-graph initializer whose stub is as
    :func:`pack` writes it and whose bytes the artifact stores, of the same type and shape;
    each stored weight must have its stub. Unknown protobuf fields are dropped, so that what
    the checks saw is all ORT gets when handed the graph serialized again.

    Raises:
        InvalidContainerError: the graph cannot be parsed, or it and the index disagree (a
            stub no weight fills, a weight no stub names, or another type or shape), or a
            tensor inside the graph names a file.
    """
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(unpacked.graph)
    except Exception:  # protobuf's DecodeError, or worse on hostile bytes
        raise _corrupt("its graph is not a valid ONNX model") from None
    proto.DiscardUnknownFields()
    stored = dict(zip(unpacked.names, unpacked.arrays, strict=True))
    for found in tensors.files_named(proto):
        tensor = found.tensor
        file = f"the file {tensors.location(tensor)[:100]!r}"
        if not found.main_initializer:
            raise _corrupt(f"tensor {tensor.name!r} ({found.where}) refers to {file}")
        array = stored.pop(tensor.name, None)
        if array is None:
            raise _corrupt(
                f"the graph's initializer {tensor.name!r} refers to {file} and has no stored bytes"
            )
        if _BY_ONNX.get(tensor.data_type) != array.dtype.name or list(tensor.dims) != list(
            array.shape
        ):
            raise _corrupt(f"the graph's initializer {tensor.name!r} and its stored bytes differ")
        if [(e.key, e.value) for e in tensor.external_data] != _stub_entries(array.nbytes):
            raise _corrupt(
                f"the graph's initializer {tensor.name!r} refers to {file}, not to its stored bytes"
            )
    if stored:
        raise _corrupt(f"the stored weight {next(iter(stored))!r} is in no initializer")
    return proto


def graph_in_memory(unpacked: Unpacked) -> bytes:
    """The graph to hand ORT with the weights given beside it (``add_external_initializers``),
    checked (:func:`parse_graph`).

    Raises:
        InvalidContainerError: as :func:`parse_graph`.
    """
    return bytes(parse_graph(unpacked).SerializeToString())


def graph_reading(unpacked: Unpacked, location: str, base: int) -> bytes:
    """The graph with each weight stub pointing into the file ``location``, checked
    (:func:`parse_graph`).

    Args:
        unpacked: the artifact, validated.
        location: the file's name, relative to the folder ORT is told to read weights from.
        base: where the artifact's first byte lies in that file.

    Raises:
        InvalidContainerError: as :func:`parse_graph`.
    """
    proto = parse_graph(unpacked)
    packs = unpacked.prepacked or [[] for _ in unpacked.names]
    stored = {
        name: (offset, array, pre)
        for name, offset, array, pre in zip(
            unpacked.names, unpacked.offsets, unpacked.arrays, packs, strict=True
        )
    }
    for init in proto.graph.initializer:
        if not tensors.names_a_file(init):
            continue
        offset, array, pre = stored[init.name]  # parse_graph matched each stub to its weight
        del init.external_data[:]
        entries = [
            ("location", location),
            ("offset", str(base + offset)),
            ("length", str(array.nbytes)),
        ]
        for j, (key, spans) in enumerate(pre):  # ORT's format: key|offset;length;checksum|...
            text = "|".join(f"{base + o};{n};0" for o, n in spans)
            entries.append((f"prepacked_{j}", f"{key}|{text}"))
        for key, value in entries:
            init.external_data.add(key=key, value=value)
    return bytes(proto.SerializeToString())


def _stub_entries(nbytes: int) -> list[tuple[str, str]]:
    """The external data entries of a weight's stub, as :func:`pack` writes them."""
    return [("location", _LOCATION), ("offset", "0"), ("length", str(nbytes))]


def _align(offset: int, to: int = ALIGN) -> int:
    return -(-offset // to) * to


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
