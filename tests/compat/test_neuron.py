"""crossrt.compat.neuron: every NRT_STATUS value and NEURON_RT_* variable the seed names, each
tested for its meaning; the tensor, tensor-set, model and execution calls; and no exception
across the API whatever the arguments."""

from __future__ import annotations

import inspect
import json
import logging
import logging.handlers
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
import crossrt.compat.neuron as nrt
from concurrency_models import heavy, tiny
from crossrt import StatusCode
from crossrt.compat.neuron import NRT_STATUS
from crossrt.host import host_cpus
from crossrt.memory import memory_log
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")

CPUS = list(host_cpus().cpus)
NEURON_VARS = (
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
    "NEURON_RT_LOG_LEVEL",
    "NEURON_RT_LOG_LOCATION",
    "NEURON_RT_EXEC_TIMEOUT",
    "NEURON_RT_VALIDATE_HASH",
    "NEURON_RT_NUMERICAL_ERRORS_VERIFICATION",
    "NEURON_RT_NUMERICAL_ERRORS_VERBOSITY",
    "NEURON_FAIL_ON_NAN",
    "NEURON_RT_DEBUG_MEMLOG_MAX_SIZE",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No NEURON_RT_* variable from the user; the runtime closed after each test, and
    crossrt's logger and allocation log as they were."""
    for name in NEURON_VARS:
        monkeypatch.delenv(name, raising=False)
    logger = logging.getLogger("crossrt")
    level, entries = logger.level, memory_log().max_entries
    yield
    nrt.nrt_close()
    logger.setLevel(level)
    from crossrt.memory import reset_memory_log

    reset_memory_log(entries)


def _init() -> None:
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_SUCCESS


def _crm(model: crossrt.Model | None = None) -> bytes:
    return crossrt.compile(model or tiny(), "cpu").to_bytes()


def _load(data: bytes, start_nc: int = -1, nc_count: int = -1) -> Any:
    status, model = nrt.nrt_load(data, len(data), start_nc, nc_count)
    assert status == nrt.NRT_SUCCESS, status
    return model


def _sets(model: Any, feed: dict[str, np.ndarray]) -> tuple[Any, Any]:
    _, inputs = nrt.nrt_allocate_tensor_set()
    _, outputs = nrt.nrt_allocate_tensor_set()
    _, info = nrt.nrt_get_model_tensor_info(model)
    for t in info.tensor_array:
        _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, t.size, t.name)
        if t.usage == nrt.NRT_TENSOR_USAGE_INPUT:
            assert nrt.nrt_tensor_write(tensor, feed[t.name], 0, t.size) == nrt.NRT_SUCCESS
            nrt.nrt_add_tensor_to_tensor_set(inputs, t.name, tensor)
        else:
            nrt.nrt_add_tensor_to_tensor_set(outputs, t.name, tensor)
    return inputs, outputs


def _read(tensor_set: Any, name: str, dtype: Any = np.float32) -> np.ndarray:
    _, tensor = nrt.nrt_get_tensor_from_tensor_set(tensor_set, name)
    buf = bytearray(nrt.nrt_tensor_get_size(tensor))
    assert nrt.nrt_tensor_read(tensor, buf, 0, len(buf)) == nrt.NRT_SUCCESS
    return np.frombuffer(buf, dtype)


# -- status values -----------------------------------------------------------------------------

SEED_STATUS = {
    "NRT_SUCCESS": 0,
    "NRT_FAILURE": 1,
    "NRT_INVALID": 2,
    "NRT_INVALID_HANDLE": 3,
    "NRT_RESOURCE": 4,
    "NRT_TIMEOUT": 5,
    "NRT_HW_ERROR": 6,
    "NRT_QUEUE_FULL": 7,
    "NRT_LOAD_NOT_ENOUGH_NC": 9,
    "NRT_UNSUPPORTED_NEFF_VERSION": 10,
    "NRT_UNINITIALIZED": 13,
    "NRT_CLOSED": 14,
    "NRT_EXEC_BAD_INPUT": 1002,
    "NRT_EXEC_COMPLETED_WITH_NUM_ERR": 1003,
    "NRT_EXEC_COMPLETED_WITH_ERR": 1004,
    "NRT_EXEC_NC_BUSY": 1005,
    "NRT_OOB": 1006,
    "NRT_EXEC_HW_ERR_COLLECTIVES": 1200,
    "NRT_EXEC_HW_ERR_HBM_UE": 1201,
}


