"""crossrt.compat.neuron's explicit async API (nrt_async.h, nrta_*): execution units and their
queues, sequence ids, tensor reads, writes and copies, scheduled executions compared with
crossrt's own, completion polled and waited on through file descriptors, error trackers,
and every status for bad arguments.

Executions are held at a gate (concurrency_models.gate) where a test needs one still running,
so no test depends on this host's speed."""

from __future__ import annotations

import os
import select
from typing import Any

import numpy as np
import pytest
from test_neuron import _crm, _init, _load, _sets
from test_neuron import clean as clean  # autouse: the runtime closed after each test

import crossrt
import crossrt.compat.neuron as nrt
from concurrency_models import gate, tiny

pytestmark = pytest.mark.usefixtures("runtime_dir")

WAIT_MS = 10_000


@pytest.fixture(autouse=True)
def explicit_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", raising=False)


def _readable(fd: int, timeout_ms: int = WAIT_MS) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_ms))


def _wait(seq: int) -> None:
    """Wait for ``seq`` on its completion handle, as a program does."""
    status, fd = nrt.nrta_get_completion_handle(seq)
    assert status == nrt.NRT_SUCCESS
    try:
        assert _readable(fd)
    finally:
        os.close(fd)


def _ok(result: tuple[Any, Any]) -> Any:
    status, value = result
    assert status == nrt.NRT_SUCCESS, status
    return value


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def _tensor(size: int, nc: int = 0) -> Any:
    return _ok(nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, nc, size, "t"))


def test_sequence_ids_carry_the_execution_unit_and_a_number() -> None:
    _init()
    tracker = _ok(nrt.nrta_error_tracker_create(0))
    tensor = _tensor(8)
    first = _ok(nrt.nrta_tensor_write(tensor, b"\x01" * 8, 0, 8, 1, tracker))
    second = _ok(nrt.nrta_tensor_write(tensor, b"\x02" * 8, 0, 8, 1, tracker))
    xu_id = nrt.NRTA_XU_TENSOR_WRITE | 1 << 4  # type, queue 1, NeuronCore 0
    assert [nrt.NRTA_SEQ_GET_XU_ID(s) for s in (first, second)] == [xu_id, xu_id]
    assert [nrt.NRTA_SEQ_GET_SEQ_NUM(s) for s in (first, second)] == [1, 2]
    assert nrt.NRTA_SEQ_NUM_MAX == nrt.NRTA_SEQ_NUM_MASK == (1 << 48) - 1
    _wait(second)
    assert _ok(nrt.nrta_is_completed(first)) is True  # one queue runs in order
    assert _ok(nrt.nrta_get_sequence(0, nrt.NRTA_XU_TENSOR_WRITE, 1)) == second
    assert _ok(nrt.nrta_get_sequence(0, nrt.NRTA_XU_TENSOR_WRITE, 0)) == 1 << 48  # none yet
    out = bytearray(8)
    assert nrt.nrt_tensor_read(tensor, out, 0, 8) == nrt.NRT_SUCCESS
    assert out == b"\x02" * 8
    assert _ok(nrt.nrta_error_tracker_get_list(tracker)) == []


def test_write_execute_read_match_crossrt() -> None:
    _init()
    exe = crossrt.compile(tiny(), "cpu")
    model = _load(exe.to_bytes())
    x = _x(0)
    inputs, outputs = _sets(model, {"x": np.zeros_like(x)})
    _, x_tensor = nrt.nrt_get_tensor_from_tensor_set(inputs, "x")
    _, y_tensor = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    tracker = _ok(nrt.nrta_error_tracker_create(model.start_nc))
    # Different queues are not ordered: wait for each producer before its consumer.
    _wait(_ok(nrt.nrta_tensor_write(x_tensor, x, 0, x.nbytes, 0, tracker)))
    run = _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, tracker))
    assert nrt.NRTA_SEQ_GET_XU_ID(run) == nrt.NRTA_XU_COMPUTE | model.start_nc << 8
    _wait(run)
    y = np.zeros((4, 8), np.float32)
    read = _ok(nrt.nrta_tensor_read(y, y_tensor, 0, y.nbytes, 0, tracker))
    _wait(read)
    with crossrt.Runtime() as rt:
        expected = rt.load(exe).run({"x": x})["y"]
    assert y.tobytes() == expected.tobytes()
    assert _ok(nrt.nrta_get_sequence(model.start_nc, nrt.NRTA_XU_COMPUTE, 0)) == run
    assert _ok(nrt.nrta_error_tracker_get_list(tracker)) == []


