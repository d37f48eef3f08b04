"""A device's memory the BMLib way: :class:`Device` (``bm_handle_t``) with ``malloc``,
``free``, ``memcpy_s2d`` / ``d2s`` / ``d2d``, copies to another device, ``memset`` and
``mmap`` with ``flush`` / ``invalidate``.

On a host-coherent device (every CPU driver) device memory is host memory: ``mmap`` returns
a view of the bytes themselves and ``flush`` / ``invalidate`` do nothing. On a device whose
memory is not host-coherent the contract is enforced, as a cache would punish breaking it:

- ``mmap`` gives a host copy of the device's bytes; after any device write to the memory
  (a copy, a run) it reads as poison (0xDB bytes), stale cache lines, until ``invalidate``
  fetches the device's bytes again;
- a device operation on memory whose mapping holds host writes not yet ``flush``-ed is
  refused (OPERATION_FORBIDDEN), as are ``invalidate`` (it would discard them) and
  ``munmap``;
- ``flush`` after the device wrote the memory since the last ``invalidate`` is refused:
  one side's writes would be lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..drivers import DeviceInfo, Driver, resolve_device
from ..errors import InvalidArgumentError, InvalidHandleError, OperationForbiddenError
from ..memory import (
    Allocation,
    Allocator,
    Format,
    MemoryStats,
    Tensor,
    byte_index,
    byte_view,
    device_allocator,
    owner_key,
)

POISON = 0xDB
"""What a mapping of non-coherent memory reads as after a device write, until ``invalidate``."""


class DeviceMemory:
    """A block of device memory from :meth:`Device.malloc` (``bm_device_mem_t``).

    Attributes:
        device: the device's id.
        size: its size in bytes.
        name: the name given to ``malloc``.
    """

    __slots__ = ("_allocation", "device", "name", "size")

    def __init__(self, allocation: Allocation) -> None:
        self._allocation = allocation
        self.device = allocation.allocator.device.id
        self.size = allocation.nbytes
        self.name = allocation.name

    @property
    def freed(self) -> bool:
        """Whether it was freed."""
        return self._allocation.freed

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return f"DeviceMemory({self.name!r}, {self.size} bytes on {self.device}{state})"


class _Mapping:
    """The host's copy of one block of non-coherent memory, and what it knows about it."""

    def __init__(self, allocation: Allocation) -> None:
        self.allocation = allocation
        # A new mapping has nothing cached: reads reach the device's bytes, as an uncached
        # line is read from DDR. Poison stands for stale cache lines, after a device write.
        self.shadow = np.empty(allocation.nbytes, dtype=np.uint8)
        allocation.allocator.hooks.copy_out(
            allocation.allocator.device, self.shadow.data, allocation.handle, 0
        )
        self.clean = self.shadow.copy()  # the shadow as of the last flush or invalidate
        # The allocation's version the host side last agreed with: device writes after this
        # (poisoning the shadow) must be invalidated before the host writes and flushes.
        self.synced = allocation.version

    def dirty(self, lo: int = 0, hi: int | None = None) -> bool:
        return not np.array_equal(self.shadow[lo:hi], self.clean[lo:hi])

    @property
    def stale(self) -> bool:
        return self.synced != self.allocation.version

    def before_device_access(self, what: str) -> None:
        if self.dirty():
            raise OperationForbiddenError(
                f"{_describe(self.allocation)} is mapped and the host wrote to the mapping "
                f"without flushing; {what} would not see those writes: call "
                "device.flush(mem) first",
                details={"device": self.allocation.allocator.device.id},
            )

    def after_device_write(self) -> None:
        # The device changed the memory: the host copy is stale. Poison it so that a read
        # which skips invalidate sees 0xDB bytes, never plausible old data.
        self.shadow[:] = POISON
        self.clean[:] = POISON