def test_status_values_are_the_seeds() -> None:
    for name, value in SEED_STATUS.items():
        assert getattr(nrt, name) == value, name
        assert nrt.nrt_get_status_as_str(value) and "Unknown" not in nrt.nrt_get_status_as_str(
            value
        )
    assert (
        nrt.nrt_get_status_as_str(1003)
        == "Execution completed with numerical errors (produced NaN)"
    )
    assert nrt.nrt_get_status_as_str(4242) == "Unknown status 4242"


def test_every_crossrt_code_has_a_status_and_back() -> None:
    for code in StatusCode:
        assert code in nrt.TO_NRT
    for status in NRT_STATUS:
        if status in nrt.FROM_NRT:
            assert nrt.TO_NRT[nrt.FROM_NRT[status]] == status
    assert nrt.TO_NRT[StatusCode.NOT_FOUND] == nrt.NRT_FAILURE  # a name missing from a set


def test_before_init_calls_are_uninitialized_and_after_close_closed() -> None:
    code = (
        "import crossrt.compat.neuron as n\n"
        "print(int(n.nrt_get_visible_nc_count()[0]), int(n.nrt_tensor_allocate(0, 0, 4)[0]))\n"
        "print(int(n.nrt_get_total_nc_count()[0]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["13", "13", "0"], done.stderr
    _init()
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_FAILURE  # twice
    assert nrt.nrt_close() == nrt.NRT_SUCCESS
    assert nrt.nrt_get_visible_nc_count() == (nrt.NRT_CLOSED, None)
    assert nrt.nrt_close() == nrt.NRT_CLOSED


def test_a_model_used_after_nrt_close_is_closed_not_an_invalid_handle() -> None:
    """Seed 002: after nrt_close every call returns NRT_CLOSED, a model's too; after a new
    nrt_init, a model of the closed runtime is a stale handle (INVALID_HANDLE)."""
    _init()
    model = _load(_crm())
    assert nrt.nrt_get_model_tensor_info(model)[0] == nrt.NRT_SUCCESS
    assert nrt.nrt_close() == nrt.NRT_SUCCESS
    assert nrt.nrt_get_model_tensor_info(model) == (nrt.NRT_CLOSED, None)
    assert nrt.nrt_get_model_nc_count(model) == (nrt.NRT_CLOSED, None)
    assert nrt.nrt_unload(model) == nrt.NRT_CLOSED
    _init()
    assert nrt.nrt_get_model_tensor_info(model) == (nrt.NRT_INVALID_HANDLE, None)


def test_neuron_variables_not_read_are_warned_of_once_by_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27: a diagnostics variable a port relies on is never ignored silently."""
    from crossrt.compat.neuron import env

    monkeypatch.setattr(env, "_warned", set())
    monkeypatch.setenv("NEURON_RT_DBG_DUMP_INPUTS_ON_ERR", "1")
    monkeypatch.setenv("NEURON_RT_LOG_LEVEL_NRT", "DEBUG")
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
    monkeypatch.setenv("NEURON_RT_EXEC_TIMEOUT", "30")  # read: no warning
    with caplog.at_level(logging.WARNING, logger="crossrt"):
        _init()
        nrt.nrt_close()
        _init()  # once per process, not per nrt_init
    warned = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert [w.split()[0] for w in warned] == [
        "NEURON_RT_DBG_DUMP_INPUTS_ON_ERR",
        "NEURON_RT_LOG_LEVEL_NRT",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN",
    ]
    assert "round to nearest" in warned[2]


def test_an_invalid_framework_is_refused() -> None:
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_INVALID, "", "") == nrt.NRT_INVALID
    assert nrt.nrt_init(99, "", "") == nrt.NRT_INVALID
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_PYTORCH, "2.1", "1.0") == nrt.NRT_SUCCESS


# -- cores: NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES ---------------------------------------


def test_visible_cores_are_reserved_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", str(CPUS[-1]))
    _init()
    assert nrt.nrt_get_visible_nc_count() == (nrt.NRT_SUCCESS, 1)
    assert nrt.runtime().cores == (CPUS[-1],) and nrt.runtime().exclusive
    assert nrt.nrt_get_total_nc_count() == (nrt.NRT_SUCCESS, os.cpu_count())
    # Another process asking for the same core is told it is busy.
    code = (
        "import crossrt.compat.neuron as n\n"
        "print(int(n.nrt_init(n.NRT_FRAMEWORK_TYPE_NO_FW, '', '')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.stdout.strip() == str(int(nrt.NRT_EXEC_NC_BUSY)), done.stderr
    nrt.nrt_close()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.stdout.strip() == "0", done.stderr  # free again after nrt_close


def test_visible_cores_must_be_contiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "3,5,6")
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_INVALID


def test_num_cores_reserves_that_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "1")
    _init()
    assert nrt.nrt_get_visible_nc_count() == (nrt.NRT_SUCCESS, 1)
    assert nrt.runtime().exclusive
    nrt.nrt_close()
    monkeypatch.setenv("NEURON_RT_NUM_CORES", str(len(CPUS) + 1))
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_LOAD_NOT_ENOUGH_NC
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "0")  # 0: all, as when unset
    _init()
    assert nrt.nrt_get_visible_nc_count() == (nrt.NRT_SUCCESS, len(CPUS))
    assert not nrt.runtime().exclusive


# -- logging: NEURON_RT_LOG_LEVEL, NEURON_RT_LOG_LOCATION --------------------------------------


@pytest.mark.parametrize(
    ("level", "number"),
    [("ERROR", 40), ("WARN", 30), ("WARNING", 30), ("INFO", 20), ("DEBUG", 10), ("TRACE", 5)],
)
def test_log_level_sets_crossrts_loggers(
    monkeypatch: pytest.MonkeyPatch, level: str, number: int
) -> None:
    monkeypatch.setenv("NEURON_RT_LOG_LEVEL", level)
    _init()
    assert logging.getLogger("crossrt").level == number


def test_quiet_logs_nothing(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setenv("NEURON_RT_LOG_LEVEL", "QUIET")
    _init()
    caplog.set_level(logging.NOTSET)
    logging.getLogger("crossrt").setLevel(logging.CRITICAL + 10)  # caplog may reset it
    assert nrt.nrt_unload("not a model") == nrt.NRT_INVALID_HANDLE
    assert not [r for r in caplog.records if r.name.startswith("crossrt")]


def test_errors_are_logged_with_what_to_do(caplog: Any) -> None:
    _init()
    with caplog.at_level(logging.ERROR, "crossrt"):
        assert nrt.nrt_load(b"not a crm", 9, -1, -1)[0] == nrt.NRT_INVALID
    assert any("nrt_load" in r.getMessage() for r in caplog.records)


def test_log_location_syslog_adds_a_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_RT_LOG_LOCATION", "syslog")
    _init()
    handlers = logging.getLogger("crossrt").handlers
    assert any(isinstance(h, logging.handlers.SysLogHandler) for h in handlers)
    nrt.nrt_close()
    handlers = logging.getLogger("crossrt").handlers
    assert not any(isinstance(h, logging.handlers.SysLogHandler) for h in handlers)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NEURON_RT_LOG_LEVEL", "LOUD"),
        ("NEURON_RT_LOG_LOCATION", "file"),
        ("NEURON_RT_NUM_CORES", "-1"),
        ("NEURON_RT_DEBUG_MEMLOG_MAX_SIZE", "many"),
    ],
)
def test_a_malformed_init_variable_fails_init(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_INVALID
    # Not initialized (CLOSED when an earlier test of this process closed it).
    assert nrt.nrt_get_visible_nc_count()[0] in (nrt.NRT_UNINITIALIZED, nrt.NRT_CLOSED)


def test_memlog_max_size_sizes_the_allocation_log(monkeypatch: pytest.MonkeyPatch) -> None:
    _init()
    assert memory_log().max_entries == 1 << 20  # the seed's default
    nrt.nrt_close()
    monkeypatch.setenv("NEURON_RT_DEBUG_MEMLOG_MAX_SIZE", "16")
    _init()
    assert memory_log().max_entries == 16


# -- model variables: NEURON_RT_EXEC_TIMEOUT, _VALIDATE_HASH, numerical errors -----------------


def test_exec_timeout_stops_a_long_execution(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _init()
    monkeypatch.setenv("NEURON_RT_EXEC_TIMEOUT", "0.001")
    model = _load(_crm(heavy()))
    assert model.model.instances.exec_timeout == 0.001
    x = np.eye(512, dtype=np.float32)
    inputs, outputs = _sets(model, {"x": x})
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_TIMEOUT
    # the message names Neuron's setting, not crossrt's (issue 27.4)
    said = [r.getMessage() for r in caplog.records if "execution timeout" in r.getMessage()]
    assert said and all("NEURON_RT_EXEC_TIMEOUT" in m and "CROSSRT_" not in m for m in said)
    monkeypatch.delenv("NEURON_RT_EXEC_TIMEOUT")
    assert _load(_crm()).model.instances.exec_timeout == 30  # the seed's default
    monkeypatch.setenv("NEURON_RT_EXEC_TIMEOUT", "soon")
    data = _crm()
    assert nrt.nrt_load(data, len(data), -1, -1) == (nrt.NRT_INVALID, None)


def test_validate_hash_is_off_by_default_as_in_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    _init()
    exe = crossrt.compile(tiny(), "cpu")
    data = bytearray(exe.to_bytes())
    weights = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
    at = bytes(data).index(weights.tobytes()[:32])  # a byte of the stored weights
    data[at + 4] ^= 0x40
    assert nrt.nrt_load(data, len(data), -1, -1)[0] == nrt.NRT_SUCCESS
    monkeypatch.setenv("NEURON_RT_VALIDATE_HASH", "1")
    assert nrt.nrt_load(data, len(data), -1, -1) == (nrt.NRT_INVALID, None)


def _log_model() -> crossrt.Model:
    b = GraphBuilder("log")
    x = b.input("x", "float32", [4])
    b.output(b.op("Log", [x]), shape=[4])
    return b.finish()


@pytest.mark.parametrize(
    "setting",
    [
        None,
        ("NEURON_RT_NUMERICAL_ERRORS_VERIFICATION", "1"),
        ("NEURON_FAIL_ON_NAN", "1"),
        ("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "critical"),
    ],
)
def test_nan_returns_1003_with_the_outputs_when_checked(
    monkeypatch: pytest.MonkeyPatch, setting: tuple[str, str] | None
) -> None:
    _init()
    if setting:
        monkeypatch.setenv(*setting)
    model = _load(_crm(_log_model()))
    inputs, outputs = _sets(model, {"x": np.array([1, -1, 2, 4], np.float32)})
    status = nrt.nrt_execute(model, inputs, outputs)
    # Off by default, as the seed's release notes say (a hardware false positive).
    assert status == (nrt.NRT_EXEC_COMPLETED_WITH_NUM_ERR if setting else nrt.NRT_SUCCESS)
    (name,) = list(outputs)
    got = _read(outputs, name)
    assert np.isnan(got[1]) and got[0] == 0 and got[3] == np.float32(np.log(4))


def test_infinity_is_a_value_not_a_numerical_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27.4: 1003 means a NaN was produced (seed 002); log(0) = -inf counted as one."""
    _init()
    monkeypatch.setenv("NEURON_FAIL_ON_NAN", "1")
    model = _load(_crm(_log_model()))
    inputs, outputs = _sets(model, {"x": np.array([1, 0, 2, 4], np.float32)})
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    (name,) = list(outputs)
    assert np.isneginf(_read(outputs, name)[1])


# -- models ------------------------------------------------------------------------------------


def test_tensor_info_has_the_seeds_fields() -> None:
    _init()
    model = _load(_crm())
    status, info = nrt.nrt_get_model_tensor_info(model)
    assert status == nrt.NRT_SUCCESS and info.tensor_count == 2
    x, y = info.tensor_array
    assert (x.name, x.usage, x.size, x.dtype, x.shape, x.ndim) == (
        "x", nrt.NRT_TENSOR_USAGE_INPUT, 128, nrt.NRT_DTYPE_FLOAT32, [4, 8], 2
    )  # fmt: skip
    assert (y.name, y.usage) == ("y", nrt.NRT_TENSOR_USAGE_OUTPUT)
    assert nrt.nrt_free_model_tensor_info(info) == nrt.NRT_SUCCESS and info.tensor_count == 0
    assert nrt.nrt_get_model_nc_count(model) == (nrt.NRT_SUCCESS, 1)
    assert nrt.nrt_get_model_instance_count(model) == (nrt.NRT_SUCCESS, 1)


def test_load_places_copies_on_cores() -> None:
    _init()
    visible = nrt.nrt_get_visible_nc_count()[1]
    data = _crm()
    first, second = _load(data), _load(data)
    if visible > 1:  # -1: the first core with fewest models
        assert (first.start_nc, second.start_nc) == (0, 1)
        both = _load(data, 0, 2)
        assert nrt.nrt_get_model_nc_count(both) == (nrt.NRT_SUCCESS, 2)
        assert nrt.nrt_get_model_instance_count(both) == (nrt.NRT_SUCCESS, 2)
    assert nrt.nrt_load(data, len(data), visible, -1) == (nrt.NRT_LOAD_NOT_ENOUGH_NC, None)
    assert nrt.nrt_load(data, len(data), 0, visible + 1) == (nrt.NRT_LOAD_NOT_ENOUGH_NC, None)
    assert nrt.nrt_load(data, len(data), 0, 0) == (nrt.NRT_INVALID, None)
    assert nrt.nrt_load(data, len(data) + 1, -1, -1) == (nrt.NRT_INVALID, None)
    assert nrt.nrt_unload(first) == nrt.NRT_SUCCESS
    assert nrt.nrt_unload(first) == nrt.NRT_INVALID_HANDLE


def test_load_takes_any_buffer() -> None:
    _init()
    data = _crm()
    for buffer in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert nrt.nrt_load(buffer, len(data), -1, -1)[0] == nrt.NRT_SUCCESS


def test_a_damaged_file_is_invalid() -> None:
    _init()
    data = _crm()
    assert nrt.nrt_load(data[:100], 100, -1, -1) == (nrt.NRT_INVALID, None)


def test_a_file_of_another_format_is_unsupported_neff_version() -> None:
    _init()
    data = bytearray(_crm())
    data[8:12] = struct.pack("<I", 2)  # the .crm format field: an older crossrt's file
    assert nrt.nrt_load(data, len(data), -1, -1) == (nrt.NRT_UNSUPPORTED_NEFF_VERSION, None)


def test_memory_beyond_what_the_device_has_is_resource() -> None:
    _init()
    status, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 1 << 62, "huge")
    assert (status, tensor) == (nrt.NRT_RESOURCE, None)


