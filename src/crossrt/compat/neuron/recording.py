"""A recording of the whole runtime for ``nrt_trace_*`` and ``nrt_inspect_*``: every model,
the ones loaded after it started included, as one Chrome trace.

A :class:`crossrt.profiling.Profile` records the models it is given when it starts. A Neuron
trace or inspect session covers "all visible NeuronCores" and usually starts before any
model is loaded (``NEURON_RT_INSPECT_ENABLE`` at ``nrt_init``), so a recording keeps one Profile per
model (its requests and its nrt API calls, on one clock), starts one for each model
``nrt_load`` adds, and merges their traces when it stops: one timeline, one track per
instance, request ids kept apart.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...memory import memory_log
from ...profiling import MAX_REQUESTS, Profile
from .state import _state, nrt_model_t
from .status import NRT_STATUS

API_TRACK = "nrt API"
"""The track the nrt_* calls (nrt_execute, nrta_execute_schedule...) are drawn on (in a
recording, one per model)."""

MEMORY_CATEGORY = "memory"
"""The category of the device-memory counters a recording with ``memory`` adds."""

FailureHandler = Callable[["Recording", nrt_model_t, str, NRT_STATUS], None]


class Recording:
    """Every model of the runtime from :meth:`start` to :meth:`stop`, as one Chrome trace.

    Args:
        kind: what records (``"trace"``, ``"inspect"``), for messages and conflicts.
        max_requests: requests, and nrt API calls, kept per model (later ones are counted).
        cores: which NeuronCores (a model's first core) are recorded; default all.
        categories: the trace categories kept (``request``, ``infer``, ``node``, ``copy``,
            ``mark`` for API calls, ``memory``); default all.
        memory: add the device memory in use over time (counters from the allocation log)
            and each device's memory statistics at the stop.
        cpu: add the process's CPU time over the recording (``otherData.cpu_util``).
        device: whether it records device activity (continuous profiling refuses to start
            beside such an inspect session, as libnrt's does).
        on_fail: called when an execution of a recorded model fails.
    """

    def __init__(
        self,
        kind: str,
        *,
        max_requests: int = MAX_REQUESTS,
        cores: Callable[[int], bool] | None = None,
        categories: frozenset[str] | None = None,
        memory: bool = False,
        cpu: bool = False,
        device: bool = True,
        on_fail: FailureHandler | None = None,
    ) -> None:
        self.kind = kind
        self.device = device
        self.on_fail = on_fail
        self._max = max_requests
        self._cores = cores or (lambda nc: True)
        self._categories = categories
        self._memory, self._cpu = memory, cpu
        self._lock = threading.Lock()
        # The timeline's start; each model's requests and API calls go in the model's own
        # Profile, so that a call and the request it made share one clock exactly.
        self._base = Profile((), None)
        self._profiles: dict[int, Profile] = {}  # by model_id
        self._marks: dict[int, int] = {}  # marks per model, to keep at most max_requests
        self._times, self._began = os.times(), time.monotonic()
        self._stopped = False

    def start(self, models: Iterable[nrt_model_t]) -> Recording:
        """Begin with ``models`` (later ones come through :meth:`add`)."""
        self._base.start()
        self._times, self._began = os.times(), time.monotonic()
        for model in models:
            self.add(model)
        return self

    def add(self, model: nrt_model_t) -> None:
        """Record ``model`` from now on (a model just loaded)."""
        if not self.covers(model):
            return
        profile = Profile(model.model, max_requests=self._max, drawn_requests=self._max)
        with self._lock:
            if not self._stopped:  # a load racing the stop: a profile never stopped would leak
                self._profiles[model.model_id] = profile.start()

    def covers(self, model: nrt_model_t) -> bool:
        """Whether ``model``'s NeuronCore is recorded."""
        return self._cores(model.start_nc)

    def mark(self, model: nrt_model_t, what: str, began: int, ended: int) -> None:
        """Draw the nrt API call ``what`` of ``model`` (``time.perf_counter_ns()`` times)."""
        with self._lock:
            profile = self._profiles.get(model.model_id)
            kept = self._marks.get(model.model_id, 0)
            if profile is None or kept >= self._max:
                return
            self._marks[model.model_id] = kept + 1
        track = f"{API_TRACK}: model {model.model_id} ({model.model.name})"
        profile.mark(
            what, began, ended, track,
            model=model.model.name, start_nc=model.start_nc, nc_count=model.nc_count,
        )  # fmt: skip

    def stop(self) -> dict[str, Any]:
        """Stop; the merged trace (``traceEvents``, ``otherData``)."""
        with self._lock:
            self._stopped = True
            profiles = list(self._profiles.values())
        trace = _merge([self._base.stop(), *(p.stop() for p in profiles)])
        base = trace["otherData"]["start_epoch_us"]
        if self._memory:
            trace["traceEvents"] += _memory_counters(base)
            runtime = _state.runtime
            if runtime is not None and not runtime.closed:
                stats = runtime.memory_stats()
                trace["otherData"]["memory"] = {d: s.to_dict() for d, s in stats.items()}
        if self._cpu:
            now = os.times()
            wall = max(time.monotonic() - self._began, 1e-9)
            used = (now.user - self._times.user, now.system - self._times.system)
            trace["otherData"]["cpu_util"] = {
                "user_s": round(used[0], 6),
                "system_s": round(used[1], 6),
                "wall_s": round(wall, 6),
                "percent": round(100 * sum(used) / wall, 2),
            }
        if self._categories is not None:
            kept = self._categories
            trace["traceEvents"] = [
                e for e in trace["traceEvents"] if e["ph"] == "M" or e.get("cat") in kept
            ]
        return trace


def _merge(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace of several Profiles' traces of the same process: times moved to the first
    one's clock, tracks and async request ids renumbered so that none collide."""
    first = traces[0]
    base = first["otherData"]["start_epoch_us"]
    events: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    tids = 0
    for k, trace in enumerate(traces):
        shift = trace["otherData"]["start_epoch_us"] - base
        used = 0
        for event in trace["traceEvents"]:
            if k and event["ph"] == "M" and event["name"] == "process_name":
                continue
            moved = dict(event)
            if "ts" in moved:
                moved["ts"] = round(moved["ts"] + shift, 3)
            if moved.get("tid"):  # track 0 holds the async request slices, ids apart
                used = max(used, moved["tid"])
                moved["tid"] += tids
            if "id" in moved:
                moved["id"] = f"{k}.{moved['id']}"
            events.append(moved)
        tids += used
        summary += trace["otherData"]["summary"]
    return {
        "traceEvents": events,
        "displayTimeUnit": first.get("displayTimeUnit", "ms"),
        "otherData": {**first["otherData"], "summary": summary},
    }


def _memory_counters(base_us: int) -> list[dict[str, Any]]:
    """The allocation log since ``base_us`` (epoch microseconds) as one counter per device:
    bytes in use after each allocation and free."""
    pid = os.getpid()
    return [
        {"ph": "C", "cat": MEMORY_CATEGORY, "name": f"memory {row.device}", "pid": pid,
         "tid": 0, "ts": round(row.time * 1e6 - base_us, 3),
         "args": {"bytes_in_use": row.device_in_use}}
        for row in memory_log().rows()
        if row.time * 1e6 >= base_us
    ]  # fmt: skip


# -- the recordings running now ------------------------------------------------------------

_active: list[Recording] = []
_active_lock = threading.Lock()


def begin(recording: Recording) -> Recording:
    """Start ``recording`` with the models loaded now, and feed it the ones loaded later."""
    with _state.lock, _active_lock:
        recording.start(list(_state.models))
        _active.append(recording)
    return recording


def end(recording: Recording) -> dict[str, Any]:
    """Stop ``recording``; its trace."""
    with _active_lock:
        if recording in _active:
            _active.remove(recording)
    return recording.stop()


def active(kind: str) -> list[Recording]:
    """The recordings of ``kind`` running now."""
    with _active_lock:
        return [r for r in _active if r.kind == kind]


def loaded(model: nrt_model_t) -> None:
    """``nrt_load`` added ``model``: every running recording records it from now on."""
    with _active_lock:
        recordings = list(_active)
    for recording in recordings:
        recording.add(model)


def called(model: nrt_model_t, what: str, began: int, ended: int) -> None:
    """An nrt API call of ``model`` took from ``began`` to ``ended``."""
    with _active_lock:
        recordings = list(_active)
    for recording in recordings:
        recording.mark(model, what, began, ended)


def failed(model: nrt_model_t, what: str, status: NRT_STATUS) -> None:
    """An execution of ``model`` failed: the recordings that capture failures hear of it."""
    with _active_lock:
        recordings = [r for r in _active if r.on_fail is not None and r.covers(model)]
    for recording in recordings:
        assert recording.on_fail is not None
        recording.on_fail(recording, model, what, status)
