"""Translators of the API 12 operations that need more than one ONNX operator or a layout
(57-108, after ops_extra.py's element-wise ones), and the reasons the rest are refused.

Layouts follow the layer's convention (docs/compat-nnrt.md): DEPTH_TO_SPACE, SPACE_TO_DEPTH,
LRN and INSTANCE_NORM take NHWC data, as MindSpore Lite's kernels do, and are transposed to
ONNX's NCHW around the operator.
"""

from __future__ import annotations

import numpy as np

from .graph import Ctx
from .ops_basic import Spec, _reduce
from .status import NNError, OH_NN_ReturnCode, invalid

__all__ = ["API12_OPS", "REFUSED"]


def _text(c: Ctx, attr: str, default: str, codes: dict[int, str]) -> str:
    """A string-valued parameter: its bytes (a char array) or an int code."""
    v = c.p(attr)
    if v is None:
        return default
    flat = v.reshape(-1)
    if flat.dtype in (np.uint8, np.int8) and flat.size > 1:
        return bytes(flat.astype(np.uint8)).rstrip(b"\0").decode("ascii", "replace").upper()
    code = int(flat[0])
    if code not in codes:
        raise invalid(f"{c.op.name}: {attr} {code} is not one of {codes}")
    return codes[code]


def _unsupported(c: Ctx, what: str) -> NNError:
    return NNError(OH_NN_ReturnCode.OH_NN_UNSUPPORTED, f"{c.op.name}: {what}")


def depth_to_space(c: Ctx) -> list[str]:
    """DEPTH_TO_SPACE (NHWC) -> DepthToSpace(blocksize, mode DCR / CRD) on NCHW."""
    mode = _text(c, "MODE", "DCR", {0: "DCR", 1: "CRD"})
    if mode not in ("DCR", "CRD"):
        raise invalid(f"{c.op.name}: MODE {mode!r} is not DCR or CRD")
    y = c.op_("DepthToSpace", [c.nchw(c.x(0))], blocksize=c.pi("BLOCK_SIZE", 1), mode=mode)
    return [c.nhwc(y)]


def space_to_depth(c: Ctx) -> list[str]:
    """SPACE_TO_DEPTH (NHWC) -> SpaceToDepth(blocksize) on NCHW."""
    y = c.op_("SpaceToDepth", [c.nchw(c.x(0))], blocksize=c.pi("BLOCK_SIZE", 1))
    return [c.nhwc(y)]


def lrn(c: Ctx) -> list[str]:
    """LRN (NHWC, across channels) -> LRN on NCHW: NNRt's (TensorFlow's) sum over
    ``2 * DEPTH_RADIUS + 1`` channels is scaled by ALPHA, ONNX's by ``alpha / size``."""
    region = _text(c, "NORM_REGION", "ACROSS_CHANNELS", {0: "ACROSS_CHANNELS"})
    if region != "ACROSS_CHANNELS":
        raise _unsupported(c, f"NORM_REGION {region!r}: only ACROSS_CHANNELS has an ONNX LRN")
    radius = c.pi("DEPTH_RADIUS", 5)
    size = 2 * radius + 1
    y = c.op_(
        "LRN",
        [c.nchw(c.x(0))],
        size=size,
        alpha=c.pf("ALPHA", 1.0) * size,
        beta=c.pf("BETA", 0.5),
        bias=c.pf("BIAS", 1.0),
    )
    return [c.nhwc(y)]


def instance_norm(c: Ctx) -> list[str]:
    """INSTANCE_NORM (NHWC; scale and bias per channel) -> InstanceNormalization on NCHW."""
    if len(c.shape(0)) != 4:
        raise invalid(f"{c.op.name}: input 0 must be 4-D NHWC, not {c.shape(0)}")
    y = c.op_(
        "InstanceNormalization",
        [c.nchw(c.x(0)), c.x(1), c.x(2)],
        epsilon=c.pf("EPSILON", 1e-5),
    )
    return [c.nhwc(y)]


