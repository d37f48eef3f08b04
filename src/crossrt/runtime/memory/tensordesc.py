"""What a tensor is, apart from its memory: placement, format, dtype, shape (NN_TensorDesc)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import dtypes
from ...dtypes import DType
from ...errors import InvalidArgumentError, UnsupportedError
from ...model import TensorSpec


class Placement(enum.IntEnum):
    """Where a tensor's memory lives (Neuron ``nrt_tensor_placement_t``).

    DEVICE memory comes from the device's allocator (host memory on CPU devices); HOST and
    VIRTUAL memory from the host allocator (crossrt treats them alike).
    """

    DEVICE = 0
    HOST = 1
    VIRTUAL = 2


class Format(enum.IntEnum):
    """How a tensor's dimensions are laid out (``OH_NN_Format``)."""

    NCHW = 1
    NHWC = 2
    ND = 3


def as_dtype(dtype: Any) -> DType:
    """A :class:`DType` from a DType, a name (``"float32"``) or a NumPy dtype."""
    if isinstance(dtype, DType):
        return dtype
    return dtypes.from_name(dtype) if isinstance(dtype, str) else dtypes.from_numpy(dtype)


def fixed_size(dtype: DType) -> DType:
    if not dtype.itemsize:
        raise UnsupportedError(
            f"{dtype} elements have no fixed size, so a Tensor cannot hold them; pass "
            "strings to run() as NumPy arrays instead"
        )
    return dtype


def as_shape(shape: Any, *, dynamic: bool = False) -> tuple[int, ...]:
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # the common case, a tuple of sizes, at a quarter of the cost
    dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    out = []
    for d in dims:
        if d is None or (not isinstance(d, bool) and isinstance(d, int | np.integer) and d == -1):
            if not dynamic:
                raise InvalidArgumentError(
                    f"shape {list(dims)} has a dynamic dimension; a tensor needs sizes, "
                    "give each dimension as an int >= 0"
                )
            out.append(-1)
        elif isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0:
            raise InvalidArgumentError(
                f"shape {list(dims)}: dimension {d!r} is not a size; give ints >= 0"
                + (" (-1 or None for a dynamic one)" if dynamic else "")
            )
        else:
            out.append(int(d))
    return tuple(out)


@dataclass(frozen=True, init=False)
class TensorDesc:
    """Name, dtype, shape and format of a tensor (``NN_TensorDesc``).

    Args:
        name: the tensor's name.
        dtype: a :class:`DType`, a name (``"float32"``) or a NumPy dtype.
        shape: sizes; ``-1`` or ``None`` marks a dynamic dimension.
        format: the layout.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    format: Format

    def __init__(
        self,
        name: str = "",
        dtype: Any = "float32",
        shape: Sequence[int | None] | int = (),
        format: Format = Format.ND,
    ) -> None:
        object.__setattr__(self, "name", str(name))
        object.__setattr__(self, "dtype", as_dtype(dtype))
        object.__setattr__(self, "shape", as_shape(shape, dynamic=True))
        object.__setattr__(self, "format", Format(format))

    @classmethod
    def from_spec(cls, spec: TensorSpec, format: Format = Format.ND) -> TensorDesc:
        """The descriptor of a model input or output (dynamic dims become ``-1``)."""
        if spec.dtype is None or spec.shape is None:
            raise UnsupportedError(f"{spec.name!r} ({spec.describe()}) has no tensor descriptor")
        shape = [d if isinstance(d, int) else -1 for d in spec.shape]
        return cls(spec.name, spec.dtype, shape, format)

    @property
    def is_dynamic(self) -> bool:
        """Whether some dimension is dynamic."""
        return -1 in self.shape

    @property
    def element_count(self) -> int:
        """Number of elements (``OH_NNTensorDesc_GetElementCount``).

        Raises:
            InvalidArgumentError: the shape is dynamic.
        """
        if self.is_dynamic:
            raise InvalidArgumentError(
                f"tensor {self.name!r} has dynamic shape {list(self.shape)}: its element count "
                "is unknown until the dimensions are set"
            )
        return math.prod(self.shape)

    @property
    def byte_size(self) -> int:
        """Bytes of its elements (``OH_NNTensorDesc_GetByteSize``); see :attr:`element_count`."""
        return self.element_count * fixed_size(self.dtype).itemsize


def owner_key(owner: Any) -> str:
    """The accounting key of an owner: a string, or a model's ``memory.owner``."""
    if owner is None:
        return ""
    return owner if isinstance(owner, str) else str(owner.memory.owner)


def byte_index(value: Any, what: str) -> int:
    """``value`` as an offset or a size in bytes: a whole number >= 0 (a NumPy integer too).

    Raises:
        InvalidArgumentError: anything else (a bool, a float, a negative number), naming
            ``what``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidArgumentError(f"{what}={value!r} must be a whole number of bytes >= 0")
    return int(value)
