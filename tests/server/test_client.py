"""``connect()``: the daemon's models behind the Runtime API, giving what the same ``.crm``
gives in-process."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from serving import Daemon
from tritonclient.utils import InferenceServerException

import crossrt
from crossrt.runtime.statistics import ModelStatistics
from crossrt.server.client import connect


def test_remote_outputs_are_the_in_process_ones(daemon: Daemon) -> None:
    x = np.random.default_rng(3).random((4, 8), dtype=np.float32)
    with crossrt.Runtime() as rt:
        local = rt.load(crossrt.load_executable(daemon.repository / "tiny.crm")).run({"x": x})
    with connect(daemon.url) as remote:
        model = remote.load("tiny")
        assert [s.name for s in model.inputs] == ["x"] and model.version == "1"
        assert [(i.name, i.usage, i.size) for i in model.tensor_info()] == [
            ("x", "input", 128),
            ("y", "output", 128),
        ]
        got = model.run({"x": x})
        assert got.keys() == local.keys()
        np.testing.assert_array_equal(got["y"], local["y"])
        triton = tc.InferInput("x", [4, 8], "FP32")
        triton.set_data_from_numpy(x)
        np.testing.assert_array_equal(
            daemon.client().infer("tiny", [triton]).as_numpy("y"), got["y"]
        )
        np.testing.assert_array_equal(model.run_async(x).result()["y"], local["y"])
        np.testing.assert_array_equal(asyncio.run(model.infer(x))["y"], local["y"])
        assert model.triton_statistics().inference_stats.success.count >= 3


def test_statistics_are_the_same_type_through_connect(daemon: Daemon) -> None:
    """``statistics()`` of a remote model is a ``ModelStatistics``, as in-process: failures by
    status, percentiles, instances; what Triton's message has agrees with it."""
    x = np.ones((4, 8), np.float32)
    with connect(daemon.url) as remote:
        model = remote.load("tiny")
        before = model.statistics()
        assert isinstance(before, ModelStatistics)
        for _ in range(5):
            model.run({"x": x})
        with pytest.raises(crossrt.CrossrtError):
            model.run({"x": np.ones((4, 9), np.float32)})  # refused by the client's own check
        bad = tc.InferInput("x", [4, 9], "FP32")
        bad.set_data_from_numpy(np.ones((4, 9), np.float32))
        with pytest.raises(InferenceServerException):
            daemon.client().infer("tiny", [bad])
        after = model.statistics()
        triton = model.triton_statistics().inference_stats
    assert after.success - before.success >= 5
    assert after.failure > before.failure
    assert after.percentile_us(50) is not None and after.latency.count == after.success
    assert triton.success.count == after.success
    assert triton.fail.count == after.failure
    assert ModelStatistics.from_dict(after.to_dict()) == after


def test_connect_is_exported_from_the_package_root() -> None:
    assert crossrt.connect is connect
    assert crossrt.RemoteRuntime.__name__ == "RemoteRuntime"


def test_large_tensors_go_through_shared_memory(
    daemon: Daemon, client: tc.InferenceServerClient
) -> None:
    x = np.arange(4096, dtype=np.float32)
    with connect(f"unix:{daemon.socket}", shm_threshold=1024) as remote:
        adder = remote.load("adder")  # dynamic output: the input alone goes through shm
        np.testing.assert_array_equal(adder.run(x)["y"], x + 1)
        tiny = remote.load("tiny")  # static: input and output both
        y = tiny.run(np.ones((4, 8), np.float32))["y"]
        assert y.shape == (4, 8)
        regions = client.get_system_shared_memory_status().regions
        assert len(regions) == 1  # this client's segment for adder (tiny's 256 B is below)
        for _ in range(3):
            adder.run(x)
        assert len(client.get_system_shared_memory_status().regions) == 1  # reused
    assert len(client.get_system_shared_memory_status().regions) == 0  # released on close


def test_static_outputs_come_back_through_shared_memory(daemon: Daemon) -> None:
    with connect(daemon.url, shm_threshold=1) as remote:
        tiny = remote.load("tiny")
        x = np.full((4, 8), 2, np.float32)
        expected = x @ (np.arange(64, dtype=np.float32).reshape(8, 8) / 64) + 1
        for _ in range(2):
            np.testing.assert_allclose(tiny.run(x)["y"], expected, rtol=1e-6)


