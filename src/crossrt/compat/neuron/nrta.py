"""``nrt_async.h``: the explicit async API (``nrta_*``) over crossrt.

Each NeuronCore has execution units (XUs): TENSOR_READ, TENSOR_WRITE and TENSOR_OP for
copies, COMPUTE for executions (``LoadedModel.run_async``), COLLECTIVES (none here: crossrt
has no collective library). ``execution_units.py`` runs their queues and makes the sequence
ids. As in libnrt, nothing orders requests of different queues: wait for a producer's
sequence id before scheduling its consumer elsewhere.

A request's completion can be polled (:func:`nrta_is_completed`, :func:`nrta_get_sequence`),
waited on with a file descriptor that becomes readable (:func:`nrta_get_completion_handle`,
an eventfd), or signalled to eventfds of the caller's. A failed request is still completed;
its status goes to the error tracker it was scheduled with.

Scheduling never waits: a queue with :data:`NRTA_QUEUE_DEPTH` requests not yet completed
refuses more with NRT_QUEUE_FULL. In the legacy async mode every ``nrta_*`` call is
NRT_FAILURE: the two modes exclude each other, as in libnrt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ...memory import Tensor, TensorSet
from .execution_units import (
    NRTA_QUEUE_DEPTH,
    NRTA_QUEUES,
    NRTA_SEQ_GET_SEQ_NUM,
    NRTA_SEQ_GET_XU_ID,
    NRTA_SEQ_NUM_MASK,
    NRTA_SEQ_NUM_MAX,
    NRTA_XU_COLLECTIVES,
    NRTA_XU_COMPUTE,
    NRTA_XU_TENSOR_OP,
    NRTA_XU_TENSOR_READ,
    NRTA_XU_TENSOR_WRITE,
    NRTA_XU_TYPE_NUM,
    Queue,
    Request,
    close_all,
    find,
    nrta_error_t,
    nrta_error_tracker_t,
    nrta_xu_t,
    queue_of,
    unit_name,
    when_done,
    xu_id,
)
from .profiling import timed
from .state import _model, _state, nrt_model_t, tensor_nc
from .status import NRT_STATUS, NrtError, guarded

__all__ = [
    "NRTA_QUEUES",
    "NRTA_QUEUE_DEPTH",
    "NRTA_SEQ_GET_SEQ_NUM",
    "NRTA_SEQ_GET_XU_ID",
    "NRTA_SEQ_NUM_MASK",
    "NRTA_SEQ_NUM_MAX",
    "NRTA_XU_COLLECTIVES",
    "NRTA_XU_COMPUTE",
    "NRTA_XU_TENSOR_OP",
    "NRTA_XU_TENSOR_READ",
    "NRTA_XU_TENSOR_WRITE",
    "NRTA_XU_TYPE_NUM",
    "nrta_error_t",
    "nrta_error_tracker_create",
    "nrta_error_tracker_destroy",
    "nrta_error_tracker_get_list",
    "nrta_error_tracker_t",
    "nrta_event_register_seq_id_completion",
    "nrta_event_register_xu_completion",
    "nrta_execute_schedule",
    "nrta_get_completion_handle",
    "nrta_get_sequence",
    "nrta_is_completed",
    "nrta_tensor_copy",
    "nrta_tensor_read",
    "nrta_tensor_write",
    "nrta_xu_t",
]


def _explicit() -> None:
    _state.require()
    if _state.inflight:
        raise NrtError(
            NRT_STATUS.NRT_FAILURE,
            "the nrta_* calls do not run in the legacy async mode; unset "
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
        )


def _request(seq: Any) -> tuple[Queue, int]:
    """The queue of a sequence id the runtime handed out, and its request number."""
    _explicit()
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 1 << 64:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{seq!r} is not an nrta_seq_t")
    queue = find(NRTA_SEQ_GET_XU_ID(seq))
    number = NRTA_SEQ_GET_SEQ_NUM(seq)
    if queue is None or not 1 <= number <= queue.scheduled:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"sequence id {seq:#x} was not scheduled (request {number} of "
            f"{unit_name(NRTA_SEQ_GET_XU_ID(seq))})",
        )
    return queue, number


def _tracker(err: Any, lnc: int) -> nrta_error_tracker_t | None:
    if err is None:
        return None  # failures are only logged
    if not isinstance(err, nrta_error_tracker_t) or err.destroyed:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{err!r} is not a live error tracker")
    if err.lnc != lnc:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"the error tracker is NeuronCore {err.lnc}'s; this request runs on {lnc}",
        )
    return err


def _schedule(lnc: int, xu: nrta_xu_t, queue: Any, err: Any, request: Request) -> int:
    unit = xu_id(lnc, xu, queue)
    request.tracker = _tracker(err, lnc)
    return queue_of(unit).schedule(request)


def _tensor(tensor: Any) -> Tensor:
    if not isinstance(tensor, Tensor) or tensor.freed:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{tensor!r} is not a live nrt_tensor_t")
    return tensor


def _span(tensor: Tensor, offset: Any, size: Any) -> None:
    for what, value in (("offset", offset), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give a byte count >= 0")
    if offset + size > tensor.size:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"tensor {tensor.name!r}: {size} bytes at offset {offset} are out of range: it "
            f"holds {tensor.size}; keep offset + size <= {tensor.size}",
        )


def _buffer(buf: Any, size: int, writable: bool) -> None:
    try:
        view = memoryview(buf)
    except TypeError:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{type(buf).__name__} is not a buffer") from None
    if writable and view.readonly:
        raise NrtError(NRT_STATUS.NRT_INVALID, "the buffer to read into is read-only")
    if view.nbytes < size:
        raise NrtError(
            NRT_STATUS.NRT_INVALID, f"the buffer holds {view.nbytes} bytes, fewer than {size}"
        )


def _done(action: Callable[[], Any]) -> Callable[[], NRT_STATUS]:
    def run() -> NRT_STATUS:
        action()
        return NRT_STATUS.NRT_SUCCESS

    return run


# -- scheduling --------------------------------------------------------------------------------


@guarded("pair")
def nrta_tensor_write(
    tensor: Tensor, buf: Any, offset: int, size: int, queue: int, err: Any
) -> tuple[NRT_STATUS, int | None]:
    """Schedule a copy of ``size`` bytes of ``buf`` into ``tensor`` at ``offset`` on the
    TENSOR_WRITE unit of the tensor's NeuronCore; ``buf`` is read when it runs, so keep it
    unchanged until then. Returns its sequence id."""
    return NRT_STATUS.NRT_SUCCESS, _host_copy(
        NRTA_XU_TENSOR_WRITE, tensor, buf, offset, size, queue, err
    )


@guarded("pair")
def nrta_tensor_read(
    buf: Any, tensor: Tensor, offset: int, size: int, queue: int, err: Any
) -> tuple[NRT_STATUS, int | None]:
    """Schedule a copy of ``size`` bytes of ``tensor`` from ``offset`` into the writable
    ``buf`` on the TENSOR_READ unit of the tensor's NeuronCore. Returns its sequence id."""
    return NRT_STATUS.NRT_SUCCESS, _host_copy(
        NRTA_XU_TENSOR_READ, tensor, buf, offset, size, queue, err
    )


