"""Translators of NNRt's element-wise, shape and reduction operations to ONNX."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import helper

from .graph import Ctx, Translator
from .ops_index import pad_symmetric, strided_spec
from .status import invalid
from .types import numpy_dtype

__all__ = ["BASIC_OPS"]

_INT64_MAX = np.iinfo(np.int64).max


def _binary(onnx_op: str, act: str | None = None) -> Translator:
    def translate(c: Ctx) -> list[str]:
        y = str(c.op_(onnx_op, [c.x(0), c.x(1)]))
        return [c.fuse(y, act) if act else y]

    return translate


def _unary(onnx_op: str, **attrs: Any) -> Translator:
    def translate(c: Ctx) -> list[str]:
        return [str(c.op_(onnx_op, [c.x(0)], **attrs))]

    return translate


def cast(c: Ctx) -> list[str]:
    """CAST -> Cast to the OH_NN_DataType held by input 1."""
    to = helper.np_dtype_to_tensor_dtype(numpy_dtype(int(c.const(1).reshape(-1)[0])))
    return [str(c.op_("Cast", [c.x(0)], to=int(to)))]


def concat(c: Ctx) -> list[str]:
    """CONCAT -> Concat(axis)."""
    return [str(c.op_("Concat", [c.x(k) for k in range(len(c.op.inputs))], axis=c.pi("AXIS", 0)))]


_ELTWISE = {0: "Mul", 1: "Add", 2: "Max"}


def eltwise(c: Ctx) -> list[str]:
    """ELTWISE -> Mul (PROD), Add (SUM) or Max (MAXIMUM)."""
    mode = c.pi("MODE", 1)
    if mode not in _ELTWISE:
        raise invalid(f"{c.op.name}: mode {mode} is not 0 (PROD), 1 (SUM) or 2 (MAXIMUM)")
    return [str(c.op_(_ELTWISE[mode], [c.x(0), c.x(1)]))]


def expand_dims(c: Ctx) -> list[str]:
    """EXPAND_DIMS -> Unsqueeze(axes = input 1)."""
    return [str(c.op_("Unsqueeze", [c.x(0), c.as_i64(1)]))]


def fill(c: Ctx) -> list[str]:
    """FILL -> Expand(value, shape)."""
    return [str(c.op_("Expand", [c.x(0), c.as_i64(1)]))]


def gather(c: Ctx) -> list[str]:
    """GATHER -> Gather(axis = input 2)."""
    axis = int(c.const(2).reshape(-1)[0])
    return [str(c.op_("Gather", [c.x(0), c.x(1)], axis=axis))]


def one_hot(c: Ctx) -> list[str]:
    """ONE_HOT -> OneHot(indices, depth, [off, on], axis)."""
    one = c.i64([1])
    values = c.op_(
        "Concat",
        [c.op_("Reshape", [c.x(3), one]), c.op_("Reshape", [c.x(2), one])],
        axis=0,
    )
    depth = c.op_("Reshape", [c.x(1), c.i64([])])  # ONNX wants a scalar depth
    return [str(c.op_("OneHot", [c.x(0), depth, values], axis=c.pi("AXIS", -1)))]


_PAD_MODES = {0: "constant", 1: "reflect"}


def pad(c: Ctx) -> list[str]:
    """PAD -> Pad; paddings [[before, after]...] become ONNX's [befores..., afters...].
    SYMMETRIC (2) is Slice and Concat (ops_index.py)."""
    mode = c.pi("PADDING_MODE", 0)
    if mode == 2:
        return [pad_symmetric(c, c.x(0))]
    if mode not in _PAD_MODES:
        raise invalid(f"{c.op.name}: padding mode {mode}: give 0 constant, 1 reflect, 2 symmetric")
    data = c.tensor(1).data
    if data is not None:
        pads = c.i64(np.asarray(data).reshape(-1, 2).T.reshape(-1))
    else:
        flat = c.op_("Reshape", [c.op_("Transpose", [c.x(1)], perm=[1, 0]), c.i64([-1])])
        pads = str(c.op_("Cast", [flat], to=7))
    value = c.scalar(c.pf("CONSTANT_VALUE", 0.0), c.out_dtype())
    return [str(c.op_("Pad", [c.x(0), pads, value], mode=_PAD_MODES[mode]))]


def power(c: Ctx) -> list[str]:
    """POW -> Pow(scale * x + shift, y)."""
    base = c.x(0)
    scale, shift = c.pf("SCALE", 1.0), c.pf("SHIFT", 0.0)
    if scale != 1.0:
        base = c.op_("Mul", [base, c.scalar(scale, c.out_dtype())])
    if shift != 0.0:
        base = c.op_("Add", [base, c.scalar(shift, c.out_dtype())])
    return [str(c.op_("Pow", [base, c.x(1)]))]


def shape(c: Ctx) -> list[str]:
    """SHAPE -> Shape, cast to the output's type."""
    return [c.cast(c.op_("Shape", [c.x(0)]))]


