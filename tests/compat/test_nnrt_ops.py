"""Every NNRt operation type this layer translates, as a one-op model built through
OH_NNModel_*, compiled for the ``reference`` driver and run through OH_NNExecutor_RunSync,
against NumPy (or, for convolutions and pools, the ONNX operator run through crossrt's own
GraphBuilder on NCHW data)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt.compat import nnrt as nn
from crossrt.compat.nnrt.model import OPS

pytestmark = pytest.mark.usefixtures("runtime_dir")

F32 = np.float32
rng = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


class Const:
    """A constant input (SetTensorData) rather than a model input."""

    def __init__(self, value: Any, dtype: Any = None) -> None:
        self.value = np.asarray(value, dtype)


_NN = {np.dtype(v): k for k, v in nn.types._NUMPY.items()}


def _desc(dtype: Any, shape: Sequence[int]) -> nn.NN_TensorDesc:
    d = nn.OH_NNTensorDesc_Create()
    assert nn.OH_NNTensorDesc_SetDataType(d, _NN[np.dtype(dtype)]) == nn.OH_NN_SUCCESS
    if len(shape):
        assert nn.OH_NNTensorDesc_SetShape(d, list(shape)) == nn.OH_NN_SUCCESS
    return d


def run_op(
    op: int,
    inputs: Sequence[Any],
    params: Sequence[tuple[int, Any]] = (),
    outputs: Sequence[tuple[Any, Sequence[int]]] = (),
    driver: str = "reference",
) -> list[np.ndarray]:
    """Build, compile (the ``reference`` driver unless told) and run a one-op model; its
    outputs."""
    model = nn.OH_NNModel_Construct()
    index = 0
    in_idx, feeds, param_idx = [], [], []
    for value in inputs:
        arr = value.value if isinstance(value, Const) else np.asarray(value)
        assert nn.OH_NNModel_AddTensorToModel(model, _desc(arr.dtype, arr.shape)) == 0
        if isinstance(value, Const):
            assert nn.OH_NNModel_SetTensorData(model, index, arr, arr.nbytes) == 0
        else:
            feeds.append((index, arr))
        in_idx.append(index)
        index += 1
    for tag, value in params:
        arr = np.asarray(value)
        assert nn.OH_NNModel_AddTensorToModel(model, _desc(arr.dtype, arr.shape or [1])) == 0
        assert nn.OH_NNModel_SetTensorType(model, index, tag) == 0
        assert nn.OH_NNModel_SetTensorData(model, index, arr.reshape(-1), arr.nbytes) == 0
        param_idx.append(index)
        index += 1
    out_idx = []
    for dtype, shape in outputs:
        assert nn.OH_NNModel_AddTensorToModel(model, _desc(dtype, shape)) == 0
        out_idx.append(index)
        index += 1
    assert nn.OH_NNModel_AddOperation(model, op, param_idx, in_idx, out_idx) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [i for i, _ in feeds], out_idx) == 0
    assert nn.OH_NNModel_Finish(model) == 0
    device = nn.device_id(driver)
    compilation = nn.OH_NNCompilation_Construct(model)
    assert nn.OH_NNCompilation_SetDevice(compilation, device) == 0
    assert nn.OH_NNCompilation_Build(compilation) == 0
    executor = nn.OH_NNExecutor_Construct(compilation)
    assert executor is not None
    in_tensors = []
    for k, (_, arr) in enumerate(feeds):
        t = nn.OH_NNTensor_Create(device, nn.OH_NNExecutor_CreateInputTensorDesc(executor, k))
        nn.OH_NNTensor_GetDataBuffer(t)[...] = arr
        in_tensors.append(t)
    out_tensors = []
    for k, (dtype, shape) in enumerate(outputs):
        size = max(int(np.prod(shape)), 1) * np.dtype(dtype).itemsize
        d = nn.OH_NNExecutor_CreateOutputTensorDesc(executor, k)
        out_tensors.append(nn.OH_NNTensor_CreateWithSize(device, d, size))
    code = nn.OH_NNExecutor_RunSync(
        executor, in_tensors, len(in_tensors), out_tensors, len(out_tensors)
    )
    assert code == nn.OH_NN_SUCCESS
    results = [np.array(nn.OH_NNTensor_GetDataBuffer(t)) for t in out_tensors]
    nn.OH_NNExecutor_Destroy(executor)
    return results


def onnx_ref(op_type: str, inputs: Sequence[np.ndarray], **attrs: Any) -> np.ndarray:
    """The ONNX operator run through crossrt's GraphBuilder, compile and Runtime."""
    b = crossrt.GraphBuilder("ref")
    names = [b.input(f"x{i}", a.dtype, a.shape) for i, a in enumerate(inputs)]
    b.output(b.op(op_type, names, **attrs))
    exe = crossrt.compile(b.finish(), "cpu:0", driver="reference")
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({f"x{i}": a for i, a in enumerate(inputs)})
    return next(iter(out.values()))


def nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def i32(*v: int) -> np.ndarray:
    return np.array(v, np.int32)


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


