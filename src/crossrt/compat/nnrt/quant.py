"""``OH_NNQuantParam_*``: per-tensor or per-channel quantization parameters.

A tensor of an integer type with quantization parameters holds ``q = round(x / scale) +
zero_point``, saturated to its ``numBits``; the model computes on ``x`` (qdq.py lowers the
operations around it). One scale is per tensor; several are per channel of the first
dimension (NNRt's weights, OHWI), which must then be that long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .status import OH_NN_ReturnCode, forbidden, guarded, invalid

__all__ = [
    "NN_QuantParam",
    "OH_NNQuantParam_Create",
    "OH_NNQuantParam_Destroy",
    "OH_NNQuantParam_SetNumBits",
    "OH_NNQuantParam_SetScales",
    "OH_NNQuantParam_SetZeroPoints",
    "check_quant",
    "quant_range",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS


@dataclass(eq=False)
class NN_QuantParam:
    """Quantization: one entry (per tensor) or one per channel."""

    scales: list[float] = field(default_factory=list)
    zero_points: list[int] = field(default_factory=list)
    num_bits: list[int] = field(default_factory=list)
    alive: bool = True


def quant_range(dtype: np.dtype[Any], bits: int) -> tuple[int, int]:
    """The values ``bits`` bits of the integer ``dtype`` hold."""
    if np.issubdtype(dtype, np.signedinteger):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def check_quant(q: NN_QuantParam, dtype: np.dtype[Any], shape: list[int], what: str) -> None:
    """Raise OH_NN_INVALID_PARAMETER for parameters that cannot describe a tensor of
    ``dtype`` and ``shape`` (a float tensor takes any: they are not read for it), and
    OH_NN_OPERATION_FORBIDDEN for a combination this layer cannot compute."""
    if not np.issubdtype(dtype, np.integer):
        return
    count, width = len(q.scales), dtype.itemsize * 8
    if not all(math.isfinite(s) and s > 0 for s in q.scales):
        raise invalid(f"{what}: scales {q.scales} must be finite and > 0")
    if count > 1 and (not shape or shape[0] != count):
        raise invalid(
            f"{what}: {count} scales (per channel) for shape {shape}: per-channel "
            f"parameters are per index of the first dimension; give {shape[:1] or [1]} of "
            "them, or one for the whole tensor"
        )
    for name, values in (("zero points", q.zero_points), ("bit widths", q.num_bits)):
        if len(values) not in (0, 1, count):
            raise invalid(f"{what}: {len(values)} {name} for {count} scales; give 1 or {count}")
    if len(set(q.num_bits)) > 1:
        raise forbidden(f"{what}: per-channel bit widths {q.num_bits} differ; give one width")
    bits = q.num_bits[0] if q.num_bits else width
    if not 1 < bits <= width:
        raise invalid(f"{what}: {bits} bits in a {dtype} tensor; give 2 to {width}")
    lo, hi = quant_range(dtype, bits)
    bad = [z for z in q.zero_points if not lo <= z <= hi]
    if bad:
        raise invalid(f"{what}: zero points {bad} are outside {bits}-bit {dtype} ({lo}..{hi})")


def OH_NNQuantParam_Create() -> NN_QuantParam:
    """An empty quantization parameter object."""
    return NN_QuantParam()


def _quant(q: Any) -> NN_QuantParam:
    if not isinstance(q, NN_QuantParam) or not q.alive:
        raise invalid(f"{q!r} is not a live NN_QuantParam")
    return q


def _values(values: Any, quantCount: int | None, kind: type) -> list[Any]:
    if values is None:
        raise invalid("the values are NULL")
    items = list(values)
    count = len(items) if quantCount is None else quantCount
    if not 0 < count <= len(items):
        raise invalid(f"quantCount {count}: give 1 to {len(items)}")
    return [kind(v) for v in items[:count]]


@guarded()
def OH_NNQuantParam_SetScales(
    quantParams: NN_QuantParam, scales: Any, quantCount: int | None = None
) -> OH_NN_ReturnCode:
    """Scales: 1 (per tensor) or one per channel."""
    _quant(quantParams).scales = _values(scales, quantCount, float)
    return _OK


@guarded()
def OH_NNQuantParam_SetZeroPoints(
    quantParams: NN_QuantParam, zeroPoints: Any, quantCount: int | None = None
) -> OH_NN_ReturnCode:
    """Zero points: 1 (per tensor) or one per channel."""
    _quant(quantParams).zero_points = _values(zeroPoints, quantCount, int)
    return _OK


@guarded()
def OH_NNQuantParam_SetNumBits(
    quantParams: NN_QuantParam, numBits: Any, quantCount: int | None = None
) -> OH_NN_ReturnCode:
    """Bit widths: 1 (per tensor) or one per channel."""
    _quant(quantParams).num_bits = _values(numBits, quantCount, int)
    return _OK


@guarded()
def OH_NNQuantParam_Destroy(quantParams: NN_QuantParam) -> OH_NN_ReturnCode:
    """Free the object."""
    _quant(quantParams).alive = False
    return _OK