@pytest.mark.parametrize(
    "setting",
    [
        ("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1"),
        ("NEURON_RT_STOCHASTIC_ROUNDING_SEED", "7"),
    ],
)
def test_variables_without_an_effect_here_are_accepted(
    monkeypatch: pytest.MonkeyPatch, setting: tuple[str, str]
) -> None:
    # Round-to-nearest engines (as inf1, where the seed says rounding has no effect).
    monkeypatch.setenv(*setting)
    _init()
    model = _load(_crm())
    inputs, outputs = _sets(model, {"x": np.ones((4, 8), np.float32)})
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS


def test_load_collectives_places_ranks_on_their_cores() -> None:
    _init()
    data = _crm()
    visible = nrt.nrt_get_visible_nc_count()[1]
    status, model = nrt.nrt_load_collectives(data, len(data), -1, -1, visible - 1, visible)
    assert status == nrt.NRT_SUCCESS and model.start_nc == visible - 1
    assert model.rank == (visible - 1, visible)
    bad = nrt.nrt_load_collectives(data, len(data), -1, -1, 2, 2)
    assert bad == (nrt.NRT_INVALID, None)
    many = nrt.nrt_load_collectives(data, len(data), -1, -1, 0, visible + 1)
    assert many == (nrt.NRT_LOAD_NOT_ENOUGH_NC, None)


