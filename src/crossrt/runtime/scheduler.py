"""The bounded request queue of one loaded model: a queued request's life, from admission
to completion (its workers run it: ``workers.py``; the request itself: ``queued.py``).

- An **instance** is one copy of the model's programs on its own cores. It takes one request
  at a time; for a multi-node executable, one request per node at a time (each node has a
  lock, taken hand over hand, so requests pass through the nodes in a pipeline).
- ``run()`` pops an idle instance without blocking and runs in the caller's thread; with
  none idle it waits in line for one (``line.py``: the workers' line too, first come first
  served), or, with a deadline, a cancel token or batching, queues like ``run_async`` and
  waits.
- ``run_async`` admits at most ``depth`` requests not yet finished (waiting or running);
  past that a request waits in line for room, or gets ``QUEUE_FULL`` when its caller asks
  not to wait (``admission.py``). There is one worker thread per instance, each taking a
  request, then an idle instance (the request is queued, and can still be cancelled or
  expire, until it has one); for a multi-node executable, each instance has one stage
  thread per node with a queue between stages (``workers.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Any

from ..drivers.base import CancelToken
from ..errors import (
    ClosedError,
    CrossrtError,
    OutOfResourcesError,
    StatusCode,
)
from . import watchdog, workers
from .admission import Admission
from .batching import Batching, batch_key
from .instance import Instance as Instance  # where loading.py and runtime.py find it
from .line import InstanceLine
from .queued import STOP, QueuedRequest, late
from .statistics import Statistics

log = logging.getLogger("crossrt")

Finish = Callable[[Callable[..., dict[str, Any]], dict[str, Any], Any], Any]
"""``finish(execute, feed, outputs)``: binds outputs, runs ``execute``, checks the results."""


class Scheduler:
    """The queue and workers of one loaded model (see the module docstring)."""

    def __init__(
        self,
        name: str,
        instances: Sequence[Instance],
        finish: Finish,
        depth: int,
        exec_timeout: float | None,
        statistics: Statistics | None = None,
        batching: Batching | None = None,
    ) -> None:
        self.name = name
        self.batching = batching
        self.statistics = statistics or Statistics(len(instances))
        self.instances = tuple(instances)
        self.depth = depth
        self.exec_timeout = exec_timeout
        # Weak: the worker threads must not keep the model (and through it its runtime and
        # reserved cores) alive once its user lets go of it; a finalizer then stops them.
        self._finish = weakref.WeakMethod(finish)
        self.entry: queue.SimpleQueue[QueuedRequest | None] = queue.SimpleQueue()
        self._admission = Admission(depth, self._enqueue)
        self._slots = threading.Lock()  # who gives a job's slot back: see _give_slot_back
        # Each queued job by its future, until the future resolves: a callback holding the
        # job would make a cycle (future -> callback -> job -> future) that only the cyclic
        # garbage collector frees, with the job's inputs and outputs, long after the caller
        # dropped the future (a daemon kept 16-32 MiB of posted requests a round this way).
        self._settling: dict[Future[Any], QueuedRequest] = {}
        self._closed = False
        # What a request that will not run now fails with: the model's reason for closing.
        self._closing: Callable[[], BaseException] = self._closed_error
        # The workers and run() callers take instances from one line (line.py).
        self.line = InstanceLine(self.instances)
        self.give_back = self.line.give_back
        self.take_in_turn = self.line.take_in_turn
        self._threads: list[threading.Thread] = []
        for inst in self.instances:
            nodes = len(inst.programs) if inst.pipelined else 1  # 1: a worker walks them all
            stages: list[queue.SimpleQueue[QueuedRequest | None]] = [self.entry]
            stages += [queue.SimpleQueue() for _ in range(nodes - 1)]
            for j in range(nodes):
                target = workers.serve if nodes == 1 else workers.stage
                args = (self,) if nodes == 1 else (self, inst, j, stages)
                thread = threading.Thread(
                    target=target, args=args, name=f"crossrt-{name}-{inst.index}.{j}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def closing_error(self) -> BaseException:
        """What a request that will not run fails with: the model's reason for closing."""
        return self._closing()

    # -- admission ------------------------------------------------------------------------

    def submit(
        self,
        feed: dict[str, Any],
        outputs: Any,
        *,
        block: bool,
        timeout: float | None,
        deadline: float | None,
        detached: bool = False,
        on_done: Callable[[Future[Any]], None] | None = None,
        arrived: int = 0,
        checked: int = 0,
        cancel: CancelToken | None = None,
    ) -> Future[Any]:
        """Queue one request; its future resolves with ``finish``'s result or error.

        Args:
            block: when the queue is full, wait in line for room; else raise QUEUE_FULL.
            timeout: with ``block``, the most seconds to wait for room (``None``: no limit),
                then QUEUE_FULL.
            detached: wait for room without holding the caller's thread: the future is
                returned at once and the request is admitted when a slot frees (a timeout
                then fails the future with QUEUE_FULL). For ``infer``, whose event loop
                must not block.
            on_done: added to the future before the request can run, so that it runs in
                the worker that resolves it.
            arrived: ``time.perf_counter_ns()`` when the request came in (default now).
            checked: the same when its inputs were checked (default ``arrived``).
            cancel: when it fires, the request is dropped if it waits and stopped where
                the engine can if it runs (``CancelledError``).
        """
        now = time.perf_counter_ns()
        job = QueuedRequest(Future(), feed, outputs, deadline)
        if self.batching is not None and outputs is None:
            job.batch = batch_key(feed)
        job.arrived = arrived or now
        job.checked = checked or job.arrived
        self.statistics.arrived()
        # Counted once, whatever resolves the future: a worker, a timeout while waiting for
        # room, the caller's cancel, the model's close.
        self._settling[job.future] = job
        job.future.add_done_callback(self._settled_future)
        if on_done is not None:
            job.future.add_done_callback(on_done)
        try:
            self._admission.enter(
                job,
                job.future,
                block=block,
                timeout=timeout,
                detached=detached,
                full=self._full,
                closed=self._closing,
            )
        except BaseException as exc:  # refused at the door: the future never resolves
            self._settling.pop(job.future, None)
            self.statistics.failed(exc)
            raise
        if deadline is not None:
            # A request still waiting at its deadline fails then, not when a worker gets to
            # it: its caller stops waiting on time (a worker skips it later).
            expiry = CancelToken()
            expiry.on_cancel(partial(self._expire, job))
            watchdog.watch(expiry, deadline)
        if cancel is not None:
            job.stoppable = True
            cancel.on_cancel(partial(self._abandon, job))
        return job.future

    def _abandon(self, job: QueuedRequest) -> None:
        """Its caller went away: drop ``job`` if it waits, stop it where the engine can if
        it runs."""
        if job.deadline is not None and time.monotonic() >= job.deadline:
            self._expire(job)  # its deadline passed: TIMEOUT (gRPC ends such a call too)
        job.abandoned = True
        if job.future.cancel():  # still waiting: no worker will run it
            return
        token = job.token
        if token is not None:
            token.cancel()

    def _expire(self, job: QueuedRequest) -> None:
        """Fail ``job`` with TIMEOUT if nothing has started or settled it yet."""
        if job.claim():  # else running (its own token stops it) or already settled
            job.future.set_exception(late(self.name, "its deadline passed while it was queued"))

    def _settled_future(self, future: Future[Any]) -> None:
        job = self._settling.pop(future, None)
        if job is not None:
            self._settled(job, future)

    def _settled(self, job: QueuedRequest, future: Future[Any]) -> None:
        if not job.started:
            # Resolved before it ran (its deadline, its caller gone, cancel(), a close): its
            # slot goes back now, not when a worker reaches it and skips it, so that a
            # request nobody waits for keeps no one out of the queue.
            self._give_slot_back(job)
        if future.cancelled():
            self.statistics.cancelled()
        elif (error := future.exception()) is not None:
            self.statistics.failed(error)
        else:
            self.statistics.succeeded(
                job.arrived,
                job.started - job.checked,
                job.checked - job.arrived,
                job.computed - job.started,
                job.instance,
            )

    @property
    def waiting_for_room(self) -> int:
        """How many requests wait in line for a queue slot."""
        return len(self._admission)

    def _full(self, waited: float | None) -> OutOfResourcesError:
        details = {"model": self.name, "queue_depth": self.depth}
        if waited is None:
            return OutOfResourcesError(
                f"model {self.name!r}: its queue of {self.depth} requests is full; retry "
                "later, let the call wait for room (block=True, the default), or load the "
                "model with a larger queue_depth or more instances",
                code=StatusCode.QUEUE_FULL,
                details=details,
            )
        return OutOfResourcesError(
            f"model {self.name!r}: no room in its queue of {self.depth} requests within "
            f"{waited} s; wait longer (timeout=), or load the model with a larger queue_depth "
            "or more instances",
            code=StatusCode.QUEUE_FULL,
            details={**details, "timeout": waited},
        )

    def _enqueue(self, job: QueuedRequest) -> None:
        """Hand an admitted request (it holds a slot) to the workers."""
        job.admitted = True
        if job.future.done():  # resolved as it was admitted: the slot is not its to keep
            self._give_slot_back(job)
        self.entry.put(job)
        if self._closed:  # closed while queueing: the workers may be gone
            self.fail(job, self._closing())

    def _give_slot_back(self, job: QueuedRequest) -> None:
        """Give ``job``'s queue slot back if it holds one, once whoever calls."""
        with self._slots:
            if not job.admitted or job.slot_back:
                return
            job.slot_back = True
        self._admission.release()

    def _closed_error(self) -> CrossrtError:
        return ClosedError(f"model {self.name!r} was unloaded before the request ran")

    def fail(self, job: QueuedRequest, error: BaseException) -> None:
        # Resolved meanwhile (by a worker, or cancelled): nothing left to report.
        if job.claim():
            job.future.set_exception(error)

    def start(self, job: QueuedRequest) -> bool:
        """Whether ``job`` may run: not cancelled, deadline not passed (else it is resolved)."""
        if not job.claim():  # cancelled, or failed meanwhile: the model closed as it waited
            self._give_slot_back(job)
            return False
        if job.deadline is not None and time.monotonic() >= job.deadline:
            self.done(job, error=late(self.name, "its deadline passed while it was queued"))
            return False
        limit = self.exec_timeout
        end = job.deadline
        if limit is not None:
            end = time.monotonic() + limit if end is None else min(end, time.monotonic() + limit)
        if end is not None or job.stoppable:
            job.token, job.end = CancelToken(), end
            if end is not None:
                watchdog.watch(job.token, end)
            if job.abandoned:  # abandoned as it started, before it had a token
                job.token.cancel()
        job.started = time.perf_counter_ns()
        return True

    def done(
        self, job: QueuedRequest, result: Any = None, error: BaseException | None = None
    ) -> None:
        if job.token is not None:
            expired = watchdog.finish(job.token)
            late_now = job.end is not None and time.monotonic() > job.end
            if job.abandoned and not late_now:
                error = CancelledError()  # its caller is gone; whatever it made is dropped
            elif error is None and (expired or late_now):
                error = late(self.name, "it ran past its deadline or execution timeout")
        self._give_slot_back(job)
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def call(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], outputs: Any
    ) -> Any:
        """``execute`` on ``feed`` through the model's ``finish`` (outputs bound, results
        checked); the model's reason when it is gone."""
        finish = self._finish()
        if finish is None:
            raise self._closing()
        return finish(execute, feed, outputs)

    def close(self, error: Callable[[], BaseException] | None = None, timeout: float = 5.0) -> None:
        """Stop the workers: every request not running yet fails with ``error()`` (default
        CLOSED): those waiting for room, those queued, and those whose worker waits for an
        instance; running ones finish.

        Args:
            error: what the requests that will not run fail with (the model says why it
                closed: unloaded, or its runtime closed).
            timeout: the most seconds to wait for each worker to stop.
        """
        if error is not None:
            self._closing = error
        self._closed = True
        self.line.close()  # those in line for an instance get none: they see the close
        self._admission.close(self._closing)
        pending: list[QueuedRequest] = []
        try:
            while True:
                job = self.entry.get_nowait()
                if job is not None:
                    pending.append(job)
        except queue.Empty:
            pass
        for job in pending:  # a job its deadline or its caller resolved already is skipped
            self.fail(job, self._closing())
        for _ in self.instances:
            self.entry.put(STOP)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:  # a completion callback may unload its own model
                thread.join(timeout)
            if thread.is_alive() and thread is not current:
                log.warning("crossrt: worker %s did not stop within %s s", thread.name, timeout)
