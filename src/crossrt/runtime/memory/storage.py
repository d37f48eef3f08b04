"""The bytes behind tensors: one :class:`Storage` shared by a tensor and all its slices.

A storage counts its users (the tensors viewing it). It is released when the last of them is
freed or garbage-collected, so a slice that outlives the tensor it was cut from stays valid.
Releasing returns allocator memory, closes (and, for named segments, unlinks) shared memory,
and drops the reference to an attached caller buffer.

Bytes are either host-visible (``host``, a ``uint8`` NumPy array: NumPy views and DLPack work
without copies) or on a device whose memory is not host memory (``allocation`` only: every
access goes through the driver's copy hooks).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import dtypes
from ...dtypes import DType
from ...errors import InvalidArgumentError, OperationForbiddenError
from .allocation import Allocation
from .tensordesc import as_dtype, as_shape, fixed_size


class Storage:
    """Bytes viewed by one or more tensors.

    Args:
        nbytes: its size.
        host: a ``uint8`` array over the bytes when the host can address them.
        allocation: the allocator's record, when an allocator made or adopted the bytes.
        fd: the shared-memory file descriptor the bytes are mapped from, if any.
        fd_offset: where in that file the bytes begin.
        on_release: called once when the last user lets go (unmap, close, unlink).
        keepalive: an object to keep referenced while in use (an attached caller buffer).
        borrowed: the allocation belongs to someone else (``Device.malloc`` memory wrapped
            in a tensor): releasing does not free it.
    """

    __slots__ = (
        "_lock",
        "allocation",
        "borrowed",
        "fd",
        "fd_offset",
        "host",
        "keepalive",
        "nbytes",
        "on_release",
        "readonly",
        "users",
    )

    def __init__(
        self,
        nbytes: int,
        *,
        host: np.ndarray | None = None,
        allocation: Allocation | None = None,
        fd: int | None = None,
        fd_offset: int = 0,
        on_release: Callable[[], None] | None = None,
        keepalive: Any = None,
        borrowed: bool = False,
    ) -> None:
        self.nbytes = nbytes
        self.host = host
        self.allocation = allocation
        self.fd = fd
        self.fd_offset = fd_offset
        self.on_release = on_release
        self.keepalive = keepalive
        self.borrowed = borrowed
        self.readonly = host is not None and not host.flags.writeable
        self.users = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """Count one more user."""
        with self._lock:
            self.users += 1

    def release(self) -> None:
        """Count one user less; the last one releases the bytes."""
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            allocation, self.allocation = self.allocation, None
            on_release, self.on_release = self.on_release, None
            # Drop our views too: a mapping can only be closed once no view of it is left.
            self.keepalive = self.host = None
        if allocation is not None and not self.borrowed:
            allocation.free()
        if on_release is not None:
            on_release()

    # -- bytes in and out (offsets already checked by the caller) ----------------------------

    def read_into(self, offset: int, dst: np.ndarray) -> None:
        """Copy ``dst.size`` bytes from ``offset`` into a host ``uint8`` array."""
        if self.host is not None:
            dst[...] = self.host[offset : offset + dst.size]
        else:
            self._device().copy_out(dst, offset)

    def check_writable(self) -> None:
        """Raise when the bytes are a read-only buffer."""
        if self.readonly:
            raise OperationForbiddenError(
                "the tensor's memory is read-only (a read-only buffer was attached); attach a "
                "writable buffer or copy it into a new tensor"
            )

    def write_from(self, offset: int, src: np.ndarray) -> None:
        """Copy a host ``uint8`` array into the bytes at ``offset``."""
        self.check_writable()
        if self.host is not None:
            self.host[offset : offset + src.size] = src
        else:
            self._device().copy_in(src, offset)

    def fill(self, offset: int, size: int, value: int) -> None:
        """Set ``size`` bytes from ``offset`` to ``value``."""
        if self.host is not None and not self.readonly:
            self.host[offset : offset + size] = value
        else:
            self.write_from(offset, np.full(size, value, dtype=np.uint8))

    def copy(self, dst: Storage, nbytes: int, dst_offset: int, src_offset: int) -> None:
        """Copy ``nbytes`` to another storage (or within this one; overlap is handled)."""
        dst.check_writable()
        if self.host is not None:
            # NumPy detects overlapping source and destination and buffers the copy.
            dst.write_from(dst_offset, self.host[src_offset : src_offset + nbytes])
        elif dst.host is not None:
            self.read_into(src_offset, dst.host[dst_offset : dst_offset + nbytes])
        else:
            dst._device().copy_from(self._device(), nbytes, dst_offset, src_offset)

    def _device(self) -> Allocation:
        if self.allocation is None or self.allocation.freed:
            raise OperationForbiddenError("the tensor's memory was released")
        return self.allocation


def byte_view(buffer: Any, *, writable: bool, what: str) -> np.ndarray:
    """A ``uint8`` view of a caller's buffer (NumPy array, buffer protocol or DLPack) without
    copying it.

    Raises:
        InvalidArgumentError: not contiguous, not a buffer, or read-only when ``writable``.
    """
    array = as_array(buffer, what)
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{what} is not C-contiguous; pass a contiguous buffer (np.ascontiguousarray "
            "makes one, as a copy)",
            details={"buffer": what},
        )
    if array.dtype.kind == "O":
        raise InvalidArgumentError(
            f"{what} holds Python objects, which have no bytes to copy; pass a numeric array",
            details={"buffer": what},
        )
    if writable and not array.flags.writeable:
        raise InvalidArgumentError(
            f"{what} is read-only; pass a writable buffer (a numpy array, bytearray...)",
            details={"buffer": what},
        )
    return array.reshape(-1).view(np.uint8)


def as_array(buffer: Any, what: str) -> np.ndarray:
    """``buffer`` as a NumPy array over the same memory: arrays as they are, DLPack producers
    through ``np.from_dlpack``, anything with the buffer protocol through ``memoryview``."""
    if isinstance(buffer, np.ndarray):
        return buffer
    if hasattr(buffer, "__dlpack__"):
        try:
            return np.from_dlpack(buffer)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"{what}: NumPy cannot view this {type(buffer).__name__} through DLPack "
                f"({exc}); it must be in host (CPU) memory",
                details={"buffer": what},
            ) from None
    try:
        view = memoryview(buffer)
    except TypeError:
        raise InvalidArgumentError(
            f"{what}: a {type(buffer).__name__} is not a buffer; pass a numpy array, "
            "bytearray, memoryview or anything with the buffer protocol or __dlpack__",
            details={"buffer": what},
        ) from None
    try:
        # Keeps a typed view's dtype and shape (a memoryview of floats gives float32).
        return np.asarray(view)
    except (TypeError, ValueError, NotImplementedError):  # a format NumPy does not know
        return np.frombuffer(view, dtype=np.uint8)


def buffer_storage(
    buffer: Any, size: int | None, dtype: Any, shape: Sequence[int] | None, what: str
) -> tuple[Storage, DType, tuple[int, ...]]:
    """A storage over a caller's buffer (no copy), and the dtype and shape to view it as:
    those given, else the array's own (uint8 for raw bytes or a ``size`` prefix)."""
    array = as_array(buffer, what)
    raw = byte_view(array, writable=False, what=what)
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= raw.size:
            raise InvalidArgumentError(
                f"{what}: size={size!r} but the buffer holds {raw.size} bytes; give a size "
                f"from 0 to {raw.size}"
            )
        raw = raw[:size]
    if dtype is None and shape is None and size is None:
        try:
            dt, dims = fixed_size(dtypes.from_numpy(array.dtype)), tuple(array.shape)
        except InvalidArgumentError:
            dt, dims = dtypes.from_name("uint8"), (raw.size,)
    else:
        dt = dtypes.from_name("uint8") if dtype is None else fixed_size(as_dtype(dtype))
        dims = (raw.size // dt.itemsize,) if shape is None else as_shape(shape)
    needed = math.prod(dims) * dt.itemsize
    if needed > raw.size:
        raise InvalidArgumentError(
            f"{what}: {dt} {list(dims)} needs {needed} bytes but the buffer holds "
            f"{raw.size}; attach a larger buffer"
        )
    return Storage(raw.size, host=raw, keepalive=buffer), dt, dims
