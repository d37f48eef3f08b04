"""The worker threads of a loaded model's queue: a single-node model's workers take a
request, then an idle instance (joining queued requests into one batch where the model
batches); a multi-node model has one stage thread per node of each instance, requests
passing from stage to stage (a pipeline). The request's life (admission, start, completion)
is the scheduler's (``scheduler.py``); these run it."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from ..drivers.base import CancelToken
from . import watchdog
from .batching import Batching, join, split
from .cores.pinning import pin_thread
from .instance import Instance, assemble
from .line import InstanceLine
from .queued import STOP, QueuedRequest, late


class Workers(Protocol):
    """What the workers need of their scheduler."""

    name: str
    batching: Batching | None
    exec_timeout: float | None
    entry: queue.SimpleQueue[QueuedRequest | None]
    line: InstanceLine

    def start(self, job: QueuedRequest) -> bool: ...

    def done(
        self, job: QueuedRequest, result: Any = None, error: BaseException | None = None
    ) -> None: ...

    def fail(self, job: QueuedRequest, error: BaseException) -> None: ...

    def closing_error(self) -> BaseException: ...

    def call(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], outputs: Any
    ) -> Any: ...


def serve(scheduler: Workers) -> None:
    """One worker of a single-node model: a request, then an idle instance to run it on
    (joined with others into a batch where the model batches).

    Each request is served in a call of its own (:func:`_serve`), so that nothing of it is
    left in this loop while it waits for the next: a request holds its caller's inputs and
    outputs, which in the daemon are a client's shared memory, kept mapped as long as
    anything refers to them (a dead client's memfd stayed mapped until the next request)."""
    pinned: tuple[int, ...] | None = None
    carried: QueuedRequest | None = None  # taken from the queue by a batch it could not join
    while True:
        job = carried if carried is not None else scheduler.entry.get()
        if job is STOP:
            return
        pinned, carried = _serve(scheduler, job, pinned)
        del job


def _serve(
    scheduler: Workers, job: QueuedRequest, pinned: tuple[int, ...] | None
) -> tuple[tuple[int, ...] | None, QueuedRequest | None]:
    """Serve ``job`` (and the requests a batch gathers with it); the cores this thread is
    pinned to now, and the request taken that could not join the batch."""
    # The instance first: while this waits for one that run() callers hold, the
    # request is still queued, so its deadline, its caller going away or cancel()
    # resolve it at once rather than when an instance frees up.
    inst = scheduler.line.take_in_turn()
    if inst is None:  # closed while it waited for an instance
        scheduler.fail(job, scheduler.closing_error())
        return pinned, None
    if not scheduler.start(job):
        scheduler.line.give_back(inst)
        return pinned, None
    if inst.pin is not None and inst.pin != pinned:  # it serves any idle instance
        pinned = pin_thread(inst.pin)
    carried = None
    if job.batch is not None and job.batch[1] < scheduler.batching.max_size:  # type: ignore[union-attr]
        jobs, carried = gather(scheduler, job)
        if len(jobs) > 1:
            run_batch(scheduler, inst, jobs)
            return pinned, carried
    run_one(scheduler, inst, job)
    return pinned, carried


def _stage(
    scheduler: Workers,
    inst: Instance,
    j: int,
    job: QueuedRequest,
    following: queue.SimpleQueue[QueuedRequest | None] | None,
) -> None:
    """Walk node ``j`` of ``inst`` for ``job``, then hand it to the ``following`` stage, or
    (the last) resolve it."""
    try:
        with inst.locks[j]:
            if j == 0:  # started once the node is free: queued until then
                if not scheduler.start(job):
                    return
                job.values = dict(job.feed)
            inst.step(j, job.values, job.token, id(job.future))
        if following is None:
            execute = partial(_assemble_with, job.values, inst.output_names)
            result = scheduler.call(execute, job.feed, job.outputs)
    except BaseException as exc:
        scheduler.done(job, error=exc)
        return
    if following is None:
        job.computed, job.instance = time.perf_counter_ns(), inst.index
        scheduler.done(job, result)
    else:
        following.put(job)


def run_one(scheduler: Workers, inst: Instance, job: QueuedRequest, keep: bool = False) -> None:
    """Run ``job`` on ``inst`` (held by this worker) and resolve it; the instance is
    given back first unless ``keep``."""
    try:
        execute = partial(_execute_with, inst, job.token)
        result = scheduler.call(execute, job.feed, job.outputs)
    except BaseException as exc:  # the caller gets it through the future
        if not keep:
            scheduler.line.give_back(inst)
        scheduler.done(job, error=exc)
    else:
        job.computed, job.instance = time.perf_counter_ns(), inst.index
        if not keep:
            scheduler.line.give_back(inst)
        scheduler.done(job, result)


def gather(
    scheduler: Workers, first: QueuedRequest
) -> tuple[list[QueuedRequest], QueuedRequest | None]:
    """``first`` and the queued requests that can join it, up to the batch's size, for
    at most the batching delay; and the request taken that could not join (or the
    stop), for this worker's next turn."""
    batching = scheduler.batching
    assert batching is not None and first.batch is not None
    key, rows = first.batch
    jobs = [first]
    until = time.monotonic() + batching.delay
    while rows < batching.max_size:
        try:
            left = until - time.monotonic()
            job = scheduler.entry.get(timeout=left) if left > 0 else scheduler.entry.get_nowait()
        except queue.Empty:
            break
        if (
            job is STOP
            or job.batch is None
            or job.batch[0] != key
            or rows + job.batch[1] > batching.max_size
        ):
            return jobs, job
        if scheduler.start(job):  # else resolved meanwhile: skipped, its slot given back
            jobs.append(job)
            rows += job.batch[1]
    return jobs, None


def run_batch(scheduler: Workers, inst: Instance, jobs: list[QueuedRequest]) -> None:
    """Run ``jobs`` (started) as one batch on ``inst`` and resolve each with its rows.

    A request's own deadline or cancel does not stop the batch (the others want it):
    it is judged when the batch ends (``_done``). The execution timeout does."""
    token = None
    if scheduler.exec_timeout is not None:
        token = CancelToken()
        watchdog.watch(token, time.monotonic() + scheduler.exec_timeout)
    execute = partial(_execute_with, inst, token)
    try:
        result = scheduler.call(execute, join([job.feed for job in jobs]), None)
    except BaseException as exc:
        scheduler.line.give_back(inst)
        for job in jobs:
            scheduler.done(job, error=exc)
        return
    finally:
        expired = token is not None and watchdog.finish(token)
    parts = split(result, [job.batch[1] for job in jobs])  # type: ignore[index]
    if parts is None:  # an output that does not follow the batch: each runs alone
        for job in jobs:
            run_one(scheduler, inst, job, keep=True)
        scheduler.line.give_back(inst)
        return
    computed = time.perf_counter_ns()
    scheduler.line.give_back(inst)
    for i, (job, part) in enumerate(zip(jobs, parts, strict=True)):
        # The instance's run is counted once, with the first request: its busy time and
        # execution count are the batch's.
        job.computed, job.instance = computed, inst.index if i == 0 else -1
        if expired:
            why = "its batch ran past the execution timeout"
            scheduler.done(job, error=late(scheduler.name, why))
        else:
            scheduler.done(job, part)


def stage(
    scheduler: Workers,
    inst: Instance,
    j: int,
    stages: list[queue.SimpleQueue[QueuedRequest | None]],
) -> None:
    """The stage thread of node ``j`` of a multi-node instance: requests pass from stage to
    stage, each node walked by :meth:`Instance.step` under that node's lock."""
    if inst.pin is not None:
        pin_thread(inst.pin)
    last = j == len(inst.programs) - 1
    while True:
        job = stages[j].get()
        if job is STOP:
            break
        _stage(scheduler, inst, j, job, None if last else stages[j + 1])
        del job  # nothing of it kept while this waits for the next (see serve)
    if not last:
        stages[j + 1].put(STOP)


def _execute_with(
    inst: Instance, token: CancelToken | None, feed: dict[str, Any], outputs: Any = None
) -> dict[str, np.ndarray]:
    return inst.execute(feed, outputs, token)


def _assemble_with(
    values: dict[str, Any], names: Sequence[str], feed: dict[str, Any], outputs: Any = None
) -> dict[str, np.ndarray]:
    return assemble(values, names, outputs)
