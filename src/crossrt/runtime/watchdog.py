"""One thread per process that cancels calls whose execution timeout expired.

A ``threading.Timer`` per call would start a thread per call; the watchdog keeps a heap of
deadlines instead and sleeps until the nearest one.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

from ..drivers.base import CancelToken
from .cores.pinning import CALLER

_lock = threading.Condition()
_heap: list[tuple[float, int, CancelToken]] = []
_order = itertools.count()
_thread: threading.Thread | None = None


def watch(token: CancelToken, deadline: float) -> None:
    """Cancel ``token`` at ``deadline`` (``time.monotonic()``) unless it is finished first."""
    global _thread
    with _lock:
        entry = (deadline, next(_order), token)
        heapq.heappush(_heap, entry)
        if _thread is None or not _thread.is_alive():
            CALLER.unpin()  # a request thread's pin is not for the thread it starts
            _thread = threading.Thread(target=_loop, name="crossrt-watchdog", daemon=True)
            _thread.start()
        if _heap[0] is entry:
            # Only a new nearest deadline needs the thread to wake and sleep anew: waking it
            # on every call (a thread switch) cost a call on the lane ~100 us.
            _lock.notify()


def _loop() -> None:
    while True:
        with _lock:
            while not _heap or _heap[0][0] > time.monotonic():
                # Bounded: Condition.wait refuses a timeout past the platform's time_t (an
                # infinite deadline), and that error would end this thread for good.
                _lock.wait(None if not _heap else min(_heap[0][0] - time.monotonic(), 3600.0))
            _, _, token = heapq.heappop(_heap)
        # A finished call's token is marked cancelled too (see finish): nothing to stop.
        token.cancel()


def finish(token: CancelToken) -> bool:
    """Mark a call done; True when its timeout had already cancelled it."""
    return token.settle()  # the watchdog's later cancel() is then a no-op
