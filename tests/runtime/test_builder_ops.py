"""GraphBuilder: every NNRt operator family, built, compiled and run on both CPU drivers.

Each case builds a small graph with seeded random inputs, compiles it with the
``onnxruntime`` and the ``reference`` driver, runs it through ``Runtime().load(exe).run``,
and compares against a NumPy expectation and across drivers (exact for integer outputs).
The builder's refusals are checked at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import crossrt
from crossrt import GraphBuilder
from crossrt.errors import (
    InvalidArgumentError,
    InvalidModelError,
    OperationForbiddenError,
    StatusCode,
)

DRIVERS = ("onnxruntime", "reference")
F32 = np.float32


@dataclass
class Case:
    """A built graph, its feeds and (optionally) the NumPy expectation per output."""

    model: crossrt.Model
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-5


BUILDERS: dict[str, Callable[[np.random.Generator], Case]] = {}


def case(name: str) -> Callable[[Callable[[np.random.Generator], Case]], Any]:
    def register(fn: Callable[[np.random.Generator], Case]) -> Any:
        assert name not in BUILDERS
        BUILDERS[name] = fn
        return fn

    return register


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


def unary(op: str, x: np.ndarray, expected: np.ndarray | None, **attrs: Any) -> Case:
    b = GraphBuilder(op.lower())
    xi = b.input("x", x.dtype, list(x.shape))
    y = b.op(op, [xi], **attrs)
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: expected} if expected is not None else {})


# -- NumPy references --------------------------------------------------------------------


def np_conv(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    pads: int = 0,
    stride: int = 1,
    group: int = 1,
) -> np.ndarray:
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads, pads), (pads, pads)))
    kh, kw = w.shape[2:]
    win = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    cin = x.shape[1] // group
    cout = w.shape[0] // group
    outs = [
        np.einsum(
            "nchwij,mcij->nmhw",
            win[:, g * cin : (g + 1) * cin],
            w[g * cout : (g + 1) * cout].astype(np.float64),
        )
        for g in range(group)
    ]
    y = np.concatenate(outs, axis=1)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    return y


def np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


def np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- conv --------------------------------------------------------------------------------


@case("conv_bias_pads")
def _(rng: np.random.Generator) -> Case:
    x, w, bias = randn(rng, 2, 3, 7, 7), randn(rng, 4, 3, 3, 3), randn(rng, 4)
    b = GraphBuilder("conv")
    y = b.op(
        "Conv",
        [b.input("x", "float32", [None, 3, 7, 7]), b.constant(w), b.constant(bias)],
        pads=[1, 1, 1, 1],
        kernel_shape=[3, 3],
    )
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: np_conv(x, w, bias, pads=1)})


@case("conv_strided")
def _(rng: np.random.Generator) -> Case:
    x, w = randn(rng, 1, 2, 9, 9), randn(rng, 3, 2, 3, 3)
    b = GraphBuilder("conv_strided")
    y = b.op("Conv", [b.input("x", "float32", [1, 2, 9, 9]), b.constant(w)], strides=[2, 2])
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: np_conv(x, w, None, stride=2)})


@case("conv_depthwise")
def _(rng: np.random.Generator) -> Case:
    x, w = randn(rng, 1, 4, 6, 6), randn(rng, 4, 1, 3, 3)
    b = GraphBuilder("conv_dw")
    y = b.op(
        "Conv", [b.input("x", "float32", [1, 4, 6, 6]), b.constant(w)], group=4, pads=[1, 1, 1, 1]
    )
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: np_conv(x, w, None, pads=1, group=4)})


# -- pooling -----------------------------------------------------------------------------


@case("maxpool")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 3, 8, 8)
    expected = x.reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5))
    return unary("MaxPool", x, expected, kernel_shape=[2, 2], strides=[2, 2])


@case("averagepool_padded")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 1, 2, 5, 5)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=np.nan)
    expected = np.nanmean(sliding_window_view(padded, (3, 3), axis=(2, 3)), axis=(4, 5))
    return unary("AveragePool", x, expected, kernel_shape=[3, 3], pads=[1, 1, 1, 1])


@case("globalaveragepool")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 5, 4, 6)
    return unary("GlobalAveragePool", x, x.mean(axis=(2, 3), keepdims=True))


# -- matmul / gemm -----------------------------------------------------------------------


@case("matmul_batched")
def _(rng: np.random.Generator) -> Case:
    a, w = randn(rng, 2, 3, 5), randn(rng, 5, 4)
    b = GraphBuilder("matmul")
    y = b.op("MatMul", [b.input("a", "float32", [2, 3, 5]), b.constant(w)])
    b.output(y)
    return Case(b.finish(), {"a": a}, {y: a.astype(np.float64) @ w})


@case("gemm_transb")
def _(rng: np.random.Generator) -> Case:
    a, w, c = randn(rng, 3, 6), randn(rng, 4, 6), randn(rng, 4)
    b = GraphBuilder("gemm")
    y = b.op(
        "Gemm",
        [b.input("a", "float32", [3, 6]), b.constant(w), b.constant(c)],
        transB=1,
        alpha=0.5,
        beta=2.0,
    )
    b.output(y)
    return Case(b.finish(), {"a": a}, {y: 0.5 * (a.astype(np.float64) @ w.T) + 2.0 * c})


# -- elementwise -------------------------------------------------------------------------

BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "Max": np.maximum,
    "Min": np.minimum,
}


def _binary(op: str) -> Callable[[np.random.Generator], Case]:
    def build(rng: np.random.Generator) -> Case:
        a = randn(rng, 2, 3, 4)
        c = randn(rng, 3, 1)  # broadcast
        if op in ("Pow", "Div"):
            a = np.abs(a) + F32(0.5)
            c = np.abs(c) + F32(0.5)
        b = GraphBuilder(op.lower())
        y = b.op(op, [b.input("a", "float32", [2, 3, 4]), b.input("c", "float32", [3, 1])])
        b.output(y)
        expected = BINARY[op](a.astype(np.float64), c.astype(np.float64))
        return Case(b.finish(), {"a": a, "c": c}, {y: expected})

    return build


for _op in BINARY:
    case(f"elementwise_{_op.lower()}")(_binary(_op))


UNARY = {
    "Sqrt": (np.sqrt, True),
    "Exp": (np.exp, False),
    "Log": (np.log, True),
    "Abs": (np.abs, False),
    "Neg": (np.negative, False),
    "Tanh": (np.tanh, False),
    "Sigmoid": (lambda v: 1 / (1 + np.exp(-v)), False),
    "Relu": (lambda v: np.maximum(v, 0), False),
}


def _unary(op: str) -> Callable[[np.random.Generator], Case]:
    fn, positive = UNARY[op]

    def build(rng: np.random.Generator) -> Case:
        x = randn(rng, 3, 5)
        if positive:
            x = np.abs(x) + F32(0.1)
        return unary(op, x, fn(x.astype(np.float64)))

    return build


for _op in UNARY:
    case(f"elementwise_{_op.lower()}")(_unary(_op))


@case("elementwise_add_int32")
def _(rng: np.random.Generator) -> Case:
    a = rng.integers(-1000, 1000, (4, 5)).astype(np.int32)
    c = rng.integers(-1000, 1000, (5,)).astype(np.int32)
    b = GraphBuilder("add_int")
    y = b.op("Add", [b.input("a", "int32", [4, 5]), b.constant(c)])
    b.output(y)
    return Case(b.finish(), {"a": a}, {y: a + c})


# -- activations -------------------------------------------------------------------------


@case("relu6_clip")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 4, 8) * F32(5)
    b = GraphBuilder("relu6")
    y = b.op("Clip", [b.input("x", "float32", [4, 8]), b.constant(F32(0)), b.constant(F32(6))])
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: np.clip(x, 0, 6)})


@case("hardswish")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 7) * F32(4)
    x64 = x.astype(np.float64)
    return unary("HardSwish", x, x64 * np.clip(x64 + 3, 0, 6) / 6)


@case("gelu")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 9) * F32(2)
    x64 = x.astype(np.float64)
    c = unary("Gelu", x, 0.5 * x64 * (1 + np_erf(x64 / math.sqrt(2))))
    c.atol = 1e-5
    return c


@case("gelu_tanh")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 9) * F32(2)
    x64 = x.astype(np.float64)
    inner = math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)
    return unary("Gelu", x, 0.5 * x64 * (1 + np.tanh(inner)), approximate="tanh")


@case("leakyrelu")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 9)
    return unary("LeakyRelu", x, np.where(x > 0, x, F32(0.1) * x), alpha=0.1)


# -- normalization -----------------------------------------------------------------------


@case("batchnorm")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 4, 3, 3)
    scale, bias, mean = randn(rng, 4), randn(rng, 4), randn(rng, 4)
    var = np.abs(randn(rng, 4)) + F32(0.5)
    b = GraphBuilder("bn")
    y = b.op(
        "BatchNormalization",
        [b.input("x", "float32", [2, 4, 3, 3]), *(b.constant(v) for v in (scale, bias, mean, var))],
        epsilon=1e-5,
    )
    b.output(y)
    r = lambda v: v.reshape(1, 4, 1, 1).astype(np.float64)  # noqa: E731
    expected = r(scale) * (x - r(mean)) / np.sqrt(r(var) + 1e-5) + r(bias)
    return Case(b.finish(), {"x": x}, {y: expected})


@case("layernorm")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 3, 8)
    gamma, beta = randn(rng, 8), randn(rng, 8)
    b = GraphBuilder("ln")
    y = b.op(
        "LayerNormalization",
        [b.input("x", "float32", [2, 3, 8]), b.constant(gamma), b.constant(beta)],
        axis=-1,
        epsilon=1e-5,
    )
    b.output(y)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    var = x64.var(axis=-1, keepdims=True)
    return Case(b.finish(), {"x": x}, {y: (x64 - mu) / np.sqrt(var + 1e-5) * gamma + beta})


# -- shape and data movement ---------------------------------------------------------------


@case("reshape")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 3, 4)
    b = GraphBuilder("reshape")
    y = b.op("Reshape", [b.input("x", "float32", [2, 3, 4]), b.constant(np.array([4, -1, 2]))])
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: x.reshape(4, -1, 2)})


@case("transpose")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 3, 4, 5)
    return unary("Transpose", x, x.transpose(0, 2, 3, 1), perm=[0, 2, 3, 1])


@case("slice_steps")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 6, 7, 5)
    b = GraphBuilder("slice")
    consts = [b.constant(np.array(v, dtype=np.int64)) for v in ([1, -1], [5, -8], [0, 1], [2, -2])]
    y = b.op("Slice", [b.input("x", "float32", [6, 7, 5]), *consts])
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: x[1:5:2, -1:-8:-2]})


@case("concat")
def _(rng: np.random.Generator) -> Case:
    a, c = randn(rng, 2, 3, 4), randn(rng, 2, 5, 4)
    b = GraphBuilder("concat")
    y = b.op(
        "Concat", [b.input("a", "float32", [2, 3, 4]), b.input("c", "float32", [2, 5, 4])], axis=1
    )
    b.output(y)
    return Case(b.finish(), {"a": a, "c": c}, {y: np.concatenate([a, c], axis=1)})


@case("split_sizes")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 4, 9)
    b = GraphBuilder("split")
    outs = b.op(
        "Split",
        [b.input("x", "float32", [4, 9]), b.constant(np.array([2, 3, 4]))],
        outputs=3,
        axis=1,
    )
    assert isinstance(outs, tuple) and len(outs) == 3
    for o in outs:
        b.output(o)
    parts = np.split(x, [2, 5], axis=1)
    return Case(b.finish(), {"x": x}, dict(zip(outs, parts, strict=True)))


@case("split_num_outputs")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 6, 2)
    b = GraphBuilder("split_n")
    outs = b.op(
        "Split", [b.input("x", "float32", [6, 2])], outputs=["p", "q", "r"], axis=0, num_outputs=3
    )
    assert outs == ("p", "q", "r")
    for o in outs:
        b.output(o)
    return Case(b.finish(), {"x": x}, dict(zip(outs, np.split(x, 3), strict=True)))


@case("gather_axis0")
def _(rng: np.random.Generator) -> Case:
    table = randn(rng, 10, 4)
    idx = np.array([[0, 9], [3, -1], [5, 5]], dtype=np.int64)
    b = GraphBuilder("gather")
    y = b.op("Gather", [b.constant(table), b.input("idx", "int64", [3, 2])], axis=0)
    b.output(y)
    return Case(b.finish(), {"idx": idx}, {y: np.take(table, idx, axis=0)})


@case("gather_axis1_int")
def _(rng: np.random.Generator) -> Case:
    x = rng.integers(-50, 50, (3, 6)).astype(np.int64)
    b = GraphBuilder("gather1")
    y = b.op("Gather", [b.input("x", "int64", [3, 6]), b.constant(np.array([4, 0, 2]))], axis=1)
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: x[:, [4, 0, 2]]})


# -- reductions ----------------------------------------------------------------------------

REDUCE = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max}


def _reduce(op: str, keepdims: int) -> Callable[[np.random.Generator], Case]:
    def build(rng: np.random.Generator) -> Case:
        x = randn(rng, 3, 4, 5)
        b = GraphBuilder(op.lower())
        y = b.op(
            op,
            [b.input("x", "float32", [3, 4, 5]), b.constant(np.array([0, 2]))],
            keepdims=keepdims,
        )
        b.output(y)
        expected = REDUCE[op](x.astype(np.float64), axis=(0, 2), keepdims=bool(keepdims))
        return Case(b.finish(), {"x": x}, {y: expected})

    return build


for _op in REDUCE:
    for _keep in (0, 1):
        case(f"{_op.lower()}_keepdims{_keep}")(_reduce(_op, _keep))


@case("softmax")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 4, 7) * F32(3)
    return unary("Softmax", x, np_softmax(x.astype(np.float64), axis=-1), axis=-1)


@case("softmax_axis1")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 4, 7)
    return unary("Softmax", x, np_softmax(x.astype(np.float64), axis=1), axis=1)


# -- resize --------------------------------------------------------------------------------


@case("resize_nearest_x2")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 1, 2, 3, 4)
    b = GraphBuilder("resize")
    scales = b.constant(np.array([1, 1, 2, 2], dtype=F32))
    y = b.op("Resize", [b.input("x", "float32", [1, 2, 3, 4]), None, scales], mode="nearest")
    b.output(y)
    return Case(b.finish(), {"x": x}, {y: x.repeat(2, axis=2).repeat(2, axis=3)})


@case("resize_linear_sizes")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 1, 1, 4, 4)
    b = GraphBuilder("resize_linear")
    sizes = b.constant(np.array([1, 1, 7, 5], dtype=np.int64))
    y = b.op("Resize", [b.input("x", "float32", [1, 1, 4, 4]), None, None, sizes], mode="linear")
    b.output(y)
    return Case(b.finish(), {"x": x})  # no NumPy expectation: the drivers must agree


# -- top-k, argmax -------------------------------------------------------------------------


@case("topk")
def _(rng: np.random.Generator) -> Case:
    x = rng.permutation(40).reshape(4, 10).astype(F32) / 4  # distinct: no ties
    b = GraphBuilder("topk")
    values, indices = b.op(
        "TopK", [b.input("x", "float32", [4, 10]), b.constant(np.array([3]))], outputs=2, axis=1
    )
    b.output(values)
    b.output(indices)
    order = np.argsort(-x, axis=1)[:, :3]
    return Case(
        b.finish(),
        {"x": x},
        {values: np.take_along_axis(x, order, axis=1), indices: order.astype(np.int64)},
    )


@case("topk_smallest")
def _(rng: np.random.Generator) -> Case:
    x = rng.permutation(30).reshape(5, 6).astype(F32)
    b = GraphBuilder("topk_small")
    values, indices = b.op(
        "TopK",
        [b.input("x", "float32", [5, 6]), b.constant(np.array([2]))],
        outputs=["v", "i"],
        axis=0,
        largest=0,
    )
    b.output(values)
    b.output(indices)
    order = np.argsort(x, axis=0)[:2]
    return Case(
        b.finish(),
        {"x": x},
        {"v": np.take_along_axis(x, order, axis=0), "i": order.astype(np.int64)},
    )


@case("argmax")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 5, 8)
    return unary("ArgMax", x, np.argmax(x, axis=1).astype(np.int64), axis=1, keepdims=0)


@case("argmax_keepdims")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 4, 5)
    return unary("ArgMax", x, np.argmax(x, axis=0)[None].astype(np.int64), axis=0)


# -- cast ----------------------------------------------------------------------------------


def _cast(src: str, dst: str) -> Callable[[np.random.Generator], Case]:
    def build(rng: np.random.Generator) -> Case:
        if src == "float32":
            x = (randn(rng, 4, 6) * F32(50)).astype(F32)
        else:
            x = rng.integers(-100, 100, (4, 6)).astype(src)
        to = crossrt.dtypes.from_name(dst)
        expected = x.astype(np.float64).astype(to.numpy) if dst != "bool" else x != 0
        if to.numpy.kind in "iu":
            expected = np.trunc(x).astype(to.numpy)
        return unary("Cast", x, expected, to=to.onnx)

    return build


for _src, _dst in [
    ("float32", "int32"),
    ("float32", "int64"),
    ("float32", "float16"),
    ("float32", "bool"),
    ("int64", "float32"),
    ("int32", "int8"),
    ("int64", "float64"),
]:
    case(f"cast_{_src}_to_{_dst}")(_cast(_src, _dst))


# -- quantization ----------------------------------------------------------------------------


@case("quantizelinear_uint8")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 3, 8) * F32(3)
    scale, zero = F32(0.05), np.uint8(128)
    b = GraphBuilder("quant")
    y = b.op(
        "QuantizeLinear", [b.input("x", "float32", [3, 8]), b.constant(scale), b.constant(zero)]
    )
    b.output(y)
    expected = np.clip(np.rint(x / scale) + 128, 0, 255).astype(np.uint8)
    return Case(b.finish(), {"x": x}, {y: expected})


@case("quantizelinear_int8_per_axis")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 2, 4) * F32(2)
    scale = np.array([0.01, 0.02, 0.05, 0.1], dtype=F32)
    zero = np.array([0, -3, 5, 10], dtype=np.int8)
    b = GraphBuilder("quant_axis")
    y = b.op(
        "QuantizeLinear",
        [b.input("x", "float32", [2, 4]), b.constant(scale), b.constant(zero)],
        axis=1,
    )
    b.output(y)
    expected = np.clip(np.rint(x / scale) + zero, -128, 127).astype(np.int8)
    return Case(b.finish(), {"x": x}, {y: expected})


@case("dequantizelinear")
def _(rng: np.random.Generator) -> Case:
    q = rng.integers(0, 256, (3, 8)).astype(np.uint8)
    scale, zero = F32(0.05), np.uint8(100)
    b = GraphBuilder("dequant")
    y = b.op(
        "DequantizeLinear", [b.input("q", "uint8", [3, 8]), b.constant(scale), b.constant(zero)]
    )
    b.output(y)
    return Case(b.finish(), {"q": q}, {y: (q.astype(F32) - F32(100)) * scale})


@case("quantize_dequantize_roundtrip")
def _(rng: np.random.Generator) -> Case:
    x = randn(rng, 4, 4)
    scale, zero = F32(0.02), np.uint8(128)
    b = GraphBuilder("qdq")
    s, z = b.constant(scale), b.constant(zero)
    q = b.op("QuantizeLinear", [b.input("x", "float32", [4, 4]), s, z])
    y = b.op("DequantizeLinear", [q, s, z])
    b.output(y)
    q_ref = np.clip(np.rint(x / scale) + 128, 0, 255)
    return Case(b.finish(), {"x": x}, {y: ((q_ref - 128) * scale).astype(F32)})


# -- a small network mixing families ------------------------------------------------------


@case("mini_cnn")
def _(rng: np.random.Generator) -> Case:
    b = GraphBuilder("mini_cnn")
    x = b.input("image", "float32", ["batch", 3, 8, 8])
    h = b.op(
        "Conv",
        [x, b.constant(randn(rng, 8, 3, 3, 3) * F32(0.3)), b.constant(randn(rng, 8))],
        pads=[1, 1, 1, 1],
    )
    h = b.op("Clip", [h, b.constant(F32(0)), b.constant(F32(6))])
    h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("GlobalAveragePool", [h])
    h = b.op("Flatten", [h])
    logits = b.op(
        "Gemm", [h, b.constant(randn(rng, 8, 5)), b.constant(randn(rng, 5))], name="classifier"
    )
    probs = b.op("Softmax", [logits], axis=-1)
    label = b.op("ArgMax", [probs], axis=1, keepdims=0)
    b.output(probs)
    b.output(label)
    return Case(b.finish(), {"image": randn(rng, 2, 3, 8, 8)})


CASE_NAMES = sorted(BUILDERS)

# Known driver bugs, by (case, driver); each must fail until fixed (strict).
BROKEN: dict[tuple[str, str], str] = {}


def _xfail(name: str, driver: str) -> list[pytest.MarkDecorator]:
    reason = BROKEN.get((name, driver))
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


NUMPY_PARAMS = [
    pytest.param(name, driver, id=f"{name}-{driver}", marks=_xfail(name, driver))
    for name in CASE_NAMES
    for driver in DRIVERS
]
AGREE_PARAMS = [pytest.param(name, id=name, marks=_xfail(name, "reference")) for name in CASE_NAMES]


# -- running -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime() -> Iterator[crossrt.Runtime]:
    with crossrt.Runtime() as rt:
        yield rt


@cache
def built(name: str) -> Case:
    seed = sum(map(ord, name))
    return BUILDERS[name](np.random.default_rng(seed))


_RESULTS: dict[tuple[str, str], dict[str, np.ndarray]] = {}


def results(runtime: crossrt.Runtime, name: str, driver: str) -> dict[str, np.ndarray]:
    key = (name, driver)
    if key not in _RESULTS:
        c = built(name)
        exe = crossrt.compile(c.model, driver=driver)
        assert exe.nodes[0].driver == driver
        loaded = runtime.load(exe)
        try:
            _RESULTS[key] = loaded.run({k: v.copy() for k, v in c.feeds.items()})
        finally:
            loaded.unload()
    return _RESULTS[key]


def assert_close(got: np.ndarray, want: np.ndarray, c: Case, what: str) -> None:
    got = np.asarray(got)
    if got.dtype.kind in "iub":
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=c.rtol, atol=c.atol, err_msg=what
        )


@pytest.mark.parametrize("name", CASE_NAMES)
def test_model_is_built_and_typed(name: str) -> None:
    c = built(name)
    assert c.model.proto.producer_name == "crossrt.GraphBuilder"
    assert [s.name for s in c.model.inputs] == list(c.feeds)
    for spec in c.model.outputs:
        assert spec.dtype is not None, f"output {spec.name} has no inferred dtype"
    for out, want in c.expected.items():
        spec = next(s for s in c.model.outputs if s.name == out)
        assert spec.shape is not None and len(spec.shape) == np.ndim(want)


@pytest.mark.parametrize(("name", "driver"), NUMPY_PARAMS)
def test_matches_numpy(runtime: crossrt.Runtime, name: str, driver: str) -> None:
    c = built(name)
    got = results(runtime, name, driver)
    assert list(got) == [s.name for s in c.model.outputs]
    for spec in c.model.outputs:
        out = got[spec.name]
        assert out.dtype == spec.dtype.numpy, f"{spec.name}: {out.dtype} != {spec.dtype}"
        static = [d for d in (spec.shape or ()) if isinstance(d, int)]
        if spec.is_static:
            assert list(out.shape) == static
    # Cases without a NumPy expectation (resize linear, the mini CNN) are checked by
    # test_drivers_agree; here their names, dtypes and static shapes are.
    for out, want in c.expected.items():
        want = np.asarray(want)
        if want.dtype.kind == "f" and got[out].dtype.kind == "f":
            want = want.astype(np.float64)
        assert got[out].shape == want.shape, f"{out}: shape {got[out].shape} != {want.shape}"
        assert_close(got[out], want, c, f"{name} on {driver}: output {out}")


@pytest.mark.parametrize("name", AGREE_PARAMS)
def test_drivers_agree(runtime: crossrt.Runtime, name: str) -> None:
    c = built(name)
    ort_out = results(runtime, name, "onnxruntime")
    ref_out = results(runtime, name, "reference")
    assert ort_out.keys() == ref_out.keys()
    for out in ort_out:
        assert ort_out[out].dtype == ref_out[out].dtype
        assert ort_out[out].shape == ref_out[out].shape
        assert_close(ort_out[out], ref_out[out], c, f"{name}: {out}, onnxruntime vs reference")


def test_every_family_is_covered() -> None:
    ops = {n.op_type for name in CASE_NAMES for n in built(name).model.nodes}
    families = {
        "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "MatMul", "Gemm", "Add", "Sub",
        "Mul", "Div", "Pow", "Sqrt", "Clip", "HardSwish", "Gelu", "BatchNormalization",
        "LayerNormalization", "Reshape", "Transpose", "Slice", "Concat", "Split", "Gather",
        "ReduceMean", "ReduceSum", "ReduceMax", "Softmax", "Resize", "TopK", "ArgMax", "Cast",
        "QuantizeLinear", "DequantizeLinear",
    }  # fmt: skip
    assert families <= ops, f"missing: {sorted(families - ops)}"


# -- the builder's rules -------------------------------------------------------------------


def _finished() -> GraphBuilder:
    b = GraphBuilder("done")
    b.output(b.op("Relu", [b.input("x", "float32", [2])]))
    b.finish()
    return b


FORBIDDEN_AFTER_FINISH: dict[str, Callable[[GraphBuilder], Any]] = {
    "input": lambda b: b.input("y", "float32", [1]),
    "constant": lambda b: b.constant(np.ones(2, F32)),
    "op": lambda b: b.op("Relu", ["x"]),
    "output": lambda b: b.output("x"),
    "finish": lambda b: b.finish(),
}


@pytest.mark.parametrize("action", list(FORBIDDEN_AFTER_FINISH))
def test_finished_builder_refuses_edits(action: str) -> None:
    b = _finished()
    assert b.finished
    with pytest.raises(OperationForbiddenError) as info:
        FORBIDDEN_AFTER_FINISH[action](b)
    err = info.value
    assert err.code is StatusCode.OPERATION_FORBIDDEN
    assert "'done'" in err.message and "finished" in err.message


def test_finish_returns_a_validated_model_once() -> None:
    b = GraphBuilder("once")
    assert not b.finished
    b.output(b.op("Relu", [b.input("x", "float32", [None, 3])]))
    m = b.finish()
    assert isinstance(m, crossrt.Model)
    assert m.name == "once"
    assert m.opsets == {"": crossrt.model.DEFAULT_OPSET}
    assert m.inputs[0].shape == (None, 3)
    assert m.outputs[0].dtype.name == "float32"


@pytest.mark.parametrize(
    "clash",
    [
        lambda b: b.input("x", "float32", [1]),
        lambda b: b.constant(np.ones(1, F32), name="x"),
        lambda b: b.op("Relu", ["x"], outputs=["x"]),
        lambda b: b.op("Relu", ["x"], outputs=["r"]) and b.op("Relu", ["x"], outputs=["r"]),
        lambda b: b.constant(np.ones(1, F32), name="w") and b.input("w", "float32", [1]),
    ],
    ids=["input-input", "constant-input", "op-input", "op-op", "input-constant"],
)
def test_duplicate_value_names_refused(clash: Callable[[GraphBuilder], Any]) -> None:
    b = GraphBuilder("dups")
    b.input("x", "float32", [1])
    with pytest.raises(InvalidArgumentError, match="already used"):
        clash(b)


def test_duplicate_node_names_refused() -> None:
    b = GraphBuilder("dup_nodes")
    x = b.input("x", "float32", [2])
    b.output(b.op("Relu", [x], name="act"))
    with pytest.raises(InvalidArgumentError, match="act"):
        b.op("Sigmoid", [x], name="act")


def test_refused_op_leaves_no_trace() -> None:
    b = GraphBuilder("retry")
    x = b.input("x", "float32", [4])
    with pytest.raises(InvalidArgumentError):
        b.op("Split", [x], outputs=["p", "p"], axis=0, num_outputs=2)
    p, q = b.op("Split", [x], outputs=["p", "q"], axis=0, num_outputs=2)
    assert (p, q) == ("p", "q")


def test_unencodable_attribute_is_an_invalid_argument() -> None:
    b = GraphBuilder("attr")
    x = b.input("x", "float32", [2])
    with pytest.raises(InvalidArgumentError, match="alpha"):
        b.op("LeakyRelu", [x], alpha=object())


def test_unknown_domain_refused() -> None:
    b = GraphBuilder("domains")
    x = b.input("x", "float32", [2])
    with pytest.raises(InvalidArgumentError) as info:
        b.op("Gelu", [x], domain="com.example")
    assert "com.example" in info.value.message and "opsets=" in info.value.message


def test_imported_domain_accepted() -> None:
    b = GraphBuilder("domains", opsets={"com.microsoft": 1})
    x = b.input("x", "float32", [2, 4])
    y = b.op("Gelu", [x], domain="com.microsoft")
    b.output(y, "float32", [2, 4])
    m = b.finish()
    assert m.opsets == {"": crossrt.model.DEFAULT_OPSET, "com.microsoft": 1}
    assert m.nodes[0].domain == "com.microsoft"


def test_no_outputs_refused() -> None:
    b = GraphBuilder("empty")
    b.op("Relu", [b.input("x", "float32", [2])])
    with pytest.raises(InvalidModelError) as info:
        b.finish()
    assert info.value.code is StatusCode.INVALID_MODEL
    assert "no outputs" in info.value.message
    assert not b.finished, "a refused finish() leaves the builder open"


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda b, x: b.op("Relu", [x], alpha=1.0), "alpha"),
        (lambda b, x: b.op("Softmax", [x], axis=5), "Softmax"),
        (lambda b, x: b.op("MatMul", [x, b.constant(np.ones((3, 2), F32))]), "MatMul"),
        (lambda b, x: b.op("Add", [x, b.constant(np.ones(4, np.int64))]), "Add"),
    ],
    ids=["unknown-attribute", "axis-out-of-range", "shape-mismatch", "type-mismatch"],
)
def test_bad_op_makes_finish_raise(build: Callable[[GraphBuilder, str], str], named: str) -> None:
    b = GraphBuilder("bad")
    x = b.input("x", "float32", [2, 4])
    b.output(build(b, x))
    with pytest.raises(InvalidModelError) as info:
        b.finish()
    assert info.value.code is StatusCode.INVALID_MODEL
    assert named in info.value.message


def test_unknown_operator_refused_when_added() -> None:
    b = GraphBuilder("unknown_op")
    x = b.input("x", "float32", [2])
    with pytest.raises(InvalidArgumentError, match="NoSuchOp"):
        b.op("NoSuchOp", [x])


def test_output_of_unknown_value_refused() -> None:
    b = GraphBuilder("dangling")
    b.input("x", "float32", [2])
    b.output("never_made")
    with pytest.raises(InvalidModelError, match="never_made"):
        b.finish()


def test_output_dtype_and_shape_override() -> None:
    b = GraphBuilder("typed")
    x = b.input("x", "float32", [None, 4])
    b.output(b.op("Relu", [x]), "float32", ["batch", 4])
    (out,) = b.finish().outputs
    assert out.shape == ("batch", 4)


def test_op_returns_generated_unique_names() -> None:
    b = GraphBuilder("names")
    x = b.input("x", "float32", [6])
    a, c = b.op("Relu", [x]), b.op("Relu", [x])
    parts = b.op("Split", [x], outputs=3, num_outputs=3)
    names = [a, c, *parts]
    assert len(set(names)) == len(names) == 5
    for n in names:
        b.output(n)
    m = b.finish()
    assert len({n.name for n in m.nodes}) == 3
