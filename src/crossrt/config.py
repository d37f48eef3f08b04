"""``CROSSRT_*`` environment settings, parsed and validated in one place.

Each setting is parsed when it is first read, not at import: tests and tools can set the
environment first, and a malformed variable raises where its setting is used, so that
``import crossrt`` always works. Later capabilities add their variables here (and to
:data:`SETTINGS`), never by reading ``os.environ`` elsewhere.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from .errors import InvalidOptionError

SIM_TOPOLOGIES = ("torus", "ring", "mesh", "none")
"""How the ``sim`` driver's devices are linked (see :class:`SimSettings`)."""

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True)
class SimSettings:
    """The simulated accelerator served by the ``sim`` driver (``CROSSRT_SIM``).

    ``CROSSRT_SIM="devices=4,cores=2,memory=4GiB,topology=ring,copy_gbps=10,op_us=5"``; every
    key is optional. The defaults describe an AWS trn1.32xlarge: 16 devices of 2 cores and
    32 GiB each, linked in a 4x4 torus.

    Attributes:
        devices: how many devices (``sim:0`` ... ``sim:N-1``), 1 to 1024.
        cores: cores per device, 1 to 1024.
        memory_bytes: device memory per device (``memory``: bytes, or ``4GiB``, ``512M``).
        topology: how devices are linked: ``torus`` (a near-square grid whose rows and
            columns wrap around), ``ring``, ``mesh`` (the grid without wrapping) or ``none``.
        copy_gbps: copy bandwidth in GB/s (10^9 bytes a second) of every copy between host
            and device memory and between device buffers; 0: copies cost no simulated time.
        op_us: microseconds of simulated compute per operator of a run; 0: none.
    """

    devices: int = 16
    cores: int = 2
    memory_bytes: int = 32 << 30
    topology: str = "torus"
    copy_gbps: float = 0.0
    op_us: float = 0.0


