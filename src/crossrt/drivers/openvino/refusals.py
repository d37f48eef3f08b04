"""Which nodes the openvino driver refuses though OpenVINO may convert them: element types it
has no tensors for, and the nodes whose results differ from ONNX's definition (found by the
ONNX node suite, tests/conformance). Refused, a node runs where the results are ONNX's when the
compile allows fallback, and never silently differs. Where a small rewrite gives ONNX's
results instead (:func:`exact_infinities`), the node is rewritten, not refused."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from ...model import Model

# Element types OpenVINO has no tensors for (or none its Python binding exchanges), by ONNX
# number: a node reading or writing one is refused. BFLOAT16: the CPU plugin compiles some
# bf16 graphs it accepted (ReduceMax) with an error; bf16 is its precision= choice instead.
# DOUBLE: the CPU plugin computes float64 in float32 (a silent change of precision, and
# overflow to inf where float64 holds the value). FLOAT8E4M3FN/E5M2: its casts saturate and
# round differently from ONNX's.
_TP = onnx.TensorProto
_NO_TYPE = {
    getattr(_TP, name): name
    for name in (
        "STRING", "BFLOAT16", "DOUBLE", "FLOAT8E4M3FN", "FLOAT8E5M2", "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1", "INT4", "UINT4", "INT2", "UINT2",
        "COMPLEX64", "COMPLEX128",
    )
    if hasattr(_TP, name)
}  # fmt: skip


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


# Nodes OpenVINO converts and runs, but whose results differ from ONNX's definition (found by
# the ONNX node suite, tests/conformance): refused, so that with fallback they run where the
# results are ONNX's, and never silently differ. Each rule gives the reason, or None.
_DIFFERS: dict[str, Any] = {
    "TopK": lambda n: "OpenVINO orders equal values differently from ONNX (lower index first)",
    "LSTM": lambda n: (
        "OpenVINO's LSTM has no peephole connections" if len(n.input) > 7 and n.input[7] else None
    ),
    "BitShift": lambda n: "OpenVINO shifts by the type's width or more differently from ONNX",
    "Attention": lambda n: "OpenVINO's Attention differs from ONNX's on masks and windows",
    "RotaryEmbedding": lambda n: "OpenVINO's RotaryEmbedding differs from ONNX's",
    "DynamicQuantizeLinear": lambda n: "OpenVINO rounds the zero point differently from ONNX",
    "Resize": lambda n: (
        "OpenVINO's Resize differs from ONNX's with antialias, exclude_outside or "
        "keep_aspect_ratio_policy"
        if _attr(n, "antialias", 0)
        or _attr(n, "exclude_outside", 0)
        or _attr(n, "keep_aspect_ratio_policy", "stretch") != "stretch"
        else None
    ),
    "RoiAlign": lambda n: (
        "OpenVINO's RoiAlign max mode differs from ONNX's" if _attr(n, "mode") == "max" else None
    ),
    "SpaceToDepth": lambda n: (
        "OpenVINO's SpaceToDepth CRD mode differs from ONNX's"
        if _attr(n, "mode") == "CRD"
        else None
    ),
}


def _refused(
    node: onnx.NodeProto, types: dict[str, onnx.TypeProto], apart: bool = True
) -> str | None:
    """Why OpenVINO must not take ``node`` though it may convert it, or ``None``; ``apart``:
    the node may be placed apart from the producers of its inputs."""
    for name in (*node.input, *node.output):
        t = types.get(name)
        elem = t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else 0
        if elem in _NO_TYPE:
            return f"OpenVINO takes no {_NO_TYPE[elem]} tensors ({node.op_type} {name!r})"
        if apart and name in node.input and elem and not t.tensor_type.HasField("shape"):  # type: ignore[union-attr]
            # Placed apart from its producer, the value would be an input of unknown rank,
            # which OpenVINO's CPU plugin refuses at compile time.
            return f"OpenVINO needs the rank of {node.op_type}'s input {name!r}, unknown here"
    out = types.get(node.output[0]) if node.output else None
    if (
        node.op_type == "QuantizeLinear"
        and out is not None
        and out.tensor_type.elem_type in (_TP.UINT16, _TP.INT16)
    ):
        return "OpenVINO rounds 16-bit quantization differently from ONNX"
    rule = _DIFFERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    return rule(node) if rule is not None else None


def refusals(model: Model, whole: bool = False) -> list[str | None]:
    """Per node of ``model``: why OpenVINO must not take it, or ``None``.

    ``whole``: the reasons when OpenVINO takes the whole model, every value then produced
    inside it; a rank that ONNX's shape inference leaves unknown does not matter there, as
    OpenVINO infers its own shapes (rapidocr's recognizer has such values)."""
    types = model.value_types()
    constants = _constants(model)
    found = []
    for node in model.nodes:
        why = _refused(node, types, apart=not whole)
        if why is None and node.domain in ("", "ai.onnx"):
            why = _in_context(node, types, constants)
        found.append(why)
    return found


_OTHER_END = {"ReduceMax": ("ReduceMin", 0), "ReduceMin": ("ReduceMax", 1)}


def exact_infinities(model: Model) -> bytes:
    """The model as OpenVINO gets it (serialized): each ReduceMax (ReduceMin) whose input may
    hold an infinity rewritten to give -inf (+inf) where the whole slice is -inf (+inf).

    OpenVINO's ReduceMax starts from the lowest finite float, so a slice of -inf alone (an
    attention row masked entirely) gives -3.4e38: the rewrite takes, there, the ReduceMin of
    the slice, which is -inf. The extra nodes run only on such inputs.
    """
    infinite = _may_hold_infinity(model, _constants(model))
    targets = {
        i
        for i, n in enumerate(model.nodes)
        if n.op_type in _OTHER_END
        and n.domain in ("", "ai.onnx")
        and n.input
        and n.input[0] in infinite
        and n.output
    }
    if not targets:
        return model.to_bytes()
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(model.proto.graph.node):
        if i not in targets:
            nodes.append(node)
            continue
        other, positive = _OTHER_END[node.op_type]
        out = node.output[0]
        tmp = [f"{out}__crossrt_ov_{k}" for k in ("raw", "isinf", "float", "all", "cond", "end")]
        raw = onnx.NodeProto()
        raw.CopyFrom(node)
        raw.output[0] = tmp[0]
        rest = list(node.input[1:])  # the axes input, from opset 18
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        make = onnx.helper.make_node
        nodes += [
            raw,
            make("IsInf", [node.input[0]], [tmp[1]], detect_negative=1 - positive,
                 detect_positive=positive),
            make("Cast", [tmp[1]], [tmp[2]], to=onnx.TensorProto.FLOAT),
            make("ReduceMin", [tmp[2], *rest], [tmp[3]], **attrs),
            make("Cast", [tmp[3]], [tmp[4]], to=onnx.TensorProto.BOOL),
            make(other, [node.input[0], *rest], [tmp[5]], **attrs),
            make("Where", [tmp[4], tmp[5], tmp[0]], [out]),
        ]  # fmt: skip
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return bytes(proto.SerializeToString())


def _in_context(
    node: onnx.NodeProto,
    types: dict[str, onnx.TypeProto],
    constants: dict[str, np.ndarray],
) -> str | None:
    """The rules that need more than the node: its inputs' values, shapes or origins."""
    op = node.op_type
    if op == "Tile" and len(node.input) > 1 and node.input[1] not in constants:
        return "OpenVINO's Tile with repeats computed at run time returns wrong values"
    # (Of infinities alone, it gives the largest finite float too: exact_infinities.)
    if op in ("ReduceMax", "ReduceMin") and 0 in _static_shape(types.get(node.input[0])):
        return f"OpenVINO's {op} of nothing gives the largest finite float, not infinity"
    if op in ("MaxPool", "AveragePool") and _attr(node, "ceil_mode", 0):
        shape = _static_shape(types.get(node.input[0]))
        if shape and _ceil_drops_a_window(node, shape):
            return (
                f"OpenVINO's {op} with ceil_mode keeps a last window that starts in the end "
                "padding, which ONNX drops"
            )
    return None


def _constants(model: Model) -> dict[str, np.ndarray]:
    """The values known before running: initializers and Constant nodes' tensors."""
    graph = model.proto.graph
    found = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            value = next((a for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None:
                found[node.output[0]] = onnx.numpy_helper.to_array(value.t)
    return found


def _may_hold_infinity(model: Model, constants: dict[str, np.ndarray]) -> set[str]:
    """Values that may hold an infinity because a constant they are computed from does (an
    attention mask's -inf, say); the model's inputs are taken to be finite."""
    infinite = {
        name
        for name, value in constants.items()
        if value.dtype.kind == "f" and value.size and not np.isfinite(value).all()
    }
    for node in model.nodes:  # topological order
        if any(v in infinite for v in node.input):
            infinite.update(o for o in node.output if o)
    return infinite


def _static_shape(t: onnx.TypeProto | None) -> tuple[int, ...]:
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return ()
    dims = t.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return ()
    return tuple(d.dim_value for d in dims)


def _ceil_drops_a_window(node: onnx.NodeProto, shape: tuple[int, ...]) -> bool:
    """Whether ONNX's ceil_mode rule drops a last window that starts in the end padding on
    some axis of input ``shape`` (OpenVINO keeps it: the output is one larger there)."""
    spatial = shape[2:]
    kernel = list(_attr(node, "kernel_shape", []))
    if len(kernel) != len(spatial) or _attr(node, "auto_pad", "NOTSET") != "NOTSET":
        return False
    strides = list(_attr(node, "strides", [1] * len(spatial)))
    dilations = list(_attr(node, "dilations", [1] * len(spatial)))
    pads = list(_attr(node, "pads", [0] * 2 * len(spatial)))
    for axis, size in enumerate(spatial):
        begin, end = pads[axis], pads[axis + len(spatial)]
        window = (kernel[axis] - 1) * dilations[axis] + 1
        out = math.ceil((size + begin + end - window) / strides[axis]) + 1
        if (out - 1) * strides[axis] >= size + begin:
            return True
    return False
