"""The parts of PAD and STRIDED_SLICE that ONNX has no single operator for: SYMMETRIC
padding (reflect including the edge) and TensorFlow's ellipsis and new-axis masks."""

from __future__ import annotations

import numpy as np

from .graph import Ctx
from .status import NNError, OH_NN_ReturnCode, invalid

__all__ = ["StridedSpec", "pad_symmetric", "strided_spec"]

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def pad_symmetric(c: Ctx, x: str) -> str:
    """PAD with PADDING_MODE 2: per axis, the first ``before`` elements reversed, the data,
    the last ``after`` reversed (Slice with step -1, Concat). Paddings must be constant,
    non-negative and no wider than the axis (TensorFlow's rule)."""
    data = c.tensor(1).data
    if data is None:
        raise NNError(
            OH_NN_ReturnCode.OH_NN_UNSUPPORTED,
            f"{c.op.name}: SYMMETRIC padding needs constant paddings (SetTensorData)",
        )
    pads = np.asarray(data).reshape(-1, 2).astype(np.int64)
    dims = c.shape(0)
    if len(pads) != len(dims):
        raise invalid(f"{c.op.name}: {len(pads)} [before, after] pairs for rank {len(dims)}")
    y = x
    for axis, ((before, after), dim) in enumerate(zip(pads.tolist(), dims, strict=True)):
        if before < 0 or after < 0 or (dim >= 0 and max(before, after) > dim):
            raise invalid(
                f"{c.op.name}: SYMMETRIC paddings [{before}, {after}] on axis {axis} of size "
                f"{dim}: each must be 0..{dim}"
            )
        if not before and not after:
            continue
        ax, back = c.i64([axis]), c.i64([-1])
        parts = []
        if before:
            parts.append(c.op_("Slice", [y, c.i64([before - 1]), c.i64([_INT64_MIN]), ax, back]))
        parts.append(y)
        if after:
            parts.append(c.op_("Slice", [y, c.i64([-1]), c.i64([-after - 1]), ax, back]))
        y = str(c.op_("Concat", parts, axis=axis))
    return y


StridedSpec = tuple[list[int], list[int], list[int], list[int], list[int], list[int]]
"""(new axes to unsqueeze, begins, ends, axes, steps, axes to squeeze)."""


def strided_spec(
    c: Ctx, begin: np.ndarray, end: np.ndarray, steps: np.ndarray, rank: int
) -> StridedSpec:
    """TensorFlow's strided-slice spec as ONNX steps over the input with its new axes
    inserted: an ellipsis stands for the dims no other entry takes, a new axis is a dim of
    1 (its other bits ignored), a shrunk axis is sliced to one element and squeezed."""
    ellipsis = c.pi("ELLIPSIS_MASK", 0)
    new_axis = c.pi("NEW_AXIS_MASK", 0)
    bmask, emask, shrink = c.pi("BEGIN_MASK", 0), c.pi("END_MASK", 0), c.pi("SHRINK_AXIS_MASK", 0)
    n = len(begin)
    if bin(ellipsis).count("1") > 1:
        raise invalid(f"{c.op.name}: ellipsisMask {ellipsis} has more than one bit")
    takes = sum(1 for i in range(n) if not (new_axis >> i & 1) and not (ellipsis >> i & 1))
    if takes > rank:
        raise invalid(f"{c.op.name}: {takes} sliced dims for an input of rank {rank}")
    unsqueeze: list[int] = []
    begins: list[int] = []
    ends: list[int] = []
    axes: list[int] = []
    strides: list[int] = []
    squeeze: list[int] = []
    pos = 0  # the dim of the input with its new axes inserted
    for i in range(n):
        if ellipsis >> i & 1:
            pos += rank - takes  # those dims are taken whole
            continue
        if new_axis >> i & 1:
            unsqueeze.append(pos)
            pos += 1
            continue
        b, e, s = int(begin[i]), int(end[i]), int(steps[i])
        if s == 0:
            raise invalid(f"{c.op.name}: stride {i} is 0")
        if bmask >> i & 1:
            b = 0 if s > 0 else -1
        if emask >> i & 1:
            e = _INT64_MAX if s > 0 else _INT64_MIN
        if shrink >> i & 1:
            e, s = (b + 1 if b != -1 else _INT64_MAX), 1
            squeeze.append(pos)
        begins.append(b)
        ends.append(e)
        axes.append(pos)
        strides.append(s)
        pos += 1
    return unsqueeze, begins, ends, axes, strides, squeeze