def relu6(c: Ctx) -> list[str]:
    """RELU6 -> Clip(0, 6)."""
    dt = c.out_dtype()
    return [str(c.op_("Clip", [c.x(0), c.scalar(0, dt), c.scalar(6, dt)]))]


def rsqrt(c: Ctx) -> list[str]:
    """RSQRT -> Reciprocal(Sqrt)."""
    return [str(c.op_("Reciprocal", [c.op_("Sqrt", [c.x(0)])]))]


def slice_(c: Ctx) -> list[str]:
    """SLICE -> Slice(begin, begin + size; size -1: to the end) on ``axes``."""
    begin = c.const(1).astype(np.int64).reshape(-1)
    size = c.const(2).astype(np.int64).reshape(-1)
    ends = np.where(size < 0, _INT64_MAX, begin + size)
    axes = c.plist("AXES") or list(range(len(begin)))
    return [str(c.op_("Slice", [c.x(0), c.i64(begin), c.i64(ends), c.i64(axes)]))]


def softmax(c: Ctx) -> list[str]:
    """SOFTMAX -> Softmax(axis)."""
    return [str(c.op_("Softmax", [c.x(0)], axis=c.pi("AXIS", -1)))]


def split(c: Ctx) -> list[str]:
    """SPLIT -> Split(axis) by sizeSplits, else into outputNum equal parts."""
    n = len(c.op.outputs)
    sizes = c.plist("SIZE_SPLITS")
    axis = c.pi("AXIS", 0)
    if sizes:
        out = c.op_("Split", [c.x(0), c.i64(sizes)], outputs=n, axis=axis)
    else:
        out = c.op_("Split", [c.x(0)], outputs=n, axis=axis, num_outputs=c.pi("OUTPUT_NUM", n))
    return [out] if n == 1 else list(out)


def squared_difference(c: Ctx) -> list[str]:
    """SQUARED_DIFFERENCE -> Sub, Mul by itself."""
    d = c.op_("Sub", [c.x(0), c.x(1)])
    return [str(c.op_("Mul", [d, d]))]


def _axes_op(onnx_op: str) -> Translator:
    def translate(c: Ctx) -> list[str]:
        return [str(c.op_(onnx_op, [c.x(0), c.i64(c.plist("AXIS") or [])]))]

    return translate


def stack(c: Ctx) -> list[str]:
    """STACK -> Unsqueeze each input at axis, Concat."""
    axis = c.pi("AXIS", 0)
    axes = c.i64([axis])
    parts = [c.op_("Unsqueeze", [c.x(k), axes]) for k in range(len(c.op.inputs))]
    return [str(c.op_("Concat", parts, axis=axis))]


