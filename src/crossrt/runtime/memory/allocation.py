"""A block of device memory (:class:`Allocation`) and how bytes move in and out of it.

The bytes move through the driver's memory hooks (``Driver.allocate`` ... ``copy_device``).
Drivers that keep all five defaults serve host memory ("coherent"): a block is a NumPy
``uint8`` array the host reads directly. Others keep memory the host cannot address; when
such a block is mapped into host memory (``Device.mmap``), its mapping checks every device
access (see :mod:`.devices`).
"""

from __future__ import annotations

import dataclasses
import errno
from typing import Any, Protocol

import numpy as np

from ...drivers import DeviceInfo, Driver
from ...drivers.base import Capabilities, host_cpu, keeps_default_memory
from ...errors import OutOfResourcesError, StatusCode

HOST = "host"
"""The device name of host memory (HOST and VIRTUAL placements, shared memory)."""


class MemoryHooks(Protocol):
    """The memory half of the driver interface (``Driver.allocate`` ... ``copy_device``)."""

    def allocate(self, device: DeviceInfo, nbytes: int) -> Any: ...

    def free(self, device: DeviceInfo, buffer: Any) -> None: ...

    def copy_in(self, device: DeviceInfo, dst: Any, src: memoryview, offset: int = 0) -> None: ...

    def copy_out(self, device: DeviceInfo, dst: memoryview, src: Any, offset: int = 0) -> None: ...

    def copy_device(
        self,
        device: DeviceInfo,
        dst: Any,
        src: Any,
        nbytes: int,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None: ...

    def address_of(self, device: DeviceInfo, buffer: Any) -> int | None: ...

    def wrap_address(self, device: DeviceInfo, address: int, nbytes: int, keep: Any) -> Any: ...


class HostMemory:
    """Host memory: a driver's default hooks, zero-filled (calloc: pages are zeroed lazily, so
    it costs no more than ``np.empty`` and never shows stale bytes)."""

    name = "host"

    def device(self) -> DeviceInfo:
        return dataclasses.replace(host_cpu("host", Capabilities()), id=HOST)

    allocate = Driver.allocate
    free = Driver.free
    copy_in = Driver.copy_in
    copy_out = Driver.copy_out
    copy_device = Driver.copy_device
    address_of = Driver.address_of
    wrap_address = Driver.wrap_address


# What the system answers when it has no memory (or /dev/shm no room) for a mapping or a file.
_NO_MEMORY = {errno.ENOMEM, errno.ENOSPC}
_NO_FILES = {errno.EMFILE, errno.ENFILE}


def host_memory_error(nbytes: int, what: str, exc: BaseException) -> OutOfResourcesError:
    """The system refused ``nbytes`` of host memory for ``what``: ``FAIL_HOST_MEM_ALLOC``
    naming the bytes, in place of a bare ``MemoryError`` or ``OSError`` (ENOMEM, ENOSPC; too
    many open files is ``RESOURCE``)."""
    if isinstance(exc, OSError) and exc.errno in _NO_FILES:
        return OutOfResourcesError(
            f"cannot make {what} ({nbytes} bytes): this process has too many open files "
            f"({exc.strerror}); free tensors no longer needed or raise the limit (ulimit -n)",
            details={"requested": nbytes, "errno": exc.errno},
        )
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "out of memory"
    return OutOfResourcesError(
        f"cannot allocate {nbytes} bytes of host memory for {what}: {why}; free memory (tensors, "
        "models no longer needed), or give the process more (its cgroup or ulimit -v limit)",
        code=StatusCode.FAIL_HOST_MEM_ALLOC,
        details={"requested": nbytes},
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the system refusing memory (or file descriptors)."""
    if isinstance(exc, OSError):
        return exc.errno in _NO_MEMORY or exc.errno in _NO_FILES
    return isinstance(exc, MemoryError)


def host_empty(shape: tuple[int, ...], dtype: Any, what: str) -> np.ndarray:
    """``np.empty(shape, dtype)``, a refusal being :func:`host_memory_error`."""
    try:
        return np.empty(shape, dtype=dtype)
    except MemoryError as exc:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        raise host_memory_error(nbytes, what, exc) from None


def host_contiguous(array: Any, what: str) -> np.ndarray:
    """``np.ascontiguousarray(array)`` (a copy when it is not), a refusal being
    :func:`host_memory_error`."""
    try:
        return np.ascontiguousarray(array)
    except MemoryError as exc:
        raise host_memory_error(int(getattr(array, "nbytes", 0)), what, exc) from None


def is_coherent(driver: Any, device: DeviceInfo | None = None) -> bool:
    """Whether a driver's memory (on ``device``) is host memory: the driver says so per
    device (:meth:`Driver.coherent`: onnxruntime's CPU is, its ``cuda:N`` not); without a
    device, or for hooks that are no driver, whether it keeps all five default memory hooks
    (:class:`HostMemory` is ``Driver``'s own)."""
    if device is not None and isinstance(driver, Driver):
        return driver.coherent(device)
    return keeps_default_memory(driver)


class MappingState(Protocol):
    """What an allocation mapped into host memory on a non-coherent device checks
    (see :mod:`.devices`)."""

    def before_device_access(self, what: str) -> None: ...

    def after_device_write(self) -> None: ...


class Books(Protocol):
    """What an allocation needs of the allocator that made it (:class:`.memory.Allocator`):
    declared here so that this module does not import the one that imports it."""

    hooks: MemoryHooks
    device: DeviceInfo
    coherent: bool

    def free(self, allocation: Allocation) -> None: ...


class Allocation:
    """A block of device memory from an :class:`Allocator` (or adopted into its accounting).

    Attributes:
        allocator: where it came from.
        handle: the driver's buffer.
        host: a ``uint8`` NumPy view of the bytes when the device is host-coherent, else
            ``None`` (then use :meth:`copy_in` / :meth:`copy_out`).
        nbytes: its size.
        owner: who it is charged to.
        name: the name given when allocating.
        version: bumped by every device-side write (coherence checks use it).
        mapping: the host mapping of a non-coherent allocation (``Device.mmap``), or ``None``.
    """

    __slots__ = (
        "adopted",
        "allocator",
        "freed",
        "handle",
        "host",
        "mapping",
        "name",
        "nbytes",
        "owner",
        "version",
    )

    def __init__(
        self,
        allocator: Books,
        handle: Any,
        nbytes: int,
        owner: str,
        name: str,
        adopted: bool = False,
    ) -> None:
        self.allocator = allocator
        self.handle = handle
        self.host: np.ndarray | None = handle if allocator.coherent else None
        self.nbytes = nbytes
        self.owner = owner
        self.name = name
        self.freed = False
        self.adopted = adopted  # made elsewhere: freeing drops the handle, no driver free
        self.version = 0
        self.mapping: MappingState | None = None

    def free(self) -> None:
        """Return the memory to the driver (idempotent)."""
        self.allocator.free(self)

    def copy_in(self, src: np.ndarray, offset: int = 0) -> None:
        """Copy host bytes (a ``uint8`` array) into the allocation at ``offset``."""
        if self.mapping is not None:
            self.mapping.before_device_access("a write to the memory")
        a = self.allocator
        a.hooks.copy_in(a.device, self.handle, src.data, offset)
        self.version += 1
        if self.mapping is not None:
            self.mapping.after_device_write()

    def copy_out(self, dst: np.ndarray, offset: int = 0) -> None:
        """Copy ``dst.size`` bytes from ``offset`` into a host ``uint8`` array."""
        if self.mapping is not None:
            self.mapping.before_device_access("a read of the memory")
        a = self.allocator
        a.hooks.copy_out(a.device, dst.data, self.handle, offset)

    def copy_from(self, src: Allocation, nbytes: int, dst_offset: int, src_offset: int) -> None:
        """Copy ``nbytes`` from another allocation; on one device through ``copy_device``,
        across devices through a host buffer."""
        if src.mapping is not None:
            src.mapping.before_device_access("a copy from the memory")
        if src.allocator is self.allocator:
            if self.mapping is not None:
                self.mapping.before_device_access("a copy into the memory")
            a = self.allocator
            a.hooks.copy_device(a.device, self.handle, src.handle, nbytes, dst_offset, src_offset)
            self.version += 1
            if self.mapping is not None:
                self.mapping.after_device_write()
            return
        staging = host_empty((nbytes,), np.uint8, "a copy between devices")
        src.copy_out(staging, src_offset)
        self.copy_in(staging, dst_offset)