class Device:
    """One device's memory, BMLib style; get one with ``Device.open("cpu:0")``.

    Attributes:
        info: the device.
        coherent: whether its memory is host memory (True for CPU drivers).
    """

    def __init__(self, driver: Driver, info: DeviceInfo) -> None:
        self.info = info
        self._allocator: Allocator = device_allocator(driver, info)
        self.coherent = self._allocator.coherent

    @classmethod
    def open(cls, device: str) -> Device:
        """The device named ``device`` (``"cpu"``, ``"cpu:0"``)."""
        driver, info = resolve_device(device)
        return cls(driver, info)

    @property
    def id(self) -> str:
        """The device's id (``"cpu:0"``)."""
        return self.info.id

    def malloc(self, nbytes: int, *, name: str = "", owner: Any = None) -> DeviceMemory:
        """Allocate ``nbytes`` (``bm_malloc_device_byte``).

        Raises:
            OutOfResourcesError: the device's memory or the owner's budget would be exceeded.
        """
        return DeviceMemory(self._allocator.allocate(nbytes, owner=owner_key(owner), name=name))

    def free(self, mem: DeviceMemory) -> None:
        """Release memory from :meth:`malloc` (``bm_free_device``); safe to call twice."""
        self._own(mem, "free", allow_freed=True).free()

    def memcpy_s2d(
        self, dst: DeviceMemory, src: Any, size: int | None = None, dst_offset: int = 0
    ) -> None:
        """Copy ``size`` bytes (default all of ``src``) from a host buffer to device memory
        at ``dst_offset`` (``bm_memcpy_s2d_partial_offset``)."""
        block = self._own(dst, "memcpy_s2d")
        data = byte_view(src, writable=False, what="memcpy_s2d source")
        n = _fits(data.size if size is None else size, data, "memcpy_s2d source")
        _range(block, dst_offset, n, "memcpy_s2d")
        block.copy_in(data[:n], dst_offset)

    def memcpy_d2s(
        self, dst: Any, src: DeviceMemory, size: int | None = None, src_offset: int = 0
    ) -> None:
        """Copy ``size`` bytes (default: from ``src_offset`` to the end) of device memory to
        a host buffer (``bm_memcpy_d2s_partial_offset``)."""
        block = self._own(src, "memcpy_d2s")
        out = byte_view(dst, writable=True, what="memcpy_d2s destination")
        n = block.nbytes - byte_index(src_offset, "src_offset") if size is None else size
        _range(block, src_offset, _fits(n, out, "memcpy_d2s destination"), "memcpy_d2s")
        block.copy_out(out[:n], src_offset)

    def memcpy_d2d(
        self,
        dst: DeviceMemory,
        src: DeviceMemory,
        size: int | None = None,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        """Copy ``size`` bytes (default: from ``src_offset`` to the end) between two blocks
        of this device (``bm_memcpy_d2d_byte``)."""
        to, frm = self._own(dst, "memcpy_d2d"), self._own(src, "memcpy_d2d")
        n = frm.nbytes - byte_index(src_offset, "src_offset") if size is None else size
        _range(frm, src_offset, n, "memcpy_d2d (source)")
        _range(to, dst_offset, n, "memcpy_d2d (destination)")
        to.copy_from(frm, n, dst_offset, src_offset)

    def memcpy_to(self, other: Device, dst: DeviceMemory, src: DeviceMemory, size: int) -> None:
        """Copy the first ``size`` bytes of this device's ``src`` to the start of ``dst`` on
        device ``other`` (``bm_memcpy_p2p`` / ``bm_memcpy_c2c``); through host memory when
        the devices differ, as :meth:`memcpy_d2d` when they are the same."""
        frm, to = self._own(src, "memcpy_to"), other._own(dst, "memcpy_to")
        _range(frm, 0, size, "memcpy_to (source)")
        _range(to, 0, size, "memcpy_to (destination)")
        to.copy_from(frm, size, 0, 0)

    def check_range(self, mem: DeviceMemory, offset: int, size: int, what: str) -> None:
        """Raise as a copy would when ``size`` bytes at ``offset`` are not all in ``mem``
        (or ``mem`` is not this device's, or was freed): for calls that check every
        operation before moving a byte."""
        _range(self._own(mem, what), offset, size, what)

    def memset(
        self, mem: DeviceMemory, value: int, size: int | None = None, offset: int = 0
    ) -> None:
        """Set ``size`` bytes (default: to the end) from ``offset`` to the byte ``value``
        (``bm_memset_device``)."""
        block = self._own(mem, "memset")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise InvalidArgumentError(f"memset value {value!r} is not a byte; give 0 to 255")
        n = block.nbytes - byte_index(offset, "offset") if size is None else size
        _range(block, offset, n, "memset")
        block.copy_in(np.full(n, value, dtype=np.uint8), offset)

    # -- host mappings -----------------------------------------------------------------------

    def mmap(self, mem: DeviceMemory) -> memoryview:
        """Map device memory into host memory (``bm_mem_mmap_device_mem``).

        On a coherent device the view is the memory itself. Otherwise it is a host copy:
        call :meth:`invalidate` before reading it and :meth:`flush` after writing it.
        """
        block = self._own(mem, "mmap")
        if block.host is not None:
            return block.host.data
        if block.mapping is None:
            block.mapping = _Mapping(block)
        assert isinstance(block.mapping, _Mapping)
        return block.mapping.shadow.data

    def munmap(self, mem: DeviceMemory) -> None:
        """Drop a mapping (``bm_mem_unmap_device_mem``); refused while it holds unflushed
        writes."""
        block = self._own(mem, "munmap")
        mapping = _mapping(block)
        if mapping is not None:
            if mapping.dirty():
                raise _unflushed(block, "unmapping")
            block.mapping = None

    def flush(self, mem: DeviceMemory, offset: int = 0, size: int | None = None) -> None:
        """Write the host's writes through the mapping to the device
        (``bm_mem_flush_partial_device_mem``); a no-op on coherent memory."""
        block = self._own(mem, "flush")
        lo, hi = _span(block, offset, size, "flush")
        mapping = _mapping(block)
        if mapping is None:
            return
        if not mapping.dirty(lo, hi):
            return
        if mapping.stale:
            raise OperationForbiddenError(
                f"{_describe(block)}: the device wrote it after it was last invalidated, and "
                "the host wrote to the mapping too: flushing would overwrite one with the "
                "other; invalidate before writing through a mapping",
                details={"device": self.id},
            )
        hooks = self._allocator.hooks
        hooks.copy_in(self.info, block.handle, mapping.shadow[lo:hi].data, lo)
        mapping.clean[lo:hi] = mapping.shadow[lo:hi]
        block.version += 1
        mapping.synced = block.version

    def invalidate(self, mem: DeviceMemory, offset: int = 0, size: int | None = None) -> None:
        """Fetch the device's bytes into the mapping (``bm_mem_invalidate_partial_device_mem``);
        a no-op on coherent memory. Refused while the range holds unflushed writes."""
        block = self._own(mem, "invalidate")
        lo, hi = _span(block, offset, size, "invalidate")
        mapping = _mapping(block)
        if mapping is None:
            return
        if mapping.dirty(lo, hi):
            raise _unflushed(block, "invalidating")
        hooks = self._allocator.hooks
        hooks.copy_out(self.info, mapping.shadow[lo:hi].data, block.handle, lo)
        mapping.clean[lo:hi] = mapping.shadow[lo:hi]
        if lo == 0 and hi == block.nbytes:
            mapping.synced = block.version

    # -- the rest ----------------------------------------------------------------------------

    def tensor(
        self,
        mem: DeviceMemory,
        dtype: Any,
        shape: Sequence[int],
        *,
        offset: int = 0,
        name: str = "",
        format: Format = Format.ND,
    ) -> Tensor:
        """A tensor over device memory (``bmrt_tensor_with_device``); the memory stays the
        caller's to free."""
        block = self._own(mem, "tensor")
        return Tensor.from_allocation(
            block, dtype, shape, offset=offset, name=name or mem.name, format=format, keepalive=mem
        )

    def before_device_access(self, mem: DeviceMemory, what: str) -> None:
        """Refuse (OPERATION_FORBIDDEN) a device operation ``what`` that is not one of this
        class's own (a run on the memory) while its mapping holds writes not flushed."""
        mapping = _mapping(self._own(mem, what))
        if mapping is not None:
            mapping.before_device_access(what)

    def device_wrote(self, mem: DeviceMemory) -> None:
        """Record that the device wrote ``mem`` outside this class (a run's outputs): its
        mapping reads as poison again until :meth:`invalidate`."""
        block = self._own(mem, "device_wrote", allow_freed=True)
        block.version += 1
        mapping = _mapping(block)
        if mapping is not None:
            mapping.after_device_write()

    def stats(self) -> MemoryStats:
        """This device's memory statistics (crossrt's record; ``bm_get_stat`` gives them as
        ``bm_dev_stat_t``: compat/bmruntime/facts.py)."""
        return self._allocator.stats()

    def __repr__(self) -> str:
        kind = "coherent" if self.coherent else "not host-coherent"
        return f"Device({self.id!r}, {self.info.driver}, {kind})"

    def _own(self, mem: DeviceMemory, op: str, allow_freed: bool = False) -> Allocation:
        if not isinstance(mem, DeviceMemory):
            raise InvalidArgumentError(
                f"{op}: expected DeviceMemory from Device.malloc, got {type(mem).__name__}"
            )
        block = mem._allocation
        if block.allocator is not self._allocator:
            raise InvalidArgumentError(
                f"{op}: {mem!r} belongs to {mem.device}, not {self.id}; use that device",
                details={"device": self.id, "memory_device": mem.device},
            )
        if block.freed and not allow_freed:
            raise InvalidHandleError(f"{op}: {mem!r} was freed; allocate it again")
        return block


def _mapping(block: Allocation) -> _Mapping | None:
    mapping = block.mapping
    return mapping if isinstance(mapping, _Mapping) else None


def _describe(block: Allocation) -> str:
    name = f" {block.name!r}" if block.name else ""
    return f"device memory{name} ({block.nbytes} bytes on {block.allocator.device.id})"


def _unflushed(block: Allocation, doing: str) -> OperationForbiddenError:
    return OperationForbiddenError(
        f"{_describe(block)}: the host wrote to its mapping without flushing; {doing} would "
        "lose those writes: call device.flush(mem) first",
        details={"device": block.allocator.device.id},
    )


def _range(block: Allocation, offset: Any, size: Any, op: str) -> None:
    at, n = byte_index(offset, "offset"), byte_index(size, "size")
    if at + n > block.nbytes:
        raise InvalidArgumentError(
            f"{op}: {n} bytes at offset {at} are out of range of {_describe(block)}; keep "
            f"offset + size <= {block.nbytes}",
            details={"offset": at, "size": n, "memory_size": block.nbytes},
        )


def _span(block: Allocation, offset: Any, size: Any, op: str) -> tuple[int, int]:
    at = byte_index(offset, "offset")
    n = block.nbytes - at if size is None else byte_index(size, "size")
    _range(block, at, n, op)
    return at, at + n


def _fits(size: Any, buffer: np.ndarray, what: str) -> int:
    n = byte_index(size, "size")
    if n > buffer.size:
        raise InvalidArgumentError(
            f"{what} holds {buffer.size} bytes, fewer than size={n}; give a larger buffer"
        )
    return n
