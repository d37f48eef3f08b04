"""A serialized ONNX model's graph fields, sliced out of its protobuf bytes without parsing
the rest.

Parsing a large model costs about a second per 150 MB, most of it in node attributes (a tree
ensemble's millions of numbers and strings). Some steps need only a graph's value types or
its initializers: :func:`graph_fields` hands back the encoded fields asked for, which parse
into a small ``GraphProto``, each node skipped by its length in one step.

For bytes crossrt or onnx wrote themselves (shape inference's output, ORT's saved model):
a malformed encoding raises ValueError, and callers parse the whole model instead.
"""

from __future__ import annotations

import onnx

_GRAPH = 7  # ModelProto.graph
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

INITIALIZER = 5
INPUT = 11
OUTPUT = 12
VALUE_INFO = 13
"""GraphProto field numbers."""


def graph_fields(data: bytes | memoryview, numbers: frozenset[int]) -> onnx.GraphProto:
    """The main graph of the serialized ModelProto ``data`` holding only the fields
    ``numbers`` (GraphProto field numbers: :data:`INITIALIZER`, :data:`VALUE_INFO`...).

    Raises:
        ValueError: ``data`` is not a well-formed encoding.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    graphs = [view[body:end] for number, _, body, end in _fields(view) if number == _GRAPH]
    kept: list[memoryview] = []
    for graph in graphs:  # a message field given twice is merged, as a parser would
        kept += [graph[start:end] for number, start, _, end in _fields(graph) if number in numbers]
    slim = onnx.GraphProto()
    try:
        slim.ParseFromString(b"".join(kept))
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"malformed graph field: {exc}") from None
    return slim


def graph_bytes(data: bytes | memoryview) -> memoryview | None:
    """The encoded main graph of the serialized ModelProto ``data`` (what
    ``proto.graph.SerializeToString()`` gives), or ``None`` when it is not one field.

    Raises:
        ValueError: ``data`` is not a well-formed encoding.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    graphs = [view[body:end] for number, _, body, end in _fields(view) if number == _GRAPH]
    return graphs[0] if len(graphs) == 1 else None


def _fields(view: memoryview) -> list[tuple[int, int, int, int]]:
    """Each field of the message ``view``: (number, start, body, end): the whole encoded
    field (tag included) is ``start:end``, a length-delimited one's payload ``body:end``."""
    found = []
    at, size = 0, len(view)
    while at < size:
        start = at
        key, at = _varint(view, at)
        body = at
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            _, at = _varint(view, at)
        elif kind == _FIXED64:
            at += 8
        elif kind == _FIXED32:
            at += 4
        elif kind == _LENGTH:
            length, at = _varint(view, at)
            body = at
            at += length
        else:
            raise ValueError(f"unsupported wire type {kind} at byte {start}")
        if at > size or number == 0:
            raise ValueError(f"truncated or malformed field at byte {start}")
        found.append((number, start, body, at))
    return found


def _varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise ValueError(f"malformed varint at byte {at}")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
