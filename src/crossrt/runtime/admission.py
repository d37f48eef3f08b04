"""Admission to a loaded model's bounded queue: backpressure, first come first admitted.

At most ``depth`` requests are admitted at once (waiting for a worker or running). Past
that a request waits in line for a slot, as OpenVINO's ``AsyncInferQueue`` makes its caller
wait: either its caller's thread waits (``run_async``), or nothing does and the request is
admitted when a slot frees (``infer``: the event loop must not block). A slot that frees
goes to the head of the line, never back to the count while anyone waits, so the line is
empty whenever a slot is free. A request gets ``QUEUE_FULL`` at once when its caller asks
not to wait, or when its bounded wait expires.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from ..drivers.base import CancelToken
from . import watchdog
from .queued import RequestFuture

T = TypeVar("T")


@dataclass(eq=False)
class Waiter(Generic[T]):
    """A request waiting in line: the item to admit, and the future that reports on it."""

    item: T
    future: RequestFuture
    admitted: threading.Event | None = None
    """Set when a caller's thread waits for it: admitted, or the queue closed."""
    give_up: CancelToken | None = None
    """Armed on the watchdog while a detached request waits with a timeout."""


class Admission(Generic[T]):
    """The slots of one bounded queue and the line of requests waiting for one.

    Args:
        depth: how many requests may be admitted at once.
        admit: hands an admitted item to the workers (called outside the lock).
    """

    def __init__(self, depth: int, admit: Callable[[T], None]) -> None:
        self.depth = depth
        self._admit = admit
        self._lock = threading.Lock()
        self._free = depth
        self._line: deque[Waiter[T]] = deque()
        self._closed = False

    def __len__(self) -> int:
        """How many requests wait in line."""
        return len(self._line)

    def enter(
        self,
        item: T,
        future: RequestFuture,
        *,
        block: bool,
        timeout: float | None,
        detached: bool,
        full: Callable[[float | None], BaseException],
        closed: Callable[[], BaseException],
    ) -> None:
        """Admit ``item`` now, or have it wait in line for a slot.

        Args:
            item: what :attr:`admit` hands to the workers once it holds a slot.
            future: resolves with the item's outcome; cancelling it while the item waits
                takes the item out of the line.
            block: wait when no slot is free; else raise ``full(None)``.
            timeout: the most seconds to wait (``None``: no limit), then ``full(timeout)``.
            detached: return at once and let the item wait in line with no thread held;
                an expired wait then fails ``future`` with ``full(timeout)``.
            full: the error for a full queue, given the seconds waited (``None``: none).
            closed: the error for a queue that is closed.

        Raises:
            Whatever ``full`` or ``closed`` returns.
        """
        with self._lock:
            if self._closed:
                raise closed()
            if self._free:
                self._free -= 1
                waiter = None
            elif not block:
                raise full(None)
            else:
                waiter = Waiter(item, future, None if detached else threading.Event())
                self._line.append(waiter)
        if waiter is None:
            self._admit(item)
            return
        future.add_done_callback(partial(self._left, waiter))
        if detached:
            if timeout is not None:
                waiter.give_up = CancelToken()
                waiter.give_up.on_cancel(partial(self._expire, waiter, full(timeout)))
                watchdog.watch(waiter.give_up, time.monotonic() + timeout)
            return
        assert waiter.admitted is not None
        if not waiter.admitted.wait(timeout) and self._withdraw(waiter):
            raise full(timeout)

    def release(self) -> None:
        """Give a slot back: to the first request waiting in line, else to the count."""
        with self._lock:
            while self._line:
                waiter = self._line.popleft()
                if not waiter.future.done():  # not cancelled (nor failed) while it waited
                    break
            else:
                self._free += 1
                return
        if waiter.give_up is not None:
            watchdog.finish(waiter.give_up)
        self._admit(waiter.item)
        if waiter.admitted is not None:
            waiter.admitted.set()

    def close(self, error: Callable[[], BaseException]) -> None:
        """Refuse new requests and fail those waiting in line with ``error()``."""
        with self._lock:
            self._closed = True
            waiting = list(self._line)
            self._line.clear()
        for waiter in waiting:  # outside the lock: a done callback may queue elsewhere
            if waiter.give_up is not None:
                watchdog.finish(waiter.give_up)
            _fail(waiter.future, error())
            if waiter.admitted is not None:
                waiter.admitted.set()

    def _withdraw(self, waiter: Waiter[T]) -> bool:
        """Take ``waiter`` out of the line; False when it was admitted (or closed) meanwhile."""
        with self._lock:
            try:
                self._line.remove(waiter)
            except ValueError:
                return False
            return True

    def _left(self, waiter: Waiter[T], future: Future[Any]) -> None:
        if future.cancelled():  # the caller gave up: its place goes to the next one
            self._withdraw(waiter)

    def _expire(self, waiter: Waiter[T], error: BaseException) -> None:
        if self._withdraw(waiter):
            _fail(waiter.future, error)


def _fail(future: RequestFuture, error: BaseException) -> None:
    # Resolved meanwhile (cancelled, or claimed by another): nothing left to report.
    if future.claim():
        future.set_exception(error)