# Each case: () -> (what the one-op model gave, what it should give).
Case = Callable[[], tuple[list[np.ndarray], list[np.ndarray]]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return register


def _binary(name: str, fn: Callable[[Any, Any], Any], out_dtype: Any = F32) -> None:
    op = nn.OH_NN_OperationType[f"OH_NN_OPS_{name}"]

    def run() -> tuple[list[np.ndarray], list[np.ndarray]]:
        a, b = rand(2, 3), rand(2, 3)
        return run_op(op, [a, b], outputs=[(out_dtype, [2, 3])]), [fn(a, b)]

    CASES[name] = run


def _unary(
    name: str, fn: Callable[[Any], Any], data: Callable[[], np.ndarray] = lambda: rand(2, 3)
) -> None:
    op = nn.OH_NN_OperationType[f"OH_NN_OPS_{name}"]

    def run() -> tuple[list[np.ndarray], list[np.ndarray]]:
        x = data()
        want = np.asarray(fn(x))
        return run_op(op, [x], outputs=[(want.dtype, want.shape)]), [want]

    CASES[name] = run


_binary("BIAS_ADD", np.add)
_binary("LESS_EQUAL", np.less_equal, np.bool_)
_binary("MAXIMUM", np.maximum)
_binary("SQUARED_DIFFERENCE", lambda a, b: (a - b) ** 2)
_binary("LESS", np.less, np.bool_)
_binary("EQUAL", np.equal, np.bool_)
_binary("GREATER", np.greater, np.bool_)
_binary("NOT_EQUAL", np.not_equal, np.bool_)
_binary("GREATER_EQUAL", np.greater_equal, np.bool_)
_binary("MINIMUM", np.minimum)
_unary("HSWISH", lambda x: x * np.clip(x + 3, 0, 6) / 6)
_unary("SIGMOID", lambda x: 1 / (1 + np.exp(-x)))
_unary("SQRT", np.sqrt, lambda: np.abs(rand(2, 3)))
_unary("TANH", np.tanh)
_unary("RSQRT", lambda x: 1 / np.sqrt(x), lambda: np.abs(rand(2, 3)) + 0.5)
_unary("RELU", lambda x: np.maximum(x, 0))
_unary("RELU6", lambda x: np.clip(x, 0, 6), lambda: rand(2, 3) * 4)
_unary("SHAPE", lambda x: np.array(x.shape, np.int32))
_unary("GELU", lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))).astype(F32))
_unary("ABS", np.abs)
_unary("ERF", lambda x: np.vectorize(math.erf)(x).astype(F32))
_unary("EXP", np.exp)
_unary("SQUARE", np.square)
_unary("COS", np.cos)
_unary("LOG", np.log, lambda: np.abs(rand(2, 3)) + 0.1)
_unary("NEG", np.negative)
_unary("RECIPROCAL", np.reciprocal, lambda: np.abs(rand(2, 3)) + 0.5)
_unary("SIN", np.sin)
_unary("CEIL", np.ceil)
_unary("FLOOR", np.floor)
_unary("ROUND", np.round, lambda: np.array([[0.5, 1.5, -2.5], [0.2, 2.7, -0.4]], F32))
_unary("SWISH", lambda x: x / (1 + np.exp(-x)))
_unary("LOGICAL_NOT", np.logical_not, lambda: rand(2, 3) > 0)
_unary("FLATTEN", lambda x: x.reshape(2, 12), lambda: rand(2, 3, 4))
_unary("RANK", lambda x: np.array([3], np.int32), lambda: rand(2, 3, 4))


def _activation(name: str, fn: Callable[[Any, Any], Any], tag: str) -> None:
    op = nn.OH_NN_OperationType[f"OH_NN_OPS_{name}"]
    param = nn.OH_NN_TensorType[tag]

    def run() -> tuple[list[np.ndarray], list[np.ndarray]]:
        a, b = rand(2, 3), rand(2, 3) + 3
        got = run_op(op, [a, b], [(param, np.int8(1))], [(F32, [2, 3])])
        relu6 = run_op(op, [a * 4, b], [(param, np.int8(2))], [(F32, [2, 3])])
        return got + relu6, [np.maximum(fn(a, b), 0), np.clip(fn(a * 4, b), 0, 6)]

    CASES[name] = run


_activation("ADD", np.add, "OH_NN_ADD_ACTIVATIONTYPE")
_activation("SUB", np.subtract, "OH_NN_SUB_ACTIVATIONTYPE")
_activation("MUL", np.multiply, "OH_NN_MUL_ACTIVATION_TYPE")
_activation("DIV", np.divide, "OH_NN_DIV_ACTIVATIONTYPE")


@case("LOGICAL_AND")
def _logical_and() -> Any:
    a, b = rand(2, 3) > 0, rand(2, 3) > 0
    return run_op(nn.OH_NN_OPS_LOGICAL_AND, [a, b], outputs=[(np.bool_, [2, 3])]), [a & b]


@case("LOGICAL_OR")
def _logical_or() -> Any:
    a, b = rand(2, 3) > 0, rand(2, 3) > 0
    return run_op(nn.OH_NN_OPS_LOGICAL_OR, [a, b], outputs=[(np.bool_, [2, 3])]), [a | b]


@case("SELECT")
def _select() -> Any:
    cond, a, b = rand(2, 3) > 0, rand(2, 3), rand(2, 3)
    return run_op(nn.OH_NN_OPS_SELECT, [cond, a, b], outputs=[(F32, [2, 3])]), [
        np.where(cond, a, b)
    ]


@case("WHERE")
def _where() -> Any:
    cond, a, b = rand(2, 3) > 0, rand(2, 3), rand(2, 3)
    return run_op(nn.OH_NN_OPS_WHERE, [cond, a, b], outputs=[(F32, [2, 3])]), [np.where(cond, a, b)]


@case("LEAKY_RELU")
def _leaky() -> Any:
    x = rand(2, 3)
    got = run_op(
        nn.OH_NN_OPS_LEAKY_RELU,
        [x],
        [(nn.OH_NN_LEAKY_RELU_NEGATIVE_SLOPE, F32(0.1))],
        [(F32, [2, 3])],
    )
    return got, [np.where(x > 0, x, 0.1 * x)]


