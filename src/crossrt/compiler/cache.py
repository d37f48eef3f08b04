"""The compiled-model cache: content-addressed ``.crm`` entries in a directory (NNRt SetCache).

``compile(model, device, cache_dir=...)`` looks a model up by a key over everything its
compiled form depends on (see :mod:`.cache_keys`) and, on a miss, compiles and stores it. A
slot (the model on a target) holds one entry, and NNRt's version rules apply to it: an entry
built with an older cache version is rebuilt and replaced; one built with a newer version is
an error. An entry that fails to load (its SHA-256 does not match, it is truncated...) is
rebuilt with a warning, never returned. A size budget evicts the least recently used entries
after each insert.

The cache only saves time: one that cannot be used (a directory that cannot be created or
written, a file where a directory belongs...) is passed by with one warning, and the compile
goes on without it. A source record (model file bytes or status -> content hash) is a claim
that the entry it leads to checks: the entry lists the sources it was compiled from, so an
edited record costs a recompute of the content hash, never another model.

Processes share a directory safely: files are renamed into place, the directory's metadata
changes under an exclusive ``flock``, and one process at a time builds a given slot, so
processes compiling one model at once compile it once and leave one entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..config import settings
from ..drivers.base import CompileOptions, DeviceInfo, Driver
from ..drivers.registry import resolve_device
from ..errors import CrossrtError, InvalidArgumentError, StatusCode
from ..model import Model
from .cache_keys import (
    RECIPE,
    SourceId,
    digest_identity,
    fallback_material,
    file_identity,
    identify,
    json_safe,
    key_of,
    slot_of,
)
from .cache_store import CacheEntry, EntryStore, describe
from .container import FORMAT_VERSION, load_executable
from .executable import Executable

__all__ = ["CacheEntry", "CacheStats", "CompileCache", "cache_stats", "shared_cache"]

log = logging.getLogger("crossrt")


@dataclass
class CacheStats:
    """What a cache did.

    Attributes:
        hits: compiles answered from the cache.
        misses: compiles that had to build (rebuilds included).
        rebuilds: misses that replaced a corrupt entry or one of an older cache version.
        evictions: entries removed to keep within the size budget.
        compile_seconds: time spent building on misses.
    """

    hits: int = 0
    misses: int = 0
    rebuilds: int = 0
    evictions: int = 0
    compile_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return asdict(self)


_process_stats = CacheStats()
_stats_lock = threading.Lock()


def cache_stats() -> CacheStats:
    """A snapshot of the counters of every compile cache in this process, added up."""
    with _stats_lock:
        return replace(_process_stats)


class CompileCache:
    """A directory of compiled models (OH_NNCompilation_SetCache).

    Args:
        directory: where entries live; created when missing.
        version: the user cache version (NNRt's cache version): an entry built with an older
            version is rebuilt, one built with a newer version is refused.
        max_bytes: size budget; after each insert the least recently used entries are evicted
            until the entries fit. ``None``: no limit.

    Raises:
        InvalidArgumentError: the directory cannot be created, or a bad version or budget.

    Example:
        >>> cache = CompileCache("~/.cache/crossrt", version=1, max_bytes=2 << 30)
        >>> exe = crossrt.compile("model.onnx", "cpu", cache_dir=cache.directory)
    """

    def __init__(
        self, directory: str | os.PathLike[str], version: int = 0, max_bytes: int | None = None
    ) -> None:
        _check_arguments(version, max_bytes)
        self.directory = Path(directory).expanduser().absolute()
        self.version = version
        self.max_bytes = max_bytes
        self._store = EntryStore(self.directory)
        self._stats = CacheStats()
        self._warned = False

    @property
    def stats(self) -> CacheStats:
        """A snapshot of this cache object's counters."""
        with _stats_lock:
            return replace(self._stats)

    def key(
        self,
        content_hash: str,
        driver: Driver,
        device: DeviceInfo,
        options: CompileOptions,
        fallback: str | Sequence[str] | None = None,
    ) -> str:
        """The entry key of a model (by :attr:`Model.content_hash`) on a target at
        :attr:`version`."""
        return key_of(slot_of(content_hash, driver, device, options, fallback), self.version)

    # -- compile through the cache -------------------------------------------------------

    def get_or_compile(
        self,
        source: Any,
        driver: Driver,
        device: DeviceInfo,
        options: CompileOptions,
        build: Callable[[Model], Executable],
        fallback: str | Sequence[str] | None = None,
    ) -> Executable:
        """The cached executable of ``source`` on this target, or ``build(model)``, stored.

        A model file seen before is recognised by its status while it is unchanged, else by
        the SHA-256 of its bytes (a buffer too), so a hit neither parses nor validates it; on
        a miss it is loaded and validated as :func:`crossrt.load_model` does.

        Raises:
            InvalidArgumentError: (INVALID) the cache holds this model on this target built
                with a newer cache version than :attr:`version`.
            CrossrtError: whatever loading the model or ``build`` raises.
        """
        source_id = identify(source)
        if not json_safe(options.to_dict()):
            log.warning(
                "compile cache %s: options %r are not plain JSON and cannot be keyed; "
                "compiling without the cache",
                self.directory,
                options.to_dict(),
            )
            return build(source_id.load()[0])
        target = (driver, device, options, fallback)
        try:
            found = self._lookup(source_id, *target)
        except OSError as exc:
            self._unusable(exc)
            found = None
        if found is not None:
            self._count(hits=1)
            return found
        model, aliasable = source_id.load()
        sources = source_id.identities() if aliasable else []
        slot = slot_of(model.content_hash, *target)
        key = key_of(slot, self.version)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self._store.lock(slot))
                # Another process may have built it while this one waited for the slot.
                inside = self._read(key, model.content_hash, device, sources)
                if isinstance(inside, Executable):
                    rebuilt = False
                else:
                    rebuilt = self._clear_slot(slot, key, inside)
            except OSError as exc:
                self._unusable(exc)
                return build(model)
            if isinstance(inside, Executable):
                self._count(hits=1)
                exe = inside
            else:
                self._count(misses=1, rebuilds=int(rebuilt))
                started = time.perf_counter()
                try:
                    exe = build(model)
                finally:
                    self._count(compile_seconds=time.perf_counter() - started)
                self._put(key, slot, exe, fallback, sources=sources)
        if aliasable:
            self._remember(source_id, model.content_hash)
        return exe

    # -- device="auto" decisions ---------------------------------------------------------

    def decision(self, material: Mapping[str, Any]) -> dict[str, Any] | None:
        """The decision stored for ``material`` (what a choice depends on), or ``None``."""
        try:
            return self._store.decision(_decision_key(material, self.version))
        except OSError as exc:
            self._unusable(exc)
            return None

    def remember_decision(self, material: Mapping[str, Any], decision: dict[str, Any]) -> None:
        """Store ``decision`` for ``material``; a cache that cannot be written is passed by."""
        try:
            self._store.set_decision(_decision_key(material, self.version), decision)
        except OSError as exc:
            self._unusable(exc, "store a device='auto' decision")

    # -- entries -------------------------------------------------------------------------

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        return self._store.entries()

    def size(self) -> int:
        """Bytes of all entries."""
        return sum(e.size for e in self.entries())

    def entry(self, key: str) -> CacheEntry:
        """The entry of ``key``, or of the one key that starts with ``key`` (a prefix).

        Raises:
            InvalidArgumentError: no entry (NOT_FOUND), or several, match.
        """
        prefix = key.strip().lower()
        matches = [e for e in self.entries() if prefix and e.key.startswith(prefix)]
        if len(matches) != 1:
            what = "no entry" if not matches else f"{len(matches)} entries"
            raise InvalidArgumentError(
                f"{what} of cache {str(self.directory)!r} match key {key!r}; run `crossrt "
                "cache ls` and give one key, or a longer prefix of it",
                code=StatusCode.NOT_FOUND if not matches else None,
                details={"key": key, "matches": [e.key for e in matches]},
            )
        return matches[0]

    def export_entry(self, key: str) -> bytes:
        """The ``.crm`` bytes of an entry (OH_NNCompilation_ExportCacheToBuffer).

        Args:
            key: the key, or a prefix that names one entry.
        """
        with self._explicit("read an entry"):
            return self.entry(key).path.read_bytes()

    def import_entry(
        self, data: bytes | bytearray | memoryview, *, fallback: str | Sequence[str] | None = None
    ) -> str:
        """Add an exported entry (OH_NNCompilation_ImportCacheFromBuffer); return its key.

        The container is loaded first (every hash checked, each driver installed at the version
        it was compiled with), then keyed as :func:`crossrt.compile` keys that model for that
        target at :attr:`version`, replacing an entry of an older version. Give ``fallback``
        as it was given to the compile that produced it.

        Raises:
            CrossrtError: the bytes are not a valid container for the drivers here, or the
                cache holds the model at a newer version.
        """
        payload = bytes(data)
        exe = load_executable(payload, validate_hash=True, check_drivers=True)
        primary = next((n for n in exe.nodes if n.device_kind == exe.device_kind), exe.nodes[0])
        drv, dev = resolve_device(exe.device, primary.driver)
        slot = slot_of(exe.content_hash, drv, dev, exe.options, fallback)
        key = key_of(slot, self.version)
        with self._explicit("import an entry"), self._store.lock(slot):
            self._clear_slot(slot, key, None)
            self._put(key, slot, exe, fallback, payload=payload, explicit=True)
        return key

    def remove(self, key: str) -> None:
        """Delete the entry of a full key; a missing one is not an error."""
        with self._explicit("remove an entry"), self._store.lock():
            self._store.unlink(key)

    def verify(self, *, fix: bool = False) -> list[tuple[CacheEntry, str]]:
        """Load every entry with every hash checked; return the corrupt ones with the reason.

        Args:
            fix: delete the corrupt entries.
        """
        bad = []
        for entry in self.entries():
            try:
                load_executable(entry.path, validate_hash=True, check_drivers=False)
            except CrossrtError as exc:
                bad.append((entry, exc.message))
                if fix:
                    self.remove(entry.key)
        return bad

    def prune(self, max_bytes: int | None = None) -> list[CacheEntry]:
        """Evict least recently used entries until the rest fit ``max_bytes``.

        Also deletes leftovers: metadata without an entry, temporary files of writers that
        died, source records of models no entry holds.

        Args:
            max_bytes: the size to fit; default the budget (nothing evicted when it has none);
                ``0`` clears the cache.

        Returns:
            The evicted entries.
        """
        limit = self.max_bytes if max_bytes is None else max_bytes
        with self._explicit("prune"), self._store.lock():
            evicted = self._store.evict_locked(limit)
            self._store.tidy_locked()
        self._count(evictions=len(evicted))
        return evicted

    # -- internals -----------------------------------------------------------------------

    def _count(self, **deltas: float) -> None:
        with _stats_lock:
            for stats in (self._stats, _process_stats):
                for name, delta in deltas.items():
                    setattr(stats, name, getattr(stats, name) + delta)

    def _unusable(self, exc: OSError, doing: str = "") -> None:
        """The cache only saves time: when it cannot be used, say so once and go on."""
        with _stats_lock:
            first, self._warned = not self._warned, True
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "compile cache %s cannot be used%s (%s); compiling without it",
            self.directory,
            f" to {doing}" if doing else "",
            describe(exc),
        )

    @contextlib.contextmanager
    def _explicit(self, doing: str) -> Iterator[None]:
        """What a caller asked of the cache itself fails with a CrossrtError that says why."""
        try:
            yield
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot {doing} in compile cache {str(self.directory)!r}: {describe(exc)}; "
                "check the directory's permissions and that nothing but the cache put files "
                "in it",
                details={"cache_dir": str(self.directory)},
            ) from None

    def _lookup(
        self,
        source_id: SourceId,
        driver: Driver,
        device: DeviceInfo,
        options: CompileOptions,
        fallback: str | Sequence[str] | None,
    ) -> Executable | None:
        """The entry of a source known by its content hash, or by a source record, without
        loading it; ``None`` when there is none."""
        target = (driver, device, options, fallback)
        if source_id.content_hash is not None:
            found = self._known(source_id, source_id.content_hash, None, *target)
            return found if isinstance(found, Executable) else None
        path = source_id.path
        if path is not None and (record := self._store.path_alias(path)) is not None:
            found = self._known(source_id, record[0], file_identity(path, record[1]), *target)
            if found is not _UNPROVEN:
                return found if isinstance(found, Executable) else None
            self._store.drop_alias(path=path)
        digest = source_id.digest  # reads a file source
        if digest is not None and (known := self._store.alias(digest)) is not None:
            found = self._known(source_id, known, digest_identity(digest), *target)
            if found is not _UNPROVEN:
                return found if isinstance(found, Executable) else None
            self._store.drop_alias(digest=digest)
        return None

    def _known(
        self,
        source_id: SourceId,
        content_hash: str,
        claim: str | None,
        driver: Driver,
        device: DeviceInfo,
        options: CompileOptions,
        fallback: str | Sequence[str] | None,
    ) -> Executable | str | None:
        """The entry of model ``content_hash``, which a source record gave when ``claim`` (the
        source's identity) is given: then the entry must list it among its sources, else
        :data:`_UNPROVEN`."""
        slot = slot_of(content_hash, driver, device, options, fallback)
        key = key_of(slot, self.version)
        unproven = claim is not None and not self._store.proves(key, claim)
        if unproven and self._store.crm(key).exists():
            log.info(
                "compile cache %s: entry %s was not compiled from the source a record says "
                "it holds; the record is dropped and the model hashed again",
                self.directory,
                key[:12],
            )
            return _UNPROVEN
        found = self._read(key, content_hash, device, source_id.identities())
        if isinstance(found, Executable):
            if source_id.file_stat is not None:  # known by its bytes: by its status next
                self._remember(source_id, content_hash)
            return found
        if found is None:
            self._refuse_newer(slot, claim)  # before paying for validation
        return None

    def _remember(self, source_id: SourceId, content_hash: str) -> None:
        """Next time, recognise these bytes (and this file while unchanged) without parsing
        or validating them."""
        with contextlib.suppress(OSError):
            if source_id.digest is not None:
                self._store.set_alias(source_id.digest, content_hash)
            if source_id.path is not None and source_id.file_stat is not None:
                self._store.set_path_alias(source_id.path, source_id.file_stat, content_hash)

    def _read(
        self, key: str, content_hash: str, device: DeviceInfo, sources: list[str]
    ) -> Executable | str | None:
        """The entry's executable, now marked used and compiled from ``sources`` too; ``None``
        when there is none; why, when it is unusable."""
        path = self._store.crm(key)
        if not path.exists():
            return None
        try:
            exe = load_executable(path, validate_hash=True, check_drivers=True)
        except CrossrtError as exc:
            return None if not path.exists() else exc.message  # None: evicted while read
        if exe.content_hash != content_hash:
            return f"it holds model content {exe.content_hash[:12]}, not {content_hash[:12]}"
        self._store.touch(key, sources)
        # Devices of one fingerprint share entries; the executable names the one asked for.
        return exe if exe.device == device.id else replace(exe, device=device.id)

    def _refuse_newer(self, slot: str, claim: str | None = None) -> None:
        """Refuse a slot's entry of a newer version (of the source ``claim`` when given: a
        source record's word alone does not make the error)."""
        for meta in self._store.slot_metadata(slot):
            version = meta.get("version")
            sources = meta.get("sources")
            if claim is not None and not (isinstance(sources, list) and claim in sources):
                continue
            if isinstance(version, int) and version > self.version:
                raise InvalidArgumentError(
                    f"the cache {str(self.directory)!r} holds version {version} of model "
                    f"{meta.get('model', '?')!r} for this target, and version {self.version} "
                    f"was asked for; raise the cache version to {version} or more, or clear "
                    f"the entry (crossrt cache prune --key {str(meta.get('key', ''))[:12]})",
                    code=StatusCode.INVALID,
                    details={"cached_version": version, "requested_version": self.version},
                )

    def _clear_slot(self, slot: str, key: str, bad: str | None) -> bool:
        """Before building ``key`` (holding the slot's lock): refuse a newer version, drop an
        older one and a bad entry. Whether an entry is being replaced."""
        self._refuse_newer(slot)
        stale = [str(m["key"]) for m in self._store.slot_metadata(slot) if m.get("key") != key]
        with self._store.lock():
            for old in stale:
                log.info("compile cache %s: replacing older entry %s", self.directory, old[:12])
                self._store.unlink(old)
            if bad is not None:
                self._store.unlink(key)
        if bad is not None:  # said once it is gone: a bad entry that stays is another matter
            log.warning(
                "compile cache %s: entry %s is corrupt (%s); rebuilding it",
                self.directory,
                key[:12],
                bad,
            )
        return bad is not None or bool(stale)

    def _put(
        self,
        key: str,
        slot: str,
        exe: Executable,
        fallback: str | Sequence[str] | None,
        *,
        sources: Sequence[str] = (),
        payload: bytes | None = None,
        explicit: bool = False,
    ) -> None:
        now = time.time()
        meta = {
            "key": key,
            "slot": slot,
            "version": self.version,
            "model": exe.name,
            "content_hash": exe.content_hash,
            "driver": ",".join(dict.fromkeys(n.driver for n in exe.nodes)),
            "driver_versions": {n.driver: n.driver_version for n in exe.nodes},
            "device": exe.device,
            "options": exe.options.to_dict(),
            "fallback": fallback_material(fallback),
            "format": FORMAT_VERSION,
            "created": now,
            "last_used": now,
            # The sources it was compiled from: what a source record leading here must be.
            "sources": list(sources),
        }
        try:
            data = exe.to_bytes() if payload is None else payload
            evicted = self._store.put(key, data, meta, self.max_bytes)
        except OSError as exc:
            if explicit:
                raise
            # The cache only saves time: a full disk must not fail the compile.
            self._unusable(exc, f"store entry {key[:12]}")
            return
        except CrossrtError as exc:
            log.warning("compile cache %s: cannot store %s: %s", self.directory, key[:12], exc)
            return
        self._count(evictions=len(evicted))

    def __repr__(self) -> str:
        where = str(self.directory)
        return f"CompileCache({where!r}, version={self.version}, max_bytes={self.max_bytes})"


