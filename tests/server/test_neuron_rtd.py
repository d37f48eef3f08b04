"""``crossrt serve --semantics neuron-rtd``: seed 003's meanings over crossrt.v1, against a
real daemon. Implicit core groups hold their cores alone (LOAD_NOT_ENOUGH_NC when none are
free); a group smaller than a model's nodes runs it in shared NC mode (one request at a time
through its nodes), a large enough one in normal mode (pipelined); ``ninfer`` bounds the
requests in flight (QUEUE_FULL past it); a second model started on a busy group gets
EXEC_NC_BUSY (1005); ``enable_tracing`` / ``enable_node_profiling`` write a profile."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
from onnx import TensorProto
from serving import Daemon, start_daemon

import crossrt
from concurrency_models import pipelined, tiny
from crossrt import GraphBuilder, StatusCode
from crossrt.server.client import RemoteRuntime, connect
from crossrt.server.proto import runtime_pb2 as v1

X = np.ones((4, 8), np.float32)
W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64


@pytest.fixture(scope="module")
def rtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with neuron-rtd semantics and nothing loaded at start (a repository model
    would hold cores)."""
    folder = tmp_path_factory.mktemp("rtd")
    (folder / "empty").mkdir()
    args = ["--model-control", "explicit", "--semantics", "neuron-rtd"]
    daemon = start_daemon(folder, folder / "empty", args)
    yield daemon
    assert daemon.stop() == 0, "".join(daemon.log)


@pytest.fixture
def remote(rtd: Daemon) -> Iterator[RemoteRuntime]:
    with connect(rtd.url) as remote:
        groups: list[Any] = []
        made = remote.create_core_group

        def create_core_group(*args: Any, **kwargs: Any) -> Any:
            groups.append(made(*args, **kwargs))
            return groups[-1]

        remote.create_core_group = create_core_group  # type: ignore[method-assign]
        yield remote
        for what in [*remote.models, *groups]:  # what a failed test left behind
            with contextlib.suppress(crossrt.CrossrtError):
                what.unload() if hasattr(what, "unload") else what.destroy()


def cores_of(remote: RemoteRuntime) -> int:
    return len(remote.call("v1.Devices", v1.DevicesRequest()).daemon_cores)


def load(remote: RemoteRuntime, model: Any, name: str, group: Any = None, **params: Any) -> Any:
    """``model`` (a Model or an Executable) sent to the daemon as ``name``."""
    return remote.load(model.to_bytes(), name=name, group=group, **params)


def test_implicit_groups_hold_their_cores_alone(remote: RemoteRuntime) -> None:
    everything = cores_of(remote)
    first = load(remote, tiny(), "all-cores", cores=everything)
    assert (first.mode, first.profile) == ("normal", None)  # no profile asked for
    with pytest.raises(crossrt.CrossrtError) as info:
        load(remote, tiny(), "no-room")  # crossrt's default would share the cores
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert "unload" in str(info.value)
    first.unload()
    now = load(remote, tiny(), "now-room")
    np.testing.assert_allclose(now.run(X)["y"], X @ W + 1, rtol=1e-6)
    # An implicit group is gone with its model: a group of every core can be made again.
    now.unload()
    remote.create_core_group(cores=everything).destroy()


def test_a_second_model_on_a_busy_group_is_nc_busy(remote: RemoteRuntime) -> None:
    group = remote.create_core_group(indices=[0])
    first, second = load(remote, tiny(), "first", group), load(remote, tiny(), "second", group)
    first.start()
    with pytest.raises(crossrt.CrossrtError) as started:
        second.start()
    assert started.value.code is StatusCode.EXEC_NC_BUSY
    assert "'first'" in str(started.value)
    with pytest.raises(crossrt.CrossrtError) as posted:
        second.post(X)
    assert posted.value.code is StatusCode.EXEC_NC_BUSY
    with pytest.raises(crossrt.CrossrtError) as ran:  # KServe's ModelInfer too (rtd's infer)
        second.run(X)
    assert ran.value.code is StatusCode.EXEC_NC_BUSY, ran.value  # was OPERATION_FORBIDDEN
    first.stop()
    second.start()
    np.testing.assert_allclose(second.wait(second.post(X), 30)["y"], X @ W + 1, rtol=1e-6)
    second.stop()
    first.unload()
    second.unload()
    group.destroy()


def test_ninfer_is_the_most_requests_in_flight(remote: RemoteRuntime) -> None:
    # A run long enough (~0.1-1 s) that the three posts below are made while it runs.
    b = GraphBuilder("slow")
    x = b.input("x", "float32", [256, 256])
    w = b.constant(np.eye(256, dtype=np.float32))
    h = x
    for _ in range(400):
        h = b.op("MatMul", [h, w])
    b.output(b.op("Identity", [h], outputs=["y"]))
    model = load(remote, b.finish(), "slow", ninfer=2, cores=1)
    x = np.ones((256, 256), np.float32)
    cookies = [model.post(x), model.post(x)]
    with pytest.raises(crossrt.CrossrtError) as info:
        model.post(x)
    assert info.value.code is StatusCode.QUEUE_FULL
    assert "ninfer" in str(info.value)
    with pytest.raises(crossrt.CrossrtError) as ran:  # a synchronous infer counts too
        model.run(x)
    assert ran.value.code is StatusCode.QUEUE_FULL, ran.value  # it waited its turn before
    for cookie in cookies:
        np.testing.assert_array_equal(model.wait(cookie, 60)["y"], x)
    model.unload()


