"""The BMRuntime structs as Python classes: ``bm_shape_t``, ``bm_tensor_t``,
``bm_stage_info_t``, ``bm_net_info_t``, ``memory_t`` / ``mem_info_t``, and the
``bm_data_type_t`` / ``bm_store_mode_t`` / ``bm_runtime_flag_t`` enums, with the shape helpers
of the C API (``bmrt_shape``, ``bmrt_shape_count``...)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any

from ... import dtypes
from ...errors import InvalidArgumentError
from ..bmlib import DeviceMemory
from .contract import seed_call

__all__ = [
    "BM_BFLOAT16",
    "BM_FLOAT16",
    "BM_FLOAT32",
    "BM_INT4",
    "BM_INT8",
    "BM_INT16",
    "BM_INT32",
    "BM_MAX_DIMS_NUM",
    "BM_RUNTIME_AUTO",
    "BM_RUNTIME_CHECK_MEM",
    "BM_RUNTIME_SHARE_MEM",
    "BM_STORE_1N",
    "BM_STORE_2N",
    "BM_STORE_4N",
    "BM_UINT4",
    "BM_UINT8",
    "BM_UINT16",
    "BM_UINT32",
    "bm_data_type_t",
    "bm_dtype",
    "bm_net_info_t",
    "bm_runtime_flag_t",
    "bm_shape_t",
    "bm_stage_info_t",
    "bm_store_mode_t",
    "bm_tensor_t",
    "bmrt_data_type_size",
    "bmrt_shape",
    "bmrt_shape_count",
    "bmrt_shape_is_same",
    "bmrt_tensor_bytesize",
    "bmrt_tensor_device_size",
    "crossrt_dtype",
    "mem_info_t",
    "memory_t",
    "shape_dims",
]

BM_MAX_DIMS_NUM = 8


class bm_data_type_t(IntEnum):
    """Element types as bmruntime numbers them (``bmdef.h``)."""

    BM_FLOAT32 = 0
    BM_FLOAT16 = 1
    BM_INT8 = 2
    BM_UINT8 = 3
    BM_INT16 = 4
    BM_UINT16 = 5
    BM_INT32 = 6
    BM_UINT32 = 7
    BM_BFLOAT16 = 8
    BM_INT4 = 9
    BM_UINT4 = 10


class bm_store_mode_t(IntEnum):
    """How a tensor's elements lie in device memory (see :mod:`.storemode`)."""

    BM_STORE_1N = 0
    BM_STORE_2N = 1
    BM_STORE_4N = 2


class bm_runtime_flag_t(IntFlag):
    """``bmrt_set_flags`` bits (``bmdef.h``)."""

    BM_RUNTIME_AUTO = 0
    BM_RUNTIME_SHARE_MEM = 1 << 0
    BM_RUNTIME_CHECK_MEM = 1 << 1


BM_RUNTIME_AUTO = bm_runtime_flag_t.BM_RUNTIME_AUTO
BM_RUNTIME_SHARE_MEM = bm_runtime_flag_t.BM_RUNTIME_SHARE_MEM
BM_RUNTIME_CHECK_MEM = bm_runtime_flag_t.BM_RUNTIME_CHECK_MEM
BM_FLOAT32 = bm_data_type_t.BM_FLOAT32
BM_FLOAT16 = bm_data_type_t.BM_FLOAT16
BM_INT8 = bm_data_type_t.BM_INT8
BM_UINT8 = bm_data_type_t.BM_UINT8
BM_INT16 = bm_data_type_t.BM_INT16
BM_UINT16 = bm_data_type_t.BM_UINT16
BM_INT32 = bm_data_type_t.BM_INT32
BM_UINT32 = bm_data_type_t.BM_UINT32
BM_BFLOAT16 = bm_data_type_t.BM_BFLOAT16
BM_INT4 = bm_data_type_t.BM_INT4
BM_UINT4 = bm_data_type_t.BM_UINT4
BM_STORE_1N = bm_store_mode_t.BM_STORE_1N
BM_STORE_2N = bm_store_mode_t.BM_STORE_2N
BM_STORE_4N = bm_store_mode_t.BM_STORE_4N

_BY_BM = {d.bm: d for d in dtypes.TABLE if d.bm is not None}


def crossrt_dtype(dtype: int) -> dtypes.DType:
    """The crossrt dtype of a ``bm_data_type_t``."""
    row = _BY_BM.get(int(dtype))
    if row is None:
        raise InvalidArgumentError(f"{dtype!r} is not a bm_data_type_t; give BM_FLOAT32 ... 10")
    return row


@seed_call
def bm_dtype(dtype: dtypes.DType | None) -> bm_data_type_t:
    """The ``bm_data_type_t`` of a crossrt dtype."""
    if dtype is None or dtype.bm is None:
        name = dtype.name if dtype else "a non-tensor value"
        raise InvalidArgumentError(f"{name} has no bm_data_type_t; bmruntime cannot carry it")
    return bm_data_type_t(dtype.bm)


@seed_call
def bmrt_data_type_size(dtype: int) -> int:
    """Bytes per element of a ``bm_data_type_t`` (4-bit types: 1, as bmruntime counts them)."""
    return max(1, crossrt_dtype(dtype).itemsize)


