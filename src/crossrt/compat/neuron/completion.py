"""What the legacy async mode keeps: output completion counters, executions in flight, the
tensors they use and the status callback.

With ``NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`` > 0 ``nrt_execute`` queues its run with
:meth:`LoadedModel.run_async` and returns. Each finished run adds one to the completion
counter of every tensor of its output set (``nrt_tensor_check_output_completion`` waits on
them) and calls the registered callback. Until a run is over, reading or writing a tensor of
its sets waits, as libnrt's "tensor read/write operations automatically block while tensors
are in use by pending executions".
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ExecutionError, StatusCode
from ...memory import Tensor, TensorSet
from .profiling import execution_failed
from .state import nrt_model_t
from .status import NRT_STATUS, NrtError, status_of

log = logging.getLogger("crossrt.compat.neuron")

NRT_ASYNC_EXEC_STATUS_CALLBACK = Callable[[Any, int, int, int, NRT_STATUS], None]
"""``callback(params, model_id, vnc, job_id, status)``: called when a queued execution ends."""

WARN_AFTER_S = 30.0
"""An unbounded wait for an output warns once after this many seconds, as libnrt does."""

_cond = threading.Condition()
_counts: weakref.WeakKeyDictionary[Tensor, int] = weakref.WeakKeyDictionary()
_busy: weakref.WeakKeyDictionary[Tensor, int] = weakref.WeakKeyDictionary()
_jobs: set[_Job] = set()
_job_ids: dict[int, itertools.count[int]] = {}
_callback: tuple[NRT_ASYNC_EXEC_STATUS_CALLBACK, Any] | None = None


@dataclass(eq=False)
class _Job:
    """One queued execution: its model, number and the tensors it uses."""

    model: nrt_model_t
    job_id: int
    tensors: list[Tensor]


def _default_callback(params: Any, model_id: int, vnc: int, job_id: int, status: Any) -> None:
    """The callback in place when none is registered: failures are logged, as libnrt's."""
    if status != NRT_STATUS.NRT_SUCCESS:
        log.error(
            "async execution %d of model %d on NeuronCore %d ended with %s; register a "
            "callback with nrt_register_async_exec_callback to handle it",
            job_id, model_id, vnc, NRT_STATUS(status).name,
        )  # fmt: skip


def set_callback(callback: NRT_ASYNC_EXEC_STATUS_CALLBACK | None, params: Any) -> None:
    """Replace the status callback (``None``: the default one, which logs failures)."""
    global _callback
    with _cond:
        _callback = None if callback is None else (callback, params)


def _tensors(*sets: Any) -> list[Tensor]:
    return [t for s in sets if isinstance(s, Mapping) for t in s.values() if isinstance(t, Tensor)]


def submit(model: nrt_model_t, inputs: TensorSet, outputs: TensorSet) -> None:
    """Queue one execution of ``model`` (``nrt_execute`` in the legacy async mode). Waits
    for room when the model has ``NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`` in flight (its
    queue depth); a bad input is refused here, in the caller's thread."""
    tensors = _tensors(inputs, outputs)
    with _cond:
        ids = _job_ids.setdefault(model.start_nc, itertools.count(1))
        job = _Job(model, next(ids), tensors)
        _jobs.add(job)
        for tensor in tensors:
            _busy[tensor] = _busy.get(tensor, 0) + 1
    try:
        model.model.run_async(inputs, outputs, callback=_finished, user_data=(job, outputs))
    except BaseException:
        _release(job)
        _forget_job(job)
        raise


def _release(job: _Job, outputs: Any = None) -> None:
    """The run is over: its outputs count one more, its tensors are free again."""
    with _cond:
        for tensor in _tensors(outputs):
            _counts[tensor] = _counts.get(tensor, 0) + 1
        for tensor in job.tensors:
            left = _busy.get(tensor, 1) - 1
            if left:
                _busy[tensor] = left
            else:
                _busy.pop(tensor, None)
        _cond.notify_all()