# -- execution ---------------------------------------------------------------------------------


def test_execute_matches_crossrt_and_repeat_feeds_back() -> None:
    _init()
    exe = crossrt.compile(tiny(), "cpu")
    model = _load(exe.to_bytes())
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    inputs, outputs = _sets(model, {"x": x})
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    expected = model.model.run({"x": x})["y"]
    assert _read(outputs, "y").tobytes() == expected.tobytes()
    # nrt_execute_repeat: the i-th output (state) feeds the i-th input on the next run.
    b = GraphBuilder("double")
    v = b.input("v", "float32", [3])
    b.output(b.op("Add", [v, v], outputs=["v_out"]), shape=[3])
    twice = _load(_crm(b.finish()))
    inputs, outputs = _sets(twice, {"v": np.ones(3, np.float32)})
    assert nrt.nrt_execute_repeat(twice, inputs, outputs, 3) == nrt.NRT_SUCCESS
    assert _read(outputs, "v_out").tolist() == [8, 8, 8]
    assert nrt.nrt_execute_repeat(twice, inputs, outputs, 0) == nrt.NRT_INVALID


def test_a_wrong_input_is_bad_input() -> None:
    _init()
    model = _load(_crm())
    _, inputs = nrt.nrt_allocate_tensor_set()
    _, outputs = nrt.nrt_allocate_tensor_set()
    _, small = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 64, "x")
    nrt.nrt_add_tensor_to_tensor_set(inputs, "x", small)
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_EXEC_BAD_INPUT
    _, empty = nrt.nrt_allocate_tensor_set()
    assert nrt.nrt_execute(model, empty, outputs) == nrt.NRT_EXEC_BAD_INPUT


