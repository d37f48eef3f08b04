"""A request in a loaded model's queue (:class:`QueuedRequest`): its inputs, outputs,
deadline, cancel token, statistics times and the future that completes it; and the TIMEOUT a
late one gets."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..drivers.base import CancelToken
from ..errors import DeadlineExceededError

STOP = None
"""What a worker takes from a queue to stop."""

_CLAIMING = threading.Lock()


class RequestFuture(Future[Any]):
    """The future of a queued request: :meth:`claim` starts it, or fails it, at most once.

    A worker starting a request, its deadline passing while it waits, a full queue's
    timeout and the model's close all race to settle the same future. ``Future``'s own
    ``set_running_or_notify_cancel`` answers the losers by logging CRITICAL ("Future in
    unexpected state") before it raises: a user saw that line for every request that ran past
    its deadline. Here only the first claim asks it; the others learn they lost, silently.
    """

    _claimed = False

    def claim(self) -> bool:
        """Whether this call moved the request from waiting to running (a caller that cancelled
        it meanwhile is told, once); ``False`` when it was cancelled or claimed before."""
        with _CLAIMING:
            if self._claimed or (self.done() and not self.cancelled()):
                return False  # claimed, or settled by whoever holds it (a test, say)
            self._claimed = True
        return self.set_running_or_notify_cancel()


@dataclass(eq=False)
class QueuedRequest:
    """One request in the queue: what it runs on, where its results go, its limits, its
    times for the statistics, and the future its caller waits on."""

    future: RequestFuture
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


def late(name: str, why: str) -> DeadlineExceededError:
    """TIMEOUT for a request of model ``name``: ``why`` it did not finish in time."""
    return DeadlineExceededError(
        f"model {name!r}: request timed out, {why}; allow more time (deadline=, exec_timeout=, "
        "CROSSRT_EXEC_TIMEOUT) or load more instances",
        details={"model": name},
    )
