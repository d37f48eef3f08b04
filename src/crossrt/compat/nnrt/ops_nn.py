"""Translators of NNRt's layer operations (convolutions, pools, normalizations, layout
changes) to ONNX.

NNRt's convolutions, pools and resizes take NHWC data (MindSpore Lite's layout) and
``[outChannel, kernelHeight, kernelWidth, inChannel/group]`` weights; ONNX takes NCHW and
OIHW: the data is transposed in and out around the ONNX operator, and a constant weight is
transposed once, here, instead of in the graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Ctx
from .status import invalid

__all__ = ["LAYER_OPS"]


def _weight(c: Ctx, k: int, perm: tuple[int, ...]) -> str:
    data = c.tensor(k).data
    if data is not None:
        return c.b.constant(np.ascontiguousarray(np.transpose(data, perm)))
    return str(c.op_("Transpose", [c.x(k)], perm=list(perm)))


def _padding(c: Ctx, pad: str = "PAD", mode: str = "PAD_MODE") -> dict[str, Any]:
    """ONNX pads from NNRt's padList [top, bottom, left, right] or padMode (0 same: the
    extra pixel at the bottom and right, ONNX's SAME_UPPER; 1 valid)."""
    pads = c.plist(pad)
    if pads is not None:
        if len(pads) != 4:
            raise invalid(f"{c.op.name}: padList {pads} must be [top, bottom, left, right]")
        return {"pads": [pads[0], pads[2], pads[1], pads[3]]}
    if c.p(mode) is None:
        return {}
    kind = c.pi(mode, 1)
    if kind not in (0, 1):
        raise invalid(f"{c.op.name}: padMode {kind} must be 0 (same) or 1 (valid)")
    return {"auto_pad": "SAME_UPPER" if kind == 0 else "VALID"}


def _pair(c: Ctx, attr: str) -> list[int]:
    v = c.plist(attr, [1, 1]) or [1, 1]
    return v * 2 if len(v) == 1 else v


def _conv_attrs(c: Ctx) -> dict[str, Any]:
    return {"strides": _pair(c, "STRIDES"), "dilations": _pair(c, "DILATION"), **_padding(c)}


def conv2d(c: Ctx) -> list[str]:
    """CONV2D -> Transpose, Conv, Transpose (+ activation)."""
    bias = c.x(2) if c.has(2) else None
    y = c.op_(
        "Conv",
        [c.nchw(c.x(0)), _weight(c, 1, (0, 3, 1, 2)), bias],
        group=c.pi("GROUP", 1),
        **_conv_attrs(c),
    )
    return [c.fuse(c.nhwc(y), "ACTIVATION_TYPE")]


def depthwise_conv2d(c: Ctx) -> list[str]:
    """DEPTHWISE_CONV2D_NATIVE -> Conv with group = input channels."""
    channels = c.static_shape(0)[3]
    bias = c.x(2) if c.has(2) else None
    y = c.op_(
        "Conv",
        [c.nchw(c.x(0)), _weight(c, 1, (0, 3, 1, 2)), bias],
        group=channels,
        **_conv_attrs(c),
    )
    return [c.fuse(c.nhwc(y), "ACTIVATION_TYPE")]


