"""The ``NEURON_RT_*`` variables this layer honours, with the seed's defaults and meanings.

Read at ``nrt_init`` (the runtime's: cores, logging, memory log) and at ``nrt_load`` (the
model's: timeout, hash check, numerical errors), as the seed says. A malformed value makes
that call fail with ``NRT_INVALID``, naming the variable.

- NEURON_RT_VISIBLE_CORES (unset): exactly these cores ("3-5,6", contiguous), reserved for
  this process alone. NEURON_RT_NUM_CORES (unset, 0 = all): that many free cores, reserved.
  Neither: every core, shared with other processes (a CPU host is not the runtime's alone).
- NEURON_RT_LOG_LEVEL (ERROR): ERROR, WARN(ING), INFO, DEBUG, TRACE or QUIET, for crossrt's
  loggers. NEURON_RT_LOG_LOCATION (console): console (stderr) or syslog.
- NEURON_RT_EXEC_TIMEOUT (30): seconds one execution may take; past it, NRT_TIMEOUT.
- NEURON_RT_VALIDATE_HASH (false): check the loaded file's section hashes.
- NEURON_RT_NUMERICAL_ERRORS_VERIFICATION (false), or NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=
  critical, or NEURON_FAIL_ON_NAN=1: an execution producing NaN or infinity returns
  NRT_EXEC_COMPLETED_WITH_NUM_ERR (1003), its outputs written.
- NEURON_RT_DEBUG_MEMLOG_MAX_SIZE (1048576): entries of the allocation log, dumped as CSV
  when memory runs out.
- NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS (0): above 0, nrt_execute queues its run and
  returns, that many runs in flight per model at most (more than 63: 63, as libnrt clamps).
- NEURON_RT_INSPECT_* (inspect.py): the inspect session nrt_init and nrt_inspect_begin
  begin.
- NEURON_RT_ROOT_COMM_ID (unset): ``ip:port`` where rank 0 of the global collective group
  listens (``collectives.py``), read when the global communicator is built.
- NEURON_RT_STOCHASTIC_ROUNDING_EN / _SEED: accepted, no effect (crossrt's engines round to
  nearest, as inf1 does).

Any other ``NEURON_*`` variable set (and these two) is warned of once per process at
``nrt_init``, by name, as having no effect here (:func:`warn_unread`).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ...config import parse_core_list
from ...errors import CrossrtError
from .status import NRT_STATUS, NrtError, log

__all__ = [
    "InitSettings",
    "LoadSettings",
    "init_settings",
    "load_settings",
    "warn_unread",
]

READ = frozenset(
    {
        "NEURON_RT_VISIBLE_CORES",
        "NEURON_RT_NUM_CORES",
        "NEURON_RT_LOG_LEVEL",
        "NEURON_RT_LOG_LOCATION",
        "NEURON_RT_EXEC_TIMEOUT",
        "NEURON_RT_VALIDATE_HASH",
        "NEURON_RT_NUMERICAL_ERRORS_VERIFICATION",
        "NEURON_RT_NUMERICAL_ERRORS_VERBOSITY",
        "NEURON_FAIL_ON_NAN",
        "NEURON_RT_DEBUG_MEMLOG_MAX_SIZE",
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
        "NEURON_PROCESS_TAG",
        "NEURON_RT_ROOT_COMM_ID",
        "NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED",
        "NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT",
    }
)
"""The Neuron variables this layer reads (``NEURON_RT_INSPECT_*`` too, by prefix)."""

NO_EFFECT = {
    "NEURON_RT_STOCHASTIC_ROUNDING_EN": "crossrt's engines round to nearest",
    "NEURON_RT_STOCHASTIC_ROUNDING_SEED": "crossrt's engines round to nearest",
}
"""Variables accepted with no effect, and why."""

_warned: set[str] = set()


def warn_unread(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warn once per process, by name, of each ``NEURON_*`` variable set that this layer does
    not read or that has no effect here (``NEURON_RT_DBG_DUMP_INPUTS_ON_ERR``,
    ``NEURON_RT_LOG_LEVEL_<COMPONENT>``, ``NEURON_RT_VIRTUAL_CORE_SIZE``,
    ``NEURON_RT_RESET_CORES``...): a setting a port relies on is never ignored silently.
    Returns the names warned of now."""
    env = os.environ if environ is None else environ
    warned = []
    for name in sorted(env):
        # NEURONCORE_GROUP_SIZES: the deprecated way to size core groups, a Neuron setting too
        if not name.startswith(("NEURON_", "NEURONCORE_")) or name in _warned:
            continue
        if name in READ or name.startswith("NEURON_RT_INSPECT_"):
            continue
        why = NO_EFFECT.get(name, "crossrt does not read it")
        log.warning("%s is set but has no effect here: %s", name, why)
        _warned.add(name)
        warned.append(name)
    return warned


