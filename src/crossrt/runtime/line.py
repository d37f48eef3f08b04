"""The line for a model's instances: which are idle, and who waits for one.

``run()`` callers and the scheduler's workers share it. An idle instance is popped without
blocking (``deque.pop``/``append`` are atomic and cost a third of a lock's acquire/release,
on the path every synchronous ``run()`` takes); with none idle, a caller or a worker joins
one first-come-first-served line, and whoever gives an instance back hands it to the one
who has waited longest, so a caller in a loop cannot keep an instance for good.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from .instance import Instance


class _Waiter:
    """One thread in line for an instance: ``wake`` is released when it is handed one
    (``instance``), or when the model closes (``instance`` stays ``None``)."""

    __slots__ = ("instance", "wake")

    def __init__(self) -> None:
        self.instance: Instance | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class InstanceLine:
    """The idle instances of one model and the line of threads waiting for one.

    Attributes:
        idle: instances no caller or worker holds (``pop`` one to take it without waiting).
        waiting: the threads in line for one, first come first served (truthy while anyone
            waits: ``run()`` reads it to queue up behind them).
    """

    def __init__(self, instances: Sequence[Instance]) -> None:
        self.idle: deque[Instance] = deque(instances)
        self.waiting: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def give_back(self, inst: Instance) -> None:
        """Return an instance taken from :attr:`idle`: to the first in line for one, if any."""
        self.idle.append(inst)
        if self.waiting:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the idle instances to those in line for one, first come first served (call
        after appending to :attr:`idle` when :attr:`waiting`)."""
        with self._lock:
            while self.waiting:
                try:
                    inst = self.idle.pop()
                except IndexError:
                    return
                waiter = self.waiting.popleft()
                waiter.instance = inst
                waiter.wake.release()

    def take_in_turn(self) -> Instance | None:
        """An idle instance, or the next one given back, in the order asked for; ``None``
        once the line is closed (a request must not wait for a run that may be long)."""
        if not self.waiting:
            try:
                return self.idle.pop()
            except IndexError:
                pass
        waiter = _Waiter()
        with self._lock:
            if self._closed:
                return None
            self.waiting.append(waiter)
        # Given back before this joined the line, by a thread that saw no one waiting: the
        # append came first, so it is seen here.
        if self.idle:
            self.hand_over()
        try:
            waiter.wake.acquire()
        except BaseException:  # interrupted (Ctrl-C): leave the line, or pass the instance on
            with self._lock:
                if waiter in self.waiting:
                    self.waiting.remove(waiter)
                    raise
            if waiter.instance is not None:
                self.give_back(waiter.instance)
            raise
        return waiter.instance

    def close(self) -> None:
        """Those in line get no instance (``take_in_turn`` returns ``None``), nor do those
        who come later."""
        with self._lock:
            self._closed = True
            line = list(self.waiting)
            self.waiting.clear()
        for waiter in line:
            waiter.wake.release()
