"""A real local Ray cluster for tests/ray: a head and a worker node on this host, started by
the tests and stopped after them (every process of both nodes waited for, also when a test
fails), with a crossrt runtime directory of its own, so replicas reserve cores among
themselves and not against the test process or another pytest worker.

Each test deploys its own Serve application and deletes it: a replica reserves a real core,
and this host may have only two.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_models import LOOPBACK, RayCluster, free_port

import crossrt
from crossrt.host import usable_cores

pytest.importorskip("ray.serve", reason="the ray extra is not installed (pip install crossrt[ray])")

STOP_SECONDS = 60.0
"""How long the nodes' processes have to exit once the cluster is shut down."""

# One cluster for every test here: tests/conftest.py's xdist scheduler hook runs tests/ray on one
# worker (the xdist_group marker cannot: pytest-xdist 3.8 with pytest 9.2; docs/scale-out.md).


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    if len(usable_cores()) < 2:
        pytest.skip("two replicas of one core each need 2 usable CPUs; this process has fewer")
    from ray.cluster_utils import Cluster

    import ray
    from crossrt.scaleout.ray import start_serve
    from crossrt.scaleout.ray.app import serve_env
    from ray import serve

    folder = Path(tempfile.mkdtemp(prefix="crossrt-ray-"))
    previous = os.environ.get("CROSSRT_RUNTIME_DIR")
    os.environ["CROSSRT_RUNTIME_DIR"] = str(folder)  # the nodes' workers inherit it
    with serve_env():  # Serve's proxy switches, as `crossrt deploy ray` starts its cluster
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": LOOPBACK},
        )
    try:
        with serve_env():
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address=LOOPBACK)
        http, grpc = free_port(), free_port()
        start_serve(("127.0.0.1", http), grpc)
        yield RayCluster(cluster.address, http, grpc, folder, node_processes(cluster))
    finally:
        processes = [info.process for info in node_infos(cluster)]
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
            if previous is None:
                os.environ.pop("CROSSRT_RUNTIME_DIR", None)
            else:
                os.environ["CROSSRT_RUNTIME_DIR"] = previous
        for process in processes:
            process.wait(timeout=STOP_SECONDS)


def node_infos(cluster: Any) -> list[Any]:
    """The processes Ray started for the cluster's nodes (GCS, raylets, agents, ...)."""
    return [
        info
        for node in [cluster.head_node, *cluster.worker_nodes]
        if node is not None
        for infos in node.all_processes.values()
        for info in infos
    ]


def node_processes(cluster: Any) -> list[int]:
    """The pids of :func:`node_infos`."""
    return [info.process.pid for info in node_infos(cluster)]


@pytest.fixture(scope="session")
def crm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``.crm`` files of the Ray tests' models: ``mm`` (y = x @ W + 1 on [N, 8]), ``mlp``
    (a two-layer MLP on [N, 16]: the held-out model), ``slow`` (MatMul chains, tens of ms a
    row) and their ONNX bytes beside them, for raw onnxruntime."""
    from ray_models import mlp

    from concurrency_models import batchable, slow_rows

    folder = tmp_path_factory.mktemp("ray-models")
    for name, model in (("mm", batchable()), ("mlp", mlp()), ("slow", slow_rows(chain=60))):
        crossrt.compile(model, "cpu").save(folder / f"{name}.crm")
        (folder / f"{name}.onnx.bytes").write_bytes(model.to_bytes())
    return folder