def _indices(c: Ctx, k: int) -> str:
    """Input ``k`` (an index tensor, shape kept) as int64: folded when constant."""
    data = c.tensor(k).data
    if data is not None:
        return c.i64(data)
    return str(c.op_("Cast", [c.x(k)], to=7))


def gather_nd(c: Ctx) -> list[str]:
    """GATHER_ND -> GatherND(x, int64 indices)."""
    return [str(c.op_("GatherND", [c.x(0), _indices(c, 1)]))]


def scatter_nd(c: Ctx) -> list[str]:
    """SCATTER_ND(indices, updates, shape) -> ScatterND(reduction=add) into zeros of
    ``shape``: duplicate indices sum, as TensorFlow's and MindSpore's scatter_nd."""
    zeros = c.op_("Expand", [c.scalar(0, c.out_dtype()), c.as_i64(2)])
    return [str(c.op_("ScatterND", [zeros, _indices(c, 0), c.x(1)], reduction="add"))]


def sparse_to_dense(c: Ctx) -> list[str]:
    """SPARSE_TO_DENSE(indices, values, shape) -> ScatterND of the values (a scalar is
    repeated) into zeros of ``shape``."""
    dt = c.out_dtype()
    indices = _indices(c, 0)
    count = c.op_("Slice", [c.op_("Shape", [indices]), c.i64([0]), c.i64([1])])
    values = c.op_("Expand", [c.x(1), count])
    zeros = c.op_("Expand", [c.scalar(0, dt), c.as_i64(2)])
    return [str(c.op_("ScatterND", [zeros, indices, values]))]


def hard_sigmoid(c: Ctx) -> list[str]:
    """HARD_SIGMOID -> HardSigmoid(alpha=1/6, beta=1/2): MindSpore Lite's HSigmoid,
    relu6(x + 3) / 6."""
    return [str(c.op_("HardSigmoid", [c.x(0)], alpha=1.0 / 6.0, beta=0.5))]


def mod(c: Ctx) -> list[str]:
    """MOD -> Mod(fmod=1): the remainder takes the dividend's sign (C's ``%`` and
    ``fmod``, as MindSpore Lite's kernel)."""
    return [str(c.op_("Mod", [c.x(0), c.x(1)], fmod=1))]


def l2_normalize(c: Ctx) -> list[str]:
    """L2_NORMALIZE -> x / sqrt(max(sum(x^2 over AXIS), EPSILON)), then the fused
    activation. AXIS defaults to [-1], EPSILON to 1e-4 (MindSpore's)."""
    dt = c.out_dtype()
    axes = c.plist("AXIS", [-1]) or [-1]
    squares = c.op_("ReduceSumSquare", [c.x(0), c.i64(axes)], keepdims=1)
    norm = c.op_("Sqrt", [c.op_("Max", [squares, c.scalar(c.pf("EPSILON", 1e-4), dt)])])
    return [c.fuse(str(c.op_("Div", [c.x(0), norm])), "ACTIVATION_TYPE")]


def broadcast_to(c: Ctx) -> list[str]:
    """BROADCAST_TO -> Expand(SHAPE); a -1 in SHAPE keeps the input's dimension."""
    shape = c.plist("SHAPE")
    if shape is None:
        raise invalid(f"{c.op.name}: give OH_NN_BROADCAST_TO_SHAPE")
    if any(d < 0 for d in shape):
        dims = c.shape(0)
        lead = len(shape) - len(dims)
        for i, d in enumerate(shape):
            if d < 0:
                have = dims[i - lead] if i >= lead else -1
                if have < 0:
                    raise invalid(f"{c.op.name}: SHAPE {shape} keeps dim {i}, which is unknown")
                shape[i] = have
    return [str(c.op_("Expand", [c.x(0), c.i64(shape)]))]