_UNPROVEN = "unproven"
"""What :meth:`CompileCache._known` gives for an entry a source record leads to wrongly."""


def _decision_key(material: Mapping[str, Any], version: int) -> str:
    text = json.dumps({"recipe": RECIPE, "auto": material}, sort_keys=True, separators=(",", ":"))
    return key_of(hashlib.sha256(text.encode()).hexdigest(), version)


def _check_arguments(version: Any, max_bytes: Any) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidArgumentError(f"cache version {version!r} is not valid; give an integer >= 0")
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
    ):
        raise InvalidArgumentError(
            f"cache max_bytes={max_bytes!r} is not valid; give bytes >= 0, or None"
        )


_shared: dict[tuple[Path, int, int | None], CompileCache] = {}
_unusable: set[Path] = set()  # directories already warned about
_shared_lock = threading.Lock()


def shared_cache(
    directory: str | os.PathLike[str] | None = None, version: int = 0
) -> CompileCache | None:
    """The process's cache object for a directory, so that ``compile()`` calls add up.

    Args:
        directory: the cache directory; ``None``: ``CROSSRT_CACHE_DIR``, and no cache when
            that is unset too.
        version: the user cache version.

    Returns:
        The cache (its budget from ``CROSSRT_CACHE_MAX_SIZE``), or ``None``; ``None`` too, with
        a warning the first time, when the directory cannot be made a cache (it only saves
        time).

    Raises:
        InvalidArgumentError: a bad version.
    """
    config = settings()
    where = directory if directory is not None else config.cache_dir
    if where is None:
        return None
    _check_arguments(version, config.cache_max_bytes)
    index = (Path(where).expanduser().absolute(), version, config.cache_max_bytes)
    with _shared_lock:
        cache = _shared.get(index)
        if cache is None:
            try:
                cache = _shared[index] = CompileCache(index[0], version, config.cache_max_bytes)
            except InvalidArgumentError as exc:  # tried again next time: it may be mended
                first = index[0] not in _unusable
                _unusable.add(index[0])
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "compile cache %s cannot be used (%s); compiling without it",
                    index[0],
                    exc.message,
                )
                return None
        return cache