def test_ninfer_and_queue_depth_together_are_refused(remote: RemoteRuntime) -> None:
    with pytest.raises(crossrt.CrossrtError) as info:
        load(remote, tiny(), "both", ninfer=2, queue_depth=3)
    assert info.value.code is StatusCode.INVALID
    assert "ninfer or queue_depth, not both" in str(info.value)


def three_nodes() -> crossrt.Executable:
    """ORT -> reference -> ORT (concurrency_models.pipelined), compiled here with fallback."""
    exe = crossrt.compile(pipelined(), fallback="cpu")
    assert len(exe.nodes) == 3
    return exe


def node_spans(trace: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(start, end, node name) of every node run in a trace, by start."""
    spans = [
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in trace["traceEvents"]
        if e.get("cat") == "node"
    ]
    return sorted(spans)


def read_profile(path: str) -> dict[str, Any]:
    assert os.path.isabs(path), path
    return json.loads(Path(path).read_text())


def test_a_group_smaller_than_the_model_runs_it_one_request_at_a_time(
    remote: RemoteRuntime,
) -> None:
    """Seed 003's shared NC mode: the three nodes share one core and pipelining is off, so
    no node of a request starts before the previous request's last node ends."""
    group = remote.create_core_group(indices=[0])
    model = load(remote, three_nodes(), "shared-nc", group, enable_node_profiling=True, ninfer=6)
    assert model.mode == "shared"
    assert model.profile
    model.start()
    x = np.ones((256, 256), np.float32)
    cookies = [model.post(x) for _ in range(6)]
    for cookie in cookies:
        assert model.wait(cookie, 60) is not None
    model.stop()
    model.unload()
    group.destroy()
    spans = node_spans(read_profile(model.profile))
    assert len(spans) == 18
    for before, after in itertools.pairwise(spans):
        assert after[0] >= before[1], f"{after} began before {before} ended: pipelined"


def test_a_group_as_large_as_the_model_runs_it_pipelined(remote: RemoteRuntime) -> None:
    """Normal mode: each node on cores of its own, the requests through them in a pipeline."""
    if cores_of(remote) < 2:
        pytest.skip("normal mode of a two-node model needs two cores; this daemon has one")
    b = GraphBuilder("two_nodes")
    x = b.input("x", "float32", [256, 256])
    w = b.constant(np.eye(256, dtype=np.float32))
    h = x
    for _ in range(40):
        h = b.op("MatMul", [h, w])
    as_int = b.op("Cast", [b.op("Relu", [h])], to=TensorProto.INT16)
    b.output(b.op("Max", [as_int, as_int]))  # int16 Max: a reference node after the ORT one
    group = remote.create_core_group(indices=[0, 1])
    exe = crossrt.compile(b.finish(), fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference"]
    model = load(remote, exe, "normal", group, enable_node_profiling=True, ninfer=8)
    assert model.mode == "normal"
    model.start()
    cookies = [model.post(np.ones((256, 256), np.float32)) for _ in range(8)]
    for cookie in cookies:
        assert model.wait(cookie, 60) is not None
    model.stop()
    model.unload()
    group.destroy()
    spans = node_spans(read_profile(model.profile))
    assert len(spans) == 16
    overlaps = sum(after[0] < before[1] for before, after in itertools.pairwise(spans))
    assert overlaps, "no request entered a node while another was in the next one"


def test_enable_tracing_alone_writes_the_requests_not_the_nodes(remote: RemoteRuntime) -> None:
    group = remote.create_core_group(indices=[0])
    model = load(remote, three_nodes(), "traced", group, enable_tracing=True)
    model.start()
    assert model.wait(model.post(np.ones((256, 256), np.float32)), 60) is not None
    model.stop()
    model.unload()
    group.destroy()
    trace = read_profile(model.profile)
    assert not node_spans(trace)
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "request"}
    assert {"traced", "queue", "infer"} <= names
    assert trace["otherData"]["summary"][0]["requests"] == 1


def test_the_semantics_setting_is_checked() -> None:
    from crossrt.errors import InvalidOptionError
    from crossrt.server.settings import build

    assert build(None, {"semantics": "neuron-rtd"}).semantics == "neuron-rtd"
    assert build(None, {}).semantics == "crossrt"
    with pytest.raises(InvalidOptionError, match=r"'crossrt' .*or 'neuron-rtd'"):
        build(None, {"semantics": "rtd"})
