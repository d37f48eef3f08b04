"""The enums and structs of ``nrt.h`` and ``nrt_experimental.h`` under the seed's names.

Structs are dataclasses with the C field names; arrays are lists (``tensor_array[i]``,
``shape``). Handles are Python objects: an ``nrt_model_t`` wraps a crossrt LoadedModel, an
``nrt_tensor_t`` *is* a :class:`crossrt.Tensor` and an ``nrt_tensor_set_t`` a
:class:`crossrt.TensorSet`, so a ported program can hand them to crossrt's own API too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, TypeVar

from ...dtypes import DType, from_name
from ...errors import CrossrtError
from ...memory import Tensor, TensorSet
from .status import NRT_STATUS, NrtError

__all__ = [
    "GIT_HASH_LEN",
    "HOST_PLACEMENT_MAX",
    "NRT_DTYPE_BFLOAT16",
    "NRT_DTYPE_FLOAT16",
    "NRT_DTYPE_FLOAT32",
    "NRT_DTYPE_INT8",
    "NRT_DTYPE_INT16",
    "NRT_DTYPE_INT32",
    "NRT_DTYPE_INT64",
    "NRT_DTYPE_UINT8",
    "NRT_DTYPE_UINT16",
    "NRT_DTYPE_UINT32",
    "NRT_DTYPE_UINT64",
    "NRT_DTYPE_UNKNOWN",
    "NRT_FRAMEWORK_TYPE_INVALID",
    "NRT_FRAMEWORK_TYPE_MXNET",
    "NRT_FRAMEWORK_TYPE_NO_FW",
    "NRT_FRAMEWORK_TYPE_PYTORCH",
    "NRT_FRAMEWORK_TYPE_TENSORFLOW",
    "NRT_MAJOR_VERSION",
    "NRT_MINOR_VERSION",
    "NRT_TENSOR_NAME_MAX",
    "NRT_TENSOR_PLACEMENT_DEVICE",
    "NRT_TENSOR_PLACEMENT_HOST",
    "NRT_TENSOR_PLACEMENT_VIRTUAL",
    "NRT_TENSOR_USAGE_INPUT",
    "NRT_TENSOR_USAGE_OUTPUT",
    "RT_VERSION_DETAIL_LEN",
    "dtype_code",
    "nrt_dtype_t",
    "nrt_framework_type_t",
    "nrt_model_info_t",
    "nrt_tensor_info_array_t",
    "nrt_tensor_info_t",
    "nrt_tensor_placement_t",
    "nrt_tensor_set_t",
    "nrt_tensor_t",
    "nrt_tensor_usage_t",
    "nrt_version_t",
    "nrt_vnc_memory_stats_t",
]


NRT_TENSOR_NAME_MAX = 256
"""The longest tensor name ``nrt_tensor_info_t.name`` holds, with its NUL."""

RT_VERSION_DETAIL_LEN = 128
GIT_HASH_LEN = 64
NRT_MAJOR_VERSION = 2
NRT_MINOR_VERSION = 0


class nrt_framework_type_t(IntEnum):
    """Who calls the runtime; only recorded (the seed: "no other impact")."""

    NRT_FRAMEWORK_TYPE_INVALID = 0
    NRT_FRAMEWORK_TYPE_NO_FW = 1
    NRT_FRAMEWORK_TYPE_TENSORFLOW = 2
    NRT_FRAMEWORK_TYPE_PYTORCH = 3
    NRT_FRAMEWORK_TYPE_MXNET = 4


NRT_FRAMEWORK_TYPE_INVALID = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_INVALID
NRT_FRAMEWORK_TYPE_NO_FW = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_NO_FW
NRT_FRAMEWORK_TYPE_TENSORFLOW = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_TENSORFLOW
NRT_FRAMEWORK_TYPE_PYTORCH = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_PYTORCH
NRT_FRAMEWORK_TYPE_MXNET = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_MXNET


class nrt_tensor_placement_t(IntEnum):
    """Where a tensor's memory lives (the same numbers as
    :class:`crossrt.memory.Placement`)."""

    NRT_TENSOR_PLACEMENT_DEVICE = 0
    NRT_TENSOR_PLACEMENT_HOST = 1
    NRT_TENSOR_PLACEMENT_VIRTUAL = 2


NRT_TENSOR_PLACEMENT_DEVICE = nrt_tensor_placement_t.NRT_TENSOR_PLACEMENT_DEVICE
NRT_TENSOR_PLACEMENT_HOST = nrt_tensor_placement_t.NRT_TENSOR_PLACEMENT_HOST
NRT_TENSOR_PLACEMENT_VIRTUAL = nrt_tensor_placement_t.NRT_TENSOR_PLACEMENT_VIRTUAL

HOST_PLACEMENT_MAX = 4 << 20
"""NRT_TENSOR_PLACEMENT_HOST takes sizes under 4 MB (DMA-able host memory, one page run)."""


class nrt_tensor_usage_t(IntEnum):
    """Whether a model tensor is an input or an output."""

    NRT_TENSOR_USAGE_INPUT = 0
    NRT_TENSOR_USAGE_OUTPUT = 1


NRT_TENSOR_USAGE_INPUT = nrt_tensor_usage_t.NRT_TENSOR_USAGE_INPUT
NRT_TENSOR_USAGE_OUTPUT = nrt_tensor_usage_t.NRT_TENSOR_USAGE_OUTPUT


class nrt_dtype_t(IntEnum):
    """Element types as the seed's developer guide numbers them (newer headers renumbered
    them; programs use the names)."""

    NRT_DTYPE_UNKNOWN = 0
    NRT_DTYPE_FLOAT32 = 1
    NRT_DTYPE_FLOAT16 = 2
    NRT_DTYPE_BFLOAT16 = 3
    NRT_DTYPE_INT8 = 4
    NRT_DTYPE_UINT8 = 5
    NRT_DTYPE_INT16 = 6
    NRT_DTYPE_UINT16 = 7
    NRT_DTYPE_INT32 = 8
    NRT_DTYPE_UINT32 = 9
    NRT_DTYPE_INT64 = 10
    NRT_DTYPE_UINT64 = 11


NRT_DTYPE_UNKNOWN = nrt_dtype_t.NRT_DTYPE_UNKNOWN
NRT_DTYPE_FLOAT32 = nrt_dtype_t.NRT_DTYPE_FLOAT32
NRT_DTYPE_FLOAT16 = nrt_dtype_t.NRT_DTYPE_FLOAT16
NRT_DTYPE_BFLOAT16 = nrt_dtype_t.NRT_DTYPE_BFLOAT16
NRT_DTYPE_INT8 = nrt_dtype_t.NRT_DTYPE_INT8
NRT_DTYPE_UINT8 = nrt_dtype_t.NRT_DTYPE_UINT8
NRT_DTYPE_INT16 = nrt_dtype_t.NRT_DTYPE_INT16
NRT_DTYPE_UINT16 = nrt_dtype_t.NRT_DTYPE_UINT16
NRT_DTYPE_INT32 = nrt_dtype_t.NRT_DTYPE_INT32
NRT_DTYPE_UINT32 = nrt_dtype_t.NRT_DTYPE_UINT32
NRT_DTYPE_INT64 = nrt_dtype_t.NRT_DTYPE_INT64
NRT_DTYPE_UINT64 = nrt_dtype_t.NRT_DTYPE_UINT64


def dtype_code(dtype: str | DType | None) -> nrt_dtype_t:
    """The nrt_dtype_t of a crossrt dtype (or name); NRT_DTYPE_UNKNOWN for the others."""
    if dtype is None:
        return NRT_DTYPE_UNKNOWN
    name = dtype if isinstance(dtype, str) else dtype.name
    try:
        key = f"NRT_DTYPE_{from_name(name).name.upper()}"
    except CrossrtError:  # not a tensor element type (a sequence's, a map's)
        return NRT_DTYPE_UNKNOWN
    return nrt_dtype_t.__members__.get(key, NRT_DTYPE_UNKNOWN)


@dataclass
class nrt_tensor_info_t:
    """One input or output of a loaded model."""

    name: str
    usage: nrt_tensor_usage_t
    size: int
    """Bytes of the tensor (0 when its shape is only known at run time)."""
    dtype: nrt_dtype_t
    shape: list[int]
    """Dimensions; a dynamic one is 0."""
    ndim: int


@dataclass
class nrt_tensor_info_array_t:
    """What ``nrt_get_model_tensor_info`` returns: inputs first, then outputs."""

    tensor_count: int
    tensor_array: list[nrt_tensor_info_t] = field(default_factory=list)


@dataclass
class nrt_version_t:
    """What ``nrt_get_version`` fills in: crossrt's version."""

    rt_major: int = 0
    rt_minor: int = 0
    rt_patch: int = 0
    rt_maintenance: int = 0
    rt_detail: str = ""
    git_hash: str = ""


