"""crossrt.compat.neuron's tracing and profiling beyond nrt_profile_start: nrt_trace_start /
_stop, continuous profiling (nrt_profile_continuous_*) and inspect sessions (nrt_inspect_*,
NEURON_RT_INSPECT_*), each written as a Chrome trace where the seed writes NTFF."""

from __future__ import annotations

import json
import logging
import os
import select
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_neuron import _crm, _init, _load, _sets
from test_neuron import clean as clean  # autouse: the runtime closed after each test

import crossrt.compat.neuron as nrt
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")


@pytest.fixture(autouse=True)
def no_profiling_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NEURON_RT_INSPECT_") or name == (
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS"
        ):
            monkeypatch.delenv(name)


def _double() -> Any:
    b = GraphBuilder("double")
    v = b.input("v", "float32", [3])
    b.output(b.op("Add", [v, v], outputs=["v_out"]), shape=[3])
    return b.finish()


def _run(model: Any, times: int = 1) -> None:
    name = "x" if model.model.name == "tiny_mm" else "v"
    shape = (4, 8) if name == "x" else (3,)
    inputs, outputs = _sets(model, {name: np.ones(shape, np.float32)})
    for _ in range(times):
        assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS


def _events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["traceEvents"])


def _calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "mark"]


def _requests(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "request" and e["ph"] == "b" and "args" in e]


# -- nrt_trace_start / nrt_trace_stop -------------------------------------------------------------


def test_trace_covers_models_loaded_before_and_after_it_started(tmp_path: Path) -> None:
    _init()
    tiny = _load(_crm())
    assert nrt.nrt_trace_start(False) == nrt.NRT_SUCCESS
    assert nrt.nrt_trace_start(False) == nrt.NRT_FAILURE  # one at a time
    double = _load(_crm(_double()))  # loaded after the start
    _run(tiny, 2)
    _run(double)
    path = tmp_path / "trace.json"
    assert nrt.nrt_trace_stop(str(path)) == nrt.NRT_SUCCESS
    events = _events(path)
    assert sorted(e["args"]["model"] for e in _calls(events)) == ["double", "tiny_mm", "tiny_mm"]
    requests = _requests(events)
    assert sorted(e["name"] for e in requests) == ["double", "tiny_mm", "tiny_mm"]
    assert len({e["id"] for e in requests}) == 3  # each model's ids kept apart
    for call in _calls(events):  # one clock: each request inside its call
        inside = [r for r in requests if call["ts"] <= r["ts"] <= call["ts"] + call["dur"]]
        assert [r["name"] for r in inside] == [call["args"]["model"]]
    assert not [e for e in events if e["ph"] == "C"]  # no memory without trace_mem
    assert nrt.nrt_trace_stop(str(path)) == nrt.NRT_INVALID  # none running


def test_trace_mem_adds_the_device_memory(tmp_path: Path) -> None:
    _init()
    assert nrt.nrt_trace_start(True) == nrt.NRT_SUCCESS
    _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 4096, "t")
    path = tmp_path / "trace.json"
    assert nrt.nrt_trace_stop(str(path)) == nrt.NRT_SUCCESS
    trace = json.loads(path.read_text())
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counters and counters[-1]["name"] == f"memory {tensor.device}"
    assert counters[-1]["args"]["bytes_in_use"] >= 4096
    assert trace["otherData"]["memory"][tensor.device]["bytes_in_use"] >= 4096


# -- continuous profiling ------------------------------------------------------------------------