@case("CLIP")
def _clip() -> Any:
    x = rand(2, 3)
    params = [(nn.OH_NN_CLIP_MIN, F32(-0.5)), (nn.OH_NN_CLIP_MAX, F32(0.5))]
    return run_op(nn.OH_NN_OPS_CLIP, [x], params, [(F32, [2, 3])]), [np.clip(x, -0.5, 0.5)]


@case("LOG_SOFTMAX")
def _log_softmax() -> Any:
    x = rand(2, 3)
    e = np.exp(x - x.max(1, keepdims=True))
    want = np.log(e / e.sum(1, keepdims=True))
    return run_op(
        nn.OH_NN_OPS_LOG_SOFTMAX, [x], [(nn.OH_NN_LOG_SOFTMAX_AXIS, i64(1))], [(F32, [2, 3])]
    ), [want]


@case("AVG_POOL")
def _avg_pool() -> Any:
    x = rand(1, 4, 4, 2)
    params = [(nn.OH_NN_AVG_POOL_KERNEL_SIZE, i64(2, 2)), (nn.OH_NN_AVG_POOL_STRIDE, i64(2, 2))]
    got = run_op(nn.OH_NN_OPS_AVG_POOL, [x], params, [(F32, [1, 2, 2, 2])])
    glob = run_op(
        nn.OH_NN_OPS_AVG_POOL,
        [x],
        [(nn.OH_NN_AVG_POOL_GLOBAL, np.bool_(True))],
        [(F32, [1, 1, 1, 2])],
    )
    want = nhwc(onnx_ref("AveragePool", [nchw(x)], kernel_shape=[2, 2], strides=[2, 2]))
    return got + glob, [want, x.mean((1, 2), keepdims=True)]