TRACE = 5
"""The level NEURON_RT_LOG_LEVEL=TRACE sets: below DEBUG."""

_LEVELS = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
    "QUIET": logging.CRITICAL + 10,  # above every message: nothing is logged
}
MAX_INFLIGHT = 63
"""libnrt's most NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS (a larger value is clamped)."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class InitSettings:
    """What ``nrt_init`` reads."""

    visible_cores: tuple[int, ...] | None
    num_cores: int | None
    log_level: int
    log_location: str
    memlog_max_entries: int
    async_inflight: int = 0


@dataclass(frozen=True)
class LoadSettings:
    """What ``nrt_load`` reads for the model it loads."""

    exec_timeout: float
    validate_hash: bool
    check_numerics: Literal["nan"] | bool  # "nan": NaN only, as Neuron checks


def init_settings(environ: Mapping[str, str] | None = None) -> InitSettings:
    """The runtime's settings from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    visible = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    cores = None
    if visible:
        try:
            cores = parse_core_list(visible, "NEURON_RT_VISIBLE_CORES")
        except CrossrtError as exc:
            raise NrtError(NRT_STATUS.NRT_INVALID, exc.message) from None
    num = _integer(env, "NEURON_RT_NUM_CORES", 0)
    level = env.get("NEURON_RT_LOG_LEVEL", "").strip().upper() or "ERROR"
    if level not in _LEVELS:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"NEURON_RT_LOG_LEVEL={level!r} is not a level; use one of {', '.join(_LEVELS)}",
        )
    location = env.get("NEURON_RT_LOG_LOCATION", "").strip().lower() or "console"
    if location not in ("console", "syslog"):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"NEURON_RT_LOG_LOCATION={location!r}: use console or syslog",
        )
    inflight = _integer(env, "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", 0)
    if inflight > MAX_INFLIGHT:
        log.warning(
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=%d is more than %d; using %d",
            inflight, MAX_INFLIGHT, MAX_INFLIGHT,
        )  # fmt: skip
    return InitSettings(
        visible_cores=cores,
        num_cores=num or None,  # 0 means all cores, as when unset
        log_level=_LEVELS[level],
        log_location=location,
        memlog_max_entries=_integer(env, "NEURON_RT_DEBUG_MEMLOG_MAX_SIZE", 1 << 20),
        async_inflight=min(inflight, MAX_INFLIGHT),
    )


def load_settings(environ: Mapping[str, str] | None = None) -> LoadSettings:
    """The settings ``nrt_load`` gives the model it loads."""
    env = os.environ if environ is None else environ
    timeout = env.get("NEURON_RT_EXEC_TIMEOUT", "").strip() or "30"
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"NEURON_RT_EXEC_TIMEOUT={timeout!r} is not a number of seconds > 0",
        )
    verbosity = env.get("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "").strip().lower()
    return LoadSettings(
        exec_timeout=seconds,
        validate_hash=_boolean(env, "NEURON_RT_VALIDATE_HASH"),
        # Neuron's numerical error is a NaN produced (seed 002: 1003): infinity is a value
        check_numerics="nan"
        if (
            _boolean(env, "NEURON_RT_NUMERICAL_ERRORS_VERIFICATION")
            or _boolean(env, "NEURON_FAIL_ON_NAN")
            or verbosity == "critical"
        )
        else False,
    )


def apply_logging(settings: InitSettings) -> logging.Handler | None:
    """Set crossrt's loggers to the level asked for and, for ``syslog``, send them there.

    Returns:
        The handler added (removed again at ``nrt_close``), or ``None``.
    """
    logger = logging.getLogger("crossrt")
    logger.setLevel(settings.log_level)
    if settings.log_location != "syslog":
        return None
    address = "/dev/log" if os.path.exists("/dev/log") else ("localhost", 514)
    handler = logging.handlers.SysLogHandler(address=address)
    handler.setFormatter(logging.Formatter("nrt: %(name)s: %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return handler


def _integer(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{name}={text!r} is not a whole number >= 0")
    return value


def _boolean(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise NrtError(NRT_STATUS.NRT_INVALID, f"{name}={text!r} is not a boolean; use 1 or 0")
