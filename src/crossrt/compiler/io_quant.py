"""The quantization of a model's inputs and outputs, read from its QDQ form.

An input that only ``DequantizeLinear`` nodes read, all with the same constant scalar scale
and zero point, holds ``q = x / scale + zero_point``; so does an output that a
``QuantizeLinear`` with a constant scalar scale writes (through ``Identity`` nodes). The
compiler keeps what it finds in the executable's metadata under :data:`KEY`, so a program
reading a ``.crm`` learns it without the source model (BMRuntime's ``input_scales`` /
``input_zero_point``). Per-channel parameters describe no single scale and are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnx import NodeProto, numpy_helper

from ..model import Model

__all__ = ["KEY", "io_quantization", "read_io_quantization"]

KEY = "crossrt.io_quantization"
"""Metadata key: JSON ``{"inputs": {name: [scale, zero_point]}, "outputs": {...}}``."""


def _constants(model: Model) -> dict[str, Any]:
    graph = model.proto.graph
    found: dict[str, Any] = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = node.attribute[0].t
    return found


def _scalar(constants: dict[str, Any], name: str, default: float | None) -> float | None:
    if not name:
        return default
    tensor = constants.get(name)
    if tensor is None:
        return None
    try:
        value = numpy_helper.to_array(tensor)
    except Exception:  # weights kept outside the graph: nothing to read here
        return None
    return float(value.reshape(-1)[0]) if np.size(value) == 1 else None


def _params(constants: dict[str, Any], node: NodeProto) -> tuple[float, int] | None:
    scale = _scalar(constants, node.input[1], None)
    zero = _scalar(constants, node.input[2] if len(node.input) > 2 else "", 0.0)
    return None if scale is None or zero is None else (scale, int(zero))


def io_quantization(model: Model) -> dict[str, str]:
    """``{KEY: json}`` when an input or output of ``model`` is quantized, else ``{}``."""
    graph = model.proto.graph
    constants = _constants(model)
    readers: dict[str, list[NodeProto]] = {}
    writer: dict[str, NodeProto] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
        for name in node.output:
            writer[name] = node
    inputs: dict[str, list[float | int]] = {}
    for value in graph.input:
        nodes = readers.get(value.name, [])
        found = {
            _params(constants, n)
            if n.op_type == "DequantizeLinear" and n.input[0] == value.name
            # any other reader sees the stored integers: no single meaning
            else None
            for n in nodes
        }
        if len(found) == 1 and (params := found.pop()) is not None:
            inputs[value.name] = list(params)
    outputs: dict[str, list[float | int]] = {}
    for value in graph.output:
        node = writer.get(value.name)
        while node is not None and node.op_type == "Identity":
            node = writer.get(node.input[0])
        if node is not None and node.op_type == "QuantizeLinear":
            params = _params(constants, node)
            if params is not None:
                outputs[value.name] = list(params)
    if not inputs and not outputs:
        return {}
    return {KEY: json.dumps({"inputs": inputs, "outputs": outputs}, sort_keys=True)}


def read_io_quantization(
    metadata: Mapping[str, str],
) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]]]:
    """The ``(inputs, outputs)`` scales and zero points :func:`io_quantization` recorded
    (empty for an executable without, or with a malformed entry)."""
    try:
        raw = json.loads(metadata.get(KEY, "{}"))
        return tuple(  # type: ignore[return-value]
            {str(k): (float(v[0]), int(v[1])) for k, v in dict(raw.get(side, {})).items()}
            for side in ("inputs", "outputs")
        )
    except (ValueError, TypeError, IndexError, AttributeError):
        return {}, {}