def test_profile_writes_a_chrome_trace(tmp_path: Path) -> None:
    _init()
    model = _load(_crm())
    inputs, outputs = _sets(model, {"x": np.ones((4, 8), np.float32)})
    trace = tmp_path / "model.ntff"
    trace.write_text("old contents")
    assert nrt.nrt_profile_start(model, str(trace)) == nrt.NRT_SUCCESS
    for _ in range(3):
        nrt.nrt_execute(model, inputs, outputs)
    assert nrt.nrt_profile_stop(str(trace)) == nrt.NRT_SUCCESS
    events = json.loads(trace.read_text())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "mark"]
    assert len(calls) == 3 and all(e["ph"] == "X" and e["dur"] > 0 for e in calls)
    assert {e["name"] for e in calls} == {"nrt_execute"}
    assert calls[0]["args"] == {"start_nc": 0, "nc_count": 1}
    requests = [e for e in events if e["ph"] == "b" and e["name"] == "tiny_mm"]
    assert len(requests) == 3  # each with its phases, inside its call
    for call, request in zip(calls, requests, strict=True):
        assert call["ts"] <= request["ts"] <= call["ts"] + call["dur"]
    assert nrt.nrt_profile_stop(str(trace)) == nrt.NRT_INVALID  # none started


def test_version() -> None:
    status, version = nrt.nrt_get_version()
    assert status == nrt.NRT_SUCCESS and version.rt_detail == f"crossrt {crossrt.__version__}"
    assert (version.rt_major, version.rt_minor) == tuple(
        int(p) for p in crossrt.__version__.split(".")[:2]
    )


