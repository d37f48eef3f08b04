"""A request in a loaded model's queue (:class:`QueuedRequest`): its inputs, outputs,
deadline, cancel token, statistics times and the future that completes it; and the TIMEOUT a
late one gets."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..drivers.base import CancelToken
from ..errors import DeadlineExceededError

STOP = None
"""What a worker takes from a queue to stop."""


@dataclass(eq=False)
class QueuedRequest:
    """One request in the queue: what it runs on, where its results go, its limits, its
    times for the statistics, and the future its caller waits on."""

    future: Future[Any]
    feed: dict[str, Any]
    outputs: Any
    deadline: float | None
    values: dict[str, Any] = field(default_factory=dict)
    token: CancelToken | None = None
    end: float | None = None
    abandoned: bool = False  # its caller's cancel token fired (the caller went away)
    admitted: bool = False  # it holds a queue slot (handed to the workers)
    slot_back: bool = False  # that slot was given back (once, by whoever comes first)
    stoppable: bool = False  # give it a token when it starts, though no time limit applies
    batch: tuple[Any, int] | None = None  # what it shares with requests it may join; rows
    # time.perf_counter_ns() when it arrived, its inputs were checked, its run started and
    # the engine was done; the instance that ran it (for the statistics).
    arrived: int = 0
    checked: int = 0
    started: int = 0
    computed: int = 0
    instance: int = -1
    claimed: bool = False  # its future was marked running, or found cancelled, once

    def claim(self) -> bool:
        """Mark the future running: True when it waited, False when it was cancelled or
        was claimed or settled already (by a worker, a close, its deadline). Only the first
        claim asks the future: asking a future that is running or settled makes
        concurrent.futures log CRITICAL ("in unexpected state"), as if something had broken.
        (Two threads claiming at the same instant may still both ask it; one then gets the
        RuntimeError, caught here, and that log line.)"""
        future = self.future
        if self.claimed or (future.done() and not future.cancelled()):
            return False
        self.claimed = True  # a cancelled one is asked once: that notifies its waiters
        try:
            return future.set_running_or_notify_cancel()
        except RuntimeError:  # claimed by another thread between the check and here
            return False


def late(name: str, why: str) -> DeadlineExceededError:
    """TIMEOUT for a request of model ``name``: ``why`` it did not finish in time."""
    return DeadlineExceededError(
        f"model {name!r}: request timed out, {why}; allow more time (deadline=, exec_timeout=, "
        "CROSSRT_EXEC_TIMEOUT) or load more instances",
        details={"model": name},
    )