class Settings:
    """The process-wide settings, each parsed from its variable when it is first read.

    A malformed variable raises :class:`~crossrt.errors.InvalidOptionError` (naming it, and
    what to write instead) only where its setting is used: ``import crossrt`` always works,
    and a bad ``CROSSRT_VISIBLE_CORES`` does not stop a program that never reserves cores.
    :func:`problems` checks them all (``crossrt ls`` prints what it finds).

    Attributes:
        default_device: device used when a call names none (``CROSSRT_DEFAULT_DEVICE``, "cpu").
        log_level: level of the ``crossrt`` logger (``CROSSRT_LOG_LEVEL``: DEBUG, INFO,
            WARNING...); ``None``: leave it to the application's logging configuration.
        disabled_drivers: drivers not to use even when installed (``CROSSRT_DISABLE_DRIVERS``,
            a comma-separated list).
        cache_dir: directory of the compiled-model cache ``compile()`` uses when a call names
            none (``CROSSRT_CACHE_DIR``); ``None``: no cache.
        cache_max_bytes: size budget of that cache, least recently used entries evicted past
            it (``CROSSRT_CACHE_MAX_SIZE``: bytes, or ``500M``, ``2G``...); ``None``: no limit.
        validate_hash: check the SHA-256 of every section of a ``.crm`` container loaded
            (``CROSSRT_VALIDATE_HASH``: 1/true/yes or 0/false/no, default on); the header's
            hash is always checked.
        visible_cores: the host CPUs to reserve exclusively (``CROSSRT_VISIBLE_CORES``: one
            core ``3``, a range ``3-6`` or a contiguous list ``3,4,5``); ``None``: not set.
        num_cores: how many free host CPUs to reserve exclusively (``CROSSRT_NUM_CORES``; 0:
            every free one); ``None``: not set. ``visible_cores`` wins when both are set.
        runtime_dir: where the core lock files live (``CROSSRT_RUNTIME_DIR``, else
            ``$XDG_RUNTIME_DIR/crossrt``, else ``/run/crossrt`` for root, else
            ``crossrt-<uid>`` in the temporary directory, or ``~/.cache/crossrt/run`` when
            another user made that one first).
        runtime_dir_is_default: ``runtime_dir`` was not named by ``CROSSRT_RUNTIME_DIR``.
        memlog_max_entries: how many memory events the allocation log keeps, dumped as CSV
            when an allocation fails (``CROSSRT_MEMLOG_MAX_SIZE``, like Neuron's
            ``NEURON_RT_DEBUG_MEMLOG_MAX_SIZE``; default 65536; 0 keeps none).
        exec_timeout: seconds one run of a loaded model may take before it is stopped with
            TIMEOUT, for loads that pass no ``exec_timeout`` (``CROSSRT_EXEC_TIMEOUT``: a
            positive number; unset or 0: no limit).
        check_numerics: check every output for NaN and infinity, for loads that pass no
            ``check_numerics`` (``CROSSRT_CHECK_NUMERICS``: 1/true/yes or 0/false/no, default
            off).
        sim: the simulated accelerator of the ``sim`` driver (``CROSSRT_SIM``, see
            :class:`SimSettings`).
        observe: whether a process that loads a model answers ``crossrt top``, ``monitor``
            and ``profile --pid`` on its socket in the runtime directory (``CROSSRT_OBSERVE``:
            1/true/yes or 0/false/no, default on).
        reference_memory: the most memory ``crossrt verify`` and ``device="auto"`` let the
            reference evaluator hold (``CROSSRT_REFERENCE_MEMORY``: bytes, or ``500M``,
            ``2G``...); ``None``: half of the host's usable memory. A model estimated to need
            more is checked against another oracle (``choice/oracle.py``).
        process_tag: the name ``crossrt top`` and ``monitor`` show for this process
            (``CROSSRT_PROCESS_TAG``; where it is unset, Neuron's ``NEURON_PROCESS_TAG``;
            at most 255 characters); ``None``: the program's name.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        # The mapping itself, not a copy: a setting is read when first asked for.
        self._env = os.environ if environ is None else environ

    def _text(self, name: str) -> str:
        return self._env.get(name, "").strip()

    @cached_property
    def default_device(self) -> str:
        return default_device(self._env)

    @cached_property
    def log_level(self) -> str | None:
        level = self._text("CROSSRT_LOG_LEVEL").upper() or None
        if level is not None and level not in _LOG_LEVELS:
            raise InvalidOptionError(
                f"CROSSRT_LOG_LEVEL={level!r} is not a log level; use one of "
                f"{', '.join(_LOG_LEVELS)}, or unset it",
                details={"setting": "CROSSRT_LOG_LEVEL", "value": level},
            )
        return level

    @cached_property
    def disabled_drivers(self) -> frozenset[str]:
        names = self._text("CROSSRT_DISABLE_DRIVERS").split(",")
        return frozenset(name.strip() for name in names if name.strip())

    @cached_property
    def validate_hash(self) -> bool:
        validate = self._text("CROSSRT_VALIDATE_HASH").lower() or "1"
        if validate not in _BOOLEANS:
            raise InvalidOptionError(
                f"CROSSRT_VALIDATE_HASH={validate!r} is not a boolean; use 1, true or yes to "
                "check the section hashes of .crm containers, 0, false or no to skip them",
                details={"setting": "CROSSRT_VALIDATE_HASH", "value": validate},
            )
        return _BOOLEANS[validate]

    @cached_property
    def cache_dir(self) -> str | None:
        return self._text("CROSSRT_CACHE_DIR") or None

    @cached_property
    def cache_max_bytes(self) -> int | None:
        text = self._text("CROSSRT_CACHE_MAX_SIZE")
        return parse_size(text, "CROSSRT_CACHE_MAX_SIZE") if text else None

    @cached_property
    def visible_cores(self) -> tuple[int, ...] | None:
        text = self._text("CROSSRT_VISIBLE_CORES")
        return parse_core_list(text) if text else None

    @cached_property
    def num_cores(self) -> int | None:
        return _num_cores(self._env)

    @cached_property
    def runtime_dir(self) -> str:
        return self._text("CROSSRT_RUNTIME_DIR") or _default_runtime_dir(self._env)

    @cached_property
    def runtime_dir_is_default(self) -> bool:
        return not self._text("CROSSRT_RUNTIME_DIR")

    @cached_property
    def memlog_max_entries(self) -> int:
        return _memlog_max_entries(self._env)

    @cached_property
    def exec_timeout(self) -> float | None:
        return _exec_timeout(self._env)

    @cached_property
    def check_numerics(self) -> bool:
        return _boolean(self._env, "CROSSRT_CHECK_NUMERICS", False)

    @cached_property
    def sim(self) -> SimSettings:
        return parse_sim(self._env.get("CROSSRT_SIM", ""))

    @cached_property
    def observe(self) -> bool:
        return _boolean(self._env, "CROSSRT_OBSERVE", True)

    @cached_property
    def reference_memory(self) -> int | None:
        text = self._text("CROSSRT_REFERENCE_MEMORY")
        return parse_size(text, "CROSSRT_REFERENCE_MEMORY") if text else None

    @cached_property
    def process_tag(self) -> str | None:
        # NEURON_PROCESS_TAG is read where CROSSRT_PROCESS_TAG is unset, so that a program
        # tagged for neuron-monitor keeps its tag (and its tag_filter) under crossrt.
        name = "CROSSRT_PROCESS_TAG" if self._text("CROSSRT_PROCESS_TAG") else "NEURON_PROCESS_TAG"
        tag = self._text(name)
        if len(tag) > 255 or not tag.isprintable():
            raise InvalidOptionError(
                f"{name}={tag[:40]!r}...: a tag is at most 255 printable "
                "characters; shorten it, or unset it to show the program's name",
                details={"setting": name},
            )
        return tag or None


SETTINGS = {
    "CROSSRT_DEFAULT_DEVICE": "default_device",
    "CROSSRT_LOG_LEVEL": "log_level",
    "CROSSRT_DISABLE_DRIVERS": "disabled_drivers",
    "CROSSRT_VALIDATE_HASH": "validate_hash",
    "CROSSRT_CACHE_DIR": "cache_dir",
    "CROSSRT_CACHE_MAX_SIZE": "cache_max_bytes",
    "CROSSRT_VISIBLE_CORES": "visible_cores",
    "CROSSRT_NUM_CORES": "num_cores",
    "CROSSRT_RUNTIME_DIR": "runtime_dir",
    "CROSSRT_MEMLOG_MAX_SIZE": "memlog_max_entries",
    "CROSSRT_EXEC_TIMEOUT": "exec_timeout",
    "CROSSRT_CHECK_NUMERICS": "check_numerics",
    "CROSSRT_SIM": "sim",
    "CROSSRT_OBSERVE": "observe",
    "CROSSRT_PROCESS_TAG": "process_tag",
    "CROSSRT_REFERENCE_MEMORY": "reference_memory",
}
"""Each ``CROSSRT_*`` variable and the :class:`Settings` attribute parsed from it."""


def default_device(environ: Mapping[str, str] | None = None) -> str:
    """``CROSSRT_DEFAULT_DEVICE`` (default ``"cpu"``), read alone, without building
    :class:`Settings`: every tensor allocated without a device asks for it."""
    if environ is None:
        # os.environ.get of an unset variable raises and catches a KeyError inside: 0.5 µs, a
        # tenth of a small tensor's allocation. os.environ keeps its (always current)
        # contents in the dict _data, keyed as encodekey says: read it there when it is so.
        data = getattr(os.environ, "_data", None)
        if isinstance(data, dict):
            raw = data.get(_DEFAULT_DEVICE_KEY)
            text = "" if raw is None else os.environ.decodevalue(raw)
            return str(text).strip() or "cpu"
        environ = os.environ
    return environ.get("CROSSRT_DEFAULT_DEVICE", "").strip() or "cpu"


_DEFAULT_DEVICE_KEY = os.environ.encodekey("CROSSRT_DEFAULT_DEVICE")


def simulated_devices_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``CROSSRT_SIM`` is set: the user asked for simulated devices, so listings show
    them (they are left out otherwise: a test and template device, not hardware)."""
    return bool((os.environ if environ is None else environ).get("CROSSRT_SIM", "").strip())


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``environ`` (default: ``os.environ``), each parsed when first read.

    Reading a setting whose variable is malformed raises
    :class:`~crossrt.errors.InvalidOptionError` naming the variable.
    """
    return Settings(environ)


def problems(environ: Mapping[str, str] | None = None) -> list[InvalidOptionError]:
    """The error of each malformed ``CROSSRT_*`` variable, in :data:`SETTINGS` order."""
    current = Settings(environ)
    found = []
    for attribute in SETTINGS.values():
        try:
            getattr(current, attribute)
        except InvalidOptionError as exc:
            found.append(exc)
    return found


_SIM_KEYS = ("devices", "cores", "memory", "topology", "copy_gbps", "op_us")


def parse_sim(text: str) -> SimSettings:
    """The simulated accelerator from ``CROSSRT_SIM``'s ``key=value,...`` text.

    Raises:
        InvalidOptionError: an unknown or repeated key, or a value out of range.
    """
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in _SIM_KEYS or key in values:
            why = "repeats a key" if key in values else "is not key=value with a known key"
            raise _bad_sim(text, f"{item!r} {why}; keys: {', '.join(_SIM_KEYS)}")
        values[key] = value
    default = SimSettings()
    memory = values.get("memory")
    topology = values.get("topology", default.topology).lower()
    if topology not in SIM_TOPOLOGIES:
        raise _bad_sim(text, f"topology {topology!r} is not one of {', '.join(SIM_TOPOLOGIES)}")
    sim = SimSettings(
        devices=_sim_count(values, "devices", default.devices, text),
        cores=_sim_count(values, "cores", default.cores, text),
        memory_bytes=parse_size(memory, "CROSSRT_SIM memory") if memory else default.memory_bytes,
        topology=topology,
        copy_gbps=_sim_rate(values, "copy_gbps", text),
        op_us=_sim_rate(values, "op_us", text),
    )
    if sim.memory_bytes <= 0:
        raise _bad_sim(text, "memory must be more than 0 bytes")
    return sim


def _sim_count(values: Mapping[str, str], key: str, default: int, text: str) -> int:
    value = values.get(key)
    if value is None:
        return default
    if not re.fullmatch(r"[0-9]{1,4}", value) or not 1 <= int(value) <= 1024:
        raise _bad_sim(text, f"{key}={value!r} is not a whole number from 1 to 1024")
    return int(value)


def _sim_rate(values: Mapping[str, str], key: str, text: str) -> float:
    value = values.get(key, "0")
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0 <= rate < float("inf"):
        raise _bad_sim(text, f"{key}={value!r} is not a number >= 0 (0 turns it off)")
    return rate


def _bad_sim(text: str, why: str) -> InvalidOptionError:
    return InvalidOptionError(
        f"CROSSRT_SIM={text!r}: {why}; write e.g. "
        "devices=4,cores=2,memory=4GiB,topology=ring,copy_gbps=10,op_us=5",
        details={"setting": "CROSSRT_SIM", "value": text},
    )


def _exec_timeout(env: Mapping[str, str]) -> float | None:
    text = env.get("CROSSRT_EXEC_TIMEOUT", "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InvalidOptionError(
            f"CROSSRT_EXEC_TIMEOUT={text!r} is not a number of seconds; write how long one run "
            "may take (e.g. 2.5), or 0 for no limit",
            details={"setting": "CROSSRT_EXEC_TIMEOUT", "value": text},
        )
    return seconds or None


def _boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text not in _BOOLEANS:
        raise InvalidOptionError(
            f"{name}={text!r} is not a boolean; use 1, true or yes, or 0, false or no",
            details={"setting": name, "value": text},
        )
    return _BOOLEANS[text]


def _memlog_max_entries(env: Mapping[str, str]) -> int:
    text = env.get("CROSSRT_MEMLOG_MAX_SIZE", "").strip()
    if not text:
        return 65536
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise InvalidOptionError(
            f"CROSSRT_MEMLOG_MAX_SIZE={text!r} is not an entry count; write how many memory "
            "events the allocation log keeps (a whole number; 0 keeps none)",
            details={"setting": "CROSSRT_MEMLOG_MAX_SIZE", "value": text},
        )
    return int(text)


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])I?)?B?", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from ``"1048576"``, ``"500M"``, ``"2G"``, ``"1.5GiB"`` (K, M, G, T are powers of 1024).

    Args:
        text: the size as written.
        what: what the size is for (``"--max-size"``), named in the error.

    Raises:
        InvalidOptionError: the text is not a size.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise InvalidOptionError(
            f"{what}={text!r} is not a size; write bytes or a number with K, M, G or T "
            "(powers of 1024), e.g. 500M or 2G",
            details={"setting": what, "value": text},
        )
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[(unit or "").upper()])


_CORE_ITEM = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")  # Linux caps CPUs at 8192


def parse_core_list(text: str, what: str = "CROSSRT_VISIBLE_CORES") -> tuple[int, ...]:
    """Host CPU numbers from ``"3"``, ``"3-6"`` or ``"3,4,5"`` (NEURON_RT_VISIBLE_CORES syntax).

    Items are single cores or ranges separated by commas; together they must form one
    contiguous range, as Neuron requires.

    Args:
        text: the list as written.
        what: where it came from, named in the error.

    Raises:
        InvalidOptionError: bad syntax, a core listed twice, or a gap in the range.
    """
    cores: list[int] = []
    for item in text.split(","):
        match = _CORE_ITEM.fullmatch(item.strip())
        first, last = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if last < first:
            raise InvalidOptionError(
                f"{what}={text!r} is not a core list; write one core (3), a range (3-6) or a "
                "contiguous list (3,4,5) of host CPU numbers",
                details={"setting": what, "value": text},
            )
        cores += range(first, last + 1)
    return contiguous_cores(cores, what)


def contiguous_cores(cores: Iterable[int], what: str = "CROSSRT_VISIBLE_CORES") -> tuple[int, ...]:
    """``cores`` sorted, checked to be distinct and to form one contiguous range.

    Raises:
        InvalidOptionError: a core is listed twice or the range has a gap.
    """
    chosen = sorted(cores)
    shown = ",".join(map(str, chosen))
    for a, b in itertools.pairwise(chosen):
        if a == b:
            raise InvalidOptionError(
                f"{what}={shown}: core {a} is listed twice; list each core once",
                details={"setting": what, "value": shown},
            )
        if b != a + 1:
            raise InvalidOptionError(
                f"{what}={shown}: the cores must form one contiguous range, as with "
                f"NEURON_RT_VISIBLE_CORES, but {a + 1} is missing; reserve the whole range "
                f"{chosen[0]}-{chosen[-1]}, or start one process per contiguous range",
                details={"setting": what, "value": shown},
            )
    return tuple(chosen)


def _num_cores(env: Mapping[str, str]) -> int | None:
    text = env.get("CROSSRT_NUM_CORES", "").strip()
    if not text:
        return None
    if not re.fullmatch(r"[0-9]{1,5}", text):
        raise InvalidOptionError(
            f"CROSSRT_NUM_CORES={text!r} is not a core count; write a whole number of cores to "
            "reserve (0 reserves every free core)",
            details={"setting": "CROSSRT_NUM_CORES", "value": text},
        )
    return int(text)


def _default_runtime_dir(env: Mapping[str, str]) -> str:
    xdg = env.get("XDG_RUNTIME_DIR", "").strip()
    if xdg:
        return os.path.join(xdg, "crossrt")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/run/crossrt"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shared = os.path.join(tempfile.gettempdir(), f"crossrt-{uid}")
    if _own_or_free(shared):
        return shared
    # Anyone may make /tmp/crossrt-<uid> first, and its owner's crossrt could then never
    # start: the user's home is a place no other user can take.
    home = env.get("HOME", "").strip() or os.path.expanduser("~")
    return os.path.join(home, ".cache", "crossrt", "run")


def _own_or_free(path: str) -> bool:
    """Whether ``path`` is missing or a folder of this user's that only it may write (not a
    link): a runtime directory whose core locks can be trusted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def apply_log_level(environ: Mapping[str, str] | None = None) -> None:
    """Set the ``crossrt`` logger's level from ``CROSSRT_LOG_LEVEL`` when it is set.

    Unset, the application's own logging configuration decides, as for any library. Called
    by ``import crossrt``, which must work whatever the environment holds: a malformed value
    changes nothing here, and raises where the level is used (the ``onnxruntime`` driver,
    ``crossrt ls``).
    """
    try:
        level = settings(environ).log_level
    except InvalidOptionError:
        return
    if level is not None:
        logging.getLogger("crossrt").setLevel(level)
