"""``OH_NNQuantParam_*``: per-tensor or per-channel quantization parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .status import OH_NN_ReturnCode, guarded, invalid

__all__ = [
    "NN_QuantParam",
    "OH_NNQuantParam_Create",
    "OH_NNQuantParam_Destroy",
    "OH_NNQuantParam_SetNumBits",
    "OH_NNQuantParam_SetScales",
    "OH_NNQuantParam_SetZeroPoints",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS


@dataclass(eq=False)
class NN_QuantParam:
    """Quantization: one entry (per tensor) or one per channel."""

    scales: list[float] = field(default_factory=list)
    zero_points: list[int] = field(default_factory=list)
    num_bits: list[int] = field(default_factory=list)
    alive: bool = True


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