def constant_of_shape(c: Ctx) -> list[str]:
    """CONSTANT_OF_SHAPE(shape) -> Expand(VALUE, shape) in the output's type (DATA_TYPE
    names that type too)."""
    value = c.p("VALUE")
    fill = 0.0 if value is None else value.reshape(-1)[0]
    return [str(c.op_("Expand", [c.scalar(fill, c.out_dtype()), c.as_i64(0)]))]


def range_(c: Ctx) -> list[str]:
    """RANGE -> Range(START, LIMIT, DELTA) in the output's type (the input, if any, only
    gives NNRt the type)."""
    dt = c.out_dtype()
    start, limit, delta = c.p("START"), c.p("LIMIT"), c.p("DELTA")
    if limit is None:
        raise invalid(f"{c.op.name}: give OH_NN_RANGE_LIMIT")
    begin = 0 if start is None else start.reshape(-1)[0]
    step = 1 if delta is None else delta.reshape(-1)[0]
    if step == 0:
        raise invalid(f"{c.op.name}: DELTA must not be 0")
    ends = [c.scalar(v, dt) for v in (begin, limit.reshape(-1)[0], step)]
    return [str(c.op_("Range", ends))]


def unstack(c: Ctx) -> list[str]:
    """UNSTACK -> Split(AXIS) into one piece per output, each Squeezed."""
    axis = c.pi("AXIS", 0)
    dims = c.shape(0)
    n = len(c.op.outputs)
    if not -len(dims) <= axis < len(dims):
        raise invalid(f"{c.op.name}: AXIS {axis} is outside rank {len(dims)}")
    if dims[axis] >= 0 and dims[axis] != n:
        raise invalid(f"{c.op.name}: dim {axis} is {dims[axis]}, so it takes {dims[axis]} outputs")
    parts = [c.x(0)]
    if n > 1:
        parts = list(c.op_("Split", [c.x(0)], outputs=n, axis=axis, num_outputs=n))
    return [str(c.op_("Squeeze", [p, c.i64([axis])])) for p in parts]


REFUSED: dict[str, str] = {
    "LSTM": (
        "NNRt's LSTM takes MindSpore Lite's packed weights, whose layout the seeds do not give; "
        "build the cell from MATMUL, ADD, SIGMOID and TANH-like operations"
    ),
    "ASSERT": "ONNX has no run-time assertion; check the condition in the application",
    "DETECTION_POST_PROCESS": (
        "TFLite's detection post-processing has no ONNX operator; run NMS in the application"
    ),
    "CROP": (
        "CROP's default AXIS and OFFSET are not in the seeds; use SLICE with explicit begin "
        "and size"
    ),
}
"""API 12 operations AddOperation refuses (OH_NN_UNSUPPORTED), with what to do instead."""

_1, _2, _3 = (1, 1), (2, 2), (3, 3)

API12_OPS: dict[str, Spec] = {
    "UNSTACK": (unstack, _1, (1, 2**16)),
    "DEPTH_TO_SPACE": (depth_to_space, _1, _1),
    "RANGE": (range_, (0, 1), _1),
    "INSTANCE_NORM": (instance_norm, _3, _1),
    "CONSTANT_OF_SHAPE": (constant_of_shape, _1, _1),
    "BROADCAST_TO": (broadcast_to, _1, _1),
    "ALL": (_reduce("ReduceMin", boolean=True), (1, 2), _1),
    "MOD": (mod, _2, _1),
    "SPARSE_TO_DENSE": (sparse_to_dense, _3, _1),
    "L2_NORMALIZE": (l2_normalize, _1, _1),
    "LRN": (lrn, _1, _1),
    "SCATTER_ND": (scatter_nd, _3, _1),
    "SPACE_TO_DEPTH": (space_to_depth, _1, _1),
    "REDUCE_L2": (_reduce("ReduceL2"), (1, 2), _1),
    "HARD_SIGMOID": (hard_sigmoid, _1, _1),
    "GATHER_ND": (gather_nd, _2, _1),
}
"""Op name (without ``OH_NN_OPS_``) -> (translator, (min, max) inputs, (min, max) outputs)."""
