"""The compile cache's directory: entry files, their metadata, locks and eviction.

Layout: ``<key>.crm`` (the container) and ``<key>.json`` (model, version, size, created, last
used), ``sources/<sha256>.json`` (the model content a model file's bytes hold), ``locks/<slot>
.lock`` (one builder per slot) and ``.lock`` (renames, metadata and eviction). Every file is
written under a temporary name in the directory and renamed into place, so a reader sees the
old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

log = logging.getLogger("crossrt")

RACY_NS = 2_000_000_000
"""A file changed less than this before its status was recorded is hashed again next time."""
_STALE_TEMP_S = 3600.0  # a temporary file this old belongs to a writer that died
_KEY = re.compile(r"[0-9a-f]{64}")  # only files named so are entries: never touch others
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
        try:
            (directory / "locks").mkdir(parents=True, exist_ok=True)
            (directory / "sources" / "paths").mkdir(parents=True, exist_ok=True)
            if not (directory / TAG).exists():
                (directory / TAG).write_text(_TAG_TEXT)
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot use {str(directory)!r} as a compile cache: {exc.strerror}; give a "
                "writable directory",
                details={"cache_dir": str(directory)},
            ) from None

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
        with open(path, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

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

    def path_alias(self, path: Path) -> str | None:
        """The content hash of the model in file ``path``, from its status alone.

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
        return value if isinstance(value, str) else None

    # -- writing -------------------------------------------------------------------------

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

    def set_alias(self, digest: str, content_hash: str) -> None:
        """Record that file bytes of SHA-256 ``digest`` hold model ``content_hash``."""
        self.write_json(
            self.directory / "sources" / f"{digest}.json", {"content_hash": content_hash}
        )

    def put(
        self, key: str, payload: bytes, meta: dict[str, Any], limit: int | None
    ) -> list[CacheEntry]:
        """Store an entry, then evict down to ``limit``; return the evicted entries."""
        temp = self.write_temp(payload, ".crm")
        try:
            with self.lock():
                os.replace(temp, self.crm(key))
                self.write_json(self.directory / f"{key}.json", {**meta, "size": len(payload)})
                return self.evict_locked(limit)
        finally:
            temp.unlink(missing_ok=True)  # only left when the rename failed

    def touch(self, key: str) -> None:
        """Mark an entry used now (least-recently-used order)."""
        with self.lock():
            if not self.crm(key).exists():
                return  # evicted meanwhile: do not bring its metadata back
            meta = read_json(self.directory / f"{key}.json") or {}
            meta["last_used"] = time.time()
            with contextlib.suppress(OSError):
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
        total = sum(e.size for e in entries)
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
        """Delete leftovers: metadata without an entry, stale temporary files, source records
        of models no entry holds (hold :meth:`lock`)."""
        now = time.time()
        held = set()
        for path in self.directory.glob("*.json"):
            if not is_key(path.stem):
                continue
            if not path.with_suffix(".crm").exists():
                path.unlink(missing_ok=True)
            elif meta := read_json(path):
                held.add(meta.get("content_hash"))
        for path in self.directory.glob(".tmp-*"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > _STALE_TEMP_S:
                    path.unlink()
        sources = self.directory / "sources"
        for path in [*sources.glob("*.json"), *(sources / "paths").glob("*.json")]:
            if not is_key(path.stem):
                continue
            record = read_json(path)
            if not record or record.get("content_hash") not in held:
                path.unlink(missing_ok=True)

    def write_temp(self, data: bytes, suffix: str) -> Path:
        """Write ``data`` to a new temporary file in the directory (same file system, so it
        can be renamed into place)."""
        temp = self.directory / f".tmp-{os.getpid()}-{os.urandom(6).hex()}{suffix}"
        try:
            with open(temp, "xb") as f:
                f.write(data)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp

    def write_json(self, path: Path, value: dict[str, Any]) -> None:
        """Replace ``path`` with ``value`` as JSON, atomically."""
        temp = self.write_temp(json.dumps(value, indent=1, sort_keys=True).encode(), ".json")
        os.replace(temp, path)


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
