"""Profiles and their traces, for layers built over the runtime (``crossrt.profiling``).

The supported names of the runtime's profiler (``runtime/profiler.py``), for code that records
or writes profiles in another system's terms (the Neuron layer's ``nrt_profile_start`` /
``nrt_inspect_*``): :class:`Profile` (what loaded models did between its start and stop, as a
Chrome trace and a summary; ``Runtime.profile()`` makes one), :func:`save_trace` (write a
trace whole or not at all) and :data:`MAX_REQUESTS` (how many requests a profile keeps by
default). docs/observability.md tells what a trace holds; docs/runtime-api.md lists the
public modules.
"""

from __future__ import annotations

from .runtime.profiler import MAX_REQUESTS, Profile, save_trace

__all__ = ["MAX_REQUESTS", "Profile", "save_trace"]
