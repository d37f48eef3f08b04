"""What ``LoadedModel`` offers beyond ``run()``: queued and asyncio runs, requests bound
once, repeats, instances, and start/stop on its core group (docs/concurrency.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import OperationForbiddenError
from .inputs import InputChecker
from .request import Request, repeat
from .scheduler import Instance, Scheduler

if TYPE_CHECKING:
    from .cores.groups import CoreGroup
    from .loaded import LoadedModel

log = logging.getLogger("crossrt")


class ConcurrentRuns:
    """The concurrency half of :class:`LoadedModel` (a mixin; see there)."""

    group: CoreGroup
    _checker: InputChecker
    _scheduler: Scheduler
    _instances: tuple[Instance, ...]
    _exec_timeout: float | None
    _lock: threading.Lock
    _released: tuple[type[Exception], str] | None
    _refusal: tuple[type[Exception], str] | None

    def _model(self) -> LoadedModel:
        return cast("LoadedModel", self)

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
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        feed = self._checker.check(inputs)
        on_done = None if callback is None else partial(_call_back, callback, user_data)
        return self._scheduler.submit(
            feed, outputs, block=block, timeout=timeout, deadline=deadline, on_done=on_done
        )

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
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        feed = self._checker.check(inputs)
        future = self._scheduler.submit(
            feed, outputs, block=block, timeout=timeout, deadline=deadline, detached=True
        )
        return await asyncio.wrap_future(future)

    def request(self, inputs: Any = None, outputs: Mapping[str, Any] | None = None) -> Request:
        """A :class:`Request` with its inputs (and outputs) bound once, to run many times
        (``OH_NNExecutor``, ``bmruntime::Network``)."""
        return Request(self._model(), inputs, outputs)

    def run_repeat(
        self, inputs: Any, n: int, feedback: Mapping[str, str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run ``n`` times, each run's outputs fed back as the next run's inputs
        (``nrt_execute_repeat``); returns the last run's outputs.

        Args:
            inputs: the first run's inputs, as for :meth:`run`.
            n: how many runs.
            feedback: ``{output name: input name}``; default: outputs whose name is an
                input's name.
        """
        return repeat(self._model(), inputs, n, feedback)

    @property
    def instance_count(self) -> int:
        """How many copies of the model run in parallel, each on its own cores."""
        return len(self._instances)

    @property
    def instance_cores(self) -> list[tuple[int, ...]]:
        """The core indices of each instance."""
        return [inst.cores for inst in self._instances]

    @property
    def queue_depth(self) -> int:
        """How many :meth:`run_async` requests may be waiting or running at once."""
        return self._scheduler.depth

    @property
    def exec_timeout(self) -> float | None:
        """Seconds one run may take before it is stopped with TIMEOUT (``None``: no limit)."""
        return self._exec_timeout

    @property
    def running(self) -> bool:
        """Whether the model is started on its core group (and loaded)."""
        return self._released is None and self.group.running is self

    def start(self) -> None:
        """Make the model the one running on its core group.

        Raises:
            OperationForbiddenError: another model of the group is running; stop it first.
            InvalidHandleError: the model was unloaded.
        """
        with self._lock:
            if self._released is not None:
                raise self._released[0](self._released[1])
            self.group._start(self._model())
            self._refusal = None

    def stop(self) -> None:
        """Stop running the model; it stays loaded and can be started again. ``run`` then
        raises OPERATION_FORBIDDEN. Requests already queued still run."""
        with self._lock:
            if self._released is not None:
                return
            self.group._stop(self._model())
            self._refusal = (
                OperationForbiddenError,
                f"model {self._model().name!r} is stopped on its core group "
                f"{list(self.group.indices)}; call model.start() (after stopping the group's "
                "running model) to run it",
            )


def _call_back(callback: Callable[[Any, Any], None], user_data: Any, future: Future[Any]) -> None:
    if future.cancelled():
        outcome: Any = CancelledError()
    else:
        outcome = future.exception() or future.result()
    try:
        callback(outcome, user_data)
    except Exception:
        log.exception("crossrt: a run_async callback raised")
