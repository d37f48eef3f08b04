"""The model repository: the files the daemon may serve, and the models it has loaded.

Two layouts, each model served under NAME: Triton's ``DIR/NAME/VERSION/model.crm`` (or
``model.onnx``; the highest numbered VERSION with a model file is served) and flat
``DIR/NAME.crm`` / ``DIR/NAME.onnx`` (version ``1``). A ``.crm`` wins over an ``.onnx`` of
the same name and version; an ``.onnx`` is compiled at load (through the compile cache).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from ..compiler import load_executable
from ..errors import InvalidArgumentError
from ..host import parse_cpu_set, process_alive
from ..runtime import LoadedModel, Runtime
from ..runtime.statistics import ModelStatistics
from .forms import check_servable
from .response_cache import CacheCounts, with_cache_hits
from .snapshot import snapshot, stamp_of
from .status import ServiceError

log = logging.getLogger("crossrt.serve")

SUFFIXES = (".crm", ".onnx")


@dataclass(frozen=True)
class LoadOptions:
    """How a model is loaded (``Runtime.load``'s arguments); the repository load
    parameters and the config file's ``[[models]]`` tables set them by these names."""

    device: str | None = None
    instances: int = 1
    cores: int | tuple[int, ...] | None = None
    queue_depth: int | None = None
    timeout: float | None = None
    precision: str | None = None
    max_batch_size: int = 0
    batch_delay: float = 0.0
    response_cache: bool = False

    def with_values(self, values: Mapping[str, Any]) -> LoadOptions:
        """These options with ``values`` (parameter name -> value) applied, checked."""
        changes: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace(" ", "_").replace("-", "_")
            if name == "exec_timeout":
                name = "timeout"
            if name not in LOAD_PARAMETERS:
                raise InvalidArgumentError(
                    f"unknown load parameter {key!r}; known: {', '.join(LOAD_PARAMETERS)}"
                )
            changes[name] = _parse(name, value)
        return replace(self, **changes)


LOAD_PARAMETERS = (
    "device",
    "instances",
    "cores",
    "queue_depth",
    "timeout",
    "precision",
    "max_batch_size",
    "batch_delay",
    "response_cache",
)


def _parse(name: str, value: Any) -> Any:
    try:
        if name in ("device", "precision"):
            if not isinstance(value, str) or not value:
                raise ValueError
            return value
        if name in ("instances", "queue_depth"):
            number = int(value)
            if isinstance(value, bool | float) or number < 1:
                raise ValueError
            return number
        if name == "timeout":
            seconds = float(value)
            if isinstance(value, bool) or not seconds > 0:
                raise ValueError
            return seconds
        if name == "response_cache":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            return text in ("true", "1")
        if name == "max_batch_size":
            number = int(value)
            if isinstance(value, bool | float) or number < 0:
                raise ValueError
            return number
        if name == "batch_delay":
            seconds = float(value)
            if isinstance(value, bool) or not 0 <= seconds < float("inf"):
                raise ValueError
            return seconds
        # cores: a count (4) or host core indices ("0-3", "0,2")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, list | tuple):
            return tuple(int(v) for v in value)
        text = str(value).strip()
        return int(text) if text.isdigit() else tuple(sorted(parse_cpu_set(text)))
    except (ValueError, TypeError):
        raise InvalidArgumentError(
            f"load parameter {name}={value!r} is not valid; "
            + {
                "device": "give a device ('cpu', 'cpu:0')",
                "precision": "give 'fp32', 'bf16', 'fp16' or 'int8-dynamic'",
                "instances": "give a whole number >= 1",
                "queue_depth": "give a whole number >= 1",
                "timeout": "give seconds, more than 0",
                "max_batch_size": "give a whole number >= 0 (0: no batching)",
                "batch_delay": "give seconds >= 0",
                "response_cache": "give true or false",
                "cores": "give a count (4) or core indices ('0-3', '0,2')",
            }[name]
        ) from None


@dataclass
class Entry:
    """A model the daemon knows: where it comes from and, when loaded, the loaded model."""

    name: str
    version: str
    path: Path | None  # None: sent in a request (crossrt.v1 Load)
    options: LoadOptions = field(default_factory=LoadOptions)
    model: LoadedModel | None = None
    state: str = "UNAVAILABLE"
    reason: str = "not loaded"
    stamp: tuple[int, ...] = ()  # the file's version when loaded (snapshot.stamp_of)
    owner: int = 0  # the process that sent it (crossrt.v1 Load): unloaded when it dies
    user: str | None = None  # who sent it (Peer.principal); None: the operator's repository
    refused: int = 0  # requests the daemon refused before they reached the model
    cache: CacheCounts = field(default_factory=CacheCounts)  # its response cache's use

    def statistics(self) -> ModelStatistics:
        """The model's statistics as the daemon serves it: the requests its response cache
        answered count as successes (as Triton counts them), and those the daemon refused
        before they reached the model as requests failed ``"REFUSED"``. KServe's statistics,
        crossrt.v1's and the metrics all read this."""
        assert self.model is not None
        stats = with_cache_hits(self.model.statistics(), self.cache)
        if not self.refused:
            return stats
        failures = dict(stats.failures)
        failures["REFUSED"] = failures.get("REFUSED", 0) + self.refused
        return replace(stats, requests=stats.requests + self.refused, failures=failures)

    def count_refused(self) -> None:
        """One more request refused before it reached the model (its runtime statistics
        never saw it); a failure in ModelStatistics and the metrics."""
        with _counting:
            self.refused += 1

    def count_cache(self, hit: bool, ns: int) -> None:
        """One request looked up in the response cache: answered from it (``hit``), or run
        and its answer kept; ``ns`` the time the cache took."""
        with _counting:
            if hit:
                self.cache.hits += 1
                self.cache.hit_ns += ns
            else:
                self.cache.misses += 1
                self.cache.miss_ns += ns


_counting = threading.Lock()  # an entry's counts of refused and cached requests


def discover(directory: Path) -> dict[str, tuple[str, Path]]:
    """The models in ``directory``: name -> (version, file)."""
    found: dict[str, tuple[str, Path]] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        log.error("cannot read the model repository %s: %s", directory, exc)
        return found
    for entry in entries:
        if entry.is_dir():
            versions = sorted(
                (int(v.name), v) for v in entry.iterdir() if v.is_dir() and v.name.isdigit()
            )
            for number, folder in reversed(versions):
                files = [folder / f"model{s}" for s in SUFFIXES if (folder / f"model{s}").is_file()]
                if files:
                    found[entry.name] = (str(number), files[0])
                    break
        elif entry.suffix in SUFFIXES and entry.is_file():
            held = found.get(entry.stem)
            if held is None or (held[1].parent == directory and entry.suffix == ".crm"):
                found[entry.stem] = ("1", entry)
    return found


class Repository:
    """The models of one daemon, loaded on its runtime."""

    def __init__(
        self,
        runtime: Runtime,
        directory: Path | None,
        defaults: LoadOptions,
        pinned: Iterable[Entry] = (),
    ) -> None:
        self._runtime = runtime
        self.directory = directory
        self._defaults = defaults
        self._lock = threading.RLock()  # loads and unloads one at a time
        self._entries: dict[str, Entry] = {e.name: e for e in pinned}
        self._pinned = set(self._entries)
        self.caches = False
        """Whether the daemon has a response cache: a model loaded with ``response_cache``
        needs one."""
        self.scan()

    def scan(self) -> dict[str, Entry]:
        """Read the directory again: new models become known, removed ones forgotten
        (unloaded first), changed ones keep serving until :meth:`refresh` reloads them."""
        with self._lock:
            found = discover(self.directory) if self.directory else {}
            for name, (version, path) in found.items():
                entry = self._entries.get(name)
                if entry is not None and entry.path is None:
                    # A name a client sent a model under, now in the operator's repository:
                    # the repository's wins, and the client's model gives way.
                    self.unload(name)
                    log.warning("model %s sent by %s gave way to the repository's", name,
                                entry.user or f"process {entry.owner}")  # fmt: skip
                    entry = None
                if entry is None:
                    self._entries[name] = Entry(name, version, path, self._defaults)
                elif name not in self._pinned and (entry.version, entry.path) != (version, path):
                    entry.version, entry.path = version, path
            for name in [n for n in self._entries if n not in found and n not in self._pinned]:
                self.unload(name)
                del self._entries[name]
            return dict(self._entries)

    def refresh(self, load_new: bool = True) -> None:
        """SIGHUP: rescan, load what is new (unless ``load_new`` is false: explicit model
        control), reload what changed on disk."""
        self.scan()
        for entry in list(self._entries.values()):
            new = entry.model is None and entry.reason == "not loaded"
            if (new and load_new) or _changed(entry):
                self.try_load(entry.name)

    def load_all(self, pinned_only: bool = False) -> None:
        """Load every known model not loaded yet, or only those of the config file and
        ``--model`` (a failure is logged and shown in the index)."""
        for name, entry in list(self._entries.items()):
            if entry.model is None and (name in self._pinned or not pinned_only):
                self.try_load(name)

    def try_load(self, name: str) -> None:
        """Load model ``name``; a failure is logged and shown in the index."""
        try:
            self.load(name)
        except Exception as exc:  # the index shows why; the daemon goes on
            log.error("model %s not loaded: %s", name, exc)

    def load(self, name: str, values: Mapping[str, Any] | None = None) -> Entry:
        """Load (or reload, with new options) model ``name``."""
        with self._lock:
            entry = self._entries.get(name)
            if (entry is None or entry.path is None) and self.directory is not None:
                self.scan()  # the repository's model of that name wins a client's
                entry = self._entries.get(name)
            if entry is None:
                where = f"in {self.directory}" if self.directory else "(no --model-repository)"
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    f"no model {name!r} {where}; add DIR/{name}/1/model.crm or DIR/{name}.crm",
                )
            if entry.path is None:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model {name!r} was sent in a request, not found in the repository; send "
                    "it again (crossrt.v1 Load) to load it anew",
                )
            options = entry.options.with_values(values or {})
            entry.state, entry.reason = "LOADING", ""
            try:
                model, stamp = self._load(entry.path, options, name)
                _servable(name, model)
            except BaseException as exc:
                entry.state, entry.reason = "UNAVAILABLE", str(exc)
                if entry.model is not None:  # the old one serves on
                    entry.state, entry.reason = "READY", f"reload failed: {exc}"
                raise
            model.served_as = f"{name}:{entry.version}"  # how crossrt top and profile name it
            old, entry.model, entry.options, entry.refused = entry.model, model, options, 0
            entry.cache = CacheCounts()
            entry.state, entry.reason, entry.stamp = "READY", "", stamp
            log.info("loaded model %s version %s from %s", name, entry.version, entry.path)
        if old is not None:
            old.unload()
        return entry

    def _load(
        self, path: Path, options: LoadOptions, name: str
    ) -> tuple[LoadedModel, tuple[int, ...]]:
        """The model loaded from ``path`` as ``name``, and the version of the file it was
        loaded from."""
        if options.response_cache and not self.caches:
            raise InvalidArgumentError(
                "response_cache asks for the daemon's response cache, which is off; start "
                "crossrt serve with --response-cache-bytes N (or response_cache_bytes in its "
                "config file)"
            )
        kwargs: dict[str, Any] = {
            "instances": options.instances,
            "cores": options.cores,
            "queue_depth": options.queue_depth,
            "exec_timeout": options.timeout,
            "max_batch_size": options.max_batch_size,
            "batch_delay": options.batch_delay,
            "name": name,
        }
        if path.suffix == ".crm":
            if options.precision is not None:
                raise InvalidArgumentError(
                    f"precision applies when an .onnx model is compiled; {path.name} is "
                    "compiled already: compile it again with crossrt compile --precision"
                )
            # From the daemon's own copy: the file may be written, truncated or deleted under
            # a mapping of it at any time (snapshot.py). Loaded, the model's mappings hold the
            # copy's pages; its name is not needed any more.
            with snapshot(path) as (copy, stamp):
                return self._runtime.load(load_executable(copy), options.device, **kwargs), stamp
        if options.precision is not None:
            kwargs["precision"] = options.precision
        return self._runtime.load(str(path), options.device, **kwargs), _stamp(path)

    def adopt(self, name: str, model: LoadedModel, owner: int, user: str | None = None) -> Entry:
        """Serve ``model``, loaded from bytes ``user`` sent, as ``name`` (version 1) until
        it is unloaded or process ``owner`` dies (:meth:`release_orphans`). A name the
        repository holds (loaded or not) is refused: it is the operator's.

        Raises:
            UnsupportedError: an input or output KServe cannot carry (the caller unloads).
        """
        check_servable(name, model.inputs, model.outputs)
        with self._lock:
            held = self._entries.get(name)
            if held is None and self.directory is not None and name in discover(self.directory):
                held = self.scan().get(name)
            if held is not None and held.owner and not process_alive(held.owner):
                # Sent by a process that has died and not swept yet: the name is free now (a
                # script run again at once would otherwise wait for the sweep).
                log.info("model %s of process %d, which has died, unloaded", name, held.owner)
                self.unload(name)
                held = None
            if held is not None and (held.model is not None or held.path is not None):
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"a model named {name!r} is served already, or the repository holds it; "
                    "choose another name",
                )
            entry = Entry(
                name, "1", None, model=model, state="READY", reason="", owner=owner, user=user
            )
            model.served_as = f"{name}:1"
            self._entries[name] = entry
            self._pinned.add(name)
        log.info("loaded model %s from bytes sent by process %d", name, owner)
        return entry

    def release_orphans(self) -> list[str]:
        """Unload the models sent by processes that have died; their names."""
        with self._lock:
            dead = [
                e.name for e in self._entries.values() if e.owner and not process_alive(e.owner)
            ]
            for name in dead:
                self.unload(name)
        return dead

    def known(self, name: str) -> bool:
        """Whether a model of that name is known (loaded or not)."""
        return name in self._entries

    def owner_of(self, name: str) -> str | None:
        """Who sent model ``name`` (a principal), ``None`` for the operator's.

        Raises:
            ServiceError: NOT_FOUND, no model of that name is known.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no model {name!r} is known")
        return entry.user

    def unload(self, name: str) -> None:
        """Unload model ``name`` (it stays known)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no model {name!r} is known")
            model, entry.model = entry.model, None
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"
            if entry.path is None:  # sent in a request: nothing to load it from again
                del self._entries[name]
                self._pinned.discard(name)
        if model is not None:
            model.unload()
            log.info("unloaded model %s", name)

    def entries(self) -> list[Entry]:
        """Every known model, by name."""
        return [self._entries[n] for n in sorted(self._entries)]

    def loaded(self) -> list[Entry]:
        """The loaded models."""
        return [e for e in self.entries() if e.model is not None]

    def get(self, name: str, version: str = "") -> tuple[Entry, LoadedModel]:
        """The loaded model ``name`` (of ``version``, when one is given)."""
        entry = self._entries.get(name)
        model = entry.model if entry is not None else None
        if entry is None or model is None:
            why = f" ({entry.reason})" if entry is not None and entry.reason else ""
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND if entry is None else grpc.StatusCode.UNAVAILABLE,
                f"model {short(name)} is not loaded{why}; loaded models: {self._some_loaded()}"
                + ("" if entry is None else "; load it with RepositoryModelLoad"),
            )
        if version and version != entry.version:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"model {name!r} has no version {short(version)} loaded; it serves version "
                f"{entry.version} (leave the version empty for it)",
            )
        return entry, model

    def _some_loaded(self) -> str:
        """The first :data:`NAMES_IN_ERRORS` loaded models' names: an error carries no more
        (gRPC refuses metadata over 16 KiB, and 400 names passed it), RepositoryIndex lists
        them all."""
        names = [e.name for e in self.loaded()]
        shown = ", ".join(short(n) for n in names[:NAMES_IN_ERRORS]) or "none"
        more = len(names) - NAMES_IN_ERRORS
        return shown + (f" and {more} more (RepositoryIndex lists them all)" if more > 0 else "")

    def close(self) -> None:
        """Unload everything."""
        for entry in self.entries():
            self.unload(entry.name)


NAMES_IN_ERRORS = 10
"""How many loaded models' names a NOT_FOUND error lists."""


def short(name: str, limit: int = 64) -> str:
    """``name`` quoted for an error, cut to ``limit`` characters: a client's name is echoed,
    and a long one must not make the error too long to send."""
    return repr(name) if len(name) <= limit else repr(name[:limit]) + f"... ({len(name)} chars)"


def _stamp(path: Path | None) -> tuple[int, ...]:
    if path is None:
        return ()
    try:
        return stamp_of(path.stat())
    except OSError:
        return ()


def _changed(entry: Entry) -> bool:
    return entry.model is not None and _stamp(entry.path) != entry.stamp


def _servable(name: str, model: LoadedModel) -> None:
    """Unload ``model`` and refuse it when some input or output cannot cross KServe: it is
    not READY, and the index says why, rather than failing every request."""
    try:
        check_servable(name, model.inputs, model.outputs)
    except BaseException:
        model.unload()
        raise
