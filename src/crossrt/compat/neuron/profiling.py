"""``nrt_profile.h`` and the tracing of ``nrt_experimental.h`` over crossrt's profiler: what
the seed writes as NTFF files is written as Chrome traces (``chrome://tracing``, Perfetto).

- ``nrt_profile_start`` / ``_stop``: a :class:`crossrt.profiling.Profile` of one model.
- ``nrt_trace_start`` / ``_stop``: a recording of every model (``recording.py``), with the
  device memory over time when ``trace_mem`` is set.
- ``nrt_profile_continuous_*``: while on, each execution is profiled on its own and the
  latest one per NeuronCore is kept in memory; ``_save`` writes it to a file of its own.

Every execution goes through :func:`timed`, which marks the API call in whatever records
it and keeps the continuous profile.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...errors import ExecutionError, StatusCode
from ...profiling import Profile, save_trace
from . import recording
from .recording import API_TRACK, Recording
from .state import _model, _state, nrt_model_t
from .status import NRT_STATUS, NrtError, guarded, status_of

__all__ = [
    "nrt_profile_continuous_options_allocate",
    "nrt_profile_continuous_options_free",
    "nrt_profile_continuous_options_set_output_dir",
    "nrt_profile_continuous_options_t",
    "nrt_profile_continuous_save",
    "nrt_profile_continuous_start",
    "nrt_profile_continuous_stop",
    "nrt_profile_start",
    "nrt_profile_stop",
    "nrt_trace_start",
    "nrt_trace_stop",
]

_lock = threading.Lock()
# Start core -> (model name, the Chrome trace of its latest execution, execution number);
# None while continuous profiling is off.
_latest: dict[int, tuple[str, dict[str, Any], int]] | None = None
_executions = 0


def timed(model: nrt_model_t, what: str, run: Callable[[], Any]) -> NRT_STATUS:
    """Run one execution of ``model`` for the API call ``what``: its NRT_STATUS (an
    execution that produced NaN while numerical errors are checked returns
    NRT_EXEC_COMPLETED_WITH_NUM_ERR, its outputs written). The call is marked in the profiles
    and recordings of the model; a failure is told to the recordings that capture them."""
    global _executions
    with _lock:
        continuous = _latest is not None
    profile = Profile(model.model).start() if continuous else None
    started = time.perf_counter_ns()
    status = NRT_STATUS.NRT_SUCCESS
    try:
        run()
    except ExecutionError as exc:
        if exc.code is not StatusCode.EXEC_COMPLETED_WITH_NUM_ERR:
            status = status_of(exc)
            raise
        status = NRT_STATUS.NRT_EXEC_COMPLETED_WITH_NUM_ERR  # the outputs are written
    except Exception as exc:
        status = status_of(exc)
        raise
    finally:
        ended = time.perf_counter_ns()
        _record(model, what, started, ended)
        if profile is not None:
            profile.mark(what, started, ended, API_TRACK, **_where(model), status=status.name)
            trace = profile.stop()
            with _lock:
                _executions += 1
                if _latest is not None:
                    _latest[model.start_nc] = (model.model.name, trace, _executions)
        if status is not NRT_STATUS.NRT_SUCCESS:
            execution_failed(model, what, status)
    return status


def execution_failed(model: nrt_model_t, what: str, status: NRT_STATUS) -> None:
    """An execution of ``model`` ended with ``status``: inspect-on-fail hears of it."""
    recording.failed(model, what, status)


def _where(model: nrt_model_t) -> dict[str, int]:
    return {"start_nc": model.start_nc, "nc_count": model.nc_count}


def _record(model: nrt_model_t, what: str, started: int, ended: int) -> None:
    with _state.lock:
        profiles = [p for m, p in _state.profiles.values() if m is model]
    for profile in profiles:
        profile.mark(what, started, ended, API_TRACK, **_where(model))
    recording.called(model, what, started, ended)


# -- one model: nrt_profile_start / nrt_profile_stop -----------------------------------------


@guarded()
def nrt_profile_start(model: nrt_model_t, filename: str) -> NRT_STATUS:
    """Record ``model``'s executions until :func:`nrt_profile_stop` with the same file: a
    :class:`crossrt.profiling.Profile` (each request's phases, docs/observability.md) with every
    ``nrt_execute`` call, tensor-set copies included, marked on a track of its own."""
    handle = _model(model)
    with _state.lock:
        profile = Profile(handle.model, os.fspath(filename)).start()
        _state.profiles[os.fspath(filename)] = (handle, profile)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_stop(filename: str) -> NRT_STATUS:
    """Write the executions recorded since :func:`nrt_profile_start` to ``filename`` as a
    Chrome trace (``chrome://tracing``, Perfetto), truncating the file."""
    with _state.lock:
        found = _state.profiles.pop(os.fspath(filename), None)
    if found is None:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"no profile was started for {filename!r}")
    found[1].stop()  # writes the file, whole or not at all
    return NRT_STATUS.NRT_SUCCESS


# -- every model: nrt_trace_start / nrt_trace_stop -------------------------------------------


@guarded()
def nrt_trace_start(trace_mem: bool) -> NRT_STATUS:
    """Trace every model on every visible NeuronCore, the ones loaded later included, until
    :func:`nrt_trace_stop`; with ``trace_mem``, the device memory in use over time too."""
    _state.require()
    with _lock:
        if recording.active("trace"):
            raise NrtError(
                NRT_STATUS.NRT_FAILURE, "a trace is running; nrt_trace_stop it before another"
            )
        recording.begin(Recording("trace", memory=bool(trace_mem)))
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_trace_stop(filename: str) -> NRT_STATUS:
    """Stop the trace and write it to ``filename`` as a Chrome trace: the nrt API calls on
    the "nrt API" track, each model's requests and instances, memory counters when asked."""
    path = os.fspath(filename)
    with _lock:
        running = recording.active("trace")
        if not running:
            raise NrtError(NRT_STATUS.NRT_INVALID, "no trace is running; call nrt_trace_start")
        trace = recording.end(running[0])
    save_trace(trace, path)
    return NRT_STATUS.NRT_SUCCESS


# -- continuous profiling ------------------------------------------------------------------------


@dataclass(eq=False)
class nrt_profile_continuous_options_t:
    """Options of continuous profiling: where ``nrt_profile_continuous_save`` writes."""

    output_dir: str = "./output"
    freed: bool = False


_Options = TypeVar("_Options")


def live_options(options: Any, kind: type[_Options]) -> _Options:
    """``options`` when it is a ``kind`` not yet freed, else NRT_INVALID."""
    if not isinstance(options, kind) or getattr(options, "freed", False):
        name = kind.__name__
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"{options!r} is not a live {name}; make one with {name.removesuffix('_t')}_allocate",
        )
    return options