@dataclass
class bm_shape_t:
    """A shape of up to 8 dims: ``bm_shape_t(4, [1, 3, 28, 28])`` as ``{4, {1, 3, 28, 28}}``."""

    num_dims: int = 0
    dims: list[int] = field(default_factory=lambda: [0] * BM_MAX_DIMS_NUM)

    def __post_init__(self) -> None:
        dims = [int(d) for d in self.dims]
        if not 0 <= self.num_dims <= BM_MAX_DIMS_NUM or len(dims) > BM_MAX_DIMS_NUM:
            raise InvalidArgumentError(
                f"bm_shape_t({self.num_dims}, {dims}): at most {BM_MAX_DIMS_NUM} dims"
            )
        self.dims = dims + [0] * (BM_MAX_DIMS_NUM - len(dims))

    @classmethod
    def of(cls, dims: Sequence[int]) -> bm_shape_t:
        """The shape with these dims."""
        return cls(len(dims), list(dims))

    @property
    def shape(self) -> tuple[int, ...]:
        """The first ``num_dims`` dims."""
        return tuple(self.dims[: self.num_dims])


@dataclass
class bm_tensor_t:
    """A tensor in device memory: dtype, shape, device memory and store mode."""

    dtype: bm_data_type_t = BM_FLOAT32
    shape: bm_shape_t = field(default_factory=bm_shape_t)
    device_mem: DeviceMemory | None = None
    st_mode: bm_store_mode_t = BM_STORE_1N


@dataclass
class bm_stage_info_t:
    """One stage: its input and output shapes (``input_mems`` / ``output_mems``, the
    runtime's own buffers in newer bmruntime, are empty: crossrt keeps none per stage)."""

    input_shapes: list[bm_shape_t]
    output_shapes: list[bm_shape_t]
    input_mems: list[DeviceMemory] = field(default_factory=list)
    output_mems: list[DeviceMemory] = field(default_factory=list)


@dataclass
class bm_net_info_t:
    """Everything about one network (``bmrt_get_network_info``)."""

    name: str
    is_dynamic: bool
    input_num: int
    input_names: list[str]
    input_dtypes: list[bm_data_type_t]
    input_scales: list[float]
    output_num: int
    output_names: list[str]
    output_dtypes: list[bm_data_type_t]
    output_scales: list[float]
    stage_num: int
    stages: list[bm_stage_info_t]
    max_input_bytes: list[int]
    max_output_bytes: list[int]
    input_zero_point: list[int]
    output_zero_point: list[int]
    input_loc_devices: list[int]
    output_loc_devices: list[int]
    core_num: int = 1
    addr_mode: int = 0


@dataclass
class memory_t:
    """One device memory of a :class:`mem_info_t`: ``addr`` is the caller's
    ``bm_device_mem_t`` (C: its device address; ``None`` where C has -1, none yet), ``size``
    the bytes it must hold."""

    addr: DeviceMemory | None = None
    size: int = 0
    type: int = 0
    number: int = 1


@dataclass
class mem_info_t:
    """The device memory a bmodel needs, by use (``bmrt_get_bmodel_info`` fills the sizes;
    the caller allocates each and sets ``addr`` for ``bmrt_load_bmodel_with_mem`` and
    ``bmrt_pre_alloc_mem_multi_thread``)."""

    instruction_mem: memory_t = field(default_factory=memory_t)
    variable_instruction_mem: memory_t = field(default_factory=memory_t)
    coeff_mem: memory_t = field(default_factory=memory_t)
    neuron_mem: memory_t = field(default_factory=memory_t)
    io_mem: memory_t = field(default_factory=memory_t)

    def memories(self) -> dict[str, memory_t]:
        """Each memory by its field name."""
        return {
            "instruction_mem": self.instruction_mem,
            "variable_instruction_mem": self.variable_instruction_mem,
            "coeff_mem": self.coeff_mem,
            "neuron_mem": self.neuron_mem,
            "io_mem": self.io_mem,
        }


@seed_call
def bmrt_shape(shape: bm_shape_t, dims: Sequence[int], num_dims: int) -> None:
    """Set ``shape`` to the first ``num_dims`` of ``dims``."""
    new = bm_shape_t(num_dims, list(dims[:num_dims]))
    shape.num_dims, shape.dims = new.num_dims, new.dims


@seed_call
def bmrt_shape_count(shape: bm_shape_t) -> int:
    """The number of elements; 1 for ``num_dims`` 0."""
    return math.prod(shape.shape)


@seed_call
def bmrt_shape_is_same(left: bm_shape_t, right: bm_shape_t) -> bool:
    """Whether the two shapes have the same ``num_dims`` and the same first dims."""
    return left.shape == right.shape


@seed_call
def bmrt_tensor_bytesize(tensor: bm_tensor_t) -> int:
    """Elements times bytes per element."""
    return bmrt_shape_count(tensor.shape) * bmrt_data_type_size(tensor.dtype)


@seed_call
def bmrt_tensor_device_size(tensor: bm_tensor_t) -> int:
    """The size of the tensor's device memory (0 when it has none)."""
    return 0 if tensor.device_mem is None else tensor.device_mem.size


def shape_dims(spec_shape: Any) -> list[int]:
    """A TensorSpec's dims with dynamic ones as -1 (how a dynamic bmodel reports them)."""
    return [d if isinstance(d, int) else -1 for d in spec_shape or ()]
