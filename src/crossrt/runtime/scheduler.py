"""Instances, the bounded request queue and the worker threads of one loaded model.

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
  thread per node with a queue between stages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..drivers.base import CancelToken
from ..errors import (
    ClosedError,
    CrossrtError,
    DeadlineExceededError,
    OutOfResourcesError,
    StatusCode,
)
from . import watchdog
from .admission import Admission
from .batching import Batching, batch_key, join, split
from .instance import Instance as Instance  # where loading.py and runtime.py find it
from .instance import assemble
from .line import InstanceLine
from .statistics import Statistics

log = logging.getLogger("crossrt")

Finish = Callable[[Callable[..., dict[str, Any]], dict[str, Any], Any], Any]
"""``finish(execute, feed, outputs)``: binds outputs, runs ``execute``, checks the results."""


@dataclass(eq=False)
class Job:
    """One queued request."""

    future: Future[Any]
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


_STOP = None


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
        self._entry: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._admission = Admission(depth, self._enqueue)
        self._slots = threading.Lock()  # who gives a job's slot back: see _give_slot_back
        # Each queued job by its future, until the future resolves: a callback holding the
        # job would make a cycle (future -> callback -> job -> future) that only the cyclic
        # garbage collector frees, with the job's inputs and outputs, long after the caller
        # dropped the future (a daemon kept 16-32 MiB of posted requests a round this way).
        self._settling: dict[Future[Any], Job] = {}
        self._closed = False
        # What a request that will not run now fails with: the model's reason for closing.
        self._closing: Callable[[], BaseException] = self._closed_error
        # The workers and run() callers take instances from one line (line.py).
        self.line = InstanceLine(self.instances)
        self.give_back = self.line.give_back
        self.take_in_turn = self.line.take_in_turn
        self._threads: list[threading.Thread] = []
        for inst in self.instances:
            nodes = len(inst.programs)
            stages: list[queue.SimpleQueue[Job | None]] = [self._entry]
            stages += [queue.SimpleQueue() for _ in range(nodes - 1)]
            for j in range(nodes):
                target = self._serve if nodes == 1 else self._stage
                args = () if nodes == 1 else (inst, j, stages)
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
        job = Job(Future(), feed, outputs, deadline)
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

    def _abandon(self, job: Job) -> None:
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

    def _expire(self, job: Job) -> None:
        """Fail ``job`` with TIMEOUT if nothing has started or settled it yet."""
        try:
            waiting = job.future.set_running_or_notify_cancel()
        except RuntimeError:  # running (its own token stops it) or already settled
            return
        if waiting:
            job.future.set_exception(late(self.name, "its deadline passed while it was queued"))

    def _settled_future(self, future: Future[Any]) -> None:
        job = self._settling.pop(future, None)
        if job is not None:
            self._settled(job, future)

    def _settled(self, job: Job, future: Future[Any]) -> None:
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

    def _enqueue(self, job: Job) -> None:
        """Hand an admitted request (it holds a slot) to the workers."""
        job.admitted = True
        if job.future.done():  # resolved as it was admitted: the slot is not its to keep
            self._give_slot_back(job)
        self._entry.put(job)
        if self._closed:  # closed while queueing: the workers may be gone
            self._fail(job, self._closing())

    def _give_slot_back(self, job: Job) -> None:
        """Give ``job``'s queue slot back if it holds one, once whoever calls."""
        with self._slots:
            if not job.admitted or job.slot_back:
                return
            job.slot_back = True
        self._admission.release()

    def _closed_error(self) -> CrossrtError:
        return ClosedError(f"model {self.name!r} was unloaded before the request ran")

    def _fail(self, job: Job, error: BaseException) -> None:
        # Resolved meanwhile (by a worker, or cancelled): nothing left to report.
        with contextlib.suppress(Exception):
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)

    def _start(self, job: Job) -> bool:
        """Whether ``job`` may run: not cancelled, deadline not passed (else it is resolved)."""
        try:
            runnable = job.future.set_running_or_notify_cancel()
        except RuntimeError:  # failed meanwhile: the model closed as it was queued
            runnable = False
        if not runnable:
            self._give_slot_back(job)
            return False
        if job.deadline is not None and time.monotonic() >= job.deadline:
            self._done(job, error=late(self.name, "its deadline passed while it was queued"))
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

    def _done(self, job: Job, result: Any = None, error: BaseException | None = None) -> None:
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

    # -- workers --------------------------------------------------------------------------

    def _serve(self) -> None:
        pinned: tuple[int, ...] | None = None
        carried: Job | None = None  # taken from the queue by a batch it could not join
        while True:
            job = carried if carried is not None else self._entry.get()
            carried = None
            if job is _STOP:
                return
            # The instance first: while this waits for one that run() callers hold, the
            # request is still queued, so its deadline, its caller going away or cancel()
            # resolve it at once rather than when an instance frees up.
            inst = self.take_in_turn()
            if inst is None:  # closed while it waited for an instance
                self._fail(job, self._closing())
                continue
            if not self._start(job):
                self.give_back(inst)
                continue
            if inst.pin is not None and inst.pin != pinned:  # it serves any idle instance
                pinned = _pin_thread(inst.pin)
            if job.batch is not None and job.batch[1] < self.batching.max_size:  # type: ignore[union-attr]
                jobs, carried = self._gather(job)
                if len(jobs) > 1:
                    self._run_batch(inst, jobs)
                    continue
            self._run(inst, job)

    def _run(self, inst: Instance, job: Job, keep: bool = False) -> None:
        """Run ``job`` on ``inst`` (held by this worker) and resolve it; the instance is
        given back first unless ``keep``."""
        try:
            execute = partial(_execute_with, inst, job.token)
            result = self._call(execute, job.feed, job.outputs)
        except BaseException as exc:  # the caller gets it through the future
            if not keep:
                self.give_back(inst)
            self._done(job, error=exc)
        else:
            job.computed, job.instance = time.perf_counter_ns(), inst.index
            if not keep:
                self.give_back(inst)
            self._done(job, result)

    def _gather(self, first: Job) -> tuple[list[Job], Job | None]:
        """``first`` and the queued requests that can join it, up to the batch's size, for
        at most the batching delay; and the request taken that could not join (or the
        stop), for this worker's next turn."""
        batching = self.batching
        assert batching is not None and first.batch is not None
        key, rows = first.batch
        jobs = [first]
        until = time.monotonic() + batching.delay
        while rows < batching.max_size:
            try:
                left = until - time.monotonic()
                job = self._entry.get(timeout=left) if left > 0 else self._entry.get_nowait()
            except queue.Empty:
                break
            if (
                job is _STOP
                or job.batch is None
                or job.batch[0] != key
                or rows + job.batch[1] > batching.max_size
            ):
                return jobs, job
            if self._start(job):  # else resolved meanwhile: skipped, its slot given back
                jobs.append(job)
                rows += job.batch[1]
        return jobs, None

    def _run_batch(self, inst: Instance, jobs: list[Job]) -> None:
        """Run ``jobs`` (started) as one batch on ``inst`` and resolve each with its rows.

        A request's own deadline or cancel does not stop the batch (the others want it):
        it is judged when the batch ends (``_done``). The execution timeout does."""
        token = None
        if self.exec_timeout is not None:
            token = CancelToken()
            watchdog.watch(token, time.monotonic() + self.exec_timeout)
        execute = partial(_execute_with, inst, token)
        try:
            result = self._call(execute, join([job.feed for job in jobs]), None)
        except BaseException as exc:
            self.give_back(inst)
            for job in jobs:
                self._done(job, error=exc)
            return
        finally:
            expired = token is not None and watchdog.finish(token)
        parts = split(result, [job.batch[1] for job in jobs])  # type: ignore[index]
        if parts is None:  # an output that does not follow the batch: each runs alone
            for job in jobs:
                self._run(inst, job, keep=True)
            self.give_back(inst)
            return
        computed = time.perf_counter_ns()
        self.give_back(inst)
        for i, (job, part) in enumerate(zip(jobs, parts, strict=True)):
            # The instance's run is counted once, with the first request: its busy time and
            # execution count are the batch's.
            job.computed, job.instance = computed, inst.index if i == 0 else -1
            if expired:
                self._done(job, error=late(self.name, "its batch ran past the execution timeout"))
            else:
                self._done(job, part)

    def _stage(self, inst: Instance, j: int, stages: list[queue.SimpleQueue[Job | None]]) -> None:
        if inst.pin is not None:
            _pin_thread(inst.pin)
        last = j == len(inst.programs) - 1
        while (job := stages[j].get()) is not _STOP:
            try:
                with inst.locks[j]:
                    if j == 0:  # started once the node is free: queued until then
                        if not self._start(job):
                            continue
                        job.values = dict(job.feed)
                    inst.step(j, job.values, job.token, id(job.future))
                if last:
                    execute = partial(_assemble_with, job.values, inst.output_names)
                    result = self._call(execute, job.feed, job.outputs)
            except BaseException as exc:
                self._done(job, error=exc)
                continue
            if last:
                job.computed, job.instance = time.perf_counter_ns(), inst.index
                self._done(job, result)
            else:
                stages[j + 1].put(job)
        if not last:
            stages[j + 1].put(_STOP)

    def _call(
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
        pending: list[Job] = []
        try:
            while True:
                job = self._entry.get_nowait()
                if job is not None:
                    pending.append(job)
        except queue.Empty:
            pass
        for job in pending:  # a job its deadline or its caller resolved already is skipped
            self._fail(job, self._closing())
        for _ in self.instances:
            self._entry.put(_STOP)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:  # a completion callback may unload its own model
                thread.join(timeout)
            if thread.is_alive() and thread is not current:
                log.warning("crossrt: worker %s did not stop within %s s", thread.name, timeout)


def _execute_with(
    inst: Instance, token: CancelToken | None, feed: dict[str, Any], outputs: Any = None
) -> dict[str, np.ndarray]:
    return inst.execute(feed, outputs, token)


def _assemble_with(
    values: dict[str, Any], names: Sequence[str], feed: dict[str, Any], outputs: Any = None
) -> dict[str, np.ndarray]:
    return assemble(values, names, outputs)


def late(name: str, why: str) -> DeadlineExceededError:
    """TIMEOUT for a request of model ``name``: ``why`` it did not finish in time."""
    return DeadlineExceededError(
        f"model {name!r}: request timed out, {why}; allow more time (deadline=, exec_timeout=, "
        "CROSSRT_EXEC_TIMEOUT) or load more instances",
        details={"model": name},
    )


def _pin_thread(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Pin the calling thread to ``cpus`` where the OS allows; return them."""
    setaffinity = getattr(os, "sched_setaffinity", None)
    if setaffinity is not None:  # not on Linux: threads stay where the OS puts them
        try:
            setaffinity(0, cpus)  # 0: this thread, on Linux
        except OSError as exc:  # a CPU taken away since (cgroup change): run unpinned
            log.debug("could not pin a worker to CPUs %s: %s", cpus, exc)
    return cpus
