"""``nrt_inspect_*`` (``nrt_profile.h``): inspect sessions over crossrt's profiler.

A session is a recording of every model (``recording.py``) written as a Chrome trace where
the seed writes its system and device profiles:

- ``system_profile``: the nrt API calls and each request with its phases;
- ``device_profile``: each instance's runs, a multi-node executable's node runs, copies
  between host and device memory;
- ``host_memory``: the device memory in use over time, and each device's statistics;
- ``cpu_util``: the process's CPU time over the session (``otherData.cpu_util``).

With ``enable_inspect`` the session is written to ``<output_dir>/inspect-s<session>-<pid>.json``
at :func:`nrt_inspect_stop` (or ``nrt_close``); with ``enable_inspect_on_fail`` each failed
execution writes what was recorded until then to ``...-fail<n>.json`` and the session goes
on from there. ``nrt_inspect_begin`` reads the ``NEURON_RT_INSPECT_*`` variables, and so does
``nrt_init``, which begins a session when they enable one, as libnrt does.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from ...profiling import save_trace
from . import recording
from .inspect_config import (
    CATEGORIES,
    NRT_INSPECT_EVENT_TYPES,
    config_from_environment,
    live_config,
    nrt_inspect_config_t,
)
from .recording import Recording
from .state import _state, nrt_model_t
from .status import NRT_STATUS, NrtError, guarded

__all__ = [
    "nrt_inspect_begin",
    "nrt_inspect_begin_with_options",
    "nrt_inspect_stop",
]


class _Session:
    """A running inspect session: its options (a copy), its recording, failure dumps."""

    def __init__(self, config: nrt_inspect_config_t) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.failures = 0
        self.recording: Recording | None = None
        if config.enable_inspect or config.enable_inspect_on_fail:
            self.recording = recording.begin(self._recording())

    def _recording(self) -> Recording:
        c = self.config
        kept = {e for t, e in NRT_INSPECT_EVENT_TYPES.items() if t not in c.disabled_event_types}
        categories = frozenset().union(*(CATEGORIES[a] for a in c.activities)) & kept
        return Recording(
            "inspect",
            max_requests=c.sys_trace_max_events_per_nc,
            cores=lambda nc: nc not in c.disabled_ncs,
            categories=categories,
            memory="host_memory" in c.activities and "memory" in kept,
            cpu="cpu_util" in c.activities,
            device="device_profile" in c.activities,
            on_fail=self._failed if c.enable_inspect_on_fail else None,
        )

    def _path(self, suffix: str = "") -> str:
        c = self.config
        os.makedirs(c.output_dir, exist_ok=True)
        return os.path.join(c.output_dir, f"inspect-s{c.session_id}-{os.getpid()}{suffix}.json")

    def _failed(self, running: Recording, model: nrt_model_t, what: str, status: Any) -> None:
        """An execution failed: write what was recorded until now, record on afresh."""
        with self.lock:
            if running is not self.recording:
                return  # the session moved on meanwhile
            self.failures += 1
            trace = recording.end(running)
            trace["otherData"]["failure"] = {
                "call": what, "model": model.model.name, "start_nc": model.start_nc,
                "status": NRT_STATUS(status).name,
            }  # fmt: skip
            save_trace(trace, self._path(f"-fail{self.failures}"))
            self.recording = recording.begin(self._recording())

    def stop(self) -> None:
        """End the session, writing its profile when ``enable_inspect`` asks for it."""
        with self.lock:
            running, self.recording = self.recording, None
        if running is None:
            return
        trace = recording.end(running)
        if self.config.enable_inspect:
            save_trace(trace, self._path())


_lock = threading.Lock()
_session: _Session | None = None


@guarded()
def nrt_inspect_begin_with_options(options: nrt_inspect_config_t | None) -> NRT_STATUS:
    """Begin a session with ``options`` (``None``: the defaults, which capture nothing until
    enabled), the ``NEURON_RT_INSPECT_*`` variables ignored."""
    _begin(nrt_inspect_config_t() if options is None else live_config(options))
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_begin() -> NRT_STATUS:
    """Begin a session configured by the ``NEURON_RT_INSPECT_*`` variables (docs/compat.md
    lists them); nothing is captured unless ``NEURON_RT_INSPECT_ENABLE`` or ``_ON_FAIL`` is
    set."""
    _begin(config_from_environment())
    return NRT_STATUS.NRT_SUCCESS


def _begin(config: nrt_inspect_config_t) -> None:
    global _session
    _state.require()
    with _lock:
        if _session is not None:
            raise NrtError(
                NRT_STATUS.NRT_FAILURE, "an inspect session is running; nrt_inspect_stop it first"
            )
        # A copy: setting the options later does not change the running session.
        copied = dataclasses.replace(
            config,
            activities=set(config.activities),
            disabled_ncs=set(config.disabled_ncs),
            disabled_event_types=set(config.disabled_event_types),
        )
        _session = _Session(copied)


@guarded()
def nrt_inspect_stop() -> NRT_STATUS:
    """End the session and write its profile (when ``enable_inspect`` is on)."""
    global _session
    with _lock:
        running, _session = _session, None
    if running is None:
        raise NrtError(NRT_STATUS.NRT_INVALID, "no inspect session is running")
    running.stop()
    return NRT_STATUS.NRT_SUCCESS


def _begin_from_environment() -> None:
    """At nrt_init: the session the variables enable, as libnrt begins it there."""
    config = config_from_environment()
    if config.enable_inspect or config.enable_inspect_on_fail:
        _begin(config)


def _close() -> None:
    """At nrt_close: the session ends and is written, as at nrt_inspect_stop."""
    global _session
    with _lock:
        running, _session = _session, None
    if running is not None:
        running.stop()


_state.on_init.append(_begin_from_environment)
_state.on_close.append(_close)