def test_continuous_profiling_saves_the_latest_execution_of_a_core(tmp_path: Path) -> None:
    _init()
    model = _load(_crm())
    status, options = nrt.nrt_profile_continuous_options_allocate()
    assert status == nrt.NRT_SUCCESS and options.output_dir == "./output"  # the default
    out = tmp_path / "out"
    assert nrt.nrt_profile_continuous_options_set_output_dir(options, str(out)) == 0
    assert nrt.nrt_profile_continuous_save(model.start_nc, options) == nrt.NRT_INVALID  # off
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_SUCCESS
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_FAILURE  # on already
    assert nrt.nrt_profile_continuous_save(model.start_nc, options) == nrt.NRT_INVALID  # no run
    _run(model, 3)
    assert nrt.nrt_profile_continuous_save(model.start_nc, options) == nrt.NRT_SUCCESS
    (saved,) = out.glob(f"tiny_mm-nc{model.start_nc}-exec*-{os.getpid()}.json")
    events = _events(saved)
    assert len(_requests(events)) == 1  # the latest execution alone
    (call,) = _calls(events)
    assert call["name"] == "nrt_execute" and call["args"]["status"] == "NRT_SUCCESS"
    # The explicit API's executions are profiled too; each save is a file of its own.
    inputs, outputs = _sets(model, {"x": np.ones((4, 8), np.float32)})
    _, seq = nrt.nrta_execute_schedule(model, inputs, outputs, 0, None)
    _, fd = nrt.nrta_get_completion_handle(seq)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    assert poller.poll(10_000)
    os.close(fd)
    assert nrt.nrt_profile_continuous_save(model.start_nc, options) == nrt.NRT_SUCCESS
    (latest,) = set(out.glob("*.json")) - {saved}
    assert [c["name"] for c in _calls(_events(latest))] == ["nrta_execute_schedule"]
    visible = nrt.nrt_get_visible_nc_count()[1]
    assert nrt.nrt_profile_continuous_save(visible, options) == nrt.NRT_INVALID
    assert nrt.nrt_profile_continuous_stop() == nrt.NRT_SUCCESS
    assert nrt.nrt_profile_continuous_stop() == nrt.NRT_INVALID
    assert nrt.nrt_profile_continuous_save(model.start_nc, options) == nrt.NRT_INVALID
    assert nrt.nrt_profile_continuous_options_set_output_dir(options, "") == nrt.NRT_INVALID
    assert nrt.nrt_profile_continuous_options_free(options) == nrt.NRT_SUCCESS
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_INVALID  # freed


# -- inspect ---------------------------------------------------------------------------------


def _config(out: Path, **settings: Any) -> Any:
    _, config = nrt.nrt_inspect_config_allocate()
    assert nrt.nrt_inspect_config_set_output_dir(config, str(out)) == nrt.NRT_SUCCESS
    for name, value in settings.items():
        setter = getattr(nrt, f"nrt_inspect_config_set_{name}")
        assert setter(config, *value) == nrt.NRT_SUCCESS
    return config


def test_inspect_config_has_the_seeds_defaults_and_checks_its_setters() -> None:
    status, config = nrt.nrt_inspect_config_allocate()
    assert status == nrt.NRT_SUCCESS
    assert (config.session_id, config.output_dir) == (1, "./output")
    assert not config.enable_inspect and not config.enable_inspect_on_fail
    everything = ["system_profile", "device_profile", "host_memory", "cpu_util"]
    assert nrt.nrt_inspect_config_get_all_activity_types() == (nrt.NRT_SUCCESS, everything)
    assert nrt.nrt_inspect_config_get_enabled_activity_types(config) == (0, everything)
    assert nrt.nrt_inspect_config_set_activity(config, "cpu_util", False) == 0
    assert nrt.nrt_inspect_config_get_enabled_activity_types(config) == (0, everything[:3])
    assert nrt.nrt_inspect_config_set_activity(config, "all", False) == 0
    assert nrt.nrt_inspect_config_get_enabled_activity_types(config) == (0, [])
    assert nrt.nrt_inspect_config_set_session_id(config, 7) == 0
    assert nrt.nrt_inspect_config_set_enable_inspect(config, True) == 0
    assert nrt.nrt_inspect_config_set_defaults(config) == nrt.NRT_SUCCESS
    assert (config.session_id, config.enable_inspect) == (1, False)
    assert nrt.nrt_inspect_config_get_enabled_activity_types(config) == (0, everything)
    assert nrt.nrt_inspect_config_free_activity_types(everything, 4) is None
    invalid = nrt.NRT_INVALID
    assert nrt.nrt_inspect_config_set_activity(config, "gpu_util", True) == invalid
    assert nrt.nrt_inspect_config_set_session_id(config, -1) == invalid
    assert nrt.nrt_inspect_config_set_output_dir(config, "") == invalid
    assert nrt.nrt_inspect_config_set_sys_trace_max_events_per_nc(config, 0) == invalid
    assert nrt.nrt_inspect_config_set_capture_enabled_for_nc(config, -1, True) == invalid
    set_type = nrt.nrt_inspect_config_set_capture_enabled_for_event_type_string
    assert set_type(config, "hw_notify", False) == invalid
    assert set_type(config, "nrt_execute", "maybe") == invalid
    assert nrt.nrt_inspect_config_free(config) == nrt.NRT_SUCCESS
    assert nrt.nrt_inspect_config_set_session_id(config, 2) == invalid  # freed


