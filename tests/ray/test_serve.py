"""crossrt on Ray Serve end to end, on a real local cluster (a head and a worker node): two
replicas with disjoint pinned cores, KServe v2 through Serve's gRPC and HTTP proxies giving
raw onnxruntime's outputs (tritonclient, and the held-out asyncio client), the Runtime API
over a deployment handle, and the statistics under the daemon's metric names."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tc
from ray_models import LOOPBACK, RayCluster, placements, raw_ort

import crossrt
from crossrt.scaleout.ray import RayModel, ReplicaConfig, Scaling, application

APP = "main"
HEADERS = {"application": APP}


@pytest.fixture(scope="module")
def main_app(ray_cluster: RayCluster, crm_dir: Path) -> Iterator[Any]:
    """The repository of every test model on two replicas of one core each."""
    from ray import serve

    config = ReplicaConfig(str(crm_dir), cores=1, load={"max_batch_size": 4})
    app = application(config, Scaling(replicas=2), name=APP)
    handle = serve.run(app, name=APP, route_prefix=f"/{APP}")
    try:
        yield handle
    finally:
        serve.delete(APP)


def affinities(pid: int) -> dict[int, frozenset[int]]:
    """What the kernel says each thread of ``pid`` may run on."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        except OSError:  # the thread ended
            continue
    return out


def test_both_nodes_are_on_loopback(ray_cluster: RayCluster) -> None:
    """Issue 26: a head and a worker node on loopback. Each node registers the loopback
    address as its own, the cluster's (GCS) address is there, and every connection the
    nodes' processes hold is between loopback addresses. (What they listen on is Ray's
    choice: its gRPC servers bind every interface, whatever the node's address.)"""
    import ipaddress

    import psutil

    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2, nodes
    assert {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}, nodes
    assert ipaddress.ip_address(LOOPBACK).is_loopback
    assert ray_cluster.address.startswith(f"{LOOPBACK}:"), ray_cluster.address
    connected = [
        (pid, c.laddr, c.raddr)
        for pid in ray_cluster.node_pids
        if psutil.pid_exists(pid)
        for c in psutil.Process(pid).net_connections("inet")
        if c.status == psutil.CONN_ESTABLISHED
    ]
    assert connected  # the raylets' connections to the GCS at least

    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip)
        return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.x

    wide = [c for c in connected if not (loopback(c[1].ip) and loopback(c[2].ip))]
    assert not wide, f"node connections beyond loopback: {wide}"


def test_two_replicas_never_share_a_core(main_app: Any) -> None:
    model = RayModel(main_app, "mm")
    for _ in range(24):  # requests on both replicas (routed at random): their threads start
        model.run({"x": np.ones((1, 8), dtype=np.float32)})
    replicas = placements(main_app)
    a, b = replicas.values()
    assert a["exclusive"] and b["exclusive"]
    assert len(a["cores"]) == len(b["cores"]) == 1
    assert not set(a["cores"]) & set(b["cores"]), replicas
    for pid, placement in replicas.items():
        pinned = [cpus for cpus in affinities(pid).values() if cpus < set(placement["usable"])]
        assert pinned, f"replica {pid}: no thread is pinned"  # the instances' workers
        for cpus in pinned:
            assert cpus <= set(placement["cores"]), (pid, cpus, placement["cores"])


def test_tritonclient_over_the_serve_grpc_proxy_gives_raw_onnxruntime(
    main_app: Any, ray_cluster: RayCluster, crm_dir: Path
) -> None:
    client = tc.InferenceServerClient(f"127.0.0.1:{ray_cluster.grpc}")
    assert client.is_server_live(headers=HEADERS) and client.is_server_ready(headers=HEADERS)
    assert client.is_model_ready("mlp", headers=HEADERS)
    meta = client.get_model_metadata("mlp", headers=HEADERS)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 16])]
    rng = np.random.default_rng(0)
    for name, width in (("mm", 8), ("mlp", 16)):
        x = rng.standard_normal((3, width), dtype=np.float32)
        given = tc.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        answer = client.infer(name, [given], headers=HEADERS)
        np.testing.assert_allclose(
            answer.as_numpy("y"), raw_ort(crm_dir, name, {"x": x})[0], rtol=1e-6
        )
    # crossrt's own refusal, with its status, through the proxy
    with pytest.raises(tc.InferenceServerException) as refused:
        client.infer("nope", [given], headers=HEADERS)
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    assert "nope" in refused.value.message()


PERF_ANALYZER = Path(__file__).resolve().parents[2] / "benchmarks/.perf_analyzer/perf_analyzer"


