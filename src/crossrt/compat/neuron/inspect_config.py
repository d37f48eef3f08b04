"""The options of an inspect session (``nrt_profile.h``'s ``nrt_inspect_config_*``) and the
``NEURON_RT_INSPECT_*`` variables that make them: activity types, event types, cores, the
output directory. ``inspect.py`` runs the sessions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...profiling import MAX_REQUESTS
from .env import _boolean, _integer
from .profiling import live_options, output_directory
from .recording import MEMORY_CATEGORY
from .state import _state
from .status import NRT_STATUS, NrtError, guarded

__all__ = [
    "NRT_INSPECT_ACTIVITY_TYPES",
    "NRT_INSPECT_EVENT_TYPES",
    "nrt_inspect_config_allocate",
    "nrt_inspect_config_free",
    "nrt_inspect_config_free_activity_types",
    "nrt_inspect_config_get_all_activity_types",
    "nrt_inspect_config_get_enabled_activity_types",
    "nrt_inspect_config_set_activity",
    "nrt_inspect_config_set_capture_enabled_for_event_type_string",
    "nrt_inspect_config_set_capture_enabled_for_nc",
    "nrt_inspect_config_set_defaults",
    "nrt_inspect_config_set_enable_inspect",
    "nrt_inspect_config_set_enable_inspect_on_fail",
    "nrt_inspect_config_set_output_dir",
    "nrt_inspect_config_set_session_id",
    "nrt_inspect_config_set_sys_trace_max_events_per_nc",
    "nrt_inspect_config_t",
]

CATEGORIES = {
    "system_profile": frozenset({"mark", "request"}),
    "device_profile": frozenset({"infer", "node", "copy"}),
    "host_memory": frozenset({MEMORY_CATEGORY}),
    "cpu_util": frozenset(),
}
"""The trace categories each activity type keeps."""

NRT_INSPECT_ACTIVITY_TYPES = tuple(CATEGORIES)
"""The activity types, as ``nrt_inspect_config_get_all_activity_types`` lists them."""

NRT_INSPECT_EVENT_TYPES = {
    "nrt_execute": "mark",
    "request": "request",
    "nc_exec_running": "infer",
    "node": "node",
    "copy": "copy",
    "memory": MEMORY_CATEGORY,
}
"""Event types a session can leave out, and the trace category each is: the nrt API calls,
requests with their phases, instance runs, node runs, host/device copies, memory counters."""


@dataclass(eq=False)
class nrt_inspect_config_t:
    """The options of :func:`nrt_inspect_begin_with_options`; set them with the
    ``nrt_inspect_config_set_*`` functions. The defaults are the seed's."""

    session_id: int = 1
    output_dir: str = "./output"
    activities: set[str] = field(default_factory=lambda: set(NRT_INSPECT_ACTIVITY_TYPES))
    sys_trace_max_events_per_nc: int = MAX_REQUESTS
    """Requests (and API calls) kept per model; later ones are counted, not drawn."""
    disabled_ncs: set[int] = field(default_factory=set)
    disabled_event_types: set[str] = field(default_factory=set)
    enable_inspect: bool = False
    enable_inspect_on_fail: bool = False
    freed: bool = False


def live_config(options: Any) -> nrt_inspect_config_t:
    """``options`` when it is a live nrt_inspect_config_t, else NRT_INVALID."""
    return live_options(options, nrt_inspect_config_t)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool | int):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give true or false")
    return bool(value)


def _count(value: Any, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give a whole number >= {least}")
    return value


# -- the config object ---------------------------------------------------------------------------


@guarded("pair")
def nrt_inspect_config_allocate() -> tuple[NRT_STATUS, nrt_inspect_config_t | None]:
    """A config with the defaults: session 1, ``./output``, every activity, core and event
    type, inspect and inspect-on-fail off."""
    return NRT_STATUS.NRT_SUCCESS, nrt_inspect_config_t()


@guarded()
def nrt_inspect_config_set_defaults(options: nrt_inspect_config_t) -> NRT_STATUS:
    """Put every option of ``options`` back to its default (not read from the variables)."""
    target = live_config(options)
    for f in dataclasses.fields(nrt_inspect_config_t):
        default = f.default_factory() if callable(f.default_factory) else f.default
        setattr(target, f.name, default)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_free(options: nrt_inspect_config_t) -> NRT_STATUS:
    """Release ``options``; they may not be used again."""
    live_config(options).freed = True
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_session_id(options: nrt_inspect_config_t, session_id: int) -> NRT_STATUS:
    """The session's number, in its file names."""
    live_config(options).session_id = _count(session_id, "session_id", 0)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_output_dir(options: nrt_inspect_config_t, output_dir: str) -> NRT_STATUS:
    """Where the session's files go (a non-empty path; created when they are written)."""
    live_config(options).output_dir = output_directory(output_dir)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_sys_trace_max_events_per_nc(
    options: nrt_inspect_config_t, sys_trace_max_events_per_nc: int
) -> NRT_STATUS:
    """Requests and API calls kept per model (the first ones; later ones are counted)."""
    target = live_config(options)
    target.sys_trace_max_events_per_nc = _count(sys_trace_max_events_per_nc, "max events", 1)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_capture_enabled_for_nc(
    options: nrt_inspect_config_t, nc_idx: int, enabled: bool
) -> NRT_STATUS:
    """Record the models whose first core is ``nc_idx``, or not."""
    target = live_config(options)
    nc = _count(nc_idx, "nc_idx", 0)
    if _flag(enabled, "enabled"):
        target.disabled_ncs.discard(nc)
    else:
        target.disabled_ncs.add(nc)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_capture_enabled_for_event_type_string(
    options: nrt_inspect_config_t, event_type: str, enabled: bool
) -> NRT_STATUS:
    """Keep the events of ``event_type`` (one of :data:`NRT_INSPECT_EVENT_TYPES`), or not."""
    target = live_config(options)
    if event_type not in NRT_INSPECT_EVENT_TYPES:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"event type {event_type!r} is not one of {', '.join(NRT_INSPECT_EVENT_TYPES)}",
        )
    if _flag(enabled, "enabled"):
        target.disabled_event_types.discard(event_type)
    else:
        target.disabled_event_types.add(event_type)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_enable_inspect(
    options: nrt_inspect_config_t, enable_inspect: bool
) -> NRT_STATUS:
    """Write the session's profile at its end (off by default)."""
    live_config(options).enable_inspect = _flag(enable_inspect, "enable_inspect")
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_inspect_config_set_enable_inspect_on_fail(
    options: nrt_inspect_config_t, enable_inspect_on_fail: bool
) -> NRT_STATUS:
    """Write the profile so far whenever an execution fails (off by default)."""
    live_config(options).enable_inspect_on_fail = _flag(enable_inspect_on_fail, "on_fail")
    return NRT_STATUS.NRT_SUCCESS