def _host_copy(
    xu: nrta_xu_t, tensor: Any, buf: Any, offset: Any, size: Any, queue: Any, err: Any
) -> int:
    """Schedule a tensor read (TENSOR_READ) or write (TENSOR_WRITE) on ``tensor``'s core."""
    _explicit()
    target = _tensor(tensor)
    _span(target, offset, size)
    reading = xu is NRTA_XU_TENSOR_READ
    _buffer(buf, size, writable=reading)
    copy = _done(lambda: (target.read if reading else target.write)(buf, offset, size))
    what = "nrta_tensor_read" if reading else "nrta_tensor_write"
    return _schedule(tensor_nc(target), xu, queue, err, Request(what, copy, None))


@guarded("pair")
def nrta_tensor_copy(
    src: Tensor, src_offset: int, dst: Tensor, dst_offset: int, size: int, queue: int, err: Any
) -> tuple[NRT_STATUS, int | None]:
    """Schedule a copy of ``size`` bytes between two tensors of the same NeuronCore
    (NRT_INVALID otherwise) on its TENSOR_OP unit; both must live until it completes."""
    _explicit()
    source, target = _tensor(src), _tensor(dst)
    _span(source, src_offset, size)
    _span(target, dst_offset, size)
    if tensor_nc(source) != tensor_nc(target):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"the tensors are on NeuronCores {tensor_nc(source)} and {tensor_nc(target)}; "
            "nrta_tensor_copy copies within one: read into host memory and write instead",
        )
    copy = _done(lambda: source.copy_to(target, src_offset, dst_offset, size))
    request = Request("nrta_tensor_copy", copy, None)
    return NRT_STATUS.NRT_SUCCESS, _schedule(
        tensor_nc(source), NRTA_XU_TENSOR_OP, queue, err, request
    )