def test_an_inspect_session_writes_system_and_device_profiles(tmp_path: Path) -> None:
    _init()
    config = _config(tmp_path, enable_inspect=(True,))
    assert nrt.nrt_inspect_begin_with_options(config) == nrt.NRT_SUCCESS
    assert nrt.nrt_inspect_begin_with_options(config) == nrt.NRT_FAILURE  # one at a time
    model = _load(_crm())  # loaded during the session
    _run(model, 2)
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS
    assert nrt.nrt_inspect_stop() == nrt.NRT_INVALID
    path = tmp_path / f"inspect-s1-{os.getpid()}.json"
    trace = json.loads(path.read_text())
    kinds = {e.get("cat") for e in trace["traceEvents"]}
    assert {"mark", "request", "infer"} <= kinds
    assert len(_requests(trace["traceEvents"])) == 2 and len(_calls(trace["traceEvents"])) == 2
    assert set(trace["otherData"]["cpu_util"]) == {"user_s", "system_s", "wall_s", "percent"}
    assert "memory" in trace["otherData"]
    # Session 2: no device profile, no API calls, not the model's core.
    config = _config(
        tmp_path,
        session_id=(2,),
        enable_inspect=(True,),
        activity=("device_profile", False),
        capture_enabled_for_event_type_string=("nrt_execute", False),
    )
    assert nrt.nrt_inspect_begin_with_options(config) == nrt.NRT_SUCCESS
    assert nrt.nrt_inspect_config_set_session_id(config, 3) == 0  # the session took a copy
    _run(model)
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS
    events = _events(tmp_path / f"inspect-s2-{os.getpid()}.json")
    kinds = {e.get("cat") for e in events}
    assert "request" in kinds and not kinds & {"infer", "mark"}
    config = _config(
        tmp_path,
        session_id=(4,),
        enable_inspect=(True,),
        capture_enabled_for_nc=(model.start_nc, False),
    )
    assert nrt.nrt_inspect_begin_with_options(config) == nrt.NRT_SUCCESS
    _run(model)
    nrt.nrt_close()  # writes the session, as nrt_inspect_stop
    assert not _requests(_events(tmp_path / f"inspect-s4-{os.getpid()}.json"))


def test_close_closes_even_when_the_session_cannot_be_written(tmp_path: Path, caplog: Any) -> None:
    _init()
    blocked = tmp_path / "a file"
    blocked.write_text("not a directory")
    assert nrt.nrt_inspect_begin_with_options(_config(blocked, enable_inspect=(True,))) == 0
    with caplog.at_level(logging.ERROR, "crossrt.compat.neuron"):
        assert nrt.nrt_close() == nrt.NRT_SUCCESS
    assert any("crossrt.compat.neuron.inspect" in r.getMessage() for r in caplog.records)
    assert nrt.nrt_get_visible_nc_count() == (nrt.NRT_CLOSED, None)
    _init()  # the cores were given back