def strided_slice(c: Ctx) -> list[str]:
    """STRIDED_SLICE -> Unsqueeze of the new axes, Slice, Squeeze of the shrunk axes
    (TensorFlow's begin, end, ellipsis, new-axis and shrink masks: ops_index.py)."""
    begin = c.const(1).astype(np.int64).reshape(-1)
    end = c.const(2).astype(np.int64).reshape(-1)
    steps = c.const(3).astype(np.int64).reshape(-1) if c.has(3) else np.ones_like(begin)
    if not len(begin) == len(end) == len(steps):
        raise invalid(f"{c.op.name}: begin, end and strides differ in length")
    new, begins, ends, axes, strides, squeeze = strided_spec(c, begin, end, steps, len(c.shape(0)))
    y = c.op_("Unsqueeze", [c.x(0), c.i64(new)]) if new else c.x(0)
    if axes:
        y = c.op_("Slice", [y, c.i64(begins), c.i64(ends), c.i64(axes), c.i64(strides)])
    if squeeze:
        y = c.op_("Squeeze", [y, c.i64(squeeze)])
    elif not new and not axes:
        y = c.op_("Identity", [y])
    return [str(y)]


def tile(c: Ctx) -> list[str]:
    """TILE -> Tile(multiples = input 1, else the ``dims`` parameter)."""
    reps = c.as_i64(1) if c.has(1) else c.i64(c.plist("DIMS") or [])
    return [str(c.op_("Tile", [c.x(0), reps]))]


def transpose(c: Ctx) -> list[str]:
    """TRANSPOSE -> Transpose(perm = input 1)."""
    perm = [int(i) for i in c.const(1).reshape(-1)]
    return [str(c.op_("Transpose", [c.x(0)], perm=perm))]


def _reduce(onnx_op: str, boolean: bool = False) -> Translator:
    def translate(c: Ctx) -> list[str]:
        axes = [int(a) for a in c.const(1).reshape(-1)] if c.has(1) else []
        if c.pb("REDUCE_TO_END", False) and axes:
            rank = len(c.shape(0))
            first = axes[0] + rank if axes[0] < 0 else axes[0]
            axes = list(range(first, rank))
        x = c.op_("Cast", [c.x(0)], to=6) if boolean else c.x(0)
        keep = int(c.pb("KEEP_DIMS", False))
        y = c.op_(onnx_op, [x, c.i64(axes)], keepdims=keep)
        if boolean:
            return [str(c.op_("Cast", [y], to=9))]
        coeff = c.pf("COEFF", 1.0)
        if coeff != 1.0:
            y = c.op_("Mul", [y, c.scalar(coeff, c.out_dtype())])
        return [str(y)]

    return translate


def reshape(c: Ctx) -> list[str]:
    """RESHAPE -> Reshape(shape = input 1)."""
    return [str(c.op_("Reshape", [c.x(0), c.as_i64(1)]))]


def quant_dtype_cast(c: Ctx) -> list[str]:
    """QUANT_DTYPE_CAST -> QuantizeLinear (float to an int type with the output's quant
    params), DequantizeLinear (an int type with the input's quant params to float), else
    Cast."""
    src, dst = c.tensor(0), c.tensors[c.op.outputs[0]]
    dst_dt = c.out_dtype()
    axis = c.pi("AXIS", 1)

    def params(q: Any, zp_dtype: Any) -> tuple[str, str]:
        scale = np.asarray(q.scales, np.float32)
        zp = np.asarray(q.zero_points or [0] * len(q.scales), zp_dtype)
        return c.b.constant(scale.reshape(-1) if scale.size > 1 else scale[0]), c.b.constant(
            zp.reshape(-1) if zp.size > 1 else zp[0]
        )

    if dst.quant is not None and np.issubdtype(dst_dt, np.integer):
        scale, zp = params(dst.quant, dst_dt)
        return [str(c.op_("QuantizeLinear", [c.x(0), scale, zp], axis=axis))]
    if src.quant is not None and np.issubdtype(dst_dt, np.floating):
        scale, zp = params(src.quant, numpy_dtype(src.desc.data_type))
        y = c.op_("DequantizeLinear", [c.x(0), scale, zp], axis=axis)
        return [c.cast(y)]
    return [c.cast(c.x(0))]


def top_k(c: Ctx) -> list[str]:
    """TOP_K -> TopK(k, axis, sorted, largest); the indices cast to the output's type."""
    values, idx = c.op_(
        "TopK",
        [c.x(0), c.op_("Reshape", [c.as_i64(1), c.i64([1])])],
        outputs=2,
        axis=c.pi("AXIS", -1),
        sorted=int(c.pb("SORTED", True)),
        largest=1,
    )
    return [values, c.cast(idx, 1)]


