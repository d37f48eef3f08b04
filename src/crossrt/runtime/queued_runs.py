"""Queued runs of a loaded model: ``run_async``, ``await infer`` and a ``run()`` that waits
in the queue, each a :class:`~crossrt.runtime.queued.QueuedRequest` handed to the model's
scheduler (``scheduler.py``), whose workers run it on the same instances and calls as
``run()`` (``workers.py``, ``calls.py``).

``QueuedRuns`` is a base class of ``Running`` (running.py): the model's state it reads (the
scheduler, the input checks, the statistics, why it refuses) is set up there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from functools import partial
from time import perf_counter_ns
from typing import Any

from ..drivers.base import CancelToken
from .inputs import InputChecker
from .scheduler import Scheduler
from .statistics import Statistics

log = logging.getLogger("crossrt")


class QueuedRuns:
    """The queued ways to run a model (see the module docstring)."""

    _scheduler: Scheduler
    _checker: InputChecker
    _statistics: Statistics
    _refusal: tuple[type[Exception], str] | None
    _released: tuple[type[Exception], str] | None

    def _queued(
        self,
        feed: dict[str, Any],
        outputs: Any,
        arrived: int,
        checked: int,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        names: tuple[str, ...] | None = None,
    ) -> Any:
        """``run()`` when every instance is busy: in the queue, waiting for its result (the
        outputs ``names`` of it, when given). An unload or a close fails it at once with the
        model's reason unless it is running."""
        self._statistics.handed_on()  # counted again by the queue, with its outcome
        future = self._scheduler.submit(
            feed,
            outputs,
            block=True,
            timeout=None,
            deadline=deadline,
            arrived=arrived,
            checked=checked,
            cancel=cancel,
        )
        try:
            result = future.result()
        except Exception as exc:
            released = self._released
            if released is not None and not isinstance(exc, released[0]):
                raise released[0](released[1]) from None  # it ran as the model closed
            raise
        return result if names is None else {n: result[n] for n in names}

    def run_async(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
        deadline: float | None = None,
        callback: Callable[[Any, Any], None] | None = None,
        user_data: Any = None,
    ) -> Future[Any]:
        """Queue one run; return a :class:`concurrent.futures.Future` of its result.

        Inputs are checked now, in the caller's thread; the run happens on a worker thread
        of an instance (for a multi-node executable, one stage thread per node: several
        requests are in flight at once, each on a different node). Keep the input arrays
        unchanged until the future is done: they are not copied. When the queue is full
        (``queue_depth`` requests waiting or running), the call waits for room in this
        thread: backpressure, as OpenVINO's ``AsyncInferQueue.start_async``. From asyncio,
        ``await`` :meth:`infer` instead, which waits without blocking the event loop.

        Args:
            inputs: as for :meth:`run`.
            outputs: as for :meth:`run`.
            block: when the queue is full, wait for room (default); ``False``: raise
                QUEUE_FULL at once instead.
            timeout: the most seconds to wait for room (``None``: no limit), then
                QUEUE_FULL.
            deadline: a ``time.monotonic()`` time: a request still queued then is not run,
                and one still running is stopped where the engine can; either way its
                future raises TIMEOUT.
            callback: called as ``callback(result_or_error, user_data)`` when it completes
                (``OH_NNExecutor_SetOnRunDone``), in the worker thread (or here, when it
                completed already); an exception it raises is logged.
            user_data: passed to ``callback`` as it is.

        Returns:
            A future; ``cancel()`` succeeds while the request is still queued, and a
            cancelled request never runs.

        Raises:
            OutOfResourcesError: (QUEUE_FULL) the queue is full and ``block`` is false, or
                there was no room within ``timeout``.
            InvalidInputError: as for :meth:`run`.
            OperationForbiddenError: the model is stopped.
        """
        arrived = perf_counter_ns()
        feed = self._admitted_feed(inputs)
        on_done = None if callback is None else partial(_call_back, callback, user_data)
        return self._scheduler.submit(
            feed,
            outputs,
            block=block,
            timeout=timeout,
            deadline=deadline,
            on_done=on_done,
            arrived=arrived,
            checked=perf_counter_ns(),
        )

    def _admitted_feed(self, inputs: Any) -> dict[str, Any]:
        """The checked inputs of a request for the queue; a refused one is counted failed."""
        try:
            if self._refusal is not None:
                raise self._refusal[0](self._refusal[1])
            return self._checker.checked_feed(inputs)
        except BaseException as exc:
            self._statistics.arrived()
            self._statistics.failed(exc)
            raise

    async def infer(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> Any:
        """``await model.infer(inputs)``: :meth:`run_async` for asyncio.

        When the queue is full the request waits in line for room, first come first
        admitted, and ``asyncio.gather`` of more requests than ``queue_depth`` runs them
        all. No thread waits per request, for room or for the result, and the event loop
        never blocks: a slot that frees admits the next request in line, and the worker
        resolves the awaiting task through the loop (``call_soon_threadsafe``). Cancelling
        the task cancels a request still waiting or queued.

        Args and errors are :meth:`run_async`'s, the wait for room happening in the event
        loop instead of the caller's thread.
        """
        arrived = perf_counter_ns()
        feed = self._admitted_feed(inputs)
        future = self._scheduler.submit(
            feed,
            outputs,
            block=block,
            timeout=timeout,
            deadline=deadline,
            detached=True,
            arrived=arrived,
            checked=perf_counter_ns(),
        )
        return await asyncio.wrap_future(future)


def _call_back(callback: Callable[[Any, Any], None], user_data: Any, future: Future[Any]) -> None:
    if future.cancelled():
        outcome: Any = CancelledError()
    else:
        outcome = future.exception() or future.result()
    try:
        callback(outcome, user_data)
    except Exception:
        log.exception("crossrt: a run_async callback raised")
