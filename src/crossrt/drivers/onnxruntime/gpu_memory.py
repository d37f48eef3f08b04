"""Memory of the onnxruntime driver's ``cuda:N`` devices: buffers in the GPU's own memory.

The engine contract's memory hooks (``Driver.allocate``, ``free``, ``copy_in``, ``copy_out``,
``copy_device``) for a GPU: a :class:`GpuBuffer` is an address in one device's memory, and
bytes reach it only through the CUDA runtime's copies. The runtime's tensors on ``cuda:N``,
the device-resident inputs and outputs of :mod:`.gpu_program`, and DLPack exchange with torch
or cupy all rest on these buffers.

The calls go to the CUDA runtime library that onnxruntime-gpu itself loads (``libcudart``,
from the ``nvidia-cuda-runtime`` wheel of the ``cuda`` extra, or the system's CUDA), through
:mod:`ctypes`: allocation, zero-fill and synchronous copies, nothing more.
:class:`HostStandIn` offers the same five calls over host memory, so that the code above it
runs, and is tested, on machines without a GPU (``tests/drivers/test_gpu_memory.py``);
``tests/gpu/`` runs it on a real one.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...errors import (
    DeviceUnavailableError,
    InvalidHandleError,
    OperationForbiddenError,
    OutOfResourcesError,
)
from ..base import DeviceInfo, check_range
from .cuda import index_of

_CUDA_LIBRARIES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so")
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the addresses (UVA)
_ERROR_MEMORY = 2  # cudaErrorMemoryAllocation


class DeviceApi(Protocol):
    """The five calls a GPU's memory needs (the CUDA runtime's, or a stand-in's)."""

    ort_device: str  # the device type ORT binds buffers of this memory with: "cuda", "cpu"

    def malloc(self, index: int, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def memset(self, pointer: int, value: int, nbytes: int) -> None: ...
    def memcpy(self, dst: int, src: int, nbytes: int) -> None: ...


class CudaApi:
    """The CUDA runtime library, loaded on first use.

    Raises:
        DeviceUnavailableError: no CUDA runtime library can be loaded.
    """

    ort_device = "cuda"

    def __init__(self) -> None:
        try:
            import onnxruntime as ort

            ort.preload_dlls(cuda=True, cudnn=False)  # the wheels' libcudart, where installed
        except Exception:  # an older ORT, or a system CUDA: dlopen finds it or not below
            pass
        self._lib = _load_first(_CUDA_LIBRARIES)
        self._lib.cudaGetErrorString.restype = ctypes.c_char_p
        self._lock = threading.Lock()

    def _check(self, code: int, what: str) -> None:
        if code == 0:
            return
        message = self._lib.cudaGetErrorString(code).decode(errors="replace")
        if code == _ERROR_MEMORY:
            raise OutOfResourcesError(f"{what}: the GPU is out of memory ({message})")
        raise DeviceUnavailableError(f"{what}: CUDA error {code} ({message})")

    def malloc(self, index: int, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        with self._lock:  # the current device is per thread; set and use it together
            self._check(self._lib.cudaSetDevice(index), f"cudaSetDevice({index})")
            self._check(
                self._lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 1))),
                f"allocating {nbytes} bytes on cuda:{index}",
            )
        return int(pointer.value or 0)

    def free(self, pointer: int) -> None:
        self._check(self._lib.cudaFree(ctypes.c_void_p(pointer)), "cudaFree")

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        self._check(
            self._lib.cudaMemset(ctypes.c_void_p(pointer), value, ctypes.c_size_t(nbytes)),
            "cudaMemset",
        )

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        self._check(
            self._lib.cudaMemcpy(
                ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes), _MEMCPY_DEFAULT
            ),
            "cudaMemcpy",
        )
        # From pageable host memory cudaMemcpy may return before the last DMA lands, and
        # ORT's own stream does not wait for the default one: finish it here.
        self._check(self._lib.cudaStreamSynchronize(None), "cudaStreamSynchronize")


class HostStandIn:
    """:class:`DeviceApi` over host memory, for running the GPU code paths without a GPU."""

    ort_device = "cpu"

    def __init__(self) -> None:
        self._blocks: dict[int, np.ndarray] = {}

    def malloc(self, index: int, nbytes: int) -> int:
        block = np.empty(max(nbytes, 1), np.uint8)
        pointer = int(block.ctypes.data)
        self._blocks[pointer] = block
        return pointer

    def free(self, pointer: int) -> None:
        del self._blocks[pointer]

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        ctypes.memset(pointer, value, nbytes)

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)


@dataclass(eq=False)
class GpuBuffer:
    """A block of one GPU's memory, as the driver's ``allocate`` returns it.

    Attributes:
        device: the id of the device whose memory holds it (``"cuda:0"``).
        pointer: its address in that memory.
        size: its size in bytes.
        owner: what keeps memory allocated elsewhere alive (an ORT output, a torch or cupy
            array taken through DLPack), released by ``free`` instead of freeing the memory.
    """

    device: str
    pointer: int
    size: int
    owner: Any = None
    freed: bool = field(default=False, repr=False)


CACHE_BYTES = 256 << 20
"""Freed blocks kept for reuse, per GPU, at most (see :class:`GpuMemory`)."""


