"""CancelToken: the one-shot "stop this call" signal (base layer).

A user hands one to ``run(..., cancel=)``; the runtime's watchdog cancels one when a deadline
passes; a driver's :class:`~crossrt.drivers.Program` registers how to abort its engine on it;
the daemon cancels the request of a client that went away. It knows nothing of any of them, so
it sits in the base layer with errors and dtypes, where every layer can import it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CancelToken"]


class CancelToken:
    """A one-shot signal that a running call should stop (a deadline passed, or the caller
    no longer wants the result).

    The runtime's watchdog or the caller calls :meth:`cancel`; a program registers how to
    abort its engine with :meth:`on_cancel`. Callbacks run once, in the thread that cancels.
    """

    __slots__ = ("_callbacks", "_lock", "cancelled")

    def __init__(self) -> None:
        self.cancelled = False
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on :meth:`cancel`, or now when already cancelled."""
        with self._lock:
            if not self.cancelled:
                self._callbacks.append(callback)
                return
        callback()

    def settle(self) -> bool:
        """The call it guards is done: a later :meth:`cancel` does nothing and no callback
        runs. True when it was cancelled already (the runtime's watchdog asks so whether a
        time limit stopped the call)."""
        with self._lock:
            cancelled = self.cancelled
            self.cancelled = True
            self._callbacks.clear()
        return cancelled

    def cancel(self) -> None:
        """Trigger the signal; later calls do nothing."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
