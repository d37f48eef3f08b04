"""Where a replica runs a request: inline on its event loop, or on its request threads.

A request of a model that takes a few microseconds (a tiny MLP) cost the replica more in the
hop to a request thread and back (two thread wake-ups, each a GIL handover) than the model
itself: profiled inside a replica at 4 clients, the hop was 0.1-0.4 ms against ~15 us of
KServe decoding, run and encoding. Such a model runs inline on the replica's event loop (which
Serve keeps busy only with its own bookkeeping while it waits); a model that takes longer, or
that waits inside ``run`` for other requests (dynamic batching) or for one of several
instances, keeps the request threads, so the loop never stalls behind it.

The choice is made per model from its own recent run times, measured where it runs, so a
model that becomes slow (larger inputs) goes back to the threads on its next request.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ...server.repository import Entry

INLINE_NS = 500_000
"""A model whose recent runs took less than this (0.5 ms) on average runs inline."""

WEIGHT = 0.2
"""How much the last run moves a model's average (an exponential moving average)."""


class Inline:
    """Per model, whether its requests run inline, from the average of its recent runs.

    A model starts on the request threads; its runs there give its first times. The event
    loop's thread is pinned to the replica's cores before it runs a model (``cores``; None:
    not exclusive, left as it is), as the request threads are.
    """

    def __init__(self, cores: tuple[int, ...] | None) -> None:
        self._cores = cores
        self._average: dict[str, float] = {}
        self._pinned: set[int] = set()  # threads already pinned (by id)

    def fits(self, entry: Entry | None) -> bool:
        """Whether ``entry``'s next request should run inline: a single instance, no
        dynamic batching, and an average recent run under :data:`INLINE_NS`."""
        if entry is None or entry.options.instances > 1 or entry.options.max_batch_size > 0:
            return False
        average = self._average.get(entry.name)
        return average is not None and average < INLINE_NS

    def run(self, entry: Entry | None, work: Callable[[], Any]) -> Any:
        """``work`` in this thread, timed for ``entry`` (pinning this thread first, once)."""
        thread = threading.get_ident()
        if self._cores and thread not in self._pinned:
            os.sched_setaffinity(0, self._cores)  # 0: this thread
            self._pinned.add(thread)
        began = time.perf_counter_ns()
        try:
            return work()
        finally:
            if entry is not None:
                self.record(entry.name, time.perf_counter_ns() - began)

    def record(self, name: str, took_ns: int) -> None:
        """One more run of model ``name`` that took ``took_ns``."""
        average = self._average.get(name)
        self._average[name] = (
            float(took_ns) if average is None else average + WEIGHT * (took_ns - average)
        )
