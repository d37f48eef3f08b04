"""System shared-memory regions (Triton's extension), each belonging to the user who
registered it.

Triton makes a region global to the server: any local user could name another's region and
read or overwrite their tensors through the daemon. Here each user has regions of its own (a
name is looked up among the caller's user's regions only, so two users may both register
Triton's usual names); registration is refused to a caller whose user is not proven (an
anonymous TCP client: :mod:`.peers`), for a ``/dev/shm`` file that user could not open
read-write itself, and over a connection from another host. Tensors are
read and written with ``pread``/``pwrite`` on the region's descriptor, not through a
mapping: a client that truncates its file afterwards gets an error, not a daemon killed by
SIGBUS. A region whose registering process has died is released (:meth:`Regions.sweep`).

A crossrt client on the direct lane registers a memfd instead, passing the descriptor itself
over the Unix socket (:meth:`Regions.register_sealed`): sealed against shrinking, it cannot be
cut short under a mapping, so the daemon maps it and the model reads its inputs where the
client wrote them, with no copy, and outputs are written there with one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from ..host import process_alive
from .peers import Peer
from .status import ServiceError

SHM_DIRECTORY = "/dev/shm"
MAX_REGION_BYTES = 2**30
"""The largest region a client may register, unless the daemon says otherwise
(``max_region_bytes``)."""


@dataclass
class Region:
    """One registration: ``byte_size`` bytes at ``offset`` of the segment ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    uid: int
    pid: int
    fd: int
    """Read and written with pread/pwrite (a mapped region's: asked only where its holes are)."""
    users: int = 0  # reads and writes under way: the descriptor is closed after the last
    released: bool = False
    mapping: np.ndarray | None = None
    """A sealed memfd's bytes, mapped (:meth:`Regions.register_sealed`); else read with
    pread. Unmapped once the last array viewing it is gone."""


def may_open(st: os.stat_result, uid: int, groups: frozenset[int]) -> bool:
    """Whether user ``uid`` (in ``groups``) may open a file of this owner and mode for
    reading and writing, as the kernel would decide (root may)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid in groups:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & 0o6 == 0o6


def _denied(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.PERMISSION_DENIED, message)


def _owner(peer: Peer) -> int:
    """The peer's user, or a refusal when the daemon cannot tell who it is."""
    if not peer.local:
        raise _denied(
            f"system shared memory is refused to {peer.address}, a client on another host; "
            "send tensors in the request, or run the client on the daemon's host"
        )
    if peer.uid is None:
        raise ServiceError(
            grpc.StatusCode.UNAUTHENTICATED,
            f"system shared memory opens files as the caller's user, and {peer.address} is "
            "not a proven local user: send tensors in the request, or connect through the "
            "daemon's Unix socket, or send a token the tokens file maps to your local user",
        )
    return peer.uid


