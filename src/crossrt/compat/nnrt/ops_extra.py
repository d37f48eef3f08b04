"""Translators of the simpler API 12 operations (57-108) to ONNX: element-wise maths,
comparisons, logic and reductions. The others are OH_NN_UNSUPPORTED at AddOperation."""

from __future__ import annotations

import math

from .graph import Ctx, Translator
from .ops_basic import Spec, _binary, _reduce, _unary

__all__ = ["EXTRA_OPS"]


def exp(c: Ctx) -> list[str]:
    """EXP -> base ** (scale * x + shift); base -1 (the default) is e."""
    dt = c.out_dtype()
    x = c.x(0)
    scale, shift, base = c.pf("SCALE", 1.0), c.pf("SHIFT", 0.0), c.pf("BASE", -1.0)
    if scale != 1.0:
        x = c.op_("Mul", [x, c.scalar(scale, dt)])
    if shift != 0.0:
        x = c.op_("Add", [x, c.scalar(shift, dt)])
    if base != -1.0:
        x = c.op_("Mul", [x, c.scalar(math.log(base), dt)])
    return [str(c.op_("Exp", [x]))]


def square(c: Ctx) -> list[str]:
    """SQUARE -> Mul(x, x)."""
    return [str(c.op_("Mul", [c.x(0), c.x(0)]))]


def not_equal(c: Ctx) -> list[str]:
    """NOT_EQUAL -> Not(Equal)."""
    return [str(c.op_("Not", [c.op_("Equal", [c.x(0), c.x(1)])]))]


def leaky_relu(c: Ctx) -> list[str]:
    """LEAKY_RELU -> LeakyRelu(alpha = negativeSlope)."""
    return [str(c.op_("LeakyRelu", [c.x(0)], alpha=c.pf("NEGATIVE_SLOPE", 0.0)))]


def clip(c: Ctx) -> list[str]:
    """CLIP -> Clip(min, max)."""
    dt = c.out_dtype()
    lo = None if c.p("MIN") is None else c.scalar(c.pf("MIN", 0.0), dt)
    hi = None if c.p("MAX") is None else c.scalar(c.pf("MAX", 0.0), dt)
    return [str(c.op_("Clip", [c.x(0), lo, hi]))]


def swish(c: Ctx) -> list[str]:
    """SWISH -> x * Sigmoid(x)."""
    return [str(c.op_("Mul", [c.x(0), c.op_("Sigmoid", [c.x(0)])]))]


def flatten(c: Ctx) -> list[str]:
    """FLATTEN -> Flatten(axis)."""
    return [str(c.op_("Flatten", [c.x(0)], axis=c.pi("AXIS", 1)))]


def log_softmax(c: Ctx) -> list[str]:
    """LOG_SOFTMAX -> LogSoftmax(axis)."""
    return [str(c.op_("LogSoftmax", [c.x(0)], axis=c.pi("AXIS", -1)))]


def rank(c: Ctx) -> list[str]:
    """RANK -> Size(Shape(x)) as a [1] tensor (NNRt shapes have a dim at least), cast to the
    output's type."""
    size = c.op_("Reshape", [c.op_("Size", [c.op_("Shape", [c.x(0)])]), c.i64([1])])
    return [c.cast(size)]


def select(c: Ctx) -> list[str]:
    """SELECT / WHERE -> Where(condition, x, y)."""
    return [str(c.op_("Where", [c.x(0), c.x(1), c.x(2)]))]


_1, _2, _3 = (1, 1), (2, 2), (3, 3)


def _u(op: str) -> tuple[Translator, tuple[int, int], tuple[int, int]]:
    return _unary(op), _1, _1


def _b(op: str) -> tuple[Translator, tuple[int, int], tuple[int, int]]:
    return _binary(op), _2, _1


EXTRA_OPS: dict[str, Spec] = {
    "ABS": _u("Abs"),
    "ERF": _u("Erf"),
    "EXP": (exp, _1, _1),
    "LESS": _b("Less"),
    "SELECT": (select, _3, _1),
    "SQUARE": (square, _1, _1),
    "FLATTEN": (flatten, _1, _1),
    "EQUAL": _b("Equal"),
    "GREATER": _b("Greater"),
    "NOT_EQUAL": (not_equal, _2, _1),
    "GREATER_EQUAL": _b("GreaterOrEqual"),
    "LEAKY_RELU": (leaky_relu, _1, _1),
    "CLIP": (clip, _1, _1),
    "COS": _u("Cos"),
    "LOG": _u("Log"),
    "LOGICAL_AND": _b("And"),
    "LOGICAL_NOT": _u("Not"),
    "LOGICAL_OR": _b("Or"),
    "NEG": _u("Neg"),
    "RECIPROCAL": _u("Reciprocal"),
    "SIN": _u("Sin"),
    "WHERE": (select, _3, _1),
    "CEIL": _u("Ceil"),
    "FLOOR": _u("Floor"),
    "LOG_SOFTMAX": (log_softmax, _1, _1),
    "MINIMUM": _b("Min"),
    "RANK": (rank, _1, _1),
    "REDUCE_MAX": (_reduce("ReduceMax"), (1, 2), _1),
    "REDUCE_MIN": (_reduce("ReduceMin"), (1, 2), _1),
    "REDUCE_SUM": (_reduce("ReduceSum"), (1, 2), _1),
    "ROUND": _u("Round"),
    "SWISH": (swish, _1, _1),
}
"""Op name (without ``OH_NN_OPS_``) -> (translator, (min, max) inputs, (min, max) outputs)."""