@guarded("pair")
def nrt_inspect_config_get_all_activity_types() -> tuple[NRT_STATUS, list[str] | None]:
    """Every activity type (the C array's length is ``count``)."""
    return NRT_STATUS.NRT_SUCCESS, list(NRT_INSPECT_ACTIVITY_TYPES)


@guarded("pair")
def nrt_inspect_config_get_enabled_activity_types(
    options: nrt_inspect_config_t,
) -> tuple[NRT_STATUS, list[str] | None]:
    """The activity types ``options`` enables."""
    enabled = live_config(options).activities
    return NRT_STATUS.NRT_SUCCESS, [a for a in NRT_INSPECT_ACTIVITY_TYPES if a in enabled]


@guarded("void")
def nrt_inspect_config_free_activity_types(activity_types: Any, count: int) -> None:
    """Release a list the two calls above returned (nothing to do in Python)."""


@guarded()
def nrt_inspect_config_set_activity(
    options: nrt_inspect_config_t, activity_type: str, enabled: bool
) -> NRT_STATUS:
    """Enable or disable one activity type, or ``"all"`` of them."""
    target = live_config(options)
    names = NRT_INSPECT_ACTIVITY_TYPES if activity_type == "all" else (activity_type,)
    if not set(names) <= set(NRT_INSPECT_ACTIVITY_TYPES):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"activity type {activity_type!r} is not one of "
            f"{', '.join(NRT_INSPECT_ACTIVITY_TYPES)}, all",
        )
    if _flag(enabled, "enabled"):
        target.activities |= set(names)
    else:
        target.activities -= set(names)
    return NRT_STATUS.NRT_SUCCESS


def config_from_environment(environ: Mapping[str, str] | None = None) -> nrt_inspect_config_t:
    """The session the ``NEURON_RT_INSPECT_*`` variables ask for (a malformed one is
    NRT_INVALID, naming it)."""
    env = os.environ if environ is None else environ
    prefix = "NEURON_RT_INSPECT_"
    config = nrt_inspect_config_t(
        enable_inspect=_boolean(env, prefix + "ENABLE"),
        enable_inspect_on_fail=_boolean(env, prefix + "ON_FAIL"),
        output_dir=env.get(prefix + "OUTPUT_DIR", "").strip() or "./output",
        sys_trace_max_events_per_nc=_integer(
            env, prefix + "SYS_TRACE_MAX_EVENTS_PER_NC", MAX_REQUESTS
        ),
    )
    for activity, name in (
        ("system_profile", "SYSTEM_PROFILE"),
        ("device_profile", "DEVICE_PROFILE"),
        ("host_memory", "HOST_MEMORY"),
        ("cpu_util", "CPU_UTIL"),
    ):
        if env.get(prefix + name, "").strip() and not _boolean(env, prefix + name):
            config.activities.discard(activity)
    types = env.get(prefix + "EVENT_FILTER_TYPE", "").strip()
    if types:
        wanted = {t.strip() for t in types.split(",") if t.strip()}
        unknown = wanted - set(NRT_INSPECT_EVENT_TYPES)
        if unknown:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{prefix}EVENT_FILTER_TYPE names {', '.join(sorted(unknown))}; use "
                f"{', '.join(NRT_INSPECT_EVENT_TYPES)}",
            )
        config.disabled_event_types = set(NRT_INSPECT_EVENT_TYPES) - wanted
    ncs = env.get(prefix + "EVENT_FILTER_NC", "").strip()
    if ncs:
        wanted_ncs = _nc_list(ncs, prefix + "EVENT_FILTER_NC")
        visible = len(_state.require().cores)
        config.disabled_ncs = set(range(visible)) - wanted_ncs
    return config


def _nc_list(text: str, what: str) -> set[int]:
    """NeuronCores from ``"0,2-3"``."""
    found: set[int] = set()
    for item in text.split(","):
        first, _, last = item.strip().partition("-")
        if not first.isdigit() or not (last or first).isdigit() or int(last or first) < int(first):
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{what}={text!r} is not a list of NeuronCores; write 0,2-3",
            )
        found |= set(range(int(first), int(last or first) + 1))
    return found