nrt_tensor_t = Tensor
"""A tensor handle is a :class:`crossrt.Tensor`."""

nrt_tensor_set_t = TensorSet
"""A tensor set handle is a :class:`crossrt.TensorSet`."""


@dataclass
class nrt_vnc_memory_stats_t:
    """What ``nrt_get_vnc_memory_stats`` fills in: two ``size_t``."""

    bytes_used: int = 0
    bytes_limit: int = 0
    SIZE: ClassVar[int] = 16
    """``sizeof`` in the seed's header: the size a current caller passes."""


@dataclass
class nrt_model_info_t:
    """What ``nrt_get_model_info`` fills in: one ``uint32_t``."""

    vnc: int = 0
    SIZE: ClassVar[int] = 4
    """``sizeof`` in the seed's header."""


_Struct = TypeVar("_Struct", nrt_vnc_memory_stats_t, nrt_model_info_t)


def versioned(full: _Struct, size_in: int) -> tuple[_Struct, int]:
    """``full`` as libnrt fills it for a caller whose header's struct has ``size_in`` bytes:
    the fields that fit, the rest 0, and the bytes written (``size_out``). Fields are added
    at the end only, so an older caller gets the ones it knows."""
    if isinstance(size_in, bool) or not isinstance(size_in, int) or size_in < 0:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"struct size {size_in!r}: give a size in bytes")
    names = [f.name for f in dataclasses.fields(full)]
    width = full.SIZE // len(names)
    kept = {n: getattr(full, n) if (i + 1) * width <= size_in else 0 for i, n in enumerate(names)}
    return type(full)(**kept), min(size_in, full.SIZE)