class Regions:
    """The registered regions, by name."""

    def __init__(self, directory: str = SHM_DIRECTORY, max_bytes: int = MAX_REGION_BYTES) -> None:
        self._directory = directory
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._regions: dict[tuple[int, str], Region] = {}
        """By (user, name): each user's names are its own."""

    def register(self, name: str, key: str, offset: int, byte_size: int, peer: Peer) -> None:
        """Register ``byte_size`` bytes at ``offset`` of segment ``key`` as ``name``."""
        uid = self._registrant(name, peer, byte_size)
        segment = key[1:] if key.startswith("/") else key
        if not segment or "/" in segment or segment in (".", "..") or "\0" in segment:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"key {key!r} is not a shared-memory name; give the shm_open name ('/name')",
            )
        path = os.path.join(self._directory, segment)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"no shared-memory segment {key!r} ({path}); create it before registering",
            ) from None
        except OSError as exc:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cannot open shared-memory segment {key!r}: {exc.strerror}",
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _denied(f"{path} is not a shared-memory segment")
            if not may_open(st, uid, peer.groups()):
                raise _denied(
                    f"user {uid} may not open {path} (owner {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}) for reading and writing, so it may not "
                    "register it; register a segment of your own"
                )
            if offset + byte_size > st.st_size:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"region {name!r}: offset {offset} + byte_size {byte_size} is past the end "
                    f"of {key!r} ({st.st_size} bytes)",
                )
            self._add(Region(name, key, offset, byte_size, uid, peer.pid, fd))
        except BaseException:
            os.close(fd)
            raise

    def register_sealed(self, name: str, fd: int, byte_size: int, peer: Peer) -> None:
        """Register the first ``byte_size`` bytes of the memfd ``fd`` (the peer's, passed over
        the Unix socket; this call owns it from now on, and closes it when it refuses).

        Raises:
            ServiceError: FAILED_PRECONDITION for a file not sealed against shrinking,
                INVALID_ARGUMENT for a size past its end, ALREADY_EXISTS for a name in use.
        """
        try:
            uid = self._registrant(name, peer, byte_size)
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                size = os.fstat(fd).st_size
            except OSError:
                seals, size = 0, 0  # not a memfd: no seals
            if not seals & fcntl.F_SEAL_SHRINK:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"region {name!r}: the descriptor passed is not a memfd sealed against "
                    "shrinking (F_SEAL_SHRINK), which the daemon could map safely; seal it, or "
                    "register a /dev/shm segment by name",
                )
            if not 0 < byte_size <= size:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"region {name!r}: byte_size {byte_size} does not fit the file passed "
                    f"({size} bytes)",
                )
            try:
                mapped = np.frombuffer(mmap.mmap(fd, byte_size), np.uint8)
            except OSError as exc:  # sealed against writing (F_SEAL_WRITE), say
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"region {name!r}: the daemon cannot map the file passed for reading and "
                    f"writing ({exc.strerror}); pass a memfd sealed against shrinking only",
                ) from None
            # The descriptor is kept, to ask where the file's holes are (_written)
            self._add(Region(name, "memfd", 0, byte_size, uid, peer.pid, fd, mapping=mapped))
        except BaseException:
            os.close(fd)
            raise

    def _registrant(self, name: str, peer: Peer, byte_size: int) -> int:
        """The user registering region ``name`` of ``byte_size`` bytes (after the dead's
        regions are released)."""
        uid = _owner(peer)
        self.sweep()
        if not name:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "a region needs a name")
        if byte_size > self._max_bytes:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"region {name!r}: byte_size {byte_size} is over this daemon's limit of "
                f"{self._max_bytes} bytes (max_region_bytes); register smaller regions, or "
                "start crossrt serve with a larger --max-region-bytes",
            )
        return uid

    def _add(self, region: Region) -> None:
        with self._lock:
            if (region.uid, region.name) in self._regions:
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"you have a region named {region.name!r} registered already; unregister "
                    "it first or choose another name",
                )
            self._regions[region.uid, region.name] = region

    def status(self, name: str, peer: Peer) -> list[Region]:
        """The peer's user's regions (``name`` empty), or the one named."""
        uid = _owner(peer)
        self.sweep()
        with self._lock:
            if not name:
                return [r for r in self._regions.values() if r.uid == uid]
            return [self._mine(name, uid)]

    def unregister(self, name: str, peer: Peer) -> None:
        """Unregister the region named, or (``name`` empty) every region of the peer's user."""
        uid = _owner(peer)
        with self._lock:
            keys = [k for k, r in self._regions.items() if r.uid == uid]
            if name:
                self._mine(name, uid)
                keys = [(uid, name)]
            for key in keys:
                _release(self._regions.pop(key))
        self.sweep()

    def _mine(self, name: str, uid: int) -> Region:
        region = self._regions.get((uid, name))
        if region is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"you have no shared-memory region {name!r} registered; register it first",
            )
        return region

    @contextlib.contextmanager
    def _slice(self, name: str, offset: int, size: int, peer: Peer) -> Iterator[Region]:
        uid = _owner(peer)
        with self._lock:
            region = self._mine(name, uid)
            if offset + size > region.byte_size:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"region {name!r}: offset {offset} + byte_size {size} is past its end "
                    f"({region.byte_size} bytes registered)",
                )
            region.users += 1
        try:
            yield region
        finally:
            with self._lock:
                region.users -= 1
                if region.released and not region.users:
                    _close(region)

    def read(self, name: str, offset: int, size: int, peer: Peer) -> np.ndarray:
        """``size`` bytes at ``offset`` of the peer's region ``name``: a view of a mapped
        region (no copy), else copied out."""
        with self._slice(name, offset, size, peer) as region:
            _written(region, offset, size)
            if region.mapping is not None:
                return region.mapping[offset : offset + size]
            data = np.empty(size, np.uint8)
            got = os.preadv(region.fd, [data.data], region.offset + offset) if size else 0
        if got != size:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"region {name!r}: segment {region.key!r} shrank since it was registered; "
                "register it again",
            )
        return data

    def mapped(self, name: str, offset: int, size: int, peer: Peer) -> np.ndarray | None:
        """The ``size`` bytes at ``offset`` of the peer's region ``name`` as an array over its
        mapping, to write an output into; ``None`` for a region read and written by copy."""
        with self._slice(name, offset, size, peer) as region:
            if region.mapping is None:
                return None
            return region.mapping[offset : offset + size]

    def write(self, name: str, offset: int, data: np.ndarray, peer: Peer) -> None:
        """Write ``data`` (contiguous bytes) at ``offset`` of the peer's region ``name``."""
        size = data.nbytes
        with self._slice(name, offset, size, peer) as region:
            if region.mapping is not None:
                region.mapping[offset : offset + size] = data.reshape(-1).view(np.uint8)
                return
            end = region.offset + offset + size
            if os.fstat(region.fd).st_size < end:  # pwrite would grow the client's file
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"region {name!r}: segment {region.key!r} shrank since it was registered; "
                    "register it again",
                )
            wrote = os.pwritev(region.fd, [data.data], region.offset + offset) if size else 0
        if wrote != size:
            raise ServiceError(grpc.StatusCode.INTERNAL, f"region {name!r}: short write")

    def sweep(self) -> list[str]:
        """Release the regions whose registering process has died; their names."""
        with self._lock:
            dead = [k for k, r in self._regions.items() if r.pid and not process_alive(r.pid)]
            for key in dead:
                _release(self._regions.pop(key))
        return [name for _, name in dead]

    def close(self) -> None:
        """Release every region."""
        with self._lock:
            for region in self._regions.values():
                _release(region)
            self._regions.clear()


def _written(region: Region, offset: int, size: int) -> None:
    """Refuse a slice that holds a hole: bytes its client never wrote (a sparse file costs
    its client nothing, and reading it would cost the daemon its whole size: a 1 GiB sparse
    region cost 6.2 GiB; a model reading a hole of a mapped memfd fills it with pages the
    daemon is charged for)."""
    start = region.offset + offset
    try:
        hole = os.lseek(region.fd, start, os.SEEK_HOLE) if size else start
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a file system that cannot tell: read it
            return
        hole = start  # past the end: it shrank
    if hole < start + size:
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"region {region.name!r}: bytes {hole - region.offset} to {offset + size} of the "
            f"slice asked for were never written (a hole in segment {region.key!r}, or past "
            "its end); write the tensor into the region before the request",
        )


def _release(region: Region) -> None:
    """Close the region's descriptor now, or after the last read or write under way (under
    the registry's lock): a number reused by another file must never be read."""
    region.released = True
    if not region.users:
        _close(region)


def _close(region: Region) -> None:
    os.close(region.fd)  # a mapping keeps a descriptor of its own (Python's mmap dups it)
