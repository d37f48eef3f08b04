"""A model's skeleton: its graph without the bytes of its large weights.

Validating a model (the ONNX checker, shape inference) and hashing its structure serialize
it, and for a model with hundreds of megabytes of weights each pass costs seconds (BERT-base:
about 1 s per serialization, 5 s for shape inference). None of them needs the weights' bytes,
only their names, types and shapes: the skeleton keeps every main-graph initializer of
:data:`STUB_BYTES` or more stored as ``raw_data`` as a stub marked as external data, which
shape inference types from its dims without reading anything. What the checker would have
verified of the bytes removed (that they fit the shape and type) is checked here instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import onnx

from ..dtypes import TABLE

STUB_BYTES = 1024
"""Initializers whose ``raw_data`` is this long or longer become stubs."""

_LOCATION = "crossrt-skeleton"  # never read: shape inference takes types from the stub
# Element types whose raw data is whole bytes per element (not strings, not int4 or int2,
# which ONNX packs several to a byte).
_ITEMSIZE = {d.onnx: d.bits // 8 for d in TABLE if d.bits and d.bits % 8 == 0}


@dataclass(frozen=True)
class Skeleton:
    """A model's skeleton: read it, never change it.

    Attributes:
        proto: a copy of the model whose large main-graph initializers are stubs; the
            model's own proto when it has none.
        stubbed: the indices, in ``graph.initializer``, of the initializers made stubs.
    """

    proto: onnx.ModelProto
    stubbed: tuple[int, ...]


def skeleton(proto: onnx.ModelProto) -> Skeleton:
    """The skeleton of ``proto`` (which is not changed). A model without a weight to stub is
    its own skeleton, not a copy: a tree ensemble's bulk is in node attributes, which a copy
    would duplicate (0.6 s and as much memory again for 160 MB)."""
    stubbed = tuple(
        index
        for index, init in enumerate(proto.graph.initializer)
        if init.data_location != onnx.TensorProto.EXTERNAL
        and init.data_type in _ITEMSIZE
        and len(init.raw_data) >= STUB_BYTES
    )
    if not stubbed:
        return Skeleton(proto, ())
    # Built field by field, the stubs without their bytes: a copy of the whole model and then
    # clearing them would copy every weight first (0.2 s of 190 MB).
    light = onnx.ModelProto()
    _copy_except(proto, light, "graph")
    _copy_except(proto.graph, light.graph, "initializer")
    stubs = set(stubbed)
    for index, init in enumerate(proto.graph.initializer):
        copied = light.graph.initializer.add()
        if index not in stubs:
            copied.CopyFrom(init)
            continue
        _copy_except(init, copied, "raw_data")
        copied.data_location = onnx.TensorProto.EXTERNAL
        copied.external_data.add(key="location", value=_LOCATION)
    return Skeleton(light, stubbed)


def _copy_except(source: Any, target: Any, skipped: str) -> None:
    """Copy every field of the message ``source`` into ``target`` but ``skipped``, which is
    not even read (protobuf hands a bytes field over as a copy)."""
    for field in source.DESCRIPTOR.fields:
        name = field.name
        if name == skipped:
            continue
        if field.is_repeated:
            if len(getattr(source, name)):
                getattr(target, name).extend(getattr(source, name))
        elif source.HasField(name):
            if field.message_type is not None:
                getattr(target, name).CopyFrom(getattr(source, name))
            else:
                setattr(target, name, getattr(source, name))


def misfit_weights(proto: onnx.ModelProto, stubbed: tuple[int, ...]) -> str | None:
    """Why a stubbed initializer's bytes do not fit its shape and type, or ``None``."""
    for index in stubbed:
        init = proto.graph.initializer[index]
        if any(d < 0 for d in init.dims):
            return f"initializer {init.name!r} has a negative dimension {list(init.dims)}"
        need = math.prod(init.dims) * _ITEMSIZE[init.data_type]
        have = len(init.raw_data)
        if have != need:
            return (
                f"initializer {init.name!r} holds {have} bytes, but its shape "
                f"{list(init.dims)} and type need {need}"
            )
    return None


def checkable(light: Skeleton) -> onnx.ModelProto:
    """The skeleton as the ONNX checker can take it: the stubs (whose data the checker would
    look for in a file) become graph inputs of the same type and shape. Without stubs, the
    skeleton itself (the checker only reads it)."""
    if not light.stubbed:
        return light.proto
    model = onnx.ModelProto()
    model.CopyFrom(light.proto)  # small: the stubs hold no data
    graph = model.graph
    inputs = {i.name for i in graph.input}
    for index in sorted(light.stubbed, reverse=True):
        init = graph.initializer[index]
        if init.name not in inputs:
            info = onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims)
            graph.input.append(info)
        del graph.initializer[index]
    return model
