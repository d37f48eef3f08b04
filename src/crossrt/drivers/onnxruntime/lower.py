"""Models newer than this ONNX Runtime reads, lowered when nothing in them is new to it.

The ``onnx`` package writes models at its newest IR version and opset (onnx 1.23: IR 14,
opset 28), and ORT refuses any model above its own (ORT 1.31: IR 13, opset 26), even when
every operator in it is one ORT has known for years. An opset number only selects, for each
operator, the newest schema introduced at or before it: when every node's schema at the
model's opset was introduced at or before ORT's newest opset, the model means exactly the same
at that opset. An IR version adds element types (IR 14: FLOAT6E2M3, FLOAT6E3M2) and opaque
types: a model that uses none of what came after ORT's IR version is the same model at it.
Such a model is handed to ORT with its ai.onnx opset and IR version lowered; anything else
keeps the reason ORT cannot read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import onnx

# The newest element type each IR version defines (onnx.proto's IR_VERSION history).
_NEWEST_TYPE = {
    9: onnx.TensorProto.FLOAT8E5M2FNUZ,
    10: onnx.TensorProto.INT4,
    11: onnx.TensorProto.FLOAT4E2M1,
    12: onnx.TensorProto.FLOAT8E8M0,
    13: onnx.TensorProto.INT2,
}


def node_blocker(
    node: onnx.NodeProto,
    opset: int,
    max_opset: int,
    newest_type: int | None,
    types: Mapping[str, onnx.TypeProto],
) -> str | None:
    """Why ``node`` (and the subgraphs it holds) cannot be lowered to ``max_opset`` and to the
    IR version whose newest element type is ``newest_type`` (``None``: no IR lowering), or
    ``None`` when it can."""
    changed = changed_operator(_nodes_within(node), opset, max_opset)
    if changed is not None:
        return f"{changed} is newer than the newest opset it reads ({max_opset})"
    if newest_type is not None:
        for name in (*node.input, *node.output):
            elem = types[name].tensor_type.elem_type if name in types else 0
            if elem > newest_type:
                kind = onnx.TensorProto.DataType.Name(elem).lower()
                return f"tensor {name!r} is {kind}, a type newer than the IR version it reads"
    return None


def changed_operator(nodes: Iterable[onnx.NodeProto], opset: int, other: int) -> str | None:
    """The first ai.onnx operator of ``nodes`` whose schema differs between ``opset`` and
    ``other`` (``"Cast-28"``: as at ``opset``), or ``None`` when each means the same at both.
    An operator unknown to onnx counts as unchanged: the engine's own check names it."""
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            since = onnx.defs.get_schema(node.op_type, opset, "").since_version
            if since != onnx.defs.get_schema(node.op_type, other, "").since_version:
                return f"{node.op_type}-{since}"
        except onnx.defs.SchemaError:
            continue
    return None


def newest_type(max_ir: int) -> int | None:
    """The newest element type an engine reading IR ``max_ir`` knows; ``None``: unknown IR."""
    return _NEWEST_TYPE.get(max_ir)


def lowered(proto: onnx.ModelProto, max_ir: int, max_opset: int) -> onnx.ModelProto:
    """A copy of ``proto`` at IR ``max_ir`` and ai.onnx opset ``max_opset`` (at most), for a
    model whose nodes all pass :func:`node_blocker`."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.ir_version = min(model.ir_version, max_ir)
    for imports in (model.opset_import, *(f.opset_import for f in model.functions)):
        for entry in imports:
            if entry.domain in ("", "ai.onnx") and entry.version > max_opset:
                entry.version = max_opset
    return model


def _nodes_within(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    """``node`` and every node of the subgraphs it holds (If, Loop, Scan bodies)."""
    yield node
    for attr in node.attribute:
        for graph in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            for inner in graph.node:
                yield from _nodes_within(inner)