def test_copy_within_a_core() -> None:
    _init()
    src, dst = _tensor(16), _tensor(16)
    nrt.nrt_tensor_write(src, bytes(range(16)), 0, 16)
    _wait(_ok(nrt.nrta_tensor_copy(src, 4, dst, 0, 8, 0, None)))
    out = bytearray(8)
    nrt.nrt_tensor_read(dst, out, 0, 8)
    assert out == bytes(range(4, 12))
    assert nrt.nrta_tensor_copy(src, 10, dst, 0, 8, 0, None) == (nrt.NRT_INVALID, None)
    if nrt.nrt_get_visible_nc_count()[1] > 1:  # tensors of two cores
        other = _tensor(16, 1)
        assert nrt.nrta_tensor_copy(src, 0, other, 0, 8, 0, None) == (nrt.NRT_INVALID, None)


def test_one_queue_runs_in_order_while_other_queues_go_on() -> None:
    _init()
    model = _load(_crm())
    gated = gate(model.model)
    inputs, outputs = _sets(model, {"x": _x(1)})
    first = _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None))
    second = _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None))
    assert gated.started.wait(WAIT_MS / 1000)
    tensor = _tensor(8)
    _wait(_ok(nrt.nrta_tensor_write(tensor, b"\x05" * 8, 0, 8, 0, None)))  # not held
    assert _ok(nrt.nrta_is_completed(first)) is False
    status, fd = nrt.nrta_get_completion_handle(second)
    assert status == nrt.NRT_SUCCESS and not _readable(fd, 0)
    gated.gate.set()
    assert _readable(fd)
    os.close(fd)
    assert _ok(nrt.nrta_is_completed(first)) is True  # completed before the second


def test_a_full_queue_refuses_without_waiting() -> None:
    _init()
    model = _load(_crm())
    gated = gate(model.model)
    inputs, outputs = _sets(model, {"x": _x(2)})
    seqs = [_ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None))]
    assert gated.started.wait(WAIT_MS / 1000)
    seqs += [
        _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None))
        for _ in range(nrt.NRTA_QUEUE_DEPTH - 1)
    ]
    full = nrt.nrta_execute_schedule(model, inputs, outputs, 0, None)
    assert full == (nrt.NRT_QUEUE_FULL, None)
    gated.gate.set()
    _wait(seqs[-1])
    assert nrt.NRTA_SEQ_GET_SEQ_NUM(seqs[-1]) == nrt.NRTA_QUEUE_DEPTH  # the refusal took none
    _wait(_ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None)))  # room again


def test_failures_go_to_the_error_tracker() -> None:
    _init()
    model = _load(_crm())
    other = _load(_crm(), model.start_nc)  # the same core: the same COMPUTE queue
    gated = gate(model.model)
    tracker = _ok(nrt.nrta_error_tracker_create(model.start_nc))
    inputs, outputs = _sets(model, {"x": _x(3)})
    _, empty = nrt.nrt_allocate_tensor_set()
    held = _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, tracker))
    bad = _ok(nrt.nrta_execute_schedule(model, empty, outputs, 0, tracker))  # checked later
    gone = _ok(nrt.nrta_execute_schedule(other, inputs, outputs, 0, tracker))
    assert gated.started.wait(WAIT_MS / 1000)
    assert nrt.nrt_unload(other) == nrt.NRT_SUCCESS  # before its turn comes
    gated.gate.set()
    _wait(gone)  # failed requests complete too
    errors = _ok(nrt.nrta_error_tracker_get_list(tracker))
    assert errors == [
        nrt.nrta_error_t(bad, nrt.NRT_EXEC_BAD_INPUT),
        nrt.nrta_error_t(gone, nrt.NRT_INVALID_HANDLE),
    ]
    assert held not in [e.seq_id for e in errors]
    assert _ok(nrt.nrta_error_tracker_get_list(tracker)) == []  # each failure once
    nrt.nrta_error_tracker_destroy(tracker)
    nrt.nrta_error_tracker_destroy(None)  # as free(NULL)
    assert nrt.nrta_error_tracker_get_list(tracker) == (nrt.NRT_INVALID_HANDLE, None)
    assert nrt.nrta_execute_schedule(model, inputs, outputs, 0, tracker) == (
        nrt.NRT_INVALID_HANDLE, None
    )  # fmt: skip


def test_completion_fds_and_user_eventfds() -> None:
    _init()
    model = _load(_crm())
    gated = gate(model.model)
    inputs, outputs = _sets(model, {"x": _x(4)})
    unit = (model.start_nc, nrt.NRTA_XU_COMPUTE, 0)
    every = os.eventfd(0, os.EFD_NONBLOCK)
    assert nrt.nrta_event_register_xu_completion(*unit, every) == nrt.NRT_SUCCESS
    seq = _ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None))
    mine = os.eventfd(0, os.EFD_NONBLOCK)
    assert nrt.nrta_event_register_seq_id_completion(seq, mine) == nrt.NRT_SUCCESS
    handle = _ok(nrt.nrta_get_completion_handle(seq))
    dropped = _ok(nrt.nrta_get_completion_handle(seq))
    os.close(dropped)  # closed before completion: harmless
    assert not _readable(handle, 0) and not _readable(mine, 0)
    gated.gate.set()
    assert _readable(handle) and _readable(mine)
    assert os.eventfd_read(mine) == 1
    assert _readable(every) and os.eventfd_read(every) == 1
    # Completed already: readable at once.
    late = _ok(nrt.nrta_get_completion_handle(seq))
    assert _readable(late, 0)
    for fd in (handle, late):
        os.close(fd)
    assert nrt.nrta_event_register_xu_completion(*unit, -1) == nrt.NRT_SUCCESS  # unregistered
    _wait(_ok(nrt.nrta_execute_schedule(model, inputs, outputs, 0, None)))
    assert not _readable(every, 0)
    os.close(every)
    closed = os.eventfd(0)
    os.close(closed)
    assert nrt.nrta_event_register_seq_id_completion(seq, closed) == nrt.NRT_INVALID
    assert nrt.nrta_event_register_xu_completion(*unit, closed) == nrt.NRT_INVALID
    os.close(mine)