def test_inspect_on_fail_writes_what_led_to_the_failure(tmp_path: Path) -> None:
    _init()
    model = _load(_crm())
    config = _config(tmp_path, enable_inspect_on_fail=(True,))
    assert nrt.nrt_inspect_begin_with_options(config) == nrt.NRT_SUCCESS
    _run(model)
    assert not list(tmp_path.glob("*.json"))  # nothing failed yet
    _, empty = nrt.nrt_allocate_tensor_set()
    _, outputs = nrt.nrt_allocate_tensor_set()
    assert nrt.nrt_execute(model, empty, outputs) == nrt.NRT_EXEC_BAD_INPUT
    trace = json.loads((tmp_path / f"inspect-s1-{os.getpid()}-fail1.json").read_text())
    assert trace["otherData"]["failure"]["status"] == "NRT_EXEC_BAD_INPUT"
    assert [c["name"] for c in _calls(trace["traceEvents"])] == ["nrt_execute", "nrt_execute"]
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS
    assert [p.name for p in tmp_path.glob("*.json")] == [f"inspect-s1-{os.getpid()}-fail1.json"]


def test_inspect_variables_begin_a_session_at_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_RT_INSPECT_ENABLE", "1")
    monkeypatch.setenv("NEURON_RT_INSPECT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_RT_INSPECT_DEVICE_PROFILE", "0")
    _init()
    assert nrt.nrt_inspect_begin() == nrt.NRT_FAILURE  # nrt_init began it
    _, options = nrt.nrt_profile_continuous_options_allocate()
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_SUCCESS  # no device profile
    _run(_load(_crm()))
    nrt.nrt_close()
    kinds = {e.get("cat") for e in _events(tmp_path / f"inspect-s1-{os.getpid()}.json")}
    assert "request" in kinds and "infer" not in kinds
    # With the device profile, continuous profiling does not start beside it.
    monkeypatch.delenv("NEURON_RT_INSPECT_DEVICE_PROFILE")
    _init()
    assert nrt.nrt_profile_continuous_start(options) == nrt.NRT_FAILURE
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NEURON_RT_INSPECT_ENABLE", "maybe"),
        ("NEURON_RT_INSPECT_EVENT_FILTER_TYPE", "hw_notify"),
        ("NEURON_RT_INSPECT_EVENT_FILTER_NC", "3-1"),
    ],
)
def test_a_malformed_inspect_variable_fails_init(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("NEURON_RT_INSPECT_ON_FAIL", "1")
    monkeypatch.setenv(name, value)
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_INVALID
    assert nrt.nrt_get_visible_nc_count()[0] in (nrt.NRT_UNINITIALIZED, nrt.NRT_CLOSED)
    monkeypatch.delenv(name)
    _init()  # the cores were given back


def test_inspect_begin_reads_the_variables_and_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _init()
    model = _load(_crm())
    assert nrt.nrt_inspect_begin() == nrt.NRT_SUCCESS  # nothing enabled: nothing captured
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS
    assert not list(tmp_path.glob("*"))
    monkeypatch.setenv("NEURON_RT_INSPECT_ENABLE", "1")
    monkeypatch.setenv("NEURON_RT_INSPECT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_RT_INSPECT_EVENT_FILTER_TYPE", "request,memory")
    monkeypatch.setenv("NEURON_RT_INSPECT_CPU_UTIL", "0")
    assert nrt.nrt_inspect_begin() == nrt.NRT_SUCCESS
    _run(model)
    assert nrt.nrt_inspect_stop() == nrt.NRT_SUCCESS
    trace = json.loads((tmp_path / f"inspect-s1-{os.getpid()}.json").read_text())
    assert {e.get("cat") for e in trace["traceEvents"] if e["ph"] != "M"} <= {"request", "memory"}
    assert "cpu_util" not in trace["otherData"]