def conv2d_transpose(c: Ctx) -> list[str]:
    """CONV2D_TRANSPOSE -> ConvTranspose; the weight becomes [in, out/group, kH, kW]."""
    group = c.pi("GROUP", 1)
    data = c.tensor(1).data
    if data is not None:
        out_c, kh, kw, in_g = data.shape
        w = data.reshape(group, out_c // group, kh, kw, in_g).transpose(0, 4, 1, 2, 3)
        weight = c.b.constant(np.ascontiguousarray(w.reshape(group * in_g, out_c // group, kh, kw)))
    elif group == 1:
        weight = str(c.op_("Transpose", [c.x(1)], perm=[3, 0, 1, 2]))
    else:
        raise invalid(f"{c.op.name}: a grouped transposed convolution needs a constant weight")
    attrs = _conv_attrs(c)
    if c.p("OUTPUT_PADDINGS") is not None:
        attrs["output_padding"] = _pair(c, "OUTPUT_PADDINGS")
    bias = c.x(2) if c.has(2) else None
    y = c.op_("ConvTranspose", [c.nchw(c.x(0)), weight, bias], group=group, **attrs)
    return [c.fuse(c.nhwc(y), "ACTIVATION_TYPE")]


def _pool(c: Ctx, onnx_op: str) -> list[str]:
    x = c.nchw(c.x(0))
    if c.pb("GLOBAL", False):
        y = c.op_("Global" + onnx_op, [x])
    else:
        kernel = c.plist("KERNEL_SIZE")
        if kernel is None:
            raise invalid(f"{c.op.name}: give kernelSize (or global)")
        attrs: dict[str, Any] = {
            "kernel_shape": kernel,
            "strides": _pair(c, "STRIDE"),
            "ceil_mode": c.pi("ROUND_MODE", 0),
            **_padding(c),
        }
        if onnx_op == "AveragePool":
            attrs["count_include_pad"] = 0  # MindSpore averages the pixels inside only
        y = c.op_(onnx_op, [x], **attrs)
    return [c.fuse(c.nhwc(y), "ACTIVATION_TYPE")]


def avg_pool(c: Ctx) -> list[str]:
    """AVG_POOL -> AveragePool or GlobalAveragePool."""
    return _pool(c, "AveragePool")


def max_pool(c: Ctx) -> list[str]:
    """MAX_POOL -> MaxPool or GlobalMaxPool."""
    return _pool(c, "MaxPool")


def full_connection(c: Ctx) -> list[str]:
    """FULL_CONNECTION -> Reshape to [-1, in], Gemm(transB) (+ bias), Reshape to the
    declared output shape."""
    w_shape = c.shape(1)
    x = c.op_("Reshape", [c.x(0), c.i64([-1, w_shape[1]])])
    bias = c.x(2) if c.has(2) and c.pb("HAS_BIAS", True) else None
    y = c.op_("Gemm", [x, c.x(1), bias], transB=1)
    out = c.out_desc().shape
    if len(out) != 2 and out and all(d > 0 for d in out):
        y = c.op_("Reshape", [y, c.i64(out)])
    return [c.fuse(y)]


def batch_norm(c: Ctx) -> list[str]:
    """BATCH_NORM (channels last) -> (x - mean) * scale / sqrt(var + eps) + offset."""
    eps = c.scalar(c.pf("EPSILON", 1e-4), c.out_dtype())
    std = c.op_("Sqrt", [c.op_("Add", [c.x(4), eps])])
    factor = c.op_("Div", [c.x(1), std])
    centered = c.op_("Sub", [c.x(0), c.x(3)])
    return [str(c.op_("Add", [c.op_("Mul", [centered, factor]), c.x(2)]))]


def layer_norm(c: Ctx) -> list[str]:
    """LAYER_NORM -> LayerNormalization(axis=beginNormAxis)."""
    y = c.op_(
        "LayerNormalization",
        [c.x(0), c.x(1), c.x(2) if c.has(2) else None],
        axis=c.pi("BEGIN_NORM_AXIS", 1),
        epsilon=c.pf("EPSILON", 1e-5),
    )
    return [str(y)]


_COORDINATES = {0: "asymmetric", 1: "align_corners", 2: "half_pixel"}


def resize_bilinear(c: Ctx) -> list[str]:
    """RESIZE_BILINEAR (NHWC) -> Resize(mode=linear) of axes 1 and 2."""
    mode = c.pi("COORDINATE_TRANSFORM_MODE", 0)
    if mode not in _COORDINATES:
        raise invalid(f"{c.op.name}: coordinateTransformMode {mode} is not 0, 1 or 2")
    sizes = c.i64([c.pi("NEW_HEIGHT", 0), c.pi("NEW_WIDTH", 0)])
    attrs: dict[str, Any] = {
        "mode": "linear",
        "axes": [1, 2],
        "coordinate_transformation_mode": _COORDINATES[mode],
        "exclude_outside": c.pi("EXCLUDE_OUTSIDE", 0),
    }
    if c.pb("PRESERVE_ASPECT_RATIO", False):
        attrs["keep_aspect_ratio_policy"] = "not_larger"
    return [str(c.op_("Resize", [c.x(0), None, None, sizes], **attrs))]


def batch_to_space_nd(c: Ctx) -> list[str]:
    """BATCH_TO_SPACE_ND (NHWC, static shape) -> Reshape, Transpose, Reshape, Slice."""
    n, h, w, ch = c.static_shape(0)
    bh, bw = c.plist("BLOCKSIZE", [1, 1]) or [1, 1]
    crops = c.plist("CROPS", [0, 0, 0, 0]) or [0, 0, 0, 0]
    x = c.op_("Reshape", [c.x(0), c.i64([bh, bw, n // (bh * bw), h, w, ch])])
    x = c.op_("Transpose", [x], perm=[2, 3, 0, 4, 1, 5])
    x = c.op_("Reshape", [x, c.i64([n // (bh * bw), h * bh, w * bw, ch])])
    starts = c.i64([crops[0], crops[2]])
    ends = c.i64([h * bh - crops[1], w * bw - crops[3]])
    return [str(c.op_("Slice", [x, starts, ends, c.i64([1, 2])]))]


def space_to_batch_nd(c: Ctx) -> list[str]:
    """SPACE_TO_BATCH_ND (NHWC, static shape) -> Pad, Reshape, Transpose, Reshape."""
    n, h, w, ch = c.static_shape(0)
    bh, bw = c.plist("BLOCK_SHAPE", [1, 1]) or [1, 1]
    p = c.plist("PADDINGS", [0, 0, 0, 0]) or [0, 0, 0, 0]
    x = c.op_("Pad", [c.x(0), c.i64([0, p[0], p[2], 0, 0, p[1], p[3], 0])])
    hp, wp = h + p[0] + p[1], w + p[2] + p[3]
    x = c.op_("Reshape", [x, c.i64([n, hp // bh, bh, wp // bw, bw, ch])])
    x = c.op_("Transpose", [x], perm=[2, 4, 0, 1, 3, 5])
    return [str(c.op_("Reshape", [x, c.i64([n * bh * bw, hp // bh, wp // bw, ch])]))]


def scale(c: Ctx) -> list[str]:
    """SCALE -> x * scale (+ bias), scale aligned with the input from ``axis``."""
    rank = len(c.shape(0))
    axis = c.pi("AXIS", -1)
    axis = axis + rank if axis < 0 else axis
    tail = rank - axis - len(c.shape(1))
    factor, bias = c.x(1), c.x(2) if c.has(2) else None
    if tail > 0:  # the scale covers axes [axis, axis + its rank): ones after it
        ones = c.i64([*c.shape(1), *([1] * tail)])
        factor = str(c.op_("Reshape", [factor, ones]))
        bias = None if bias is None else str(c.op_("Reshape", [bias, ones]))
    y = c.op_("Mul", [c.x(0), factor])
    if bias is not None:
        y = c.op_("Add", [y, bias])
    return [c.fuse(y)]


def matmul(c: Ctx) -> list[str]:
    """MATMUL -> Transpose of the last two axes where asked, MatMul (+ activation)."""
    values = []
    for k, attr in ((0, "TRANSPOSE_A"), (1, "TRANSPOSE_B")):
        v = c.x(k)
        if c.pb(attr, False):
            r = len(c.shape(k))
            v = c.op_("Transpose", [v], perm=[*range(r - 2), r - 1, r - 2])
        values.append(v)
    return [c.fuse(c.op_("MatMul", values), "ACTIVATION_TYPE")]


def prelu(c: Ctx) -> list[str]:
    """PRELU -> PRelu (the slope broadcasts over the last, channel, axis)."""
    return [str(c.op_("PRelu", [c.x(0), c.x(1)]))]


LAYER_OPS = {
    "AVG_POOL": (avg_pool, (1, 1), (1, 1)),
    "BATCH_NORM": (batch_norm, (5, 5), (1, 1)),
    "BATCH_TO_SPACE_ND": (batch_to_space_nd, (1, 1), (1, 1)),
    "CONV2D": (conv2d, (2, 3), (1, 1)),
    "CONV2D_TRANSPOSE": (conv2d_transpose, (2, 3), (1, 1)),
    "DEPTHWISE_CONV2D_NATIVE": (depthwise_conv2d, (2, 3), (1, 1)),
    "FULL_CONNECTION": (full_connection, (2, 3), (1, 1)),
    "LAYER_NORM": (layer_norm, (2, 3), (1, 1)),
    "MATMUL": (matmul, (2, 2), (1, 1)),
    "MAX_POOL": (max_pool, (1, 1), (1, 1)),
    "PRELU": (prelu, (2, 2), (1, 1)),
    "RESIZE_BILINEAR": (resize_bilinear, (1, 1), (1, 1)),
    "SCALE": (scale, (2, 3), (1, 1)),
    "SPACE_TO_BATCH_ND": (space_to_batch_nd, (1, 1), (1, 1)),
}
"""Op name (without ``OH_NN_OPS_``) -> (translator, (min, max) inputs, (min, max) outputs)."""
