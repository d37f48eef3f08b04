"""The daemon driven by tritonclient as a user would: metadata, inference with and without
system shared memory, streaming, the repository, statistics and the Prometheus text."""

from __future__ import annotations

import os
import queue
import re
import threading
import urllib.request
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from serving import Daemon
from tritonclient.utils import (
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64


def tiny_input(x: np.ndarray) -> tc.InferInput:
    i = tc.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def test_server_and_model_metadata(client: tc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "crossrt"
    assert {"model_repository", "system_shared_memory", "statistics"} <= set(meta.extensions)
    tiny = client.get_model_metadata("tiny")
    assert tiny.versions == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in tiny.inputs] == [("x", "FP32", [4, 8])]
    relu = client.get_model_metadata("relu", "2")
    assert relu.versions == ["2"]
    assert client.is_model_ready("relu", "2") and not client.is_model_ready("relu", "1")
    adder = client.get_model_metadata("adder")
    assert list(adder.inputs[0].shape) == [-1]
    config = client.get_model_config("tiny").config
    assert config.name == "tiny" and config.instance_group[0].count == 1
    assert [d for d in config.input[0].dims] == [4, 8]


def test_infer_matches_in_process(client: tc.InferenceServerClient) -> None:
    x = np.random.default_rng(0).random((4, 8), dtype=np.float32)
    result = client.infer("tiny", [tiny_input(x)], request_id="r1")
    np.testing.assert_allclose(result.as_numpy("y"), x @ W + 1, rtol=1e-6)
    assert result.get_response().id == "r1"
    # a dynamic input: any length
    v = np.arange(5, dtype=np.float32)
    i = tc.InferInput("x", [5], "FP32")
    i.set_data_from_numpy(v)
    assert client.infer("adder", [i]).as_numpy("y").tolist() == (v + 1).tolist()


def test_infer_through_system_shared_memory(client: tc.InferenceServerClient) -> None:
    x = np.random.default_rng(1).random((4, 8), dtype=np.float32)
    key = f"/crossrt-test-{os.getpid()}"
    region = shm.create_shared_memory_region("io", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        client.register_system_shared_memory("io", key, 2 * x.nbytes)
        status = client.get_system_shared_memory_status()
        assert status.regions["io"].byte_size == 2 * x.nbytes
        i = tc.InferInput("x", [4, 8], "FP32")
        i.set_shared_memory("io", x.nbytes)
        out = tc.InferRequestedOutput("y")
        out.set_shared_memory("io", x.nbytes, offset=x.nbytes)
        result = client.infer("tiny", [i], outputs=[out])
        sent = result.get_output("y")  # the output went to the region
        assert sent.parameters["shared_memory_region"].string_param == "io"
        assert list(sent.shape) == [4, 8]
        y = shm.get_contents_as_numpy(region, np.float32, [4, 8], offset=x.nbytes)
        np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)
        client.unregister_system_shared_memory("io")
        assert "io" not in client.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(region)


def test_streaming(client: tc.InferenceServerClient) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    xs = [np.full((4, 8), k, np.float32) for k in range(5)]
    try:
        for k, x in enumerate(xs):
            client.async_stream_infer("tiny", [tiny_input(x)], request_id=str(k))
        bad = tc.InferInput("x", [4, 8], "FP64")
        bad.set_data_from_numpy(np.zeros((4, 8)))
        client.async_stream_infer("tiny", [bad], request_id="bad")
        client.async_stream_infer("tiny", [tiny_input(xs[0])], request_id="after")
        got = [answers.get(timeout=30) for _ in range(len(xs) + 2)]
    finally:
        client.stop_stream()
    for k, (result, error) in enumerate(got[: len(xs)]):
        assert error is None
        assert result.get_response().id == str(k)
        np.testing.assert_allclose(result.as_numpy("y"), xs[k] @ W + 1, rtol=1e-6)
    result, error = got[len(xs)]
    assert result is None and "expected datatype FP32" in str(error)
    result, error = got[-1]
    assert error is None and result.get_response().id == "after"


def test_repository_load_and_unload(daemon: Daemon, client: tc.InferenceServerClient) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert {"tiny", "relu", "adder"} <= set(index)
    assert index["relu"].version == "2" and index["relu"].state == "READY"
    client.unload_model("adder")
    assert not client.is_model_ready("adder")
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("adder")
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "RepositoryModelLoad" in info.value.message()
    client.load_model("adder", config=None)
    assert client.is_model_ready("adder")
    # load parameters: instances and queue depth
    stub_params = {"instances": "2", "queue_depth": "4"}
    _load_with_parameters(daemon, "adder", stub_params)
    assert client.get_model_config("adder").config.instance_group[0].count == 2
    with pytest.raises(InferenceServerException) as info:
        _load_with_parameters(daemon, "adder", {"instances": "zero"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "whole number" in info.value.message()
    assert client.is_model_ready("adder")  # a failed reload leaves the old one serving
    with pytest.raises(InferenceServerException) as info:
        _load_with_parameters(daemon, "adder", {"precision": "bf16"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "compiled already" in info.value.message()  # a .crm: precision was chosen then
    with pytest.raises(InferenceServerException) as info:
        client.load_model("missing")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def _load_with_parameters(daemon: Daemon, name: str, params: dict[str, str]) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        request = pb.RepositoryModelLoadRequest(model_name=name)
        for k, v in params.items():
            request.parameters[k].string_param = v
        try:
            pbg.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
        except grpc.RpcError as exc:
            raise InferenceServerException(msg=exc.details(), status=str(exc.code())) from None


def test_statistics_and_metrics(daemon: Daemon, client: tc.InferenceServerClient) -> None:
    before = client.get_inference_statistics("relu").model_stats[0]
    x = np.ones((2, 3), np.float32)
    i = tc.InferInput("x", [2, 3], "FP32")
    i.set_data_from_numpy(x)
    for _ in range(3):
        client.infer("relu", [i])
    with pytest.raises(InferenceServerException):  # refused before it reaches the model
        client.infer("relu", [tiny_input(np.ones((4, 8), np.float32))])
    stats = client.get_inference_statistics("relu").model_stats[0]
    assert stats.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert (stats.name, stats.version) == ("relu", "2")
    s = stats.inference_stats
    assert s.success.count == before.inference_stats.success.count + 3
    assert s.success.ns > 0 and s.compute_infer.count == s.success.count
    assert stats.execution_count >= 3 and stats.last_inference > 0
    everything = client.get_inference_statistics().model_stats
    assert {m.name for m in everything} >= {"tiny", "relu"}
    assert daemon.metrics is not None
    text = urllib.request.urlopen(daemon.metrics, timeout=10).read().decode()
    line = (
        f'crossrt_inference_request_success_total{{model="relu",version="2"}} {s.success.count}.0'
    )
    assert line in text
    failed = re.findall(
        r'crossrt_inference_request_failure_total\{model="relu",reason="\w+",version="2"\} (\S+)',
        text,
    )
    assert len(failed) == 4 and sum(map(float, failed)) == s.fail.count  # Triton's 4 reasons
    for name in (
        "crossrt_inference_count_total",
        "crossrt_inference_exec_count_total",
        "crossrt_inference_request_duration_us_total",
        "crossrt_inference_queue_duration_us_total",
        "crossrt_inference_compute_infer_duration_us_total",
        "crossrt_inference_pending_request_count",
    ):
        assert f'{name}{{model="relu",version="2"}}' in text, name
    for name in ("hits", "misses", "evictions", "compile_seconds"):  # the compile cache's
        assert f"\ncrossrt_cache_{name}_total " in text, name


def test_sixteen_clients_every_answer_checked(daemon: Daemon) -> None:
    """16 clients x 500 requests at once, each with its own input: every answer is its own."""
    wrong: list[int] = []
    right: list[int] = []

    def client(k: int) -> None:
        c = daemon.client()
        rng = np.random.default_rng(100 + k)
        for _ in range(500):
            x = rng.random((4, 8), dtype=np.float32)
            y = c.infer("tiny", [tiny_input(x)]).as_numpy("y")
            ok = y is not None and np.allclose(y, x @ W + 1, rtol=1e-5)
            (right if ok else wrong).append(k)
        c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [] and len(right) == 16 * 500


def test_strings_travel_as_bytes(client: tc.InferenceServerClient) -> None:
    """A string model through tritonclient: BYTES in, BYTES out, in the message and through
    system shared memory (as tritonclient serializes them)."""
    words = np.array(["héllo", "", "wörld"], dtype=object)
    text = tc.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(words)
    result = client.infer("text", [text])
    assert [w.decode() for w in result.as_numpy("same")] == list(words)
    assert result.as_numpy("first").tolist() == ["héllo".encode()]
    meta = client.get_model_metadata("text")
    assert [(t.name, t.datatype) for t in meta.inputs] == [("text", "BYTES")]
    # Through system shared memory, serialized as tritonclient does.
    serialized = serialize_byte_tensor(words)
    size = serialized_byte_size(serialized)
    key = f"/crossrt-test-bytes-{os.getpid()}"
    region = shm.create_shared_memory_region("words", key, size + 256)
    try:
        shm.set_shared_memory_region(region, [serialized])
        client.register_system_shared_memory("words", key, size + 256)
        text = tc.InferInput("text", [3], "BYTES")
        text.set_shared_memory("words", size)
        out = tc.InferRequestedOutput("same")
        out.set_shared_memory("words", 256 - 8, offset=size + 8)
        result = client.infer("text", [text], outputs=[out])
        sent = result.get_output("same")
        assert sent.parameters["shared_memory_byte_size"].int64_param == size
        back = shm.get_contents_as_numpy(region, np.object_, [3], offset=size + 8)
        assert [w.decode() for w in back] == list(words)
        client.unregister_system_shared_memory("words")
    finally:
        shm.destroy_shared_memory_region(region)
