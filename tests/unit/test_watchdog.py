"""The watchdog (``runtime/watchdog.py``): one thread cancelling tokens at their deadlines."""

from __future__ import annotations

import math
import time

from crossrt.drivers.base import CancelToken
from crossrt.runtime import watchdog


def test_an_infinite_deadline_does_not_stop_the_watchdog() -> None:
    """``Condition.wait(inf)`` raises OverflowError; the thread must live on."""
    never = CancelToken()
    watchdog.watch(never, math.inf)
    thread = watchdog._thread
    time.sleep(0.05)
    assert thread is not None and thread.is_alive()  # it died here, to be started anew
    soon = CancelToken()
    watchdog.watch(soon, time.monotonic() + 0.05)
    deadline = time.monotonic() + 10
    while not soon.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert soon.cancelled and not never.cancelled
    assert watchdog._thread is thread


def test_a_finished_call_is_not_cancelled_later() -> None:
    token = CancelToken()
    stopped: list[bool] = []
    token.on_cancel(lambda: stopped.append(True))
    watchdog.watch(token, time.monotonic() + 0.02)
    assert watchdog.finish(token) is False  # done before its deadline
    time.sleep(0.1)
    assert stopped == []
