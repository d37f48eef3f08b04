"""Tensors in shared memory, which another process can map (``OH_NNTensor_CreateWithFd``).

A segment is a memfd (``os.memfd_create``) where the system has one: it has no name in any
file system, so nothing can be left behind; the kernel frees it when the last descriptor and
mapping are gone, however the processes holding them end. Its size is sealed (it can neither
shrink nor grow), so another process may map it safely. Elsewhere, or when a name is wanted
(``keep_name=True``, for peers that open segments by name, like the KServe shared-memory
extension), it is a POSIX segment made through :mod:`multiprocessing.shared_memory`: created
0600 under an unguessable name (128 random bits), unlinked right after mapping unless the
name is kept, else unlinked when its last tensor is freed, at exit, or, if the process dies
without running either, by Python's resource tracker process. When the tracker dies too (the
whole process group killed), the name is left behind: names carry the creating process's PID
(``crossrt-<pid namespace>-<pid>-<random>``), and the next crossrt process of the same user
(its first :class:`Runtime` or named segment) unlinks those whose process is gone
(:func:`remove_leftovers`).

Pass a segment to another process as its file descriptor (``socket.send_fds``, or
``subprocess`` ``pass_fds``); there, :func:`tensor_from_fd` maps it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import math
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ...dtypes import DType
from ...errors import InvalidArgumentError, UnsupportedError
from ...host import owned_name, remove_orphans
from .allocation import host_memory_error, is_out_of_memory
from .allocator import host_allocator
from .storage import Storage, buffer_storage
from .tensorbase import TensorBase
from .tensordesc import as_dtype, as_shape, byte_index, fixed_size, owner_key

log = logging.getLogger("crossrt")

KINDS = ("memfd", "posix")
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
"""The seals a memfd segment gets: its size can change no more."""
SHM_DIRECTORY = "/dev/shm"  # where Linux shows POSIX segments (shm_open names) as files
_PREFIX = "crossrt-"  # a segment is named owned_name(_PREFIX) + 32 hex digits
_swept = False
_sweep_lock = threading.Lock()


def remove_leftovers(directory: str = SHM_DIRECTORY) -> list[str]:
    """Unlink the named segments this user's dead crossrt processes left behind: names of
    crossrt's, made in this PID namespace, by a process that no longer exists
    (``host.remove_orphans``).

    Returns:
        The names removed.
    """
    return [os.path.basename(path) for path in remove_orphans(_PREFIX, (directory,))]


def sweep_once() -> None:
    """:func:`remove_leftovers`, once per process (a :class:`Runtime` and the first named
    segment call it)."""
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    removed = remove_leftovers()
    if removed:
        log.info("removed %d shared-memory segments of dead processes: %s", len(removed), removed)


class SharedMemorySegment:
    """One shared-memory segment, mapped read-write in this process.

    Attributes:
        kind: ``"memfd"`` or ``"posix"``.
        name: the POSIX name while it has one (``keep_name``), else the memfd's label (shown
            in ``/proc/<pid>/fd``) or ``None``.
        fd: its file descriptor (close-on-exec; pass it on explicitly).
        size: its size in bytes.
    """

    def __init__(self, size: int, *, kind: str | None = None, keep_name: bool = False) -> None:
        size = byte_index(size, "size")
        memfd = hasattr(os, "memfd_create")
        kind = kind or ("memfd" if memfd and not keep_name else "posix")
        if kind not in KINDS:
            raise InvalidArgumentError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
        if kind == "memfd" and (keep_name or not memfd):
            why = "a memfd has no name to keep" if keep_name else "this system has no memfd"
            raise UnsupportedError(f"kind='memfd' is not possible: {why}; use kind='posix'")
        label = owned_name(_PREFIX) + secrets.token_hex(16)
        length = max(size, 1)  # the system maps no empty files
        posix: shared_memory.SharedMemory | None = None
        fd = -1
        try:
            if kind == "memfd":
                fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.fchmod(fd, 0o600)  # memfds start 0777; /proc/<pid>/fd could reopen them
                os.ftruncate(fd, length)
                # Its size is final: a process it is passed to may map it without the risk of
                # SIGBUS from a file cut short under its mapping (the daemon checks the seal).
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS | fcntl.F_SEAL_SEAL)
            else:
                sweep_once()
                posix = shared_memory.SharedMemory(name=label, create=True, size=length)  # 0600
                fd = os.dup(posix._fd)  # type: ignore[attr-defined]  # ours: its own one closes
                posix.close()
                if not keep_name:
                    posix.unlink()  # the mapping below keeps the memory; no name to leak
                    posix = None
            self._map = mmap.mmap(fd, length)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            if posix is not None:
                posix.unlink()
            if is_out_of_memory(exc):
                raise host_memory_error(length, f"a shared-memory segment ({kind})", exc) from None
            raise
        self.kind, self.fd, self.size = kind, fd, size
        self.name: str | None = label if kind == "memfd" or posix is not None else None
        self._close = weakref.finalize(self, _close, fd, self._map, posix)

    def array(self) -> np.ndarray:
        """A ``uint8`` view of the whole segment."""
        return np.frombuffer(self._map, dtype=np.uint8, count=self.size)

    def close(self) -> None:
        """Unlink (a named segment), unmap (once no view is left) and close the descriptor."""
        self._close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return not self._close.alive


def _close(fd: int, mapped: mmap.mmap, posix: shared_memory.SharedMemory | None) -> None:
    if posix is not None:
        with contextlib.suppress(FileNotFoundError):
            posix.unlink()
    _unmap(mapped)
    os.close(fd)


def shared_storage(
    shape: Sequence[int] | int,
    dtype: Any,
    *,
    name: str,
    kind: str | None,
    keep_name: bool,
    owner: Any,
) -> tuple[Storage, DType, tuple[int, ...]]:
    """The storage of a host tensor in a new shared-memory segment of its own, with the dtype
    and shape to view it as (``Tensor.shared`` wraps it; see there)."""
    dt, dims = fixed_size(as_dtype(dtype)), as_shape(shape)
    nbytes = math.prod(dims) * dt.itemsize
    segment = SharedMemorySegment(nbytes, kind=kind, keep_name=keep_name)
    try:
        allocation = host_allocator().adopt(segment, nbytes, owner=owner_key(owner), name=name)
    except BaseException:
        segment.close()
        raise
    storage = Storage(
        nbytes,
        host=segment.array(),
        allocation=allocation,
        fd=segment.fd,
        on_release=segment.close,
        keepalive=segment,
    )
    return storage, dt, dims


def fd_storage(
    fd: int, size: int, offset: int, dtype: Any, shape: Sequence[int] | None
) -> tuple[Storage, DType, tuple[int, ...]]:
    """A storage over ``size`` bytes at ``offset`` of a shared-memory file, mapped without a
    copy, with the dtype and shape to view it as (``Tensor.from_fd`` wraps it; see there).

    Raises:
        InvalidArgumentError: ``fd`` is not an open file, or the range is beyond its end.
    """
    size, offset = byte_index(size, "size"), byte_index(offset, "offset")
    try:
        file_size = os.fstat(fd).st_size
    except (OSError, TypeError, OverflowError):
        raise InvalidArgumentError(
            f"fd={fd!r} is not an open file descriptor; pass the fd of a shared-memory "
            "segment (tensor.fd in the process that made it)",
            details={"fd": repr(fd)},
        ) from None
    if offset + size > file_size:
        raise InvalidArgumentError(
            f"fd {fd}: bytes [{offset}, {offset + size}) are beyond the end of the file, "
            f"which holds {file_size}; give offset + size <= {file_size}",
            details={"fd": fd, "offset": offset, "size": size, "file_size": file_size},
        )
    raw, mapped = np.empty(0, dtype=np.uint8), None
    if size:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets must be aligned
        mapped = mmap.mmap(fd, offset - start + size, offset=start)
        raw = np.frombuffer(mapped, dtype=np.uint8, count=size, offset=offset - start)
    storage, dt, dims = buffer_storage(raw, None, dtype, shape, f"fd {fd}")
    storage.fd, storage.fd_offset = fd, offset
    if mapped is not None:
        storage.on_release = functools.partial(_unmap, mapped)
    return storage, dt, dims


def _unmap(mapped: mmap.mmap) -> None:
    # With NumPy views still alive the close fails; the mapping goes with the last of them.
    with contextlib.suppress(BufferError):
        mapped.close()


def segment_name(tensor: TensorBase) -> str | None:
    """The name of a shared tensor's segment: its POSIX name when ``keep_name`` was given,
    the memfd's label otherwise; ``None`` for other tensors."""
    storage = tensor._storage
    segment = storage.keepalive if storage is not None else None
    return segment.name if isinstance(segment, SharedMemorySegment) else None
