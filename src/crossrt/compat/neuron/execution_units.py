"""The execution units of ``nrt_async.h``: their queues, sequence ids and error trackers.

Each NeuronCore has execution units (XUs), each with queues (:data:`NRTA_QUEUES`). A queue is
a thread that runs its requests one at a time, in the order they were scheduled; different
queues overlap. A request scheduled gets a sequence id, ``nrta_seq_t``: the XU id (type in
bits 0-3, queue in 4-7, NeuronCore in 8-15) in the top 16 bits, the queue's request number
(1, 2, ...) in the low 48. ``nrta.py`` is the API over them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .state import _state
from .status import NRT_STATUS, NrtError, status_of

log = logging.getLogger("crossrt.compat.neuron")


class nrta_xu_t(IntEnum):
    """The execution units of a NeuronCore."""

    NRTA_XU_TENSOR_READ = 0
    NRTA_XU_TENSOR_WRITE = 1
    NRTA_XU_TENSOR_OP = 2
    NRTA_XU_COMPUTE = 3
    NRTA_XU_COLLECTIVES = 4
    NRTA_XU_TYPE_NUM = 5


NRTA_XU_TENSOR_READ = nrta_xu_t.NRTA_XU_TENSOR_READ
NRTA_XU_TENSOR_WRITE = nrta_xu_t.NRTA_XU_TENSOR_WRITE
NRTA_XU_TENSOR_OP = nrta_xu_t.NRTA_XU_TENSOR_OP
NRTA_XU_COMPUTE = nrta_xu_t.NRTA_XU_COMPUTE
NRTA_XU_COLLECTIVES = nrta_xu_t.NRTA_XU_COLLECTIVES
NRTA_XU_TYPE_NUM = nrta_xu_t.NRTA_XU_TYPE_NUM

NRTA_SEQ_NUM_MAX = (1 << 48) - 1
NRTA_SEQ_NUM_MASK = NRTA_SEQ_NUM_MAX

NRTA_QUEUES = {
    nrta_xu_t.NRTA_XU_TENSOR_READ: 2,
    nrta_xu_t.NRTA_XU_TENSOR_WRITE: 2,
    nrta_xu_t.NRTA_XU_TENSOR_OP: 2,
    nrta_xu_t.NRTA_XU_COMPUTE: 1,
    nrta_xu_t.NRTA_XU_COLLECTIVES: 3,
}
"""Queues per XU of each NeuronCore (the seed's docs: one for compute, three for
collectives, two for tensor operations)."""

NRTA_QUEUE_DEPTH = 64
"""Requests a queue holds, running or waiting, before it answers NRT_QUEUE_FULL."""


def NRTA_SEQ_GET_SEQ_NUM(seq_id: int) -> int:
    """The request number of a sequence id (its low 48 bits)."""
    return seq_id & NRTA_SEQ_NUM_MASK


def NRTA_SEQ_GET_XU_ID(seq_id: int) -> int:
    """The XU id of a sequence id (its top 16 bits)."""
    return seq_id >> 48


@dataclass(frozen=True)
class nrta_error_t:
    """A failed request: its sequence id and its NRT_STATUS."""

    seq_id: int
    error_code: int


class nrta_error_tracker_t:
    """Where the failures of the requests scheduled with it are kept, for one NeuronCore."""

    def __init__(self, lnc: int) -> None:
        self.lnc = lnc
        self.destroyed = False
        self._lock = threading.Lock()
        self._errors: list[nrta_error_t] = []

    def add(self, seq_id: int, status: NRT_STATUS) -> None:
        """Keep a failure (dropped once the tracker is destroyed)."""
        with self._lock:
            if not self.destroyed:
                self._errors.append(nrta_error_t(seq_id, int(status)))

    def take(self) -> list[nrta_error_t]:
        """The failures kept since the last call."""
        with self._lock:
            errors, self._errors = self._errors, []
        return errors


@dataclass(eq=False)
class Request:
    """A request on a queue: what to run, where its failure goes, its sequence id."""

    what: str
    run: Callable[[], NRT_STATUS]
    tracker: nrta_error_tracker_t | None
    seq_id: int = 0


class Queue:
    """One queue of one XU: a thread running its requests in order."""

    def __init__(self, xu_id: int) -> None:
        self.xu_id = xu_id
        self.cond = threading.Condition()
        self.requests: deque[Request] = deque()
        self.scheduled = 0  # the last request number handed out
        self.completed = 0  # the last request number completed
        self.waiters: dict[int, list[int]] = {}  # request number -> eventfds to signal
        self.listener: int | None = None  # an eventfd signalled at every completion
        self.closing = False
        self.thread: threading.Thread | None = None

    def schedule(self, request: Request) -> int:
        with self.cond:
            if self.closing:
                raise NrtError(NRT_STATUS.NRT_CLOSED, "the runtime is closing")
            if self.scheduled - self.completed >= NRTA_QUEUE_DEPTH:
                raise NrtError(
                    NRT_STATUS.NRT_QUEUE_FULL,
                    f"queue {unit_name(self.xu_id)} holds {NRTA_QUEUE_DEPTH} requests; wait "
                    "for one to complete (nrta_get_completion_handle) and schedule again",
                )
            self.scheduled += 1
            request.seq_id = self.xu_id << 48 | self.scheduled
            self.requests.append(request)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._work, name=f"nrta {unit_name(self.xu_id)}", daemon=True
                )
                self.thread.start()
            self.cond.notify_all()
        return request.seq_id

    def _work(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.requests or self.closing)
                if not self.requests:
                    return
                request = self.requests.popleft()
            status = self._run(request)
            if status is not NRT_STATUS.NRT_SUCCESS and request.tracker is not None:
                request.tracker.add(request.seq_id, status)
            with self.cond:
                self.completed = NRTA_SEQ_GET_SEQ_NUM(request.seq_id)
                due = [n for n in self.waiters if n <= self.completed]
                fds = [fd for n in due for fd in self.waiters.pop(n)]
                listener = self.listener
                if listener is not None:
                    signal(listener)
                self.cond.notify_all()
            for fd in fds:
                signal(fd)
                os.close(fd)

    def _run(self, request: Request) -> NRT_STATUS:
        seq = NRTA_SEQ_GET_SEQ_NUM(request.seq_id)
        with _state.lock:  # nrt_close holds it while it unloads: no request starts then
            open_ = _state.runtime is not None and not self.closing
        try:
            if not open_:
                raise NrtError(NRT_STATUS.NRT_CLOSED, "nrt_close() was called before it ran")
            return request.run()
        except Exception as exc:
            status = status_of(exc)
            log.error("%s (request %d on %s): %s (%s)", request.what, seq,
                      unit_name(self.xu_id), exc, status.name)  # fmt: skip
            return status

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            thread = self.thread
        if thread is not None:
            thread.join()
        with self.cond:
            for fds in self.waiters.values():
                for fd in fds:
                    os.close(fd)
            self.waiters.clear()
            if self.listener is not None:
                os.close(self.listener)
                self.listener = None


def signal(fd: int) -> None:
    """Add 1 to the eventfd ``fd``."""
    try:
        os.eventfd_write(fd, 1)
    except OSError as exc:  # not an eventfd after all, or full: the waiter's loss only
        log.error("nrta: could not signal completion on fd %d: %s", fd, exc)


def unit_name(xu_id: int) -> str:
    """``xu_id`` in words, for messages."""
    xu, queue, nc = xu_id & 0xF, xu_id >> 4 & 0xF, xu_id >> 8
    kind = nrta_xu_t(xu).name.removeprefix("NRTA_XU_") if xu < NRTA_XU_TYPE_NUM else str(xu)
    return f"NeuronCore {nc} {kind} queue {queue}"


_lock = threading.Lock()
_queues: dict[int, Queue] = {}


def xu_id(lnc: Any, xu: Any, queue: Any) -> int:
    """The XU id of ``queue`` of unit ``xu`` of NeuronCore ``lnc``, each checked."""
    nc = _state.require_nc(lnc, "lnc")
    if isinstance(xu, bool) or xu not in NRTA_QUEUES:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"xu {xu!r} is not an nrta_xu_t")
    unit = nrta_xu_t(xu)
    if isinstance(queue, bool) or not isinstance(queue, int) or not 0 <= queue < NRTA_QUEUES[unit]:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"queue {queue!r}: {unit.name} has queues 0..{NRTA_QUEUES[unit] - 1}",
        )
    return int(unit) | queue << 4 | nc << 8


def _queue(xu_id: int) -> Queue:
    with _lock:
        return _queues.setdefault(xu_id, Queue(xu_id))


def queue_of(xu_id: int) -> Queue:
    """The queue of ``xu_id``, made on first use."""
    with _lock:
        return _queues.setdefault(xu_id, Queue(xu_id))


def find(xu_id: int) -> Queue | None:
    """The queue of ``xu_id`` if a request was ever scheduled on it."""
    with _lock:
        return _queues.get(xu_id)


def when_done(queue: Queue, number: int, fd: int) -> None:
    """Signal ``fd`` once request ``number`` completes. A copy of it is signalled, then
    closed: the caller may close theirs first without another file taking its number."""
    mine = os.dup(fd)
    with queue.cond:
        if number > queue.completed:
            queue.waiters.setdefault(number, []).append(mine)
            return
    signal(mine)
    os.close(mine)


def close_all() -> None:
    """At nrt_close: requests waiting fail with NRT_CLOSED, the running ones finish."""
    with _lock:
        queues = list(_queues.values())
        _queues.clear()
    for queue in queues:
        queue.close()
