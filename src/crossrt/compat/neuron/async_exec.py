"""The legacy async execution mode of ``nrt.h`` / ``nrt_experimental.h``: output completion
counters, the status callback and the drain.

``NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`` > 0 at ``nrt_init`` makes ``nrt_execute``
queue its run on :meth:`crossrt.LoadedModel.run_async` and return; ``completion.py`` keeps
the counters, the runs in flight and the tensors they use. The counters count synchronous
executions too, so a program may wait on them in either mode.
"""

from __future__ import annotations

from typing import Any

from ...memory import Tensor
from . import completion
from .completion import NRT_ASYNC_EXEC_STATUS_CALLBACK
from .state import _state, nrt_model_t
from .status import NRT_STATUS, NrtError, guarded

__all__ = [
    "NRT_ASYNC_EXEC_STATUS_CALLBACK",
    "nrt_async_drain_queued_execs",
    "nrt_register_async_exec_callback",
    "nrt_tensor_check_output_completion",
    "nrt_tensor_reset_output_completion",
]


def _output(tensor: Any) -> Tensor:
    # NULL is NRT_INVALID here, not NRT_INVALID_HANDLE: the seed documents these two so.
    if not isinstance(tensor, Tensor):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{tensor!r} is not an nrt_tensor_t")
    return tensor


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give a whole number")
    return value


@guarded()
def nrt_tensor_check_output_completion(
    output_tensor: Tensor, timeout: int, expected_completion_count: int
) -> NRT_STATUS:
    """Wait until executions have written ``output_tensor`` ``expected_completion_count``
    times (counted since its last reset), for at most ``timeout`` microseconds: NRT_TIMEOUT
    past it. A negative timeout waits as long as it takes, with a warning after 30 s.
    Callable at any time, as in libnrt (no nrt_init needed)."""
    tensor = _output(output_tensor)
    wanted = _whole(expected_completion_count, "expected_completion_count")
    completion.wait_count(tensor, _whole(timeout, "timeout"), wanted)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_tensor_reset_output_completion(output_tensor: Tensor) -> NRT_STATUS:
    """Set ``output_tensor``'s completion counter back to 0."""
    completion.reset(_output(output_tensor))
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_register_async_exec_callback(
    callback: NRT_ASYNC_EXEC_STATUS_CALLBACK | None, params: Any = None
) -> NRT_STATUS:
    """Call ``callback(params, model_id, vnc, job_id, status)`` when each queued execution
    ends, in the thread that ran it (keep it short; it must not wait for another queued
    execution). ``model_id`` is the model's :attr:`nrt_model_t.model_id`, ``vnc`` its first
    core, ``job_id`` the execution's number on that core (1, 2, ... in submission order).
    Registering again replaces the callback; ``None`` puts back the default one, which logs
    failures. ``nrt_close`` puts it back too."""
    _state.require()
    if callback is not None and not callable(callback):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"callback {callback!r} is not callable")
    completion.set_callback(callback, params)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_async_drain_queued_execs(vnc: int) -> NRT_STATUS:
    """Wait until no execution of a model on NeuronCore ``vnc`` is queued or running."""
    _state.require_nc(vnc)

    def covers(model: nrt_model_t) -> bool:
        return model.start_nc <= vnc < model.start_nc + model.nc_count

    completion.drain(covers)
    return NRT_STATUS.NRT_SUCCESS


_state.on_close.append(completion.forget)
