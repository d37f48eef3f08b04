"""A crossrt replica's parts in this process, without a cluster (the class Serve runs is
plain Python): its health check, the response cache and batching it keeps from ``crossrt
serve``, refusals of what does not cross Serve's hop, and the autoscaling policy's arithmetic
and the Serve-config builder's checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

import crossrt
from crossrt.scaleout.ray import Replica, ReplicaConfig
from crossrt.scaleout.ray.app import build
from crossrt.scaleout.ray.autoscale import InFlightPolicy


class Context:
    """What Serve's gRPC context records of an error (its set_code and set_details)."""

    def __init__(self) -> None:
        self.code: object = None
        self.details = ""

    def set_code(self, code: object) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


@pytest.fixture
def replica(tmp_path: Path, runtime_dir: Path) -> Iterator[Replica]:
    from concurrency_models import batchable

    crossrt.compile(batchable(), "cpu").save(tmp_path / "mm.crm")
    config = ReplicaConfig(
        str(tmp_path / "mm.crm"),
        cores=1,
        load={"max_batch_size": 4, "batch_delay": 0.001, "response_cache": True},
        response_cache_bytes=1 << 20,
    )
    made = Replica(config)
    try:
        yield made
    finally:
        made.__del__()


def request(x: np.ndarray) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="mm")
    r.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    r.raw_input_contents.append(x.tobytes())
    return r


def test_the_health_check_means_the_model_is_ready(replica: Replica) -> None:
    replica.check_health()
    replica.repository.unload("mm")
    with pytest.raises(RuntimeError, match="mm is UNAVAILABLE"):
        replica.check_health()


def test_batching_and_the_response_cache_are_those_of_crossrt_serve(replica: Replica) -> None:
    entry, model = replica.repository.get("mm")
    assert model.instances.batching is not None and model.instances.batching.max_size == 4
    x = np.ones((1, 8), dtype=np.float32)
    first = asyncio.run(replica.ModelInfer(request(x), Context()))
    second = asyncio.run(replica.ModelInfer(request(x), Context()))
    assert first.raw_output_contents == second.raw_output_contents
    assert (entry.cache.hits, entry.cache.misses) == (1, 1)


def test_errors_keep_their_grpc_status_and_shared_memory_is_refused(replica: Replica) -> None:
    import grpc

    context = Context()
    bad = request(np.ones((1, 9), dtype=np.float32))
    asyncio.run(replica.ModelInfer(bad, context))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT and "x" in context.details
    context = Context()
    asyncio.run(replica.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(), context))
    assert context.code == grpc.StatusCode.UNAVAILABLE and "in the request" in context.details


def test_the_in_flight_policy_asks_for_replicas_by_crossrt_counts() -> None:
    policy = InFlightPolicy(target=2)

    def ctx(reported: dict[str, float], ongoing: float = 0) -> SimpleNamespace:
        return SimpleNamespace(
            aggregated_metrics={"crossrt_in_flight": reported} if reported else {},
            total_num_requests=ongoing,
            capacity_adjusted_min_replicas=1,
            capacity_adjusted_max_replicas=4,
        )

    assert policy(ctx({"a": 3, "b": 2}))[0] == 3  # ceil(5 / 2)
    assert policy(ctx({"a": 40}))[0] == 4  # the max
    assert policy(ctx({"a": 0}))[0] == 1  # the min
    assert policy(ctx({}, ongoing=4))[0] == 2  # Serve's count before any report
    with pytest.raises(ValueError, match="target"):
        InFlightPolicy(target=0)


def test_the_deployment_names_crossrts_router_and_it_keeps_own_answers_on_the_replica() -> None:
    """The router's path resolves to its class (Serve imports it by that name), and the calls
    it keeps on one replica are the replica's KServe v2 methods (router.py imports nothing of
    crossrt, so it names them)."""
    import importlib

    from crossrt.scaleout.ray.app import ROUTER
    from crossrt.scaleout.ray.router import STICKY, FewestInFlight

    module, _, name = ROUTER.partition(":")
    assert getattr(importlib.import_module(module), name) is FewestInFlight
    assert set(dir(Replica)) >= STICKY and "ModelInfer" not in STICKY
    options = build({"source": "m.crm"})._bound_deployment._deployment_config
    assert options.request_router_config.request_router_class == ROUTER


def test_the_serve_config_builder_names_what_it_takes() -> None:
    with pytest.raises(crossrt.InvalidOptionError, match="give source"):
        build({"cores": 1})
    with pytest.raises(crossrt.InvalidOptionError, match="unknown \\['colour'\\]"):
        build({"source": "m.crm", "colour": "red"})


def test_a_model_of_microseconds_runs_on_the_event_loop_a_slow_one_on_the_threads(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """The hop to a request thread and back cost a tiny model more than its run (issue 26's
    throughput on Ray): once its runs are known to be short, it runs inline on the replica's
    loop, whose thread is then pinned to the replica's core; a slow model, and one that
    batches, stay on the request threads."""
    import os
    import threading

    from concurrency_models import batchable, slow_rows

    crossrt.compile(batchable(), "cpu").save(tmp_path / "mm.crm")
    crossrt.compile(slow_rows(chain=40), "cpu").save(tmp_path / "slow.crm")
    before = os.sched_getaffinity(0)  # this thread runs the loop, and gets pinned
    replica = Replica(ReplicaConfig(str(tmp_path), cores=1))
    x = np.ones((1, 8), dtype=np.float32)
    where: dict[str, list[bool]] = {"mm": [], "slow": []}

    async def requests(name: str, count: int) -> None:
        entry, model = replica.repository.get(name)
        feed = {"x": np.ones((1, int(model.inputs[0].shape[1])), dtype=np.float32)}
        loop = threading.get_ident()

        def work() -> object:
            where[name].append(threading.get_ident() == loop)
            return model.run(feed)

        for _ in range(count):
            await replica.offload(work, None, entry)

    try:
        asyncio.run(requests("mm", 8))
        assert not where["mm"][0] and all(where["mm"][2:]), where  # known short: inline
        asyncio.run(requests("slow", 4))
        assert not any(where["slow"]), where
        assert os.sched_getaffinity(0) == set(replica.runtime.cores)  # the loop ran mm
        answer = asyncio.run(replica.ModelInfer(request(x), Context()))
        assert answer.outputs[0].name == "y"
    finally:
        os.sched_setaffinity(0, before)
        replica.__del__()
