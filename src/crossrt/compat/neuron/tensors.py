"""``nrt.h``'s tensor and tensor-set API over :class:`crossrt.Tensor` and
:class:`crossrt.TensorSet`.

Data arguments take any Python buffer (bytes, bytearray, memoryview, a NumPy array).
DEVICE tensors live on crossrt's default device (``CROSSRT_DEFAULT_DEVICE``: host memory on
the CPU device, device memory on ``sim``), HOST and VIRTUAL ones in host memory.

In the async execution mode a read, write, copy, memset or free of a tensor that a queued
execution uses waits for that execution first, as libnrt's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...memory import Placement, Tensor, TensorSet, read_batch, write_batch
from . import completion
from .state import _state, set_tensor_nc, tensor_nc
from .status import NRT_STATUS, NrtError, guarded
from .types import HOST_PLACEMENT_MAX, nrt_tensor_placement_t

__all__ = [
    "nrt_add_tensor_to_tensor_set",
    "nrt_allocate_tensor_set",
    "nrt_destroy_tensor_set",
    "nrt_get_tensor_from_tensor_set",
    "nrt_tensor_allocate",
    "nrt_tensor_allocate_empty",
    "nrt_tensor_allocate_slice",
    "nrt_tensor_attach_buffer",
    "nrt_tensor_batch_op_t",
    "nrt_tensor_batch_t",
    "nrt_tensor_copy",
    "nrt_tensor_free",
    "nrt_tensor_get_size",
    "nrt_tensor_get_va",
    "nrt_tensor_memset",
    "nrt_tensor_read",
    "nrt_tensor_read_batch",
    "nrt_tensor_write",
    "nrt_tensor_write_batch",
]


def _tensor(tensor: Any) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{tensor!r} is not an nrt_tensor_t")
    return tensor


def _set(tensor_set: Any) -> TensorSet:
    if not isinstance(tensor_set, TensorSet):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{tensor_set!r} is not an nrt_tensor_set_t")
    return tensor_set


@guarded("pair")
def nrt_tensor_allocate(
    tensor_placement: int, logical_nc_id: int, size: int, name: str = ""
) -> tuple[NRT_STATUS, Tensor | None]:
    """A tensor of ``size`` bytes for core ``logical_nc_id``. HOST placement takes sizes
    under 4 MB, as the seed documents; the name is used in messages only."""
    visible = len(_state.require().cores)
    try:
        placement = nrt_tensor_placement_t(tensor_placement)
    except ValueError:
        raise NrtError(
            NRT_STATUS.NRT_INVALID, f"tensor_placement {tensor_placement!r} is not a placement"
        ) from None
    if not 0 <= logical_nc_id < visible:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"logical_nc_id {logical_nc_id}: this process holds cores 0..{visible - 1}",
        )
    if placement is nrt_tensor_placement_t.NRT_TENSOR_PLACEMENT_HOST and size >= HOST_PLACEMENT_MAX:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"NRT_TENSOR_PLACEMENT_HOST takes sizes under 4 MB, not {size}; use "
            "NRT_TENSOR_PLACEMENT_DEVICE or NRT_TENSOR_PLACEMENT_VIRTUAL",
        )
    tensor = Tensor.allocate(size, placement=Placement(int(placement)), name=name or "")
    set_tensor_nc(tensor, logical_nc_id)
    return NRT_STATUS.NRT_SUCCESS, tensor


@guarded("void")
def nrt_tensor_free(tensor: Tensor | None) -> None:
    """Free ``tensor`` (a slice keeps the memory it shares); ``None`` is ignored, as
    ``nrt_tensor_free`` of a NULL pointer is."""
    if tensor is not None:
        completion.settle(_tensor(tensor))
        tensor.free()


@guarded("pair")
def nrt_tensor_allocate_empty(name: str = "") -> tuple[NRT_STATUS, Tensor | None]:
    """A tensor without memory, for :func:`nrt_tensor_attach_buffer`."""
    return NRT_STATUS.NRT_SUCCESS, Tensor.allocate_empty(name or "")


@guarded()
def nrt_tensor_attach_buffer(tensor: Tensor, buffer: Any, size: int) -> NRT_STATUS:
    """Make ``tensor`` use the caller's ``buffer`` (its first ``size`` bytes), freeing memory
    it owned; the tensor becomes NRT_TENSOR_PLACEMENT_VIRTUAL. The buffer must outlive it."""
    target = _tensor(tensor)
    target.attach_buffer(buffer, size)
    target.placement = Placement.VIRTUAL
    return NRT_STATUS.NRT_SUCCESS


@guarded("pair")
def nrt_tensor_allocate_slice(
    tensor_source: Tensor, offset: int, size: int, name: str = ""
) -> tuple[NRT_STATUS, Tensor | None]:
    """A tensor over ``size`` bytes of ``tensor_source`` from ``offset``, no copy; the memory
    lives until the last tensor using it is freed."""
    source = _tensor(tensor_source)
    part = source.slice(offset, size, name or None)
    set_tensor_nc(part, tensor_nc(source))
    return NRT_STATUS.NRT_SUCCESS, part


@guarded()
def nrt_tensor_read(tensor: Tensor, buf: Any, offset: int, size: int) -> NRT_STATUS:
    """Copy ``size`` bytes from ``offset`` of ``tensor`` into the writable buffer ``buf``."""
    completion.settle(_tensor(tensor))
    tensor.read(buf, offset, size)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_tensor_write(tensor: Tensor, buf: Any, offset: int, size: int) -> NRT_STATUS:
    """Copy ``size`` bytes of ``buf`` into ``tensor`` at ``offset``."""
    completion.settle(_tensor(tensor))
    tensor.write(buf, offset, size)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_tensor_copy(
    src: Tensor, src_offset: int, dst: Tensor, dst_offset: int, size: int
) -> NRT_STATUS:
    """Copy ``size`` bytes between tensors (overlap within one memory is handled)."""
    completion.settle(_tensor(src), _tensor(dst))
    src.copy_to(dst, src_offset, dst_offset, size)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_tensor_memset(tensor: Tensor, offset: int, value: int, size: int) -> NRT_STATUS:
    """Set ``size`` bytes of ``tensor`` from ``offset`` to ``value``."""
    completion.settle(_tensor(tensor))
    tensor.memset(value, offset, size)
    return NRT_STATUS.NRT_SUCCESS


@guarded("value")
def nrt_tensor_get_size(tensor: Tensor) -> int:
    """The tensor's size in bytes (0 for a handle that is not a live tensor)."""
    return _tensor(tensor).size