# -- tensors and tensor sets -------------------------------------------------------------------


def test_tensor_placements_and_their_limits() -> None:
    _init()
    for placement in (
        nrt.NRT_TENSOR_PLACEMENT_DEVICE,
        nrt.NRT_TENSOR_PLACEMENT_HOST,
        nrt.NRT_TENSOR_PLACEMENT_VIRTUAL,
    ):
        status, tensor = nrt.nrt_tensor_allocate(placement, 0, 64, "t")
        assert status == nrt.NRT_SUCCESS and tensor.placement == placement
        assert nrt.nrt_tensor_get_size(tensor) == 64
    big = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_HOST, 0, 4 << 20, "big")
    assert big == (nrt.NRT_INVALID, None)  # HOST: under 4 MB
    assert nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_VIRTUAL, 0, 4 << 20, "v")[0] == 0
    visible = nrt.nrt_get_visible_nc_count()[1]
    assert nrt.nrt_tensor_allocate(0, visible, 64, "t") == (nrt.NRT_INVALID, None)
    assert nrt.nrt_tensor_allocate(7, 0, 64, "t") == (nrt.NRT_INVALID, None)


def test_read_and_write_take_any_buffer() -> None:
    _init()
    _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "t")
    data = bytes(range(16))
    for source in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert nrt.nrt_tensor_write(tensor, source, 0, 16) == nrt.NRT_SUCCESS
        for target in (bytearray(16), np.zeros(16, np.uint8), memoryview(bytearray(16))):
            assert nrt.nrt_tensor_read(tensor, target, 0, 16) == nrt.NRT_SUCCESS
            assert bytes(target) == data
    assert nrt.nrt_tensor_write(tensor, data, 8, 16) == nrt.NRT_INVALID  # past the end
    assert nrt.nrt_tensor_read(tensor, b"read-only buffer", 0, 16) == nrt.NRT_INVALID
    assert nrt.nrt_tensor_memset(tensor, 4, 0xAB, 4) == nrt.NRT_SUCCESS
    out = bytearray(16)
    nrt.nrt_tensor_read(tensor, out, 0, 16)
    assert out[4:8] == b"\xab" * 4 and out[:4] == data[:4]