@case("MAX_POOL")
def _max_pool() -> Any:
    x = rand(1, 5, 5, 2)
    params = [
        (nn.OH_NN_MAX_POOL_KERNEL_SIZE, i64(3, 3)),
        (nn.OH_NN_MAX_POOL_STRIDE, i64(2, 2)),
        (nn.OH_NN_MAX_POOL_PAD, i64(1, 1, 1, 1)),
        (nn.OH_NN_MAX_POOL_ACTIVATION_TYPE, np.int8(1)),
    ]
    got = run_op(nn.OH_NN_OPS_MAX_POOL, [x], params, [(F32, [1, 3, 3, 2])])
    want = onnx_ref("MaxPool", [nchw(x)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return got, [np.maximum(nhwc(want), 0)]


@case("BATCH_NORM")
def _batch_norm() -> Any:
    x, scale, offset, mean = rand(2, 3, 4), rand(4), rand(4), rand(4)
    var = np.abs(rand(4)) + 0.5
    got = run_op(
        nn.OH_NN_OPS_BATCH_NORM,
        [x, Const(scale), Const(offset), Const(mean), Const(var)],
        [(nn.OH_NN_BATCH_NORM_EPSILON, F32(1e-3))],
        [(F32, [2, 3, 4])],
    )
    return got, [(x - mean) / np.sqrt(var + F32(1e-3)) * scale + offset]


@case("BATCH_TO_SPACE_ND")
def _batch_to_space() -> Any:
    x = rand(4, 2, 2, 1)
    params = [
        (nn.OH_NN_BATCH_TO_SPACE_ND_BLOCKSIZE, i64(2, 2)),
        (nn.OH_NN_BATCH_TO_SPACE_ND_CROPS, i64(0, 0, 0, 1)),
    ]
    got = run_op(nn.OH_NN_OPS_BATCH_TO_SPACE_ND, [x], params, [(F32, [1, 4, 3, 1])])
    full = x.reshape(2, 2, 1, 2, 2, 1).transpose(2, 3, 0, 4, 1, 5).reshape(1, 4, 4, 1)
    return got, [full[:, :, :3]]


@case("SPACE_TO_BATCH_ND")
def _space_to_batch() -> Any:
    x = rand(1, 4, 2, 1)
    params = [
        (nn.OH_NN_SPACE_TO_BATCH_ND_BLOCK_SHAPE, i64(2, 2)),
        (nn.OH_NN_SPACE_TO_BATCH_ND_PADDINGS, i64(0, 0, 1, 1)),
    ]
    got = run_op(nn.OH_NN_OPS_SPACE_TO_BATCH_ND, [x], params, [(F32, [4, 2, 2, 1])])
    p = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
    want = p.reshape(1, 2, 2, 2, 2, 1).transpose(2, 4, 0, 1, 3, 5).reshape(4, 2, 2, 1)
    return got, [want]


@case("CAST")
def _cast() -> Any:
    x = rand(2, 3) * 5
    got = run_op(
        nn.OH_NN_OPS_CAST, [x, Const([nn.OH_NN_INT32], np.int32)], outputs=[(np.int32, [2, 3])]
    )
    return got, [x.astype(np.int32)]


@case("CONCAT")
def _concat() -> Any:
    a, b, c = rand(2, 1), rand(2, 2), rand(2, 3)
    got = run_op(nn.OH_NN_OPS_CONCAT, [a, b, c], [(nn.OH_NN_CONCAT_AXIS, i64(1))], [(F32, [2, 6])])
    return got, [np.concatenate([a, b, c], 1)]


@case("CONV2D")
def _conv2d() -> Any:
    x, w, bias = rand(1, 5, 5, 4), rand(6, 3, 3, 2), rand(6)
    params = [
        (nn.OH_NN_CONV2D_STRIDES, i64(2, 2)),
        (nn.OH_NN_CONV2D_PAD, i64(1, 1, 1, 1)),
        (nn.OH_NN_CONV2D_DILATION, i64(1, 1)),
        (nn.OH_NN_CONV2D_GROUP, i64(2)),
        (nn.OH_NN_CONV2D_ACTIVATION_TYPE, np.int8(1)),
    ]
    got = run_op(nn.OH_NN_OPS_CONV2D, [x, Const(w), Const(bias)], params, [(F32, [1, 3, 3, 6])])
    same = run_op(
        nn.OH_NN_OPS_CONV2D,
        [x, w],
        [(nn.OH_NN_CONV2D_PAD_MODE, i64(0)), (nn.OH_NN_CONV2D_GROUP, i64(2))],
        [(F32, [1, 5, 5, 6])],
    )
    wt = nchw(w)
    ref = onnx_ref("Conv", [nchw(x), wt, bias], strides=[2, 2], pads=[1, 1, 1, 1], group=2)
    ref_same = onnx_ref("Conv", [nchw(x), wt], auto_pad="SAME_UPPER", group=2)
    return got + same, [np.maximum(nhwc(ref), 0), nhwc(ref_same)]


@case("CONV2D_TRANSPOSE")
def _conv2d_transpose() -> Any:
    x, w, bias = rand(1, 3, 3, 2), rand(4, 2, 2, 2), rand(4)
    params = [
        (nn.OH_NN_CONV2D_TRANSPOSE_STRIDES, i64(2, 2)),
        (nn.OH_NN_CONV2D_TRANSPOSE_PAD, i64(0, 0, 0, 0)),
    ]
    got = run_op(
        nn.OH_NN_OPS_CONV2D_TRANSPOSE, [x, Const(w), Const(bias)], params, [(F32, [1, 6, 6, 4])]
    )
    ref = onnx_ref(
        "ConvTranspose",
        [nchw(x), np.ascontiguousarray(w.transpose(3, 0, 1, 2)), bias],
        strides=[2, 2],
    )
    return got, [nhwc(ref)]


@case("DEPTHWISE_CONV2D_NATIVE")
def _depthwise() -> Any:
    x, w = rand(1, 4, 4, 3), rand(3, 3, 3, 1)
    params = [(nn.OH_NN_DEPTHWISE_CONV2D_NATIVE_PAD_MODE, i64(1))]
    got = run_op(nn.OH_NN_OPS_DEPTHWISE_CONV2D_NATIVE, [x, Const(w)], params, [(F32, [1, 2, 2, 3])])
    return got, [nhwc(onnx_ref("Conv", [nchw(x), nchw(w)], group=3))]


@case("ELTWISE")
def _eltwise() -> Any:
    a, b = rand(2, 3), rand(2, 3)
    got = [
        run_op(
            nn.OH_NN_OPS_ELTWISE, [a, b], [(nn.OH_NN_ELTWISE_MODE, np.int8(m))], [(F32, [2, 3])]
        )[0]
        for m in (0, 1, 2)
    ]
    return got, [a * b, a + b, np.maximum(a, b)]


@case("EXPAND_DIMS")
def _expand_dims() -> Any:
    x = rand(2, 3)
    return run_op(nn.OH_NN_OPS_EXPAND_DIMS, [x, Const(i32(1))], outputs=[(F32, [2, 1, 3])]), [
        x[:, None]
    ]


@case("FILL")
def _fill() -> Any:
    got = run_op(
        nn.OH_NN_OPS_FILL, [np.array([2.5], F32), Const(i32(2, 3))], outputs=[(F32, [2, 3])]
    )
    return got, [np.full((2, 3), 2.5, F32)]


@case("FULL_CONNECTION")
def _full_connection() -> Any:
    x, w, b = rand(2, 4), rand(3, 4), rand(3)
    params = [
        (nn.OH_NN_FULL_CONNECTION_ACTIVATIONTYPE, np.int8(1)),
        (nn.OH_NN_FULL_CONNECTION_HAS_BIAS, np.bool_(True)),
    ]
    got = run_op(nn.OH_NN_OPS_FULL_CONNECTION, [x, Const(w), Const(b)], params, [(F32, [2, 3])])
    return got, [np.maximum(x @ w.T + b, 0)]


@case("GATHER")
def _gather() -> Any:
    x = rand(4, 3)
    got = run_op(nn.OH_NN_OPS_GATHER, [x, Const(i32(3, 0)), Const(i32(0))], outputs=[(F32, [2, 3])])
    return got, [x[[3, 0]]]


@case("MATMUL")
def _matmul() -> Any:
    a, b = rand(2, 3, 4), rand(2, 5, 4)
    params = [(nn.OH_NN_MATMUL_TRANSPOSE_B, np.bool_(True))]
    return run_op(nn.OH_NN_OPS_MATMUL, [a, b], params, [(F32, [2, 3, 5])]), [
        a @ b.transpose(0, 2, 1)
    ]


@case("ONE_HOT")
def _one_hot() -> Any:
    idx = np.array([0, 2, 1], np.int32)
    got = run_op(
        nn.OH_NN_OPS_ONE_HOT,
        [idx, Const(i32(3)), Const([5.0], F32), Const([-1.0], F32)],
        [(nn.OH_NN_ONE_HOT_AXIS, i64(-1))],
        [(F32, [3, 3])],
    )
    return got, [np.where(np.eye(3, dtype=bool)[idx], 5.0, -1.0).astype(F32)]


@case("PAD")
def _pad() -> Any:
    x = rand(2, 3)
    params = [(nn.OH_NN_PAD_CONSTANT_VALUE, F32(7.0))]
    got = run_op(
        nn.OH_NN_OPS_PAD, [x, Const(i32(1, 0, 0, 2).reshape(2, 2))], params, [(F32, [3, 5])]
    )
    symmetric = [(nn.OH_NN_PAD_PADDING_MODE, i32(2))]
    pads = Const(i32(2, 1, 0, 3).reshape(2, 2))
    got += run_op(nn.OH_NN_OPS_PAD, [x, pads], symmetric, [(F32, [5, 6])])
    return got, [
        np.pad(x, [(1, 0), (0, 2)], constant_values=7.0),
        np.pad(x, [(2, 1), (0, 3)], mode="symmetric"),
    ]


@case("POW")
def _pow() -> Any:
    x, y = np.abs(rand(2, 3)) + 0.5, rand(2, 3)
    params = [(nn.OH_NN_POW_SCALE, F32(2.0)), (nn.OH_NN_POW_SHIFT, F32(1.0))]
    return run_op(nn.OH_NN_OPS_POW, [x, y], params, [(F32, [2, 3])]), [(2 * x + 1) ** y]


@case("SCALE")
def _scale() -> Any:
    x, s, b = rand(2, 3, 4), rand(3), rand(3)
    params = [(nn.OH_NN_SCALE_AXIS, i64(1))]
    got = run_op(nn.OH_NN_OPS_SCALE, [x, Const(s), Const(b)], params, [(F32, [2, 3, 4])])
    return got, [x * s[:, None] + b[:, None]]


@case("SLICE")
def _slice() -> Any:
    x = rand(3, 4)
    got = run_op(
        nn.OH_NN_OPS_SLICE, [x, Const(i32(1, 0)), Const(i32(2, -1))], outputs=[(F32, [2, 4])]
    )
    return got, [x[1:3, 0:]]


@case("SOFTMAX")
def _softmax() -> Any:
    x = rand(2, 3)
    e = np.exp(x - x.max(1, keepdims=True))
    got = run_op(nn.OH_NN_OPS_SOFTMAX, [x], [(nn.OH_NN_SOFTMAX_AXIS, i64(1))], [(F32, [2, 3])])
    return got, [e / e.sum(1, keepdims=True)]


@case("SPLIT")
def _split() -> Any:
    x = rand(2, 6)
    sizes = [(nn.OH_NN_SPLIT_AXIS, i64(1)), (nn.OH_NN_SPLIT_SIZE_SPLITS, i64(1, 5))]
    even = [(nn.OH_NN_SPLIT_AXIS, i64(1)), (nn.OH_NN_SPLIT_OUTPUT_NUM, i64(2))]
    got = run_op(nn.OH_NN_OPS_SPLIT, [x], sizes, [(F32, [2, 1]), (F32, [2, 5])])
    got += run_op(nn.OH_NN_OPS_SPLIT, [x], even, [(F32, [2, 3]), (F32, [2, 3])])
    return got, [x[:, :1], x[:, 1:], x[:, :3], x[:, 3:]]


@case("SQUEEZE")
def _squeeze() -> Any:
    x = rand(2, 1, 3, 1)
    got = run_op(nn.OH_NN_OPS_SQUEEZE, [x], [(nn.OH_NN_SQUEEZE_AXIS, i64(1, 3))], [(F32, [2, 3])])
    return got, [x.reshape(2, 3)]


@case("STACK")
def _stack() -> Any:
    a, b = rand(2, 3), rand(2, 3)
    got = run_op(nn.OH_NN_OPS_STACK, [a, b], [(nn.OH_NN_STACK_AXIS, i64(1))], [(F32, [2, 2, 3])])
    return got, [np.stack([a, b], 1)]


@case("STRIDED_SLICE")
def _strided_slice() -> Any:
    x = rand(4, 6)
    consts = [Const(i32(1, 0)), Const(i32(3, 6)), Const(i32(1, 2))]
    got = run_op(nn.OH_NN_OPS_STRIDED_SLICE, [x, *consts], outputs=[(F32, [2, 3])])
    masks = [
        (nn.OH_NN_STRIDED_SLICE_BEGIN_MASK, i64(1)),
        (nn.OH_NN_STRIDED_SLICE_SHRINK_AXIS_MASK, i64(2)),
    ]
    got += run_op(nn.OH_NN_OPS_STRIDED_SLICE, [x, *consts], masks, [(F32, [3])])
    # TensorFlow's ellipsis and new-axis masks: y[1:3, ..., None, ::2] and y[None, ..., 1].
    y = rand(4, 2, 3, 6)
    spec = [Const(i32(1, 0, 0, 0)), Const(i32(3, 0, 0, 6)), Const(i32(1, 1, 1, 2))]
    masks = [
        (nn.OH_NN_STRIDED_SLICE_ELLIPSIS_MASK, i64(2)),
        (nn.OH_NN_STRIDED_SLICE_NEW_AXIS_MASK, i64(4)),
    ]
    got += run_op(nn.OH_NN_OPS_STRIDED_SLICE, [y, *spec], masks, [(F32, [2, 2, 3, 1, 3])])
    spec = [Const(i32(0, 0, 1)), Const(i32(0, 0, 2)), Const(i32(1, 1, 1))]
    masks = [
        (nn.OH_NN_STRIDED_SLICE_NEW_AXIS_MASK, i64(1)),
        (nn.OH_NN_STRIDED_SLICE_ELLIPSIS_MASK, i64(2)),
        (nn.OH_NN_STRIDED_SLICE_SHRINK_AXIS_MASK, i64(4)),
    ]
    got += run_op(nn.OH_NN_OPS_STRIDED_SLICE, [y, *spec], masks, [(F32, [1, 4, 2, 3])])
    return got, [x[1:3, 0:6:2], x[0:3, 0], y[1:3, ..., None, ::2], y[None, ..., 1]]


@case("TILE")
def _tile() -> Any:
    x = rand(2, 3)
    return run_op(nn.OH_NN_OPS_TILE, [x, Const(i32(2, 1))], outputs=[(F32, [4, 3])]), [
        np.tile(x, (2, 1))
    ]


@case("TRANSPOSE")
def _transpose() -> Any:
    x = rand(2, 3, 4)
    got = run_op(nn.OH_NN_OPS_TRANSPOSE, [x, Const(i32(2, 0, 1))], outputs=[(F32, [4, 2, 3])])
    return got, [x.transpose(2, 0, 1)]


def _reduce(
    name: str, fn: Callable[..., Any], data: Callable[[], np.ndarray] = lambda: rand(2, 3, 4)
) -> None:
    op = nn.OH_NN_OperationType[f"OH_NN_OPS_{name}"]
    keep = nn.OH_NN_TensorType[f"OH_NN_{name}_KEEP_DIMS"]

    def run() -> tuple[list[np.ndarray], list[np.ndarray]]:
        x = data()
        want = np.asarray(fn(x, axis=(1, 2), keepdims=True))
        got = run_op(
            op, [x, Const(i32(1, 2))], [(keep, np.bool_(True))], [(want.dtype, want.shape)]
        )
        flat = np.asarray(fn(x, axis=(1,)))
        got += run_op(op, [x, Const(i32(1))], [], [(flat.dtype, flat.shape)])
        return got, [want, flat]

    CASES[name] = run


_reduce("REDUCE_MEAN", np.mean)
_reduce("REDUCE_PROD", np.prod)
_reduce("REDUCE_ALL", np.all, lambda: rand(2, 3, 4) > -1)
_reduce("REDUCE_MAX", np.max)
_reduce("REDUCE_MIN", np.min)
_reduce("REDUCE_SUM", np.sum)


@case("REDUCE_MEAN_COEFF")
def _reduce_coeff() -> Any:
    x = rand(2, 3, 4)
    params = [
        (nn.OH_NN_REDUCE_MEAN_REDUCE_TO_END, np.bool_(True)),
        (nn.OH_NN_REDUCE_MEAN_COEFF, F32(2.0)),
    ]
    got = run_op(nn.OH_NN_OPS_REDUCE_MEAN, [x, Const(i32(1))], params, [(F32, [2])])
    return got, [x.mean((1, 2)) * 2]


@case("RESIZE_BILINEAR")
def _resize() -> Any:
    x = np.abs(rand(1, 2, 2, 3))
    params = [
        (nn.OH_NN_RESIZE_BILINEAR_NEW_HEIGHT, i64(4)),
        (nn.OH_NN_RESIZE_BILINEAR_NEW_WIDTH, i64(4)),
        (nn.OH_NN_RESIZE_BILINEAR_COORDINATE_TRANSFORM_MODE, i32(2)),
    ]
    got = run_op(nn.OH_NN_OPS_RESIZE_BILINEAR, [x], params, [(F32, [1, 4, 4, 3])])
    b = crossrt.GraphBuilder("ref")
    v = b.input("x", F32, [1, 3, 2, 2])
    b.output(
        b.op(
            "Resize",
            [v, None, b.constant(np.array([1, 1, 2, 2], F32))],
            mode="linear",
            coordinate_transformation_mode="half_pixel",
        )
    )
    with crossrt.Runtime() as rt:
        ref = rt.load(crossrt.compile(b.finish(), "cpu:0", driver="reference")).run({"x": nchw(x)})
    return got, [nhwc(next(iter(ref.values())))]


@case("RESHAPE")
def _reshape() -> Any:
    x = rand(2, 6)
    return run_op(nn.OH_NN_OPS_RESHAPE, [x, Const(i32(3, -1))], outputs=[(F32, [3, 4])]), [
        x.reshape(3, 4)
    ]


@case("PRELU")
def _prelu() -> Any:
    x, slope = rand(2, 2, 3), rand(3)
    got = run_op(nn.OH_NN_OPS_PRELU, [x, Const(slope)], outputs=[(F32, [2, 2, 3])])
    return got, [np.where(x > 0, x, x * slope)]


@case("LAYER_NORM")
def _layer_norm() -> Any:
    x, g, b = rand(2, 3, 4), rand(4), rand(4)
    params = [
        (nn.OH_NN_LAYER_NORM_BEGIN_NORM_AXIS, i32(-1)),
        (nn.OH_NN_LAYER_NORM_EPSILON, F32(1e-5)),
    ]
    got = run_op(nn.OH_NN_OPS_LAYER_NORM, [x, Const(g), Const(b)], params, [(F32, [2, 3, 4])])
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return got, [(x - mean) / np.sqrt(var + 1e-5) * g + b]


@case("QUANT_DTYPE_CAST")
def _quant_dtype_cast() -> Any:
    x = np.array([[1, -2, 3]], np.int8)
    return run_op(nn.OH_NN_OPS_QUANT_DTYPE_CAST, [x], outputs=[(np.int32, [1, 3])]), [
        x.astype(np.int32)
    ]


@case("TOP_K")
def _top_k() -> Any:
    x = rand(2, 5)
    got = run_op(
        nn.OH_NN_OPS_TOP_K,
        [x, Const(i32(2))],
        [(nn.OH_NN_TOP_K_SORTED, np.bool_(True))],
        [(F32, [2, 2]), (np.int32, [2, 2])],
    )
    idx = np.argsort(-x, 1)[:, :2]
    return got, [np.take_along_axis(x, idx, 1), idx.astype(np.int32)]


@case("ARG_MAX")
def _arg_max() -> Any:
    x = rand(2, 5)
    got = run_op(nn.OH_NN_OPS_ARG_MAX, [x], [(nn.OH_NN_ARG_MAX_AXIS, i64(1))], [(np.int32, [2])])
    values = [
        (nn.OH_NN_ARG_MAX_AXIS, i64(1)),
        (nn.OH_NN_ARG_MAX_KEEPDIMS, np.bool_(True)),
        (nn.OH_NN_ARG_MAX_OUT_MAX_VALUE, np.bool_(True)),
    ]
    got += run_op(nn.OH_NN_OPS_ARG_MAX, [x], values, [(F32, [2, 1])])
    return got, [x.argmax(1).astype(np.int32), x.max(1, keepdims=True)]


@case("UNSQUEEZE")
def _unsqueeze() -> Any:
    x = rand(2, 3)
    got = run_op(
        nn.OH_NN_OPS_UNSQUEEZE, [x], [(nn.OH_NN_UNSQUEEZE_AXIS, i64(0))], [(F32, [1, 2, 3])]
    )
    return got, [x[None]]


# -- API 12 operations of ops_api12.py, against NumPy ------------------------------------------

_reduce("ALL", np.all, lambda: rand(2, 3, 4) > -1)
_reduce("REDUCE_L2", lambda x, axis, keepdims=False: np.sqrt((x * x).sum(axis, keepdims=keepdims)))


def _dcr(x: np.ndarray, bs: int) -> np.ndarray:
    """TensorFlow's depth_to_space on NHWC."""
    n, h, w, c = x.shape
    y = x.reshape(n, h, w, bs, bs, c // (bs * bs)).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(y.reshape(n, h * bs, w * bs, c // (bs * bs)))


@case("DEPTH_TO_SPACE")
def _depth_to_space() -> Any:
    x = rand(1, 2, 3, 8)
    params = [(nn.OH_NN_DEPTH_TO_SPACE_BLOCK_SIZE, i64(2))]
    return run_op(nn.OH_NN_OPS_DEPTH_TO_SPACE, [x], params, [(F32, [1, 4, 6, 2])]), [_dcr(x, 2)]


@case("SPACE_TO_DEPTH")
def _space_to_depth() -> Any:
    y = rand(1, 4, 6, 2)
    n, h, w, c = y.shape
    want = y.reshape(n, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 2, 4, 5).reshape(1, 2, 3, 8)
    params = [(nn.OH_NN_SPACE_TO_DEPTH_BLOCK_SIZE, i64(2))]
    got = run_op(nn.OH_NN_OPS_SPACE_TO_DEPTH, [y], params, [(F32, [1, 2, 3, 8])])
    np.testing.assert_array_equal(_dcr(want, 2), y)  # the two are inverses
    return got, [want]


@case("LRN")
def _lrn() -> Any:
    x = rand(1, 2, 2, 7)
    r, bias, alpha, beta = 2, 1.5, 0.3, 0.75
    sq = np.pad(x * x, [(0, 0)] * 3 + [(r, r)])
    sums = np.stack([sq[..., c : c + 2 * r + 1].sum(-1) for c in range(7)], -1)
    params = [
        (nn.OH_NN_LRN_DEPTH_RADIUS, i64(r)),
        (nn.OH_NN_LRN_BIAS, np.float32(bias)),
        (nn.OH_NN_LRN_ALPHA, np.float32(alpha)),
        (nn.OH_NN_LRN_BETA, np.float32(beta)),
    ]
    # onnxruntime: onnx's ReferenceEvaluator (the reference driver) miscomputes LRN.
    got = run_op(nn.OH_NN_OPS_LRN, [x], params, [(F32, [1, 2, 2, 7])], driver="onnxruntime")
    return got, [(x / (bias + alpha * sums) ** beta).astype(F32)]


@case("INSTANCE_NORM")
def _instance_norm() -> Any:
    x, scale, bias = rand(2, 3, 4, 5), rand(5), rand(5)
    mean, var = x.mean((1, 2), keepdims=True), x.var((1, 2), keepdims=True)
    want = ((x - mean) / np.sqrt(var + 1e-3) * scale + bias).astype(F32)
    params = [(nn.OH_NN_INSTANCE_NORM_EPSILON, np.float32(1e-3))]
    got = run_op(
        nn.OH_NN_OPS_INSTANCE_NORM, [x, Const(scale), Const(bias)], params, [(F32, x.shape)]
    )
    return got, [want]


@case("GATHER_ND")
def _gather_nd() -> Any:
    x = rand(3, 4, 2)
    idx = np.array([[0, 1], [2, 3], [1, 0]], np.int32)
    got = run_op(nn.OH_NN_OPS_GATHER_ND, [x, Const(idx)], outputs=[(F32, [3, 2])])
    return got, [x[idx[:, 0], idx[:, 1]]]


@case("SCATTER_ND")
def _scatter_nd() -> Any:
    idx = np.array([[1], [3], [1]], np.int32)  # index 1 twice: the updates sum
    updates = rand(3, 2)
    want = np.zeros((5, 2), F32)
    np.add.at(want, idx[:, 0], updates)
    inputs = [Const(idx), updates, Const(i32(5, 2))]
    return run_op(nn.OH_NN_OPS_SCATTER_ND, inputs, outputs=[(F32, [5, 2])]), [want]


@case("SPARSE_TO_DENSE")
def _sparse_to_dense() -> Any:
    idx = np.array([[0, 1], [2, 0]], np.int32)
    values = rand(2)
    want = np.zeros((3, 2), F32)
    want[idx[:, 0], idx[:, 1]] = values
    inputs = [Const(idx), values, Const(i32(3, 2))]
    return run_op(nn.OH_NN_OPS_SPARSE_TO_DENSE, inputs, outputs=[(F32, [3, 2])]), [want]


_unary("HARD_SIGMOID", lambda x: np.clip(x / 6 + 0.5, 0, 1).astype(F32), lambda: rand(4, 5) * 5)


@case("MOD")
def _mod() -> Any:
    a = np.array([[7, -7, 5], [-5, 9, 0]], np.int32)
    b = np.array([[3, 3, -3], [2, 4, 7]], np.int32)
    x, y = rand(2, 3) * 5, rand(2, 3) + 3
    got = run_op(nn.OH_NN_OPS_MOD, [a, b], outputs=[(np.int32, [2, 3])])
    got += run_op(nn.OH_NN_OPS_MOD, [x, y], outputs=[(F32, [2, 3])])
    return got, [np.array([[1, -1, 2], [-1, 1, 0]], np.int32), np.fmod(x, y)]


@case("L2_NORMALIZE")
def _l2_normalize() -> Any:
    x = rand(2, 3, 4)
    x[0, 0] = 1e-4  # a row whose norm is under epsilon
    params = [(nn.OH_NN_L2_NORMALIZE_AXIS, i64(2)), (nn.OH_NN_L2_NORMALIZE_EPSILON, F32(1e-4))]
    got = run_op(nn.OH_NN_OPS_L2_NORMALIZE, [x], params, [(F32, x.shape)])
    want = x / np.sqrt(np.maximum((x * x).sum(2, keepdims=True), 1e-4))
    relu = [(nn.OH_NN_L2_NORMALIZE_ACTIVATION_TYPE, np.int8(nn.OH_NN_FUSED_RELU))]
    got += run_op(nn.OH_NN_OPS_L2_NORMALIZE, [x], relu, [(F32, x.shape)])
    last = x / np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), 1e-4))  # the defaults
    return got, [want.astype(F32), np.maximum(last, 0).astype(F32)]


