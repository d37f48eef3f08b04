"""Core groups (start/stop, one running, destroy), requests, Request.repeat and numerics checks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import crossrt
from crossrt import GraphBuilder, StatusCode

X = np.ones((4, 8), np.float32)


def test_explicit_group_loads_stopped_and_runs_one_model_at_a_time(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    group = rt.create_core_group(cores=1)
    assert group.indices == (0,) and not group.implicit
    a, b = rt.load(tiny_exe, group=group), rt.load(tiny_exe, group=group)
    assert not a.running and not b.running
    with pytest.raises(crossrt.errors.OperationForbiddenError) as stopped:
        a.run({"x": X})
    assert "start()" in stopped.value.message
    with pytest.raises(crossrt.errors.OperationForbiddenError):
        a.run_async({"x": X})
    a.start()
    assert a.running and group.running is a
    assert a.run({"x": X})["y"].shape == (4, 8)
    with pytest.raises(crossrt.errors.OperationForbiddenError) as busy:
        b.start()
    assert busy.value.code is StatusCode.OPERATION_FORBIDDEN
    assert "stop it" in busy.value.message
    a.stop()
    b.start()
    assert b.run({"x": X})["y"].shape == (4, 8)
    with pytest.raises(crossrt.errors.OperationForbiddenError):
        a.run({"x": X})


def test_destroy_refuses_a_group_with_models_and_names_them(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    group = rt.create_core_group(indices=[0])
    model = rt.load(tiny_exe, group=group)
    with pytest.raises(crossrt.errors.OperationForbiddenError) as info:
        group.destroy()
    assert "'tiny_mm'" in info.value.message
    model.unload()
    group.destroy()
    assert group not in rt.core_groups
    with pytest.raises(crossrt.errors.InvalidHandleError):
        rt.load(tiny_exe, group=group)


def test_a_core_belongs_to_one_explicit_group(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    group = rt.create_core_group(indices=[0])
    with pytest.raises(crossrt.errors.OperationForbiddenError):
        rt.create_core_group(indices=[0])
    with pytest.raises(crossrt.errors.OperationForbiddenError):
        rt.load(tiny_exe, cores=[0])  # an implicit group may not take an explicit group's core
    with pytest.raises(crossrt.OutOfResourcesError) as info:
        rt.create_core_group(cores=len(rt.cores))
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    if len(rt.cores) > 1:  # a load without core indices takes what explicit groups leave
        assert 0 not in rt.load(tiny_exe).cores
        assert rt.load(tiny_exe, cores=1).cores == (1,)
    group.destroy()


def test_implicit_groups_come_and_go_with_their_model(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    assert model.running
    (group,) = rt.core_groups
    assert group.implicit and group.models == [model] and group.indices == model.cores
    with pytest.raises(crossrt.OutOfResourcesError) as info:
        rt.create_core_group(cores=1)  # the implicit group holds every core
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    with pytest.raises(crossrt.errors.OperationForbiddenError):
        rt.create_core_group(indices=[0])
    other = rt.load(tiny_exe)  # implicit groups may share cores: the CPU is time-shared
    assert len(rt.core_groups) == 2
    model.unload()
    assert rt.core_groups == [other.instances.group]
    other.unload()
    assert rt.core_groups == []


def test_normal_mode_gives_each_node_its_own_cores(rt: crossrt.Runtime) -> None:
    b = GraphBuilder("two_nodes")
    x = b.input("x", "float32", [2, 3])
    as_int = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.INT16)
    b.output(b.op("Max", [as_int, as_int]))  # int16 Max: a reference node after the ORT one
    exe = crossrt.compile(b.finish(), fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference"]
    shared = rt.load(exe, mode="shared")
    assert _threads(shared) == [len(rt.cores)]
    feed = {"x": np.ones((2, 3), np.float32)}
    name = exe.outputs[0].name
    if len(rt.cores) >= 2:
        normal = rt.load(exe, mode="normal", cores=2)
        assert _threads(normal) == [1]
        np.testing.assert_array_equal(normal.run(feed)[name], shared.run(feed)[name])
    with pytest.raises(crossrt.OutOfResourcesError) as info:
        rt.load(exe, mode="normal", cores=1)
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC


def _threads(model: crossrt.LoadedModel) -> list[int]:
    return [
        p.session.get_session_options().intra_op_num_threads
        for p in model._programs
        if hasattr(p, "session")
    ]


def test_request_binds_once_and_runs_many_times(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    out = np.empty((4, 8), np.float32)
    request = model.request(outputs={"y": out})
    request.set_input("x", X)
    assert request.run()["y"] is out
    np.testing.assert_array_equal(out, model.run({"x": X})["y"])
    request.set_input("x", X * 2)
    request.run_async().result(10)
    np.testing.assert_array_equal(out, model.run({"x": X * 2})["y"])
    with pytest.raises(crossrt.InvalidInputError):
        request.set_input("z", X)


def test_run_repeat_feeds_outputs_back(rt: crossrt.Runtime) -> None:
    b = GraphBuilder("step")
    x = b.input("x", "float32", [3])
    b.output(b.op("Add", [x, b.constant(np.ones(3, np.float32))], outputs=["next"]))
    model = rt.load(b.finish())
    result = model.request({"x": np.zeros(3, np.float32)}).repeat(5, feedback={"next": "x"})
    np.testing.assert_array_equal(result["next"], np.full(3, 5, np.float32))
    with pytest.raises(crossrt.InvalidArgumentError):
        model.request({"x": np.zeros(3, np.float32)}).repeat(2, feedback={"nope": "x"})


def log_model() -> crossrt.Model:
    b = GraphBuilder("logs")
    x = b.input("x", "float32", [3])
    b.output(b.op("Log", [x], outputs=["log"]))
    b.output(b.op("Abs", [x], outputs=["abs"]))
    return b.finish()


def test_check_numerics_names_the_outputs_with_nan_or_inf(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(log_model())
    bad = np.array([1.0, 0.0, -1.0], np.float32)
    assert not np.isfinite(rt.load(exe).run({"x": bad})["log"]).all()  # off by default
    model = rt.load(exe, check_numerics=True)
    assert model.run({"x": np.ones(3, np.float32)})["abs"].tolist() == [1, 1, 1]
    with pytest.raises(crossrt.ExecutionError) as info:
        model.run({"x": bad})
    assert info.value.code is StatusCode.EXEC_COMPLETED_WITH_NUM_ERR
    assert info.value.details["outputs"] == ["log"]
    with pytest.raises(crossrt.ExecutionError) as later:
        model.run_async({"x": bad}).result(10)
    assert later.value.code is StatusCode.EXEC_COMPLETED_WITH_NUM_ERR


def test_check_numerics_from_the_environment(
    rt: crossrt.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSRT_CHECK_NUMERICS", "1")
    model = rt.load(crossrt.compile(log_model()))
    assert model.instances.check_numerics
    with pytest.raises(crossrt.ExecutionError):
        model.run({"x": np.zeros(3, np.float32)})
