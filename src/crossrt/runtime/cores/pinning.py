"""Threads on the CPUs of the instance they run: crossrt's workers, the daemon's request
threads, and a caller's own thread where it asks.

An instance on part of the runtime's CPUs has a ``pin`` (``Instance.pin``, from
``groups.pinned_cpus``). ONNX Runtime with one intra-op thread computes in the thread that
calls it, so whichever thread calls an instance's program decides where the work runs:

- crossrt's workers (``workers.py``) pin themselves to the instance they take a request for;
- a thread crossrt owns that calls ``run()`` itself (the daemon's gRPC, HTTP and lane threads)
  is marked once (:func:`own_thread`): each ``run()`` on it moves it onto the CPUs of the
  instance it took, with one ``sched_setaffinity`` only when that instance's CPUs differ from
  those of the last one it ran (a thread serving one instance pays nothing after the first
  call), and back onto the CPUs it had when marked for an instance that is not pinned;
- a user's own thread is left where it is unless it asks, with :func:`pinned_runs`: its
  affinity is the user's, and whatever else it does (the NumPy work around a run, the
  threads it starts, which inherit its affinity) would be confined to one instance's CPUs
  behind the user's back; restoring it after every call would cost two system calls per
  ``run()``, more than the rest of crossrt's share of a small model's run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger("crossrt")


def pin_thread(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Pin the calling thread to ``cpus`` where the OS allows; return them."""
    setaffinity = getattr(os, "sched_setaffinity", None)
    if setaffinity is not None:  # not on Linux: threads stay where the OS puts them
        try:
            setaffinity(0, cpus)  # 0: this thread, on Linux
        except OSError as exc:  # a CPU taken away since (cgroup change): run unpinned
            log.debug("could not pin a thread to CPUs %s: %s", cpus, exc)
    return cpus


def _affinity() -> tuple[int, ...] | None:
    getaffinity = getattr(os, "sched_getaffinity", None)
    return None if getaffinity is None else tuple(sorted(getaffinity(0)))


class Caller(threading.local):
    """What ``run()`` knows of the thread calling it (``__init__`` runs in each thread on
    its first use: an attribute of the thread's own dict is found faster than a class
    attribute, and ``run()`` reads :attr:`moves` on every call)."""

    def __init__(self) -> None:
        self.moves = False
        """Whether ``run()`` moves this thread onto the CPUs of the instance it takes."""
        self.cpus: tuple[int, ...] | None = None
        """The ``pin`` of the last instance it ran (``None``: it is on :attr:`free`)."""
        self.free: tuple[int, ...] | None = None
        """Its CPUs when it was marked: where an instance that is not pinned runs."""

    def follow(self, pin: tuple[int, ...] | None) -> None:
        """Move this thread onto ``pin`` (an instance's), or back onto :attr:`free` for
        ``None``; no system call when it is there already."""
        if pin != self.cpus:
            target = pin if pin is not None else self.free
            if target is not None:
                pin_thread(target)
        self.cpus = pin  # the same object next time: run() compares by identity first

    def unpin(self) -> None:
        """Back onto :attr:`free` if ``run()`` moved it: before it starts threads (a load's
        engine and worker threads), which would inherit its affinity; the next ``run()``
        moves it again."""
        if self.cpus is not None:
            self.follow(None)


CALLER = Caller()
"""The calling thread's state; ``run()`` reads ``CALLER.moves`` once a thread is marked."""

marked = False
"""Whether any thread of this process was ever marked (:func:`own_thread`): until then
``run()`` reads this module attribute, not the thread-local state (about 1 % of a tiny
model's in-process ``run()``, measured with ``benchmarks/overhead.py --against``)."""


def own_thread(cpus: tuple[int, ...] | None = None) -> None:
    """Mark the calling thread as crossrt's: from now on each ``run()`` on it computes on the
    CPUs of the instance it takes (a ``ThreadPoolExecutor`` initializer of the daemon's
    threads). ``cpus``: first put it on these (a Ray replica's cores), where it goes back for
    an instance that is not pinned. Once per thread: a marked thread is left as it is."""
    global marked
    if not CALLER.moves:
        if cpus:
            pin_thread(cpus)
        CALLER.free, CALLER.cpus, CALLER.moves = _affinity(), None, True
        marked = True


@contextlib.contextmanager
def pinned_runs() -> Iterator[None]:
    """Within it, ``run()`` on this thread computes on the CPUs of the instance it takes,
    as crossrt's own threads do; on leaving, the thread's affinity is what it was.

    A user's thread is not moved otherwise (see the module's docstring). Use it for a thread
    that calls ``run()`` many times, on a model loaded with several instances on part of the
    runtime's cores (``cores_per_instance``); nested, or on a thread crossrt owns, it changes
    nothing.

    Example::

        from crossrt.runtime.cores.pinning import pinned_runs

        with pinned_runs():
            for batch in batches:
                model.run(batch)
    """
    if CALLER.moves:
        yield
        return
    own_thread()
    try:
        yield
    finally:
        moved, free = CALLER.cpus is not None, CALLER.free
        CALLER.moves, CALLER.cpus, CALLER.free = False, None, None
        if moved and free is not None:
            pin_thread(free)