def test_perf_analyzer_runs_over_the_serve_grpc_proxy(
    main_app: Any, ray_cluster: RayCluster
) -> None:
    if not os.access(PERF_ANALYZER, os.X_OK):
        pytest.skip(f"perf_analyzer is not at {PERF_ANALYZER}: `make perf-analyzer` fetches it")
    command = [str(PERF_ANALYZER), "-m", "mlp", "-i", "grpc", "-u", f"127.0.0.1:{ray_cluster.grpc}"]
    command += ["-H", f"application: {APP}", "--shape", "x:1,16"]
    command += ["--measurement-mode", "count_windows", "--measurement-request-count", "20"]
    command += ["--max-trials", "10", "--stability-percentage", "1000"]  # a run that answers
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"Throughput: [0-9.]+ infer/sec", out), out


def test_http_has_the_routes_of_crossrt_serve(
    main_app: Any, ray_cluster: RayCluster, crm_dir: Path
) -> None:
    base = f"http://127.0.0.1:{ray_cluster.http}/{APP}/v2"
    with urllib.request.urlopen(f"{base}/health/ready", timeout=30) as answer:
        assert answer.status == 200
    x = np.random.default_rng(1).standard_normal((2, 16), dtype=np.float32)
    body = {
        "inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    request = urllib.request.Request(f"{base}/models/mlp/infer", json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30) as answer:
        doc = json.load(answer)
    y = np.array(doc["outputs"][0]["data"], dtype=np.float32).reshape(doc["outputs"][0]["shape"])
    np.testing.assert_allclose(y, raw_ort(crm_dir, "mlp", {"x": x})[0], rtol=1e-6)
    # the same checks as crossrt serve's: a wrong shape is the client's error, 400, named
    body["inputs"][0]["shape"] = [3, 16]
    request = urllib.request.Request(f"{base}/models/mlp/infer", json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "error" in json.load(refused.value)


def test_held_out_asyncio_client_eight_concurrent_requests_equal_raw_onnxruntime(
    main_app: Any, ray_cluster: RayCluster, crm_dir: Path
) -> None:
    import tritonclient.grpc.aio as aio

    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal((1 + i % 3, 16), dtype=np.float32) for i in range(8)]

    async def main() -> list[np.ndarray]:
        client = aio.InferenceServerClient(f"127.0.0.1:{ray_cluster.grpc}")
        try:

            async def one(x: np.ndarray) -> np.ndarray:
                given = aio.InferInput("x", list(x.shape), "FP32")
                given.set_data_from_numpy(x)
                answer = await client.infer("mlp", [given], headers=HEADERS)
                return answer.as_numpy("y")

            return await asyncio.wait_for(asyncio.gather(*(one(x) for x in inputs)), 60)
        finally:
            await client.close()

    for x, y in zip(inputs, asyncio.run(main()), strict=True):
        np.testing.assert_allclose(y, raw_ort(crm_dir, "mlp", {"x": x})[0], rtol=1e-6)


def test_the_runtime_api_over_a_deployment_handle(main_app: Any, crm_dir: Path) -> None:
    model = RayModel(main_app, "mlp")
    x = np.random.default_rng(2).standard_normal((2, 16), dtype=np.float32)
    want = raw_ort(crm_dir, "mlp", {"x": x})[0]
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6)
    np.testing.assert_allclose(model.run_async({"x": x}).result(60)["y"], want, rtol=1e-6)
    np.testing.assert_allclose(asyncio.run(model.infer({"x": x}))["y"], want, rtol=1e-6)
    slow = RayModel(main_app, "slow")
    rows = np.ones((64, 512), dtype=np.float32)
    with pytest.raises(crossrt.DeadlineExceededError):
        slow.run({"x": rows}, deadline=time.monotonic() + 0.01)
    token = crossrt.CancelToken()
    future = slow.run_async({"x": rows}, cancel=token)
    token.cancel()
    with pytest.raises(CancelledError):
        future.result(60)
    with pytest.raises(crossrt.CrossrtError, match="nope"):
        RayModel(main_app, "nope").run({"x": x})


def test_statistics_are_ray_metrics_with_the_daemons_names(main_app: Any) -> None:
    stats = main_app.options(method_name="record_autoscaling_stats").remote().result(timeout_s=30)
    assert set(stats) == {"crossrt_in_flight"}
    samples = main_app.options(method_name="metric_samples").remote().result(timeout_s=30)
    names = {name for name, _, _ in samples}
    assert {
        "crossrt_inference_request_success_total",
        "crossrt_inference_pending_request_count",
        "crossrt_inference_request_duration_us_total",
    } <= names
    served = {labels["model"] for name, labels, _ in samples if name.endswith("success_total")}
    assert served == {"mm", "mlp", "slow"}
    # and Ray's Prometheus endpoints serve them, with Ray's prefix, once exported (at each
    # health check): polled, as nothing announces an export
    import ray

    ports = [n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]]
    wanted = "ray_crossrt_inference_request_success_total{"
    end = time.monotonic() + 60
    while True:
        pages = [
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            for port in ports
        ]
        found = [
            line for page in pages for line in page.splitlines()
            if line.startswith(wanted) and 'model="mlp"' in line
        ]  # fmt: skip
        if found or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert found, f"no {wanted}... model=mlp on Ray's metrics endpoints {ports}"