@case("BROADCAST_TO")
def _broadcast_to() -> Any:
    x = rand(3, 1)
    params = [(nn.OH_NN_BROADCAST_TO_SHAPE, i64(2, -1, 4))]
    got = run_op(nn.OH_NN_OPS_BROADCAST_TO, [x], params, [(F32, [2, 3, 4])])
    return got, [np.broadcast_to(x, (2, 3, 4))]


@case("CONSTANT_OF_SHAPE")
def _constant_of_shape() -> Any:
    shape = np.array([2, 3], np.int64)
    params = [
        (nn.OH_NN_CONSTANT_OF_SHAPE_DATA_TYPE, i64(nn.OH_NN_FLOAT32)),
        (nn.OH_NN_CONSTANT_OF_SHAPE_VALUE, np.array([2.5], F32)),
    ]
    got = run_op(nn.OH_NN_OPS_CONSTANT_OF_SHAPE, [shape], params, [(F32, [2, 3])])
    return got, [np.full((2, 3), 2.5, F32)]


@case("RANGE")
def _range() -> Any:
    x = np.zeros(1, np.int32)  # NNRt's input only gives the type
    params = [
        (nn.OH_NN_RANGE_START, i64(2)),
        (nn.OH_NN_RANGE_LIMIT, i64(11)),
        (nn.OH_NN_RANGE_DELTA, i64(3)),
    ]
    got = run_op(nn.OH_NN_OPS_RANGE, [x], params, [(np.int32, [3])])
    return got, [np.arange(2, 11, 3, dtype=np.int32)]


