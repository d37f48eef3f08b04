"""Device memory and tensors, for layers built over the runtime (``crossrt.memory``).

The supported names of the runtime's memory room (``runtime/memory/``), for code that works
with memory directly: the seed layers in ``crossrt.compat`` (``nrt_tensor_*``,
``bm_malloc_device_byte``, ``OH_NNTensor_*``), and a tool or binding that presents crossrt's
memory in another system's terms. Applications need none of it: ``crossrt.Tensor`` and
``crossrt.TensorSet`` are enough. docs/runtime-api.md lists each name; docs/memory.md tells how
memory works.

- tensors: :class:`Tensor` (``Tensor.from_allocation`` views a block of device memory),
  :class:`TensorSet`, :class:`TensorDesc`, :class:`Placement`, :class:`Format`,
  :func:`read_batch`, :func:`write_batch`;
- device memory: :class:`Allocator` (one per device: it allocates through the driver's memory
  hooks and keeps the books), :class:`Allocation` (one block), :func:`allocator_for`,
  :func:`device_allocator`, :class:`MemoryStats`, :class:`OwnerStats`, :func:`owner_key`;
- the allocation log: :func:`memory_log`, :func:`reset_memory_log`, :class:`MemoryLog`;
- checking a caller's arguments: :func:`byte_view` (a buffer as bytes, no copy),
  :func:`byte_index` (an offset or a size).
"""

from __future__ import annotations

from .runtime.memory.allocation import Allocation
from .runtime.memory.allocator import (
    Allocator,
    MemoryStats,
    OwnerStats,
    allocator_for,
    device_allocator,
)
from .runtime.memory.memlog import MemoryLog, memory_log, reset_memory_log
from .runtime.memory.storage import byte_view
from .runtime.memory.tensor import Tensor
from .runtime.memory.tensordesc import Format, Placement, TensorDesc, byte_index, owner_key
from .runtime.memory.tensorset import TensorSet, read_batch, write_batch

__all__ = [
    "Allocation",
    "Allocator",
    "Format",
    "MemoryLog",
    "MemoryStats",
    "OwnerStats",
    "Placement",
    "Tensor",
    "TensorDesc",
    "TensorSet",
    "allocator_for",
    "byte_index",
    "byte_view",
    "device_allocator",
    "memory_log",
    "owner_key",
    "read_batch",
    "reset_memory_log",
    "write_batch",
]