def output_directory(output_dir: Any) -> str:
    """``output_dir`` as a path, else NRT_INVALID (an empty one too)."""
    if not isinstance(output_dir, str | os.PathLike) or not os.fspath(output_dir):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"output_dir {output_dir!r}: give a directory")
    return os.fspath(output_dir)


def _options(options: Any) -> nrt_profile_continuous_options_t:
    return live_options(options, nrt_profile_continuous_options_t)


@guarded("pair")
def nrt_profile_continuous_options_allocate() -> tuple[
    NRT_STATUS, nrt_profile_continuous_options_t | None
]:
    """Options with the defaults (output directory ``./output``)."""
    return NRT_STATUS.NRT_SUCCESS, nrt_profile_continuous_options_t()


@guarded()
def nrt_profile_continuous_options_free(options: nrt_profile_continuous_options_t) -> NRT_STATUS:
    """Release ``options``; they may not be used again."""
    _options(options).freed = True
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_continuous_options_set_output_dir(
    options: nrt_profile_continuous_options_t, output_dir: str
) -> NRT_STATUS:
    """Where ``nrt_profile_continuous_save`` writes (created when it saves)."""
    _options(options).output_dir = output_directory(output_dir)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_continuous_start(options: nrt_profile_continuous_options_t) -> NRT_STATUS:
    """Profile every execution from now on, keeping the latest per NeuronCore in memory;
    nothing is written until :func:`nrt_profile_continuous_save`. As in libnrt, it does not
    start in the legacy async mode or beside an inspect session that profiles the device.
    Each execution then costs about a millisecond more (its own Profile is built)."""
    global _latest
    _options(options)
    _state.require()
    if _state.inflight:
        raise NrtError(
            NRT_STATUS.NRT_FAILURE,
            "continuous profiling does not run in the async execution mode; unset "
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
        )
    if any(r.device for r in recording.active("inspect")):
        raise NrtError(
            NRT_STATUS.NRT_FAILURE,
            "an inspect session profiles the device; nrt_inspect_stop it first",
        )
    with _lock:
        if _latest is not None:
            raise NrtError(NRT_STATUS.NRT_FAILURE, "continuous profiling is on already")
        _latest = {}
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_continuous_save(vnc: int, options: nrt_profile_continuous_options_t) -> NRT_STATUS:
    """Write the profile of the latest execution whose model starts on NeuronCore ``vnc`` to
    the options' directory as ``<model>-nc<vnc>-exec<n>-<pid>.json`` (a Chrome trace);
    profiling goes on."""
    target = _options(options)
    _state.require_nc(vnc)
    with _lock:
        if _latest is None:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                "continuous profiling is off; call nrt_profile_continuous_start",
            )
        found = _latest.get(vnc)
    if found is None:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"no model starting on NeuronCore {vnc} has executed since "
            "nrt_profile_continuous_start; execute one, then save",
        )
    name, trace, number = found
    os.makedirs(target.output_dir, exist_ok=True)
    file = f"{name}-nc{vnc}-exec{number}-{os.getpid()}.json"
    save_trace(trace, os.path.join(target.output_dir, file))
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_continuous_stop() -> NRT_STATUS:
    """Stop continuous profiling; nothing is saved."""
    global _latest
    with _lock:
        if _latest is None:
            raise NrtError(NRT_STATUS.NRT_INVALID, "continuous profiling is not on")
        _latest = None
    return NRT_STATUS.NRT_SUCCESS


def _close() -> None:
    """At nrt_close: continuous profiling and the trace end, nothing written."""
    global _latest
    with _lock:
        _latest = None
        for running in recording.active("trace"):
            recording.end(running)


_state.on_close.append(_close)