class GpuMemory:
    """The memory of one GPU (thread-safe).

    Freed blocks are kept, up to ``cache_bytes``, and given again to an allocation of the same
    size: a run with host inputs and outputs allocates and frees the same blocks every call,
    and ``cudaFree`` waits for the whole device (on an H200, ResNet-50 ran 1.3-1.4x raw ORT's
    time with a ``cudaMalloc`` and a ``cudaFree`` per tensor per run, as ORT's own arena
    does not). Where the GPU is out of memory, the kept blocks are freed and the allocation
    tried again.

    Args:
        device: the device.
        api: its calls (:class:`CudaApi` on a GPU).
        cache_bytes: how many bytes of freed blocks to keep for reuse.
    """

    def __init__(self, device: DeviceInfo, api: DeviceApi, cache_bytes: int = CACHE_BYTES) -> None:
        self.device = device
        self.index = index_of(device)
        self.api = api
        self.cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._kept: dict[int, list[int]] = {}  # size -> pointers of freed blocks
        self._kept_bytes = 0

    def allocate(self, nbytes: int, zeroed: bool = True) -> GpuBuffer:
        """``nbytes`` of device memory, zero-filled unless ``zeroed`` is false (a run's output
        buffer, which the run writes whole)."""
        with self._lock:
            kept = self._kept.get(nbytes)
            pointer = kept.pop() if kept else None
            if pointer is not None:
                self._kept_bytes -= nbytes
        if pointer is None:
            try:
                pointer = self.api.malloc(self.index, nbytes)
            except OutOfResourcesError:
                if not self.release_kept():
                    raise
                pointer = self.api.malloc(self.index, nbytes)
        if zeroed:
            self.api.memset(pointer, 0, nbytes)
        return GpuBuffer(self.device.id, pointer, nbytes)

    def release_kept(self) -> int:
        """Free the blocks kept for reuse; how many bytes that gave back."""
        with self._lock:
            pointers = [p for ps in self._kept.values() for p in ps]
            released, self._kept, self._kept_bytes = self._kept_bytes, {}, 0
        for pointer in pointers:
            self.api.free(pointer)
        return released

    @property
    def kept_bytes(self) -> int:
        """Bytes of freed blocks kept for reuse."""
        return self._kept_bytes

    def adopt(self, pointer: int, nbytes: int, owner: Any) -> GpuBuffer:
        """A buffer over memory ``owner`` keeps allocated (no copy)."""
        return GpuBuffer(self.device.id, pointer, nbytes, owner=owner)

    def free(self, buffer: Any) -> None:
        """Give ``buffer`` back (or let go of what keeps it, when it was adopted)."""
        self.own(buffer, "free")
        with self._lock:
            if buffer.freed:
                raise InvalidHandleError(f"free on {self.device.id}: the buffer was freed already")
            buffer.freed = True
            keep = buffer.owner is None and self._kept_bytes + buffer.size <= self.cache_bytes
            if keep:
                self._kept.setdefault(buffer.size, []).append(buffer.pointer)
                self._kept_bytes += buffer.size
        if buffer.owner is None and not keep:
            self.api.free(buffer.pointer)
        buffer.owner = None

    def copy_in(self, dst: Any, src: memoryview, offset: int = 0) -> None:
        """Host bytes into ``dst`` at ``offset``."""
        view = np.frombuffer(src, dtype=np.uint8)
        self._check(dst, offset, view.size, "copy_in")
        if view.size:
            self.api.memcpy(dst.pointer + offset, int(view.ctypes.data), view.size)

    def copy_out(self, dst: memoryview, src: Any, offset: int = 0) -> None:
        """``src`` from ``offset`` into a host buffer."""
        out = np.frombuffer(dst, dtype=np.uint8)
        self._check(src, offset, out.size, "copy_out")
        if out.size:
            self.api.memcpy(int(out.ctypes.data), src.pointer + offset, out.size)

    def copy_device(
        self, dst: Any, src: Any, nbytes: int, dst_offset: int = 0, src_offset: int = 0
    ) -> None:
        """``nbytes`` between two buffers of this device."""
        self._check(src, src_offset, nbytes, "copy_device (source)")
        self._check(dst, dst_offset, nbytes, "copy_device (destination)")
        if nbytes:
            self.api.memcpy(dst.pointer + dst_offset, src.pointer + src_offset, nbytes)

    def own(self, buffer: Any, what: str) -> GpuBuffer:
        """``buffer``, after checking that it is a live buffer of this device."""
        if not isinstance(buffer, GpuBuffer):
            raise InvalidHandleError(
                f"{what} on {self.device.id}: a {type(buffer).__name__} is not a buffer of "
                "this device; allocate one on it"
            )
        if buffer.device != self.device.id:
            raise OperationForbiddenError(
                f"{what} on {self.device.id}: the buffer is in {buffer.device}'s memory; "
                f"allocate it on {self.device.id}, or copy it here through the host"
            )
        if buffer.freed:
            raise InvalidHandleError(f"{what} on {self.device.id}: the buffer was freed")
        return buffer

    def _check(self, buffer: Any, offset: int, nbytes: int, what: str) -> None:
        self.own(buffer, what)
        check_range(buffer.size, offset, nbytes, f"{what} on {self.device.id}")


_MEMORIES: dict[str, GpuMemory] = {}
_MEMORIES_LOCK = threading.Lock()


def memory_of(device: DeviceInfo, api: Callable[[], DeviceApi] = CudaApi) -> GpuMemory:
    """The memory of ``device``, made on first use with ``api``.

    Raises:
        DeviceUnavailableError: the CUDA runtime library cannot be loaded.
    """
    with _MEMORIES_LOCK:
        memory = _MEMORIES.get(device.id)
        if memory is None:
            memory = _MEMORIES[device.id] = GpuMemory(device, api())
        return memory


def _load_first(names: tuple[str, ...]) -> ctypes.CDLL:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceUnavailableError(
        "no CUDA runtime library (libcudart) can be loaded: install onnxruntime-gpu with its "
        "CUDA wheels (pip install 'onnxruntime-gpu[cuda,cudnn]') or NVIDIA's CUDA toolkit"
    )
