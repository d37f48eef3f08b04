"""The watchdog (``runtime/watchdog.py``): one thread cancelling tokens at their deadlines."""

from __future__ import annotations

import math
import threading
import time

from crossrt.drivers.base import CancelToken
from crossrt.runtime import watchdog

WAIT = 10  # seconds: the bound on every wait; reached only when something is broken


def _watched(deadline: float) -> threading.Event:
    """An event set when the watchdog cancels a token watched until ``deadline``."""
    token = CancelToken()
    fired = threading.Event()
    token.on_cancel(fired.set)
    watchdog.watch(token, deadline)
    return fired


def test_an_infinite_deadline_does_not_stop_the_watchdog() -> None:
    """``Condition.wait(inf)`` raises OverflowError; the thread must live on."""
    never = CancelToken()
    watchdog.watch(never, math.inf)
    thread = watchdog._thread
    # Once it has cancelled this one, the thread goes back to waiting for the infinite
    # deadline, the wait that killed it (a dead watchdog is started anew by the next watch).
    assert _watched(time.monotonic() + 0.01).wait(WAIT)
    assert _watched(time.monotonic()).wait(WAIT)
    assert thread is not None and thread.is_alive()
    assert watchdog._thread is thread and not never.cancelled


def test_a_finished_call_is_not_cancelled_later() -> None:
    token = CancelToken()
    stopped: list[bool] = []
    token.on_cancel(lambda: stopped.append(True))
    watchdog.watch(token, time.monotonic() + 0.02)
    assert watchdog.finish(token) is False  # done before its deadline
    # The watchdog takes deadlines in order: once a later one fired, it has been past this.
    assert _watched(time.monotonic() + 0.03).wait(WAIT)
    assert stopped == []