def test_attach_buffer_becomes_virtual_and_slices_share_memory() -> None:
    _init()
    status, tensor = nrt.nrt_tensor_allocate_empty("empty")
    assert status == nrt.NRT_SUCCESS and nrt.nrt_tensor_get_size(tensor) == 0
    buffer = np.zeros(32, np.uint8)
    assert nrt.nrt_tensor_attach_buffer(tensor, buffer, 32) == nrt.NRT_SUCCESS
    assert tensor.placement == nrt.NRT_TENSOR_PLACEMENT_VIRTUAL
    assert nrt.nrt_tensor_get_va(tensor) == buffer.ctypes.data
    status, part = nrt.nrt_tensor_allocate_slice(tensor, 8, 8, "part")
    assert status == nrt.NRT_SUCCESS and nrt.nrt_tensor_get_size(part) == 8
    nrt.nrt_tensor_write(part, b"\x07" * 8, 0, 8)
    assert buffer[8:16].tolist() == [7] * 8  # no copy anywhere
    assert nrt.nrt_tensor_allocate_slice(tensor, 30, 8, "past") == (nrt.NRT_INVALID, None)
    _, other = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 8, "other")
    assert nrt.nrt_tensor_copy(part, 0, other, 0, 8) == nrt.NRT_SUCCESS
    nrt.nrt_tensor_free(tensor)
    nrt.nrt_tensor_free(None)  # as free(NULL)
    assert nrt.nrt_tensor_read(tensor, bytearray(4), 0, 4) == nrt.NRT_INVALID_HANDLE
    assert nrt.nrt_tensor_get_size(part) == 8  # the slice keeps the memory


