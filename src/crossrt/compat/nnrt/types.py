"""NNRt's enums (besides the return, operation and tensor types) and structs, and how
each maps to crossrt's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from ...memory import Format
from .status import invalid

__all__ = [
    "OH_NN_DataType",
    "OH_NN_DeviceType",
    "OH_NN_Format",
    "OH_NN_FuseType",
    "OH_NN_PerformanceMode",
    "OH_NN_Priority",
    "OH_NN_UInt32Array",
]


class OH_NN_DataType(IntEnum):  # the seed's name
    """Element types."""

    OH_NN_UNKNOWN = 0
    OH_NN_BOOL = 1
    OH_NN_INT8 = 2
    OH_NN_INT16 = 3
    OH_NN_INT32 = 4
    OH_NN_INT64 = 5
    OH_NN_UINT8 = 6
    OH_NN_UINT16 = 7
    OH_NN_UINT32 = 8
    OH_NN_UINT64 = 9
    OH_NN_FLOAT16 = 10
    OH_NN_FLOAT32 = 11
    OH_NN_FLOAT64 = 12


class OH_NN_Format(IntEnum):  # the seed's name
    """Tensor layouts (ND since API 11)."""

    OH_NN_FORMAT_NONE = 0
    OH_NN_FORMAT_NCHW = 1
    OH_NN_FORMAT_NHWC = 2
    OH_NN_FORMAT_ND = 3


class OH_NN_PerformanceMode(IntEnum):  # the seed's name
    """Performance modes; the same numbers as :class:`crossrt.drivers.PerformanceMode`."""

    OH_NN_PERFORMANCE_NONE = 0
    OH_NN_PERFORMANCE_LOW = 1
    OH_NN_PERFORMANCE_MEDIUM = 2
    OH_NN_PERFORMANCE_HIGH = 3
    OH_NN_PERFORMANCE_EXTREME = 4


class OH_NN_Priority(IntEnum):  # the seed's name
    """Priorities; the same numbers as :class:`crossrt.drivers.Priority`."""

    OH_NN_PRIORITY_NONE = 0
    OH_NN_PRIORITY_LOW = 1
    OH_NN_PRIORITY_MEDIUM = 2
    OH_NN_PRIORITY_HIGH = 3


class OH_NN_DeviceType(IntEnum):  # the seed's name
    """Device kinds."""

    OH_NN_OTHERS = 0
    OH_NN_CPU = 1
    OH_NN_GPU = 2
    OH_NN_ACCELERATOR = 3


class OH_NN_FuseType(IntEnum):  # the seed's name
    """The activation an operation's ``activationType`` parameter fuses after it."""

    OH_NN_FUSED_NONE = 0
    OH_NN_FUSED_RELU = 1
    OH_NN_FUSED_RELU6 = 2


@dataclass
class OH_NN_UInt32Array:
    """``OH_NN_UInt32Array{data, size}``; a plain list of indices works wherever one is
    taken."""

    data: list[int] = field(default_factory=list)
    size: int = -1

    def __post_init__(self) -> None:
        if self.size == -1:
            self.size = len(self.data)


_NUMPY = {
    OH_NN_DataType.OH_NN_BOOL: np.dtype(np.bool_),
    OH_NN_DataType.OH_NN_INT8: np.dtype(np.int8),
    OH_NN_DataType.OH_NN_INT16: np.dtype(np.int16),
    OH_NN_DataType.OH_NN_INT32: np.dtype(np.int32),
    OH_NN_DataType.OH_NN_INT64: np.dtype(np.int64),
    OH_NN_DataType.OH_NN_UINT8: np.dtype(np.uint8),
    OH_NN_DataType.OH_NN_UINT16: np.dtype(np.uint16),
    OH_NN_DataType.OH_NN_UINT32: np.dtype(np.uint32),
    OH_NN_DataType.OH_NN_UINT64: np.dtype(np.uint64),
    OH_NN_DataType.OH_NN_FLOAT16: np.dtype(np.float16),
    OH_NN_DataType.OH_NN_FLOAT32: np.dtype(np.float32),
    OH_NN_DataType.OH_NN_FLOAT64: np.dtype(np.float64),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}


def numpy_dtype(code: int) -> np.dtype[Any]:
    """The NumPy dtype of an OH_NN_DataType; UNKNOWN or a bad value is INVALID_PARAMETER."""
    try:
        return _NUMPY[OH_NN_DataType(code)]
    except (KeyError, ValueError):
        raise invalid(f"data type {code!r} is not an OH_NN_DataType other than UNKNOWN") from None


def nn_dtype(dtype: Any) -> OH_NN_DataType:
    """The OH_NN_DataType of a NumPy (or crossrt) dtype; UNKNOWN when NNRt has none."""
    try:
        return _FROM_NUMPY.get(np.dtype(getattr(dtype, "numpy", dtype)), OH_NN_DataType(0))
    except TypeError:
        return OH_NN_DataType.OH_NN_UNKNOWN


def crossrt_format(code: int) -> Format:
    """crossrt's Format of an OH_NN_Format: NONE (no layout) is ND."""
    fmt = OH_NN_Format(code)
    return Format.ND if fmt is OH_NN_Format.OH_NN_FORMAT_NONE else Format(int(fmt))


def indices(array: Any, what: str) -> list[int]:
    """The indices of an ``OH_NN_UInt32Array`` or a sequence of ints."""
    if array is None:
        raise invalid(f"{what} is NULL; give an OH_NN_UInt32Array")
    if isinstance(array, OH_NN_UInt32Array):
        data: Sequence[Any] = array.data[: array.size]
        if array.size > len(array.data) or array.size < 0:
            raise invalid(f"{what}: size {array.size} but {len(array.data)} indices")
    else:
        data = array
    out = []
    for i in data:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < 2**32:
            raise invalid(f"{what}: {i!r} is not a uint32 index")
        out.append(int(i))
    return out
