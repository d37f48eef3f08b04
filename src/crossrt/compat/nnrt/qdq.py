"""Quantized operations lowered to ONNX's QDQ form.

An operation that reads or writes a tensor with quantization parameters (quant.py) is
translated on real values: each quantized input goes through ``DequantizeLinear``, the
operation's own translator runs on float32, and each quantized output comes out of
``QuantizeLinear`` (then ``Clip`` when its bit width is narrower than its type). This is the
form ONNX Runtime and OpenVINO fuse into int8 kernels where they have one (an int8 ADD
becomes ONNX Runtime's ``QLinearAdd``), and what the reference driver computes step by step.

ONNX rounds half to even when it quantizes and saturates to the type. It quantizes to 8 and
16 bits only (int32 is dequantized, for biases, with a zero point of 0): another quantized
type is OH_NN_OPERATION_FORBIDDEN when the model is finished.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...model import GraphBuilder
from .graph import Ctx, ModelTensor, Operation, Translator
from .quant import NN_QuantParam, quant_range
from .status import forbidden
from .types import OH_NN_DataType, numpy_dtype

__all__ = ["RAW_OPS", "translate_quantized"]

RAW_OPS = frozenset({"OH_NN_OPS_QUANT_DTYPE_CAST", "OH_NN_OPS_CAST"})
"""Operations that read quantization parameters themselves (QUANT_DTYPE_CAST) or convert the
stored integers as they are (CAST)."""

_QUANTIZES_TO = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}
_AXIS = 0  # per-channel parameters are per index of the first dimension (quant.py)


def _quantized(t: ModelTensor) -> NN_QuantParam | None:
    q = t.quant
    return q if q is not None and np.issubdtype(numpy_dtype(t.desc.data_type), np.integer) else None


def _real(q: NN_QuantParam, data: np.ndarray) -> np.ndarray:
    """A constant's real values, for a translator that reads a constant input."""
    shape = (-1,) + (1,) * (data.ndim - 1) if len(q.scales) > 1 else ()
    scale = np.asarray(q.scales, np.float64).reshape(shape)
    zero = np.asarray(q.zero_points or [0], np.float64).reshape(shape if q.zero_points[1:] else ())
    return ((data.astype(np.float64) - zero) * scale).astype(np.float32)


def _scale(b: GraphBuilder, q: NN_QuantParam) -> str:
    scales = np.asarray(q.scales, np.float32)
    return b.constant(scales if len(scales) > 1 else scales[0])


def _zero(b: GraphBuilder, q: NN_QuantParam, dtype: np.dtype[Any]) -> str:
    zeros = np.asarray(q.zero_points or [0], dtype)
    if len(q.scales) > 1 and len(zeros) == 1:
        zeros = np.repeat(zeros, len(q.scales))
    return b.constant(zeros if len(q.scales) > 1 else zeros[0])


def translate_quantized(
    b: GraphBuilder,
    tensors: Sequence[ModelTensor],
    value: Callable[[int], str],
    op: Operation,
    translate: Translator,
) -> list[str]:
    """``op`` translated on the real values of its quantized tensors (module docstring)."""
    nodes = iter(range(1 << 30))

    def node(op_type: str, inputs: list[str], **attrs: Any) -> str:
        return str(b.op(op_type, inputs, name=f"{op.name}/q{next(nodes)}", **attrs))

    quantized = {i: q for i in {*op.inputs, *op.outputs} if (q := _quantized(tensors[i]))}
    view = list(tensors)
    for i in quantized:
        t = tensors[i]
        values = None if t.data is None else _real(quantized[i], t.data)
        desc = t.desc.copy()
        desc.data_type = OH_NN_DataType.OH_NN_FLOAT32
        # No data: the translator takes the constant as a value (integers + DequantizeLinear:
        # the QDQ form of weights); Ctx.const() reads the real values.
        view[i] = ModelTensor(desc, t.type, None, None, values)

    def real(i: int) -> str:
        q = quantized.get(i)
        if q is None:
            return value(i)
        dtype = numpy_dtype(tensors[i].desc.data_type)
        if dtype == np.int32 and any(q.zero_points):
            raise forbidden(f"{op.name}: int32 tensor {i} with a zero point; ONNX takes 0 only")
        if dtype not in _QUANTIZES_TO and dtype != np.int32:
            raise forbidden(
                f"{op.name}: tensor {i} is quantized {dtype}; ONNX dequantizes int8, uint8, "
                "int16, uint16 and int32"
            )
        if dtype != np.int8:
            return node(
                "DequantizeLinear", [value(i), _scale(b, q), _zero(b, q, dtype)], axis=_AXIS
            )
        # ONNX Runtime 1.32's transpose optimizer (opset 21) breaks on an int8
        # DequantizeLinear given a zero point when a Transpose follows (the NHWC ops):
        # "output_dtype INT8 does not match y_zero_point type UINT8". Without one it is 0 of
        # x's type; a zero point that is not 0 becomes x * scale - zero_point * scale.
        x = node("DequantizeLinear", [value(i), _scale(b, q)], axis=_AXIS)
        if not any(q.zero_points):
            return x
        rank = len(tensors[i].desc.shape)
        zs = np.asarray(q.zero_points, np.float64) * np.asarray(q.scales, np.float64)
        shift = zs.astype(np.float32).reshape((-1,) + (1,) * (rank - 1) if zs.size > 1 else ())
        return node("Sub", [x, b.constant(shift)])

    results = translate(Ctx(b, view, real, op))
    out = []
    for i, result in zip(op.outputs, results, strict=True):
        q = quantized.get(i)
        if q is None:
            out.append(result)
            continue
        dtype = numpy_dtype(tensors[i].desc.data_type)
        if dtype not in _QUANTIZES_TO:
            raise forbidden(
                f"{op.name}: output tensor {i} is quantized {dtype}; ONNX quantizes to int8, "
                "uint8, int16 or uint16: declare one of those, or leave the output float"
            )
        y = node("QuantizeLinear", [result, _scale(b, q), _zero(b, q, dtype)], axis=_AXIS)
        bits = q.num_bits[0] if q.num_bits else dtype.itemsize * 8
        if bits < dtype.itemsize * 8:
            lo, hi = quant_range(dtype, bits)
            y = node(
                "Clip", [y, b.constant(np.asarray(lo, dtype)), b.constant(np.asarray(hi, dtype))]
            )
        out.append(y)
    return out