def arg_max(c: Ctx) -> list[str]:
    """ARG_MAX -> ArgMax (or ReduceMax with outMaxValue), cast to the output's type."""
    axis, keep = c.pi("AXIS", 0), int(c.pb("KEEPDIMS", False))
    if c.pb("OUT_MAX_VALUE", False):
        return [str(c.op_("ReduceMax", [c.x(0), c.i64([axis])], keepdims=keep))]
    return [c.cast(c.op_("ArgMax", [c.x(0)], axis=axis, keepdims=keep))]


def gelu(c: Ctx) -> list[str]:
    """GELU -> Gelu(approximate = "tanh" or "none")."""
    approx = "tanh" if c.pb("APPROXIMATE", False) else "none"
    return [str(c.op_("Gelu", [c.x(0)], approximate=approx))]


Spec = tuple[Callable[[Ctx], list[str]], tuple[int, int], tuple[int, int]]
_1, _2, _N = (1, 1), (2, 2), (1, 1 << 16)

BASIC_OPS: dict[str, Spec] = {
    "ADD": (_binary("Add", "ACTIVATIONTYPE"), _2, _1),
    "BIAS_ADD": (_binary("Add"), _2, _1),
    "CAST": (cast, _2, _1),
    "CONCAT": (concat, _N, _1),
    "DIV": (_binary("Div", "ACTIVATIONTYPE"), _2, _1),
    "ELTWISE": (eltwise, _2, _1),
    "EXPAND_DIMS": (expand_dims, _2, _1),
    "FILL": (fill, _2, _1),
    "GATHER": (gather, (3, 3), _1),
    "HSWISH": (_unary("HardSwish"), _1, _1),
    "LESS_EQUAL": (_binary("LessOrEqual"), _2, _1),
    "MAXIMUM": (_binary("Max"), _2, _1),
    "MUL": (_binary("Mul", "ACTIVATION_TYPE"), _2, _1),
    "ONE_HOT": (one_hot, (4, 4), _1),
    "PAD": (pad, _2, _1),
    "POW": (power, _2, _1),
    "SHAPE": (shape, _1, _1),
    "SIGMOID": (_unary("Sigmoid"), _1, _1),
    "SLICE": (slice_, (3, 3), _1),
    "SOFTMAX": (softmax, _1, _1),
    "SPLIT": (split, _1, _N),
    "SQRT": (_unary("Sqrt"), _1, _1),
    "SQUARED_DIFFERENCE": (squared_difference, _2, _1),
    "SQUEEZE": (_axes_op("Squeeze"), _1, _1),
    "STACK": (stack, _N, _1),
    "STRIDED_SLICE": (strided_slice, (3, 4), _1),
    "SUB": (_binary("Sub", "ACTIVATIONTYPE"), _2, _1),
    "TANH": (_unary("Tanh"), _1, _1),
    "TILE": (tile, (1, 2), _1),
    "TRANSPOSE": (transpose, _2, _1),
    "REDUCE_MEAN": (_reduce("ReduceMean"), (1, 2), _1),
    "RSQRT": (rsqrt, _1, _1),
    "RESHAPE": (reshape, _2, _1),
    "RELU": (_unary("Relu"), _1, _1),
    "RELU6": (relu6, _1, _1),
    "REDUCE_PROD": (_reduce("ReduceProd"), (1, 2), _1),
    "REDUCE_ALL": (_reduce("ReduceMin", boolean=True), (1, 2), _1),
    "QUANT_DTYPE_CAST": (quant_dtype_cast, _1, _1),
    "TOP_K": (top_k, _2, _2),
    "ARG_MAX": (arg_max, _1, _1),
    "UNSQUEEZE": (_axes_op("Unsqueeze"), _1, _1),
    "GELU": (gelu, _1, _1),
}
"""Op name (without ``OH_NN_OPS_``) -> (translator, (min, max) inputs, (min, max) outputs)."""
