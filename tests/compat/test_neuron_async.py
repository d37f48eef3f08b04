"""crossrt.compat.neuron's legacy async execution mode (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS):
nrt_execute returning at once, output completion counters, the status callback, the drain,
tensor I/O waiting for queued executions; and nrt_get_vnc_memory_stats, nrt_get_model_info.

Executions are held at a gate (concurrency_models.gate) where a test needs one still running,
so no test depends on this host's speed."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_neuron import _crm, _init, _load, _log_model, _read, _sets
from test_neuron import clean as clean  # autouse: the runtime closed after each test

import crossrt
import crossrt.compat.neuron as nrt
from concurrency_models import gate, heavy, tiny
from crossrt.compat.neuron import completion

pytestmark = pytest.mark.usefixtures("runtime_dir")

WAIT = 10.0
WAIT_US = int(WAIT * 1e6)
INFLIGHT = "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS"


@pytest.fixture(autouse=True)
def no_async_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INFLIGHT, raising=False)


@pytest.fixture
def async_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """The runtime in the async mode (3 in flight), with a callback that keeps its calls."""
    monkeypatch.setenv(INFLIGHT, "3")
    _init()
    calls: list[tuple[Any, ...]] = []
    assert nrt.nrt_register_async_exec_callback(lambda *a: calls.append(a), "params") == 0
    yield calls


def _expected(x: np.ndarray) -> np.ndarray:
    """crossrt's own answer: Runtime.load(exe).run(...)."""
    with crossrt.Runtime() as rt:
        return rt.load(crossrt.compile(tiny(), "cpu")).run({"x": x})["y"]


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def _in_thread(call: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    thread.start()
    return thread, result


# -- nrt_execute returns at once; counters, callback --------------------------------------------


def test_execute_queues_its_run_and_the_output_counts_when_done(
    async_mode: list[tuple[Any, ...]],
) -> None:
    model = _load(_crm())
    assert model.model.instances.queue_depth == 3  # the in-flight limit is the model's queue
    gated = gate(model.model)
    x = _x(0)
    inputs, outputs = _sets(model, {"x": x})
    _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS  # the run waits
    assert gated.started.wait(WAIT)
    assert nrt.nrt_tensor_check_output_completion(y, 0, 1) == nrt.NRT_TIMEOUT
    assert async_mode == []
    gated.gate.set()
    assert nrt.nrt_tensor_check_output_completion(y, WAIT_US, 1) == nrt.NRT_SUCCESS
    assert _read(outputs, "y").tobytes() == _expected(x).tobytes()
    assert async_mode == [("params", model.model_id, model.start_nc, 1, nrt.NRT_SUCCESS)]


def test_reading_or_writing_a_tensor_in_use_waits_for_the_execution(
    async_mode: list[tuple[Any, ...]],
) -> None:
    model = _load(_crm())
    gated = gate(model.model)
    x = _x(1)
    inputs, outputs = _sets(model, {"x": x})
    _, x_tensor = nrt.nrt_get_tensor_from_tensor_set(inputs, "x")
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    assert gated.started.wait(WAIT)
    reader, read = _in_thread(_read, outputs, "y")
    writer, wrote = _in_thread(nrt.nrt_tensor_write, x_tensor, np.zeros_like(x), 0, x.nbytes)
    reader.join(0.2)
    assert reader.is_alive() and writer.is_alive()  # held until the run is over
    gated.gate.set()
    reader.join(WAIT)
    writer.join(WAIT)
    assert read[0].tobytes() == _expected(x).tobytes()  # the run's output, whole
    assert wrote == [nrt.NRT_SUCCESS]


def test_failed_executions_reach_the_callback_and_count(
    async_mode: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_FAIL_ON_NAN", "1")
    model = _load(_crm(_log_model()))
    inputs, outputs = _sets(model, {"x": np.array([1, -1, 2, 4], np.float32)})
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    (name,) = list(outputs)
    _, out = nrt.nrt_get_tensor_from_tensor_set(outputs, name)
    assert nrt.nrt_tensor_check_output_completion(out, WAIT_US, 1) == nrt.NRT_SUCCESS
    assert async_mode[-1][-1] == nrt.NRT_EXEC_COMPLETED_WITH_NUM_ERR
    assert np.isnan(_read(outputs, name)[1])  # its outputs are written
    # A timeout ends the execution with NRT_TIMEOUT; the output counts it all the same.
    monkeypatch.setenv("NEURON_RT_EXEC_TIMEOUT", "0.001")
    slow = _load(_crm(heavy()))
    inputs, outputs = _sets(slow, {"x": np.eye(512, dtype=np.float32)})
    assert nrt.nrt_execute(slow, inputs, outputs) == nrt.NRT_SUCCESS
    (name,) = list(outputs)
    _, out = nrt.nrt_get_tensor_from_tensor_set(outputs, name)
    assert nrt.nrt_tensor_check_output_completion(out, WAIT_US, 1) == nrt.NRT_SUCCESS
    assert async_mode[-1] == ("params", slow.model_id, slow.start_nc, 1, nrt.NRT_TIMEOUT)


def test_a_bad_input_is_refused_at_once(async_mode: list[tuple[Any, ...]]) -> None:
    model = _load(_crm())
    _, empty = nrt.nrt_allocate_tensor_set()
    _, outputs = nrt.nrt_allocate_tensor_set()
    assert nrt.nrt_execute(model, empty, outputs) == nrt.NRT_EXEC_BAD_INPUT
    assert async_mode == []
    assert nrt.nrt_async_drain_queued_execs(model.start_nc) == nrt.NRT_SUCCESS


def test_a_callback_that_raises_is_logged_and_the_default_logs_failures(
    async_mode: list[tuple[Any, ...]], caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(*args: Any) -> None:
        raise RuntimeError("callback bug")

    assert nrt.nrt_register_async_exec_callback(fails, None) == nrt.NRT_SUCCESS
    assert nrt.nrt_register_async_exec_callback("not callable", None) == nrt.NRT_INVALID
    model = _load(_crm())
    inputs, outputs = _sets(model, {"x": _x(2)})
    _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    with caplog.at_level(logging.ERROR, "crossrt.compat.neuron"):
        assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
        assert nrt.nrt_async_drain_queued_execs(model.start_nc) == nrt.NRT_SUCCESS
        assert any("callback raised" in r.getMessage() for r in caplog.records)
        # None: the default callback, which logs a failed execution.
        assert nrt.nrt_register_async_exec_callback(None, None) == nrt.NRT_SUCCESS
        monkeypatch.setenv("NEURON_FAIL_ON_NAN", "1")
        nan = _load(_crm(_log_model()))
        inputs, outputs = _sets(nan, {"x": np.array([1, -1, 2, 4], np.float32)})
        assert nrt.nrt_execute(nan, inputs, outputs) == nrt.NRT_SUCCESS
        assert nrt.nrt_async_drain_queued_execs(nan.start_nc) == nrt.NRT_SUCCESS
    assert any("NRT_EXEC_COMPLETED_WITH_NUM_ERR" in r.getMessage() for r in caplog.records)
    assert nrt.nrt_tensor_check_output_completion(y, 0, 1) == nrt.NRT_SUCCESS


def test_drain_waits_for_every_queued_execution(async_mode: list[tuple[Any, ...]]) -> None:
    model = _load(_crm())
    gated = gate(model.model)
    inputs, outputs = _sets(model, {"x": _x(3)})
    _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    for _ in range(3):
        assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    drainer, drained = _in_thread(nrt.nrt_async_drain_queued_execs, model.start_nc)
    drainer.join(0.2)
    assert drainer.is_alive()
    gated.gate.set()
    drainer.join(WAIT)
    assert drained == [nrt.NRT_SUCCESS]
    assert [call[3] for call in async_mode] == [1, 2, 3]  # job ids, in submission order
    assert nrt.nrt_tensor_check_output_completion(y, 0, 3) == nrt.NRT_SUCCESS
    visible = nrt.nrt_get_visible_nc_count()[1]
    assert nrt.nrt_async_drain_queued_execs(visible) == nrt.NRT_INVALID


def test_an_unbounded_wait_warns_after_30_seconds(
    async_mode: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(completion, "WARN_AFTER_S", 0.01)  # the seed's 30 s, shortened
    warned = threading.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING and "still waiting" in record.getMessage():
                warned.set()

    handler = Catch()
    logger = logging.getLogger("crossrt.compat.neuron")
    logger.addHandler(handler)
    logging.getLogger("crossrt").setLevel(logging.WARNING)  # as NEURON_RT_LOG_LEVEL=WARN
    try:
        model = _load(_crm())
        gated = gate(model.model)
        inputs, outputs = _sets(model, {"x": _x(4)})
        _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
        assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
        waiter, waited = _in_thread(nrt.nrt_tensor_check_output_completion, y, -1, 1)
        assert warned.wait(WAIT)
        assert waiter.is_alive()  # a negative timeout keeps waiting after the warning
        gated.gate.set()
        waiter.join(WAIT)
        assert waited == [nrt.NRT_SUCCESS]
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(("value", "depth"), [("1", 1), ("100", 63)])
def test_inflight_sets_the_queue_clamped_at_63(
    monkeypatch: pytest.MonkeyPatch, value: str, depth: int
) -> None:
    monkeypatch.setenv(INFLIGHT, value)
    _init()
    assert _load(_crm()).model.instances.queue_depth == depth


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_malformed_inflight_fails_init(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(INFLIGHT, value)
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_INVALID


def test_the_explicit_api_and_continuous_profiling_refuse_the_async_mode(
    async_mode: list[tuple[Any, ...]],
) -> None:
    assert nrt.nrta_error_tracker_create(0) == (nrt.NRT_FAILURE, None)
    assert nrt.nrta_get_sequence(0, nrt.NRTA_XU_COMPUTE, 0) == (nrt.NRT_FAILURE, None)
    _, options = nrt.nrt_profile_continuous_options_allocate()
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_FAILURE


# -- counters in the synchronous mode ------------------------------------------------------------


def test_counters_count_synchronous_executions_and_reset() -> None:
    _init()
    model = _load(_crm())
    inputs, outputs = _sets(model, {"x": _x(5)})
    _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    for _ in range(2):
        assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    assert nrt.nrt_tensor_check_output_completion(y, 0, 2) == nrt.NRT_SUCCESS
    assert nrt.nrt_tensor_check_output_completion(y, 1000, 3) == nrt.NRT_TIMEOUT
    assert nrt.nrt_tensor_reset_output_completion(y) == nrt.NRT_SUCCESS
    assert nrt.nrt_tensor_check_output_completion(y, 0, 1) == nrt.NRT_TIMEOUT
    assert nrt.nrt_execute_repeat(model, inputs, outputs, 2) == nrt.NRT_SUCCESS
    assert nrt.nrt_tensor_check_output_completion(y, 0, 1) == nrt.NRT_SUCCESS
    # NULL is NRT_INVALID for these two, as the seed documents; no nrt_init needed.
    assert nrt.nrt_tensor_check_output_completion(None, 0, 1) == nrt.NRT_INVALID
    assert nrt.nrt_tensor_check_output_completion(y, "soon", 1) == nrt.NRT_INVALID
    assert nrt.nrt_tensor_reset_output_completion(None) == nrt.NRT_INVALID
    nrt.nrt_close()
    assert nrt.nrt_tensor_check_output_completion(y, 0, 1) == nrt.NRT_SUCCESS
    assert nrt.nrt_async_drain_queued_execs(0) == nrt.NRT_CLOSED
    assert nrt.nrt_register_async_exec_callback(None, None) == nrt.NRT_CLOSED


# -- nrt_get_vnc_memory_stats, nrt_get_model_info ------------------------------------------------


def test_vnc_memory_stats_are_crossrts() -> None:
    _init()
    gc.collect()  # earlier tests' garbage freed now, not between two readings
    gc.disable()
    try:
        status, (before, size) = nrt.nrt_get_vnc_memory_stats(0, 16)
        assert (status, size) == (nrt.NRT_SUCCESS, 16) and before.bytes_limit > 0
        _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 1 << 20, "big")
        _, (after, _) = nrt.nrt_get_vnc_memory_stats(0)
        stats = nrt.runtime().memory_stats()
    finally:
        gc.enable()
    assert after.bytes_used >= before.bytes_used + (1 << 20)
    (crossrts,) = [s for s in stats.values() if s.device == tensor.device]
    assert (after.bytes_used, after.bytes_limit) == (crossrts.bytes_in_use, crossrts.limit_bytes)
    # An older caller's struct, 8 bytes: only bytes_used is filled.
    status, (old, size) = nrt.nrt_get_vnc_memory_stats(0, 8)
    assert (status, size, old.bytes_limit) == (nrt.NRT_SUCCESS, 8, 0) and old.bytes_used > 0
    visible = nrt.nrt_get_visible_nc_count()[1]
    assert nrt.nrt_get_vnc_memory_stats(visible) == (nrt.NRT_INVALID, None)
    assert nrt.nrt_get_vnc_memory_stats(0, -1) == (nrt.NRT_INVALID, None)
    nrt.nrt_close()
    assert nrt.nrt_get_vnc_memory_stats(0) == (nrt.NRT_CLOSED, None)


def test_model_info_names_its_core() -> None:
    _init()
    visible = nrt.nrt_get_visible_nc_count()[1]
    model = _load(_crm(), visible - 1)
    assert nrt.nrt_get_model_info(model, 4) == (
        nrt.NRT_SUCCESS, (nrt.nrt_model_info_t(vnc=visible - 1), 4)
    )  # fmt: skip
    assert nrt.nrt_get_model_info(model, 0) == (nrt.NRT_SUCCESS, (nrt.nrt_model_info_t(0), 0))
    assert nrt.nrt_get_model_info(model, 64)[1][1] == 4  # a newer caller: what there is
    nrt.nrt_unload(model)
    assert nrt.nrt_get_model_info(model) == (nrt.NRT_INVALID_HANDLE, None)
