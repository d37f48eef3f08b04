"""The compile cache's directory: entry files, their metadata, locks and eviction.

Layout: ``<key>.crm`` (the container) and ``<key>.json`` (model, version, size, created, last
used), ``sources/<sha256>.json`` (the model content a model file's bytes hold),
``decisions/<sha256>.json`` (what ``device="auto"`` measured and chose), ``locks/<slot>
.lock`` (one builder per slot) and ``.lock`` (renames, metadata and eviction). Every file is
written whole before it gets its name, so a reader sees the old file or the new one, never half
of one: written unnamed (``O_TMPFILE``) and linked into place where the file system allows, else
written under a temporary name and renamed.

A temporary name is ``.tmp-<pid>-<random>``, and its writer holds an ``flock`` on it until it is
renamed: a temporary nobody holds whose process is gone is a leftover of a writer that died, and
the next process to open the cache deletes it. Temporaries count in the size budget. No file is
created through a symbolic link: names are created exclusively (``O_EXCL``, ``O_NOFOLLOW``) or
renamed over (which replaces a link, not what it points at), and the directories the cache
creates inside its directory must be real directories.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from ..host import process_alive

log = logging.getLogger("crossrt")

RACY_NS = 2_000_000_000
"""A file changed less than this before its status was recorded is hashed again next time."""
_STALE_TEMP_S = 3600.0  # an unlocked temporary this old is a leftover whoever named it
_KEY = re.compile(r"[0-9a-f]{64}")  # only files named so are entries: never touch others
_TEMP_OWNER = re.compile(r"\.tmp-(\d+)-")
_SOURCES_KEPT = 32  # source identities an entry's metadata keeps, the latest
_SUBDIRECTORIES = ("locks", "sources", "sources/paths", "decisions")
TAG = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks a crossrt compile cache (https://bford.info/cachedir/).\n"
)


@dataclass(frozen=True)
class CacheEntry:
    """One compiled model in the cache, as ``crossrt cache ls`` shows it.

    Attributes:
        key: the entry's key (64 hex digits); the file is ``<key>.crm``.
        path: the ``.crm`` file.
        size: its size in bytes.
        model: the model's name (``"?"`` when the metadata is lost).
        version: the user cache version it was built with (``None`` when unknown).
        driver: the driver(s) of its nodes, comma-separated.
        device: the device it was compiled for.
        created: when it was written (seconds since the epoch).
        last_used: when it was last written or read from the cache.
        slot: the key without the user version (``""`` when unknown).
    """

    key: str
    path: Path
    size: int
    model: str
    version: int | None
    driver: str
    device: str
    created: float
    last_used: float
    slot: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return {**asdict(self), "path": str(self.path)}


class EntryStore:
    """The files of a cache directory (created when missing).

    Raises:
        InvalidArgumentError: the directory cannot be created.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._link: Callable[[int, str], None] | None = None  # names an unnamed file
        self._probed = False
        try:
            directory.mkdir(parents=True, exist_ok=True)  # the user's path: may be a link
            for sub in _SUBDIRECTORIES:
                with contextlib.suppress(FileExistsError):
                    (directory / sub).mkdir()
                # A link planted here would have the cache write wherever it points.
                if not stat.S_ISDIR(os.lstat(directory / sub).st_mode):
                    raise OSError(errno.ENOTDIR, "not a directory (or a symbolic link)", sub)
            if not os.path.lexists(directory / TAG):
                self.write_file(directory / TAG, _TAG_TEXT.encode())
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot use {str(directory)!r} as a compile cache: {describe(exc)}; give a "
                "writable directory",
                details={"cache_dir": str(directory)},
            ) from None
        with contextlib.suppress(OSError):
            self.temporaries()  # the leftovers of writers that died go at the next start

    def crm(self, key: str) -> Path:
        """The container file of ``key``."""
        return self.directory / f"{key}.crm"

    @contextlib.contextmanager
    def lock(self, slot: str | None = None) -> Iterator[None]:
        """Hold the directory's lock, or with ``slot`` the lock of building that slot.

        ``flock`` locks belong to the open file, so threads of one process exclude each other
        too, and the kernel drops them when a holder dies.
        """
        path = self.directory / (".lock" if slot is None else f"locks/{slot}.lock")
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- reading -------------------------------------------------------------------------

    def entry(self, key: str) -> CacheEntry | None:
        """The entry of ``key``, or ``None``; its metadata may be lost (then ``"?"``)."""
        crm = self.crm(key)
        try:
            st = crm.stat()
        except OSError:
            return None
        meta = read_json(self.directory / f"{key}.json") or {}
        version = meta.get("version")
        return CacheEntry(
            key=key,
            path=crm,
            size=st.st_size,
            model=str(meta.get("model", "?")),
            version=version if isinstance(version, int) else None,
            driver=str(meta.get("driver", "?")),
            device=str(meta.get("device", "?")),
            created=float(meta.get("created", st.st_mtime)),
            last_used=float(meta.get("last_used", st.st_mtime)),
            slot=str(meta.get("slot", "")),
        )

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        found = [self.entry(crm.stem) for crm in self.directory.glob("*.crm") if is_key(crm.stem)]
        return sorted((e for e in found if e is not None), key=lambda e: (e.last_used, e.key))

    def slot_metadata(self, slot: str) -> list[dict[str, Any]]:
        """The metadata of the entries of ``slot`` (one, unless a writer died mid-way)."""
        found = []
        for sidecar in self.directory.glob("*.json"):
            if not is_key(sidecar.stem):
                continue
            meta = read_json(sidecar)
            if meta and meta.get("slot") == slot and sidecar.with_suffix(".crm").exists():
                found.append(meta)
        return found

    def alias(self, digest: str) -> str | None:
        """The content hash of the model whose file bytes have SHA-256 ``digest``."""
        record = read_json(self.directory / "sources" / f"{digest}.json")
        value = record.get("content_hash") if record else None
        return value if isinstance(value, str) else None

    def path_alias(self, path: Path) -> tuple[str, os.stat_result] | None:
        """The content hash of the model in file ``path``, from its status alone, and that
        status.

        Trusted only when the file's device, inode, size, mtime and ctime are those recorded
        when its bytes were hashed, and it had not changed for :data:`RACY_NS` before then
        (so that a change within one tick of a coarse file-system clock cannot go unseen).
        """
        try:
            st = path.stat()
        except OSError:
            return None
        record = read_json(self._path_record(path))
        if not record or record.get("stat") != stat_signature(st):
            return None
        recorded = record.get("recorded_ns")
        if (
            not isinstance(recorded, int)
            or recorded - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS
        ):
            return None
        value = record.get("content_hash")
        return (value, st) if isinstance(value, str) else None

    def proves(self, key: str, source: str) -> bool:
        """Whether the entry of ``key`` was compiled from ``source`` (a source identity, see
        :func:`.cache_keys.digest_identity`): what a source record claims, checked."""
        meta = read_json(self.directory / f"{key}.json")
        sources = meta.get("sources") if meta else None
        return isinstance(sources, list) and source in sources

    def decision(self, key: str) -> dict[str, Any] | None:
        """What ``device="auto"`` chose for decision key ``key`` (64 hex digits), or ``None``."""
        return read_json(self.directory / "decisions" / f"{key}.json")

    # -- writing -------------------------------------------------------------------------

    def set_decision(self, key: str, value: dict[str, Any]) -> None:
        """Record what ``device="auto"`` measured and chose for decision key ``key``."""
        self.write_json(self.directory / "decisions" / f"{key}.json", value)

    def set_path_alias(self, path: Path, st: os.stat_result, content_hash: str) -> None:
        """Record that ``path``, with status ``st`` when it was read, holds ``content_hash``."""
        record = {
            "path": os.path.realpath(path),
            "stat": stat_signature(st),
            "recorded_ns": time.time_ns(),
            "content_hash": content_hash,
        }
        self.write_json(self._path_record(path), record)

    def _path_record(self, path: Path) -> Path:
        name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()
        return self.directory / "sources" / "paths" / f"{name}.json"

    def _record(self, digest: str) -> Path:
        return self.directory / "sources" / f"{digest}.json"

    def set_alias(self, digest: str, content_hash: str) -> None:
        """Record that file bytes of SHA-256 ``digest`` hold model ``content_hash``."""
        self.write_json(self._record(digest), {"content_hash": content_hash})

    def drop_alias(self, digest: str | None = None, path: Path | None = None) -> None:
        """Delete the source record of file bytes ``digest``, or of file ``path``."""
        with contextlib.suppress(OSError):
            if digest is not None:
                self._record(digest).unlink(missing_ok=True)
            if path is not None:
                self._path_record(path).unlink(missing_ok=True)

    def put(
        self, key: str, payload: bytes, meta: dict[str, Any], limit: int | None
    ) -> list[CacheEntry]:
        """Store an entry, then evict down to ``limit``; return the evicted entries."""
        # Written before the directory's lock is taken.
        with self.staged(payload, ".crm") as publish, self.lock():
            publish(self.crm(key))
            self.write_json(self.directory / f"{key}.json", {**meta, "size": len(payload)})
            return self.evict_locked(limit)

    def touch(self, key: str, sources: list[str] | None = None) -> None:
        """Mark an entry used now (least-recently-used order), and compiled from ``sources``
        (source identities) too. Best effort: a cache that cannot be written still serves."""
        with contextlib.suppress(OSError), self.lock():
            if not self.crm(key).exists():
                return  # evicted meanwhile: do not bring its metadata back
            meta = read_json(self.directory / f"{key}.json") or {}
            meta["last_used"] = time.time()
            if sources:
                known = meta.get("sources")
                known = [s for s in known if s not in sources] if isinstance(known, list) else []
                meta["sources"] = [*known, *sources][-_SOURCES_KEPT:]
            self.write_json(self.directory / f"{key}.json", meta)

    def unlink(self, key: str) -> None:
        """Delete an entry's files (hold :meth:`lock`)."""
        self.crm(key).unlink(missing_ok=True)
        (self.directory / f"{key}.json").unlink(missing_ok=True)

    def evict_locked(self, limit: int | None) -> list[CacheEntry]:
        """Delete least recently used entries until the rest fit ``limit`` (hold :meth:`lock`)."""
        if limit is None:
            return []
        entries = self.entries()
        # Another writer's temporary is an entry soon: it takes room too.
        total = sum(e.size for e in entries) + sum(size for _, size in self.temporaries())
        evicted = []
        for entry in entries:
            if total <= limit:
                break
            self.unlink(entry.key)
            total -= entry.size
            evicted.append(entry)
            log.info(
                "compile cache %s: evicted %s (%s)", self.directory, entry.key[:12], entry.model
            )
        return evicted

    def tidy_locked(self) -> None:
        """Delete leftovers: metadata without an entry, temporary files of writers that died,
        source records of models no entry holds (hold :meth:`lock`)."""
        self.temporaries()
        held = set()
        for path in self.directory.glob("*.json"):
            if not is_key(path.stem):
                continue
            if not path.with_suffix(".crm").exists():
                path.unlink(missing_ok=True)
            elif meta := read_json(path):
                held.add(meta.get("content_hash"))
        sources = self.directory / "sources"
        for path in [*sources.glob("*.json"), *(sources / "paths").glob("*.json")]:
            if not is_key(path.stem):
                continue
            record = read_json(path)
            if not record or record.get("content_hash") not in held:
                path.unlink(missing_ok=True)

    def temporaries(self) -> list[tuple[Path, int]]:
        """The temporary files of live writers, with their sizes, once the leftovers of
        writers that died are deleted."""
        live = []
        now = time.time()
        for path in self.directory.glob(".tmp-*"):
            try:
                if _is_leftover(path, now):
                    path.unlink(missing_ok=True)
                else:
                    live.append((path, path.lstat().st_size))
            except OSError:
                continue
        return live

    @contextlib.contextmanager
    def staged(self, data: bytes, suffix: str) -> Iterator[Callable[[Path], None]]:
        """Write ``data`` to a new file in the directory, not yet in place: the body gets the
        function that puts it at a path (replacing any file there, or a link, not what the
        link points at). Unnamed until then where the file system allows (nothing is left if
        the process dies), else named :func:`temp_name`; locked either way, so that no one
        takes it for a leftover while it is written."""
        if not self._probed:
            self._link, self._probed = probe_links(self.directory), True
        link = self._link
        temp = self.directory / temp_name(suffix)
        if link is not None:
            fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, _MODE)
        else:
            fd = os.open(temp, _CREATE, _MODE)
        named = link is None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _write(fd, data)

            def publish(path: Path) -> None:
                nonlocal named
                if link is not None and not named:
                    try:
                        link(fd, str(path))  # a new name: no temporary at all
                        return
                    except FileExistsError:
                        link(fd, str(temp))
                        named = True
                os.replace(temp, path)
                named = False

            yield publish
        finally:
            if named:  # not put in place
                with contextlib.suppress(OSError):
                    temp.unlink()
            os.close(fd)

    def write_file(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data``, atomically."""
        with self.staged(data, path.suffix) as publish:
            publish(path)

    def write_json(self, path: Path, value: dict[str, Any]) -> None:
        """Replace ``path`` with ``value`` as JSON, atomically."""
        self.write_file(path, json.dumps(value, indent=1, sort_keys=True).encode())


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE = 0o666  # less the umask, as open() gives: a cache may be shared by a group


def temp_name(suffix: str) -> str:
    """A new temporary file name, naming this process (its owner)."""
    return f".tmp-{os.getpid()}-{os.urandom(6).hex()}{suffix}"


def _is_leftover(path: Path, now: float) -> bool:
    """Whether a temporary file belongs to a writer that died: nobody holds its lock, and the
    process its name gives is gone (or, since that process may be another that got its PID,
    or live in another PID namespace, the file is an hour old)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return True  # a link: crossrt never makes one, and deleting it removes the link
        return now - path.lstat().st_mtime > _STALE_TEMP_S  # cannot tell: by age
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its writer holds it
    finally:
        os.close(fd)
    owner = _TEMP_OWNER.match(path.name)
    if owner is None or not process_alive(int(owner.group(1))):
        return True
    return now - path.lstat().st_mtime > _STALE_TEMP_S


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_lock(path: Path) -> int:
    """A lock file, created when missing, never through a link. One that cannot be written
    (a cache shared read-only) is locked through a read-only descriptor."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO planted here
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, _MODE)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        fd = os.open(path, os.O_RDONLY | flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def _link_by_fd_path(fd: int, path: str) -> None:
    os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _link_empty_path(fd: int, path: str) -> None:
    # linkat(fd, "", AT_EMPTY_PATH): where /proc is not this mount's (containers); the kernel
    # allows it to privileged processes, and since 6.10 to any that opened the file.
    if _libc().linkat(fd, b"", _AT_FDCWD, os.fsencode(path), _AT_EMPTY_PATH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)


LINKS: tuple[Callable[[int, str], None], ...] = (_link_by_fd_path, _link_empty_path)
"""Ways to give an unnamed file a name, tried in order; empty: temporaries are named."""


def probe_links(directory: Path) -> Callable[[int, str], None] | None:
    """The first of :data:`LINKS` that names an unnamed file in ``directory``, or ``None``."""
    if not LINKS or not hasattr(os, "O_TMPFILE"):
        return None
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, _MODE)
    except OSError:
        return None  # the file system has no unnamed files
    try:
        for link in LINKS:
            probe = directory / temp_name(".probe")
            try:
                link(fd, str(probe))
            except OSError:
                continue
            probe.unlink(missing_ok=True)
            return link
        return None
    finally:
        os.close(fd)


def describe(exc: OSError) -> str:
    """An OS error in a few words: its reason and the file."""
    where = exc.filename if exc.filename is not None else ""
    return f"{exc.strerror or exc}" + (f" ({where})" if where else "")


def stat_signature(st: os.stat_result) -> list[int]:
    """What changes when a file's content changes: device, inode, size, mtime and ctime (which
    no user call can set back)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def is_key(name: str) -> bool:
    """Whether ``name`` is an entry key (64 lowercase hex digits)."""
    return _KEY.fullmatch(name) is not None


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or ``None`` when it is missing or not one."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