@guarded("pair")
def nrta_execute_schedule(
    model: nrt_model_t, input: TensorSet, output: TensorSet, queue: int, err: Any
) -> tuple[NRT_STATUS, int | None]:
    """Schedule one execution of ``model`` (``LoadedModel.run_async``) on the COMPUTE unit
    (queue 0) of its first NeuronCore. Its inputs are checked when it runs: a bad one is an
    NRT_EXEC_BAD_INPUT in the error tracker. NaN with numerical checks on is
    NRT_EXEC_COMPLETED_WITH_NUM_ERR there, the outputs written."""
    _explicit()
    handle = _model(model)
    for what, tensor_set in (("input", input), ("output", output)):
        if not isinstance(tensor_set, TensorSet):
            raise NrtError(
                NRT_STATUS.NRT_INVALID_HANDLE, f"{what} {tensor_set!r} is not an nrt_tensor_set_t"
            )

    def run() -> NRT_STATUS:
        live = _model(handle)
        return timed(
            live, "nrta_execute_schedule", lambda: live.model.run_async(input, output).result()
        )

    request = Request("nrta_execute_schedule", run, None)
    return NRT_STATUS.NRT_SUCCESS, _schedule(handle.start_nc, NRTA_XU_COMPUTE, queue, err, request)


# -- completion --------------------------------------------------------------------------------


@guarded("pair")
def nrta_is_completed(seq: int) -> tuple[NRT_STATUS, bool | None]:
    """Whether the request ``seq`` has completed (failed ones complete too)."""
    queue, number = _request(seq)
    with queue.cond:
        return NRT_STATUS.NRT_SUCCESS, number <= queue.completed


@guarded("pair")
def nrta_get_sequence(lnc: int, xu: int, queue: int) -> tuple[NRT_STATUS, int | None]:
    """The sequence id of the last request completed on that queue (request number 0 when
    none has)."""
    _explicit()
    unit = xu_id(lnc, xu, queue)
    found = find(unit)
    return NRT_STATUS.NRT_SUCCESS, unit << 48 | (found.completed if found else 0)


@guarded("pair")
def nrta_get_completion_handle(seq: int) -> tuple[NRT_STATUS, int | None]:
    """A file descriptor (an eventfd) that becomes readable when ``seq`` completes: only
    ``poll`` / ``select`` it and ``os.close`` it when done."""
    queue, number = _request(seq)
    fd = os.eventfd(0, os.EFD_CLOEXEC)
    when_done(queue, number, fd)
    return NRT_STATUS.NRT_SUCCESS, fd


def _own_fd(eventfd: Any) -> int:
    if isinstance(eventfd, bool) or not isinstance(eventfd, int) or eventfd < 0:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{eventfd!r} is not a file descriptor")
    try:
        os.fstat(eventfd)
    except OSError as exc:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"fd {eventfd}: {exc.strerror}") from None
    return eventfd


@guarded()
def nrta_event_register_seq_id_completion(seq: int, eventfd: int) -> NRT_STATUS:
    """Add 1 to the caller's ``eventfd`` when ``seq`` completes (at once if it has)."""
    queue, number = _request(seq)
    when_done(queue, number, _own_fd(eventfd))
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrta_event_register_xu_completion(lnc: int, xu: int, queue: int, eventfd: int) -> NRT_STATUS:
    """Add 1 to the caller's ``eventfd`` at every completion on that queue from now on (its
    count is then the completions since it was read); -1 unregisters, another fd replaces."""
    _explicit()
    unit = queue_of(xu_id(lnc, xu, queue))
    mine = None if eventfd == -1 else os.dup(_own_fd(eventfd))
    with unit.cond:
        old, unit.listener = unit.listener, mine
    if old is not None:
        os.close(old)
    return NRT_STATUS.NRT_SUCCESS


# -- error trackers ----------------------------------------------------------------------------


@guarded("pair")
def nrta_error_tracker_create(lnc_idx: int) -> tuple[NRT_STATUS, nrta_error_tracker_t | None]:
    """An error tracker for requests on NeuronCore ``lnc_idx``."""
    _explicit()
    return NRT_STATUS.NRT_SUCCESS, nrta_error_tracker_t(_state.require_nc(lnc_idx, "lnc_idx"))


@guarded("void")
def nrta_error_tracker_destroy(error_tracker: nrta_error_tracker_t | None) -> None:
    """Free the tracker; later failures of its requests are only logged."""
    if isinstance(error_tracker, nrta_error_tracker_t):
        error_tracker.take()
        error_tracker.destroyed = True


@guarded("pair")
def nrta_error_tracker_get_list(
    error_tracker: nrta_error_tracker_t,
) -> tuple[NRT_STATUS, list[nrta_error_t] | None]:
    """The failures since the last call, oldest first (the C ``error_count`` is its
    length): ``nrta_error_t(seq_id, error_code)``, the code an NRT_STATUS."""
    _explicit()
    if not isinstance(error_tracker, nrta_error_tracker_t) or error_tracker.destroyed:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{error_tracker!r} is not a live tracker")
    return NRT_STATUS.NRT_SUCCESS, error_tracker.take()


_state.on_close.append(close_all)