@case("UNSTACK")
def _unstack() -> Any:
    x = rand(2, 3, 4)
    params = [(nn.OH_NN_UNSTACK_AXIS, i64(1))]
    got = run_op(nn.OH_NN_OPS_UNSTACK, [x], params, [(F32, [2, 4])] * 3)
    return got, [x[:, i] for i in range(3)]


def test_refused_api12_operations_say_why(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.OH_NNModel_Construct()
    for _ in range(2):
        assert nn.OH_NNModel_AddTensorToModel(model, _desc(F32, [2])) == 0
    for name in ("LSTM", "ASSERT", "DETECTION_POST_PROCESS", "CROP"):
        op = nn.OH_NN_OperationType[f"OH_NN_OPS_{name}"]
        assert nn.OH_NNModel_AddOperation(model, op, [], [0], [1]) == nn.OH_NN_UNSUPPORTED
        assert f"OH_NN_OPS_{name} is not translated: " in caplog.text, name
    # Every operation type is translated or refused with a reason.
    short = {op.name.removeprefix("OH_NN_OPS_") for op in nn.OH_NN_OperationType}
    done = {op.name.removeprefix("OH_NN_OPS_") for op in OPS}
    assert short - done == set(nn.ops_api12.REFUSED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op(name: str) -> None:
    got, want = CASES[name]()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_every_translated_operation_has_a_case() -> None:
    names = {op.name.removeprefix("OH_NN_OPS_") for op in OPS}
    assert names <= set(CASES)
    first_56 = {nn.OH_NN_OperationType(v).name.removeprefix("OH_NN_OPS_") for v in range(1, 57)}
    assert first_56 <= names  # the 56 operations of the seed's version
