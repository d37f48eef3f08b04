"""BMLIB: devices (``bm_handle_t``), device memory (``bm_device_mem_t``), copies, mmap with
flush / invalidate, over :class:`crossrt.compat.bmlib.Device` (the synchronisation calls are
sync.py's, the strided, scattered and cross-device copies copies.py's).

``devid`` is an index into :func:`bm_devices` (the accelerators first: ``sim:0``...; the CPU
when there is none) or a crossrt device name (``"cpu:0"``, ``"sim:3"``). Host buffers are any
Python buffer (bytes, bytearray, memoryview, NumPy array). Out-parameters come back as
``(status, value)``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ...drivers import DeviceKind, available_drivers
from ...errors import (
    ClosedError,
    CrossrtError,
    InvalidArgumentError,
    StatusCode,
)
from ...memory import byte_index, byte_view
from ..bmlib import Device, DeviceMemory
from ..device0 import default_device_info
from .contract import seed_call
from .status import BM_SUCCESS, ERRORS, bm_status_t, failed

__all__ = [
    "bm_dev_free",
    "bm_dev_getcount",
    "bm_dev_request",
    "bm_device_mem_t",
    "bm_devices",
    "bm_free_device",
    "bm_get_devid",
    "bm_handle_t",
    "bm_malloc_device_byte",
    "bm_malloc_device_dword",
    "bm_mem_flush_device_mem",
    "bm_mem_flush_partial_device_mem",
    "bm_mem_get_device_size",
    "bm_mem_invalidate_device_mem",
    "bm_mem_invalidate_partial_device_mem",
    "bm_mem_mmap_device_mem",
    "bm_mem_unmap_device_mem",
    "bm_memcpy_d2d",
    "bm_memcpy_d2d_byte",
    "bm_memcpy_d2s",
    "bm_memcpy_d2s_partial",
    "bm_memcpy_d2s_partial_offset",
    "bm_memcpy_s2d",
    "bm_memcpy_s2d_partial",
    "bm_memcpy_s2d_partial_offset",
    "bm_memset_device",
    "bm_memset_device_ext",
]

bm_device_mem_t = DeviceMemory
"""A block of device memory, as :func:`bm_malloc_device_byte` returns it."""


@seed_call
def bm_devices() -> list[str]:
    """The devices ``devid`` numbers: 0 is the machine's default device (crossrt's
    ``CROSSRT_DEFAULT_DEVICE``, ``cpu:0`` when unset: compat/device0.py), then the
    accelerators (the ``sim`` devices here) in driver order, then the other devices."""
    infos = [info for drv in available_drivers() for info in drv.devices()]
    rank = {DeviceKind.ACCELERATOR: 0, DeviceKind.GPU: 1, DeviceKind.OTHER: 2, DeviceKind.CPU: 3}
    kinds = {i.id: i.kind for i in infos}  # a device two drivers serve is listed once
    ordered = sorted(kinds, key=lambda d: rank[kinds[d]])
    first = default_device_info().id
    return [first, *(d for d in ordered if d != first)]


class Launch:
    """A launch through a handle (``owner``): its future, and what to do once (the outputs'
    mappings become stale) when a sync sees it end."""

    def __init__(self, owner: bm_handle_t, future: Future[Any], done: Callable[[], None]) -> None:
        self.owner = owner
        self.future = future
        self._done: Callable[[], None] | None = done
        self._lock = threading.Lock()

    def finish(self) -> None:
        """Run ``done`` the first time only."""
        with self._lock:
            done, self._done = self._done, None
        if done is not None:
            done()


_HANDLES: weakref.WeakSet[bm_handle_t] = weakref.WeakSet()
"""Every handle alive, freed or not: ``bm_device_sync`` waits for the launches of each on its
device (a freed handle's launches still run there)."""
_HANDLES_LOCK = threading.Lock()


def handles_on(device_id: str) -> list[bm_handle_t]:
    """The handles alive on the device ``device_id``."""
    with _HANDLES_LOCK:
        return [h for h in _HANDLES if h.device.id == device_id]


class bm_handle_t:
    """One requested device (``bm_dev_request``): its memory, and the launches each thread
    made through it and has not synchronised yet."""

    def __init__(self, devid: int | str, device: Device) -> None:
        self.devid = devid
        self.device = device
        self.freed = False
        self.sync_timeout_ms = 0  # 0: bm_thread_sync waits as long as it takes
        self._local = threading.local()
        self._mappings: dict[int, tuple[memoryview, DeviceMemory]] = {}
        self._launches: list[Launch] = []  # every thread's, for bm_handle_sync
        self._lock = threading.Lock()
        with _HANDLES_LOCK:
            _HANDLES.add(self)

    def pending(self) -> list[Launch]:
        """This thread's launches not synchronised yet."""
        queue: list[Launch] | None = getattr(self._local, "pending", None)
        if queue is None:
            queue = []
            self._local.pending = queue
        return queue

    def launched(self, future: Future[Any], done: Callable[[], None]) -> None:
        """Record a launch this thread made: ``done`` runs once, when a sync sees it end."""
        launch = Launch(self, future, done)
        self.pending().append(launch)
        with self._lock:
            self._launches.append(launch)

    def outstanding(self) -> list[Launch]:
        """Every thread's launches through this handle not synchronised yet."""
        with self._lock:
            return list(self._launches)

    def forget(self, launch: Launch) -> None:
        """Drop a launch a sync saw end from the handle's list."""
        with self._lock:
            if launch in self._launches:
                self._launches.remove(launch)

    def check(self) -> Device:
        """The device, unless the handle was freed."""
        if self.freed:
            raise ClosedError(
                f"bm_handle_t of device {self.devid} was freed by bm_dev_free; request it again"
            )
        return self.device

    def __repr__(self) -> str:
        return f"bm_handle_t({self.devid!r} = {self.device.id}{', freed' if self.freed else ''})"


def call(what: str, action: Callable[[], Any]) -> bm_status_t:
    """BM_SUCCESS when ``action()`` returns, else its error's status, logged as ``what``."""
    try:
        action()
    except (CrossrtError, TypeError, ValueError, MemoryError) as exc:
        return failed(what, exc)
    return BM_SUCCESS


# -- devices ---------------------------------------------------------------------------------


@seed_call
def bm_dev_getcount() -> tuple[bm_status_t, int]:
    """How many devices ``devid`` numbers."""
    try:
        return BM_SUCCESS, len(bm_devices())
    except CrossrtError as exc:
        return failed("bm_dev_getcount", exc), 0


@seed_call
def bm_dev_request(devid: int | str = 0) -> tuple[bm_status_t, bm_handle_t | None]:
    """Open device ``devid``; BM_ERR_DEVNOTREADY when there is no such device."""
    try:
        if isinstance(devid, str):
            name = devid
        else:
            devices = bm_devices()
            if isinstance(devid, bool) or not 0 <= devid < len(devices):
                raise ClosedError(
                    f"there is no device {devid!r}: bm_dev_getcount() is {len(devices)}; "
                    "give 0 to count - 1, or a device name such as 'cpu:0'",
                    code=StatusCode.DEVICE_UNAVAILABLE,
                )
            name = devices[devid]
        return BM_SUCCESS, bm_handle_t(devid, Device.open(name))
    except CrossrtError as exc:
        return failed("bm_dev_request", exc), None


@seed_call
def bm_dev_free(handle: bm_handle_t) -> None:
    """Release the handle; later calls with it return BM_ERR_DEVNOTREADY."""
    handle.freed = True


@seed_call
def bm_get_devid(handle: bm_handle_t) -> int | str:
    """The ``devid`` the handle was requested with."""
    return handle.devid


# -- memory ----------------------------------------------------------------------------------


@seed_call
def bm_malloc_device_byte(
    handle: bm_handle_t, size: int
) -> tuple[bm_status_t, DeviceMemory | None]:
    """Allocate ``size`` bytes of device memory; BM_ERR_NOMEM when the device lacks them."""
    try:
        return BM_SUCCESS, handle.check().malloc(size)
    except (CrossrtError, TypeError, ValueError, MemoryError) as exc:
        return failed("bm_malloc_device_byte", exc), None


@seed_call
def bm_malloc_device_dword(
    handle: bm_handle_t, count: int
) -> tuple[bm_status_t, DeviceMemory | None]:
    """Allocate ``count`` dwords (4 bytes each)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return failed("bm_malloc_device_dword", InvalidArgumentError(f"count={count!r}")), None
    return bm_malloc_device_byte(handle, 4 * count)


@seed_call
def bm_free_device(handle: bm_handle_t, mem: DeviceMemory) -> None:
    """Free device memory (twice is harmless)."""
    call("bm_free_device", lambda: handle.device.free(mem))


@seed_call
def bm_mem_get_device_size(mem: DeviceMemory) -> int:
    """The memory's size in bytes."""
    return mem.size


@seed_call
def bm_memcpy_s2d(handle: bm_handle_t, dst: DeviceMemory, src: Any) -> bm_status_t:
    """Copy the whole of ``dst`` (its size in bytes) from host buffer ``src``, which must hold
    exactly that many bytes (a larger one is BM_ERR_PARAM too: its tail would be lost)."""

    def copy() -> None:
        device = handle.check()
        size = byte_view(src, writable=False, what="bm_memcpy_s2d source").size
        if size != dst.size:
            raise InvalidArgumentError(
                f"bm_memcpy_s2d: the source holds {size} bytes, the device memory {dst.size}; "
                "give a source of bm_mem_get_device_size(dst) bytes, or copy part of it with "
                "bm_memcpy_s2d_partial"
            )
        device.memcpy_s2d(dst, src, size)

    return call("bm_memcpy_s2d", copy)


@seed_call
def bm_memcpy_s2d_partial(
    handle: bm_handle_t, dst: DeviceMemory, src: Any, size: int
) -> bm_status_t:
    """Copy ``size`` bytes from ``src`` to the start of ``dst``."""
    return call("bm_memcpy_s2d_partial", lambda: handle.check().memcpy_s2d(dst, src, size))


@seed_call
def bm_memcpy_s2d_partial_offset(
    handle: bm_handle_t, dst: DeviceMemory, src: Any, size: int, offset: int
) -> bm_status_t:
    """Copy ``size`` bytes of ``src`` from its byte ``offset`` to the start of ``dst``, as the
    seed says ("从src的offset偏移开始拷贝"; docs/compat-bmruntime.md)."""

    def copy() -> None:
        device = handle.check()
        data = byte_view(src, writable=False, what="bm_memcpy_s2d_partial_offset source")
        start = byte_index(offset, "offset")
        if start > data.size:
            raise InvalidArgumentError(
                f"bm_memcpy_s2d_partial_offset: offset {start} is past the source's "
                f"{data.size} bytes; give an offset into src"
            )
        device.memcpy_s2d(dst, data[start:], size)

    return call("bm_memcpy_s2d_partial_offset", copy)


@seed_call
def bm_memcpy_d2s(handle: bm_handle_t, dst: Any, src: DeviceMemory) -> bm_status_t:
    """Copy all of ``src`` to host buffer ``dst``."""
    return call("bm_memcpy_d2s", lambda: handle.check().memcpy_d2s(dst, src, src.size))


@seed_call
def bm_memcpy_d2s_partial(
    handle: bm_handle_t, dst: Any, src: DeviceMemory, size: int
) -> bm_status_t:
    """Copy the first ``size`` bytes of ``src`` to ``dst``."""
    return call("bm_memcpy_d2s_partial", lambda: handle.check().memcpy_d2s(dst, src, size))


@seed_call
def bm_memcpy_d2s_partial_offset(
    handle: bm_handle_t, dst: Any, src: DeviceMemory, size: int, offset: int
) -> bm_status_t:
    """Copy ``size`` bytes of ``src`` from byte ``offset`` to ``dst``."""
    return call(
        "bm_memcpy_d2s_partial_offset",
        lambda: handle.check().memcpy_d2s(dst, src, size, offset),
    )


@seed_call
def bm_memcpy_d2d(
    handle: bm_handle_t,
    dst: DeviceMemory,
    dst_offset: int,
    src: DeviceMemory,
    src_offset: int,
    len: int,
) -> bm_status_t:
    """Copy ``len`` **dwords** (4 bytes each, as the seed says) from ``src`` at byte
    ``src_offset`` to ``dst`` at byte ``dst_offset``."""

    def copy() -> None:
        if isinstance(len, bool) or not isinstance(len, int) or len < 0:
            raise InvalidArgumentError(f"len={len!r}: give a count of dwords >= 0")
        handle.check().memcpy_d2d(dst, src, 4 * len, dst_offset, src_offset)

    return call("bm_memcpy_d2d", copy)


@seed_call
def bm_memcpy_d2d_byte(
    handle: bm_handle_t,
    dst: DeviceMemory,
    dst_offset: int,
    src: DeviceMemory,
    src_offset: int,
    size: int,
) -> bm_status_t:
    """:func:`bm_memcpy_d2d` with the length in bytes."""
    return call(
        "bm_memcpy_d2d_byte",
        lambda: handle.check().memcpy_d2d(dst, src, size, dst_offset, src_offset),
    )


@seed_call
def bm_memset_device_ext(
    handle: bm_handle_t, value: Any, mode: int, mem: DeviceMemory
) -> bm_status_t:
    """Fill ``mem`` with the first ``mode`` bytes (1 to 4) of ``value`` repeated; a tail
    shorter than ``mode`` gets the pattern's first bytes."""

    def fill() -> None:
        device = handle.check()
        if mode not in (1, 2, 3, 4):
            raise InvalidArgumentError(f"mode={mode!r}: give 1, 2, 3 or 4 bytes")
        pattern = bytes(memoryview(value).cast("B")[:mode])
        if len(pattern) != mode:
            raise InvalidArgumentError(f"value holds fewer than mode={mode} bytes")
        reps = -(-mem.size // mode)
        device.memcpy_s2d(mem, (pattern * reps)[: mem.size])

    return call("bm_memset_device_ext", fill)


@seed_call
def bm_memset_device(handle: bm_handle_t, value: int, mem: DeviceMemory) -> bm_status_t:
    """Fill ``mem`` with the 32-bit ``value`` (little-endian) repeated."""
    try:
        word = int(value).to_bytes(4, "little", signed=value < 0)
    except (OverflowError, TypeError, ValueError) as exc:
        return failed("bm_memset_device", exc)
    return bm_memset_device_ext(handle, word, 4, mem)


# -- mmap ------------------------------------------------------------------------------------


@seed_call
def bm_mem_mmap_device_mem(
    handle: bm_handle_t, dmem: DeviceMemory
) -> tuple[bm_status_t, memoryview | None]:
    """Map device memory into the host: ``(status, vmem)``, ``vmem`` a writable memoryview.

    On a coherent device (the CPU) it is the memory itself. Otherwise it is a cached copy:
    :func:`bm_mem_invalidate_device_mem` before reading what the device wrote,
    :func:`bm_mem_flush_device_mem` after writing (docs/memory.md says what is refused).
    """
    try:
        view = handle.check().mmap(dmem)
    except ERRORS as exc:
        return failed("bm_mem_mmap_device_mem", exc), None
    with handle._lock:
        handle._mappings[id(view)] = (view, dmem)
    return BM_SUCCESS, view


@seed_call
def bm_mem_unmap_device_mem(handle: bm_handle_t, vmem: Any, size: int) -> bm_status_t:
    """Unmap ``vmem`` from :func:`bm_mem_mmap_device_mem`; ``size`` is the memory's size."""

    def unmap() -> None:
        device = handle.check()
        with handle._lock:
            entry = handle._mappings.get(id(vmem))
        if entry is None or entry[0] is not vmem:
            raise InvalidArgumentError(
                "bm_mem_unmap_device_mem: vmem is not a mapping of this handle; give what "
                "bm_mem_mmap_device_mem returned"
            )
        mem = entry[1]
        if size != mem.size:
            raise InvalidArgumentError(
                f"bm_mem_unmap_device_mem: size {size} is not the memory's size {mem.size}; "
                "give bm_mem_get_device_size(mem)"
            )
        device.munmap(mem)
        with handle._lock:
            del handle._mappings[id(vmem)]

    return call("bm_mem_unmap_device_mem", unmap)


@seed_call
def bm_mem_invalidate_device_mem(handle: bm_handle_t, dmem: DeviceMemory) -> bm_status_t:
    """Fetch what the device wrote into the mapping."""
    return call("bm_mem_invalidate_device_mem", lambda: handle.check().invalidate(dmem))


@seed_call
def bm_mem_invalidate_partial_device_mem(
    handle: bm_handle_t, dmem: DeviceMemory, offset: int, len: int
) -> bm_status_t:
    """:func:`bm_mem_invalidate_device_mem` for ``len`` bytes from ``offset``."""
    return call(
        "bm_mem_invalidate_partial_device_mem",
        lambda: handle.check().invalidate(dmem, offset, len),
    )


@seed_call
def bm_mem_flush_device_mem(handle: bm_handle_t, dmem: DeviceMemory) -> bm_status_t:
    """Write the host's writes through the mapping to the device."""
    return call("bm_mem_flush_device_mem", lambda: handle.check().flush(dmem))


@seed_call
def bm_mem_flush_partial_device_mem(
    handle: bm_handle_t, dmem: DeviceMemory, offset: int, len: int
) -> bm_status_t:
    """:func:`bm_mem_flush_device_mem` for ``len`` bytes from ``offset``."""
    return call("bm_mem_flush_partial_device_mem", lambda: handle.check().flush(dmem, offset, len))