def test_unknown_sequence_ids_are_invalid() -> None:
    _init()
    tensor = _tensor(8)
    seq = _ok(nrt.nrta_tensor_write(tensor, bytes(8), 0, 8, 0, None))
    _wait(seq)
    xu_id = nrt.NRTA_SEQ_GET_XU_ID(seq)
    never_used = (nrt.NRTA_XU_TENSOR_READ << 48) | 1
    for unknown in (xu_id << 48, seq + 1, never_used, -1, 1 << 64, "seq", None):
        assert nrt.nrta_is_completed(unknown) == (nrt.NRT_INVALID, None)
        assert nrt.nrta_get_completion_handle(unknown) == (nrt.NRT_INVALID, None)
        efd = os.eventfd(0)
        assert nrt.nrta_event_register_seq_id_completion(unknown, efd) == nrt.NRT_INVALID
        os.close(efd)


def test_scheduling_checks_its_arguments() -> None:
    _init()
    model = _load(_crm())
    inputs, outputs = _sets(model, {"x": _x(5)})
    tensor = _tensor(16)
    visible = nrt.nrt_get_visible_nc_count()[1]
    write, read = nrt.nrta_tensor_write, nrt.nrta_tensor_read
    invalid, handle = (nrt.NRT_INVALID, None), (nrt.NRT_INVALID_HANDLE, None)
    assert write(tensor, bytes(16), 8, 16, 0, None) == invalid  # past the end
    assert write(tensor, bytes(4), 0, 16, 0, None) == invalid  # a short buffer
    assert write(tensor, 42, 0, 16, 0, None) == invalid  # not a buffer
    assert write(tensor, bytes(16), -1, 4, 0, None) == invalid
    assert read(b"read-only buffer", tensor, 0, 16, 0, None) == invalid
    assert write(tensor, bytes(16), 0, 16, nrt.NRTA_QUEUES[nrt.NRTA_XU_TENSOR_WRITE], None) == (
        invalid
    )
    assert write("not a tensor", bytes(16), 0, 16, 0, None) == handle
    assert write(tensor, bytes(16), 0, 16, 0, "not a tracker") == handle
    assert nrt.nrta_execute_schedule(model, inputs, outputs, 1, None) == invalid  # queue 0 only
    assert nrt.nrta_execute_schedule(model, {"x": 1}, outputs, 0, None) == handle
    assert nrt.nrta_execute_schedule("model", inputs, outputs, 0, None) == handle
    assert nrt.nrta_error_tracker_create(visible) == invalid
    assert nrt.nrta_get_sequence(visible, nrt.NRTA_XU_COMPUTE, 0) == invalid
    assert nrt.nrta_get_sequence(0, nrt.NRTA_XU_TYPE_NUM, 0) == invalid
    assert nrt.nrta_get_sequence(0, nrt.NRTA_XU_COMPUTE, 1) == invalid
    if visible > 1:  # a tracker of another core's
        other = _ok(nrt.nrta_error_tracker_create(1))
        assert write(tensor, bytes(16), 0, 16, 0, other) == invalid
    nrt.nrt_tensor_free(tensor)
    assert write(tensor, bytes(16), 0, 16, 0, None) == handle


def test_before_init_and_after_close() -> None:
    assert nrt.nrta_error_tracker_create(0)[0] in (nrt.NRT_UNINITIALIZED, nrt.NRT_CLOSED)
    _init()
    tensor = _tensor(8)
    seq = _ok(nrt.nrta_tensor_write(tensor, bytes(8), 0, 8, 0, None))
    _wait(seq)
    nrt.nrt_close()
    assert nrt.nrta_is_completed(seq) == (nrt.NRT_CLOSED, None)
    assert nrt.nrta_tensor_write(tensor, bytes(8), 0, 8, 0, None) == (nrt.NRT_CLOSED, None)
    assert nrt.nrta_get_sequence(0, nrt.NRTA_XU_TENSOR_WRITE, 0) == (nrt.NRT_CLOSED, None)
    _init()  # a new runtime numbers from 1 again
    again = _ok(nrt.nrta_tensor_write(_tensor(8), bytes(8), 0, 8, 0, None))
    assert again == seq