def test_errors_are_crossrt_errors(daemon: Daemon, tmp_path: object) -> None:
    with connect(daemon.url) as remote:
        tiny = remote.load("tiny")
        with pytest.raises(crossrt.InvalidArgumentError, match="expected datatype FP32"):
            tiny.run(np.ones((4, 8), np.float64))
        with pytest.raises(crossrt.CrossrtError) as info:
            remote.load("no-such-model")
        assert info.value.code == crossrt.StatusCode.NOT_FOUND
        assert tiny.run(np.ones((4, 8), np.float32))["y"].shape == (4, 8)
    with pytest.raises(crossrt.ClosedError, match="not answering"):
        connect(f"unix:{daemon.socket}.absent", timeout=5)


def test_strings_through_connect(daemon: Daemon) -> None:
    words = np.array(["héllo", "", "wörld"], dtype=object)
    with connect(daemon.url, shm_threshold=0) as remote:  # strings stay in the message
        got = remote.load("text").run({"text": words})
    assert got["same"].tolist() == list(words) and got["first"].tolist() == ["héllo"]


@pytest.mark.parametrize("shm_threshold", [None, 1], ids=["in-message", "shared-memory"])
@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
def test_outputs_are_written_into_the_arrays_given(
    daemon: Daemon, lane: bool, shm_threshold: int | None
) -> None:
    """``run(x, outputs={name: array})`` as ``LoadedModel.run`` takes it: the output lands
    in the caller's array, which the result holds; a wrong name, dtype or shape is refused
    with a message, and the model serves on."""
    x = np.random.default_rng(5).random((4, 8), dtype=np.float32)
    kwargs = {} if shm_threshold is None else {"shm_threshold": shm_threshold}
    with connect(daemon.url, lane=lane, **kwargs) as remote:
        model = remote.load("tiny")
        expected = model.run({"x": x})["y"]
        out = np.empty((4, 8), np.float32)
        got = model.run({"x": x}, {"y": out})
        assert got["y"] is out
        np.testing.assert_array_equal(out, expected)
        with pytest.raises(crossrt.InvalidArgumentError, match="no output 'z'"):
            model.run({"x": x}, {"z": out})
        with pytest.raises(crossrt.InvalidArgumentError, match="writable NumPy array"):
            model.run({"x": x}, {"y": out.tolist()})  # type: ignore[dict-item]
        with pytest.raises(crossrt.ExecutionError, match="buffer given"):
            model.run({"x": x}, {"y": np.empty((4, 8), np.float64)})
        np.testing.assert_array_equal(model.run({"x": x})["y"], expected)
        later = np.empty((4, 8), np.float32)
        assert model.run_async({"x": x}, {"y": later}).result()["y"] is later
        awaited = np.empty((4, 8), np.float32)
        assert asyncio.run(model.infer({"x": x}, {"y": awaited}))["y"] is awaited
        np.testing.assert_array_equal(later, expected)
        np.testing.assert_array_equal(awaited, expected)


def test_a_remote_model_is_a_runnable_model(daemon: Daemon) -> None:
    """A model of ``connect()`` is a ``crossrt.RunnableModel``, as a ``LoadedModel`` is: code
    written against the protocol runs either and gets the same outputs."""

    def outputs(model: crossrt.RunnableModel, x: np.ndarray) -> list[np.ndarray]:
        assert isinstance(model, crossrt.RunnableModel), type(model)
        assert [s.name for s in model.inputs] == ["x"] and model.name == "tiny"
        return [model.run({"x": x})["y"], model.run_async({"x": x}).result()["y"]]

    x = np.random.default_rng(5).random((4, 8), dtype=np.float32)
    with crossrt.Runtime() as rt, connect(daemon.url) as remote:
        exe = crossrt.load_executable(daemon.repository / "tiny.crm")
        local = outputs(rt.load(exe, name="tiny"), x)
        for got, want in zip(outputs(remote.load("tiny"), x), local, strict=True):
            np.testing.assert_array_equal(got, want)