@guarded("void")
def nrt_tensor_get_va(tensor: Tensor) -> int | None:
    """The host address of the tensor's first byte, ``None`` (NULL) for device memory."""
    target = _tensor(tensor)
    return target.address if target.is_host else None


@dataclass
class nrt_tensor_batch_op_t:
    """One read or write of a batch: ``size`` bytes at ``offset`` to or from ``buffer``."""

    offset: int
    size: int
    buffer: Any


@dataclass
class nrt_tensor_batch_t:
    """The operations of a batch on one tensor."""

    tensor: Tensor
    ops: list[nrt_tensor_batch_op_t]
    num_ops: int


def _batch_ops(batches: Any, num_batches: int) -> list[tuple[Tensor, int, int, Any]]:
    ops = []
    for batch in list(batches)[:num_batches]:
        tensor = _tensor(batch.tensor)
        ops += [(tensor, op.offset, op.size, op.buffer) for op in batch.ops[: batch.num_ops]]
    return ops


@guarded()
def nrt_tensor_read_batch(batches: Any, num_batches: int, unsafe: bool = False) -> NRT_STATUS:
    """Many reads in one call; every operation is checked before any byte moves. ``unsafe``
    skips the wait for queued executions using the tensors (async execution mode)."""
    ops = _batch_ops(batches, num_batches)
    if not unsafe:
        completion.settle(*(op[0] for op in ops))
    read_batch(ops)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_tensor_write_batch(batches: Any, num_batches: int, unsafe: bool = False) -> NRT_STATUS:
    """Many writes in one call; a bad operation leaves every tensor unchanged. ``unsafe``
    skips the wait for queued executions using the tensors (async execution mode)."""
    ops = _batch_ops(batches, num_batches)
    if not unsafe:
        completion.settle(*(op[0] for op in ops))
    write_batch(ops)
    return NRT_STATUS.NRT_SUCCESS


# -- tensor sets -------------------------------------------------------------------------------


@guarded("pair")
def nrt_allocate_tensor_set() -> tuple[NRT_STATUS, TensorSet | None]:
    """An empty tensor set."""
    return NRT_STATUS.NRT_SUCCESS, TensorSet()


@guarded("void")
def nrt_destroy_tensor_set(tensor_set: TensorSet | None) -> None:
    """Empty the set (its tensors are the caller's to free, as in the seed)."""
    if tensor_set is not None:
        _set(tensor_set).clear()


@guarded()
def nrt_add_tensor_to_tensor_set(
    tensor_set: TensorSet, tensor_name: str, tensor: Tensor
) -> NRT_STATUS:
    """Add ``tensor`` under ``tensor_name`` (replacing one of that name)."""
    _set(tensor_set).add(tensor_name, _tensor(tensor))
    return NRT_STATUS.NRT_SUCCESS


@guarded("pair")
def nrt_get_tensor_from_tensor_set(
    tensor_set: TensorSet, tensor_name: str
) -> tuple[NRT_STATUS, Tensor | None]:
    """The tensor added under ``tensor_name``; a name not in the set is NRT_FAILURE."""
    return NRT_STATUS.NRT_SUCCESS, _set(tensor_set)[tensor_name]