def test_batched_reads_and_writes_check_every_op_first() -> None:
    _init()
    _, a = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 8, "a")
    _, b = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 8, "b")
    op = nrt.nrt_tensor_batch_op_t
    writes = [
        nrt.nrt_tensor_batch_t(a, [op(0, 4, b"\x01" * 4), op(4, 4, b"\x02" * 4)], 2),
        nrt.nrt_tensor_batch_t(b, [op(0, 8, bytes(range(8)))], 1),
    ]
    assert nrt.nrt_tensor_write_batch(writes, 2, False) == nrt.NRT_SUCCESS
    out_a, out_b = bytearray(8), bytearray(8)
    reads = [
        nrt.nrt_tensor_batch_t(a, [op(0, 8, out_a)], 1),
        nrt.nrt_tensor_batch_t(b, [op(0, 8, out_b)], 1),
    ]
    assert nrt.nrt_tensor_read_batch(reads, 2, True) == nrt.NRT_SUCCESS
    assert (bytes(out_a), bytes(out_b)) == (b"\x01" * 4 + b"\x02" * 4, bytes(range(8)))
    bad = [nrt.nrt_tensor_batch_t(a, [op(0, 8, b"\x00" * 8), op(6, 4, b"\x00" * 4)], 2)]
    assert nrt.nrt_tensor_write_batch(bad, 1, False) == nrt.NRT_INVALID
    nrt.nrt_tensor_read(a, out_a, 0, 8)
    assert bytes(out_a) == b"\x01" * 4 + b"\x02" * 4  # nothing written


def test_tensor_sets() -> None:
    status, tensor_set = nrt.nrt_allocate_tensor_set()
    assert status == nrt.NRT_SUCCESS
    tensor = crossrt.Tensor.allocate(4)
    assert nrt.nrt_add_tensor_to_tensor_set(tensor_set, "a", tensor) == nrt.NRT_SUCCESS
    assert nrt.nrt_get_tensor_from_tensor_set(tensor_set, "a") == (nrt.NRT_SUCCESS, tensor)
    # A missing name is NRT_FAILURE, as the seed says, and nothing is returned.
    assert nrt.nrt_get_tensor_from_tensor_set(tensor_set, "b") == (nrt.NRT_FAILURE, None)
    assert nrt.nrt_add_tensor_to_tensor_set(tensor_set, "b", "not a tensor") == 3
    nrt.nrt_destroy_tensor_set(tensor_set)
    assert nrt.nrt_get_tensor_from_tensor_set(tensor_set, "a") == (nrt.NRT_FAILURE, None)


# -- never an exception ------------------------------------------------------------------------

_FUNCTIONS = sorted(
    name
    for name in nrt.__all__
    if name.startswith(("nrt_", "nrta_")) and inspect.isfunction(getattr(nrt, name))
)


@pytest.mark.parametrize("name", _FUNCTIONS)
@pytest.mark.parametrize("garbage", [None, "x", -1, object()])
def test_no_exception_crosses_the_api(name: str, garbage: Any) -> None:
    _init()
    function = getattr(nrt, name)
    count = len(inspect.signature(function).parameters)
    result = function(*([garbage] * count))  # must return, whatever it is given
    status = result[0] if isinstance(result, tuple) else result
    assert status is None or isinstance(status, int | str | nrt.nrt_version_t)