def _forget_job(job: _Job) -> None:
    with _cond:
        _jobs.discard(job)
        _cond.notify_all()


def _finished(outcome: Any, user_data: tuple[_Job, TensorSet]) -> None:
    """A queued execution ended (in the model's worker): count it, tell the callback; it is
    drained once the callback returned."""
    job, outputs = user_data
    status = NRT_STATUS.NRT_SUCCESS
    if isinstance(outcome, BaseException):
        numerical = isinstance(outcome, ExecutionError) and (
            outcome.code is StatusCode.EXEC_COMPLETED_WITH_NUM_ERR
        )
        status = NRT_STATUS.NRT_EXEC_COMPLETED_WITH_NUM_ERR if numerical else status_of(outcome)
        execution_failed(job.model, f"async execution {job.job_id}", status)
    # A failed run counts too: its status goes to the callback, and a caller waiting for
    # the count without a timeout would otherwise wait forever.
    _release(job, outputs)
    with _cond:
        callback, params = _callback or (_default_callback, None)
    try:
        callback(params, job.model.model_id, job.model.start_nc, job.job_id, status)
    except Exception:
        log.exception("the async execution callback raised; it must return without raising")
    finally:
        _forget_job(job)


def count(tensor: Tensor) -> int:
    """How many executions have written ``tensor`` since its counter was last reset."""
    with _cond:
        return _counts.get(tensor, 0)


def written(outputs: Any) -> None:
    """A synchronous execution wrote ``outputs``: count it on each of their tensors."""
    with _cond:
        for tensor in _tensors(outputs):
            _counts[tensor] = _counts.get(tensor, 0) + 1
        _cond.notify_all()


def reset(tensor: Tensor) -> None:
    """Set ``tensor``'s completion counter to 0."""
    with _cond:
        _counts.pop(tensor, None)


def wait_count(tensor: Tensor, timeout_us: int, expected: int) -> None:
    """Wait until ``tensor`` has been written ``expected`` times: NRT_TIMEOUT after
    ``timeout_us`` microseconds; a negative timeout waits for good, warning once after
    :data:`WARN_AFTER_S`."""
    started = time.monotonic()
    deadline = None if timeout_us < 0 else started + timeout_us / 1e6
    warned = False
    with _cond:
        while _counts.get(tensor, 0) < expected:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise NrtError(
                    NRT_STATUS.NRT_TIMEOUT,
                    f"tensor {tensor.name!r} was written {_counts.get(tensor, 0)} of "
                    f"{expected} times within {timeout_us} us; wait longer, or check the "
                    "executions' statuses (nrt_register_async_exec_callback)",
                )
            if deadline is None and not warned and now - started >= WARN_AFTER_S:
                log.warning(
                    "nrt_tensor_check_output_completion: still waiting for tensor %r after "
                    "%.0f s (%d of %d completions)",
                    tensor.name, now - started, _counts.get(tensor, 0), expected,
                )  # fmt: skip
                warned = True
            until = deadline if deadline is not None or warned else started + WARN_AFTER_S
            _cond.wait(None if until is None else max(0.0, until - now))


def settle(*items: Any) -> None:
    """Wait until no queued execution uses any of ``items`` (tensors, or tensor sets: all of
    their tensors), before reading or writing them."""
    tensors = [t for x in items for t in ([x] if isinstance(x, Tensor) else _tensors(x))]
    with _cond:
        _cond.wait_for(lambda: not any(_busy.get(t) for t in tensors))


def drain(covers: Callable[[nrt_model_t], bool]) -> None:
    """Wait until no execution of a model ``covers`` accepts is queued or running."""
    with _cond:
        _cond.wait_for(lambda: not any(covers(job.model) for job in _jobs))


def forget() -> None:
    """At ``nrt_close``: the callback back to the default one, job numbers from 1 again."""
    set_callback(None, None)
    with _cond:
        _job_ids.clear()
