"""Request statistics kept by every loaded model (LoadedModel.statistics()): counts by outcome,
time per phase, the latency histogram and its percentiles, per instance runs."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import crossrt
from concurrency_models import gate, tiny
from crossrt import StatusCode
from crossrt.runtime.statistics import BUCKETS_US, SUM_AT

X = np.ones((4, 8), np.float32)


def test_runs_are_counted_and_timed(rt: crossrt.Runtime) -> None:
    model = rt.load(tiny())
    for _ in range(50):
        model.run({"x": X})
    stats = model.statistics()
    assert (stats.requests, stats.success, stats.failure, stats.in_flight) == (50, 50, 0, 0)
    assert stats.latency.count == stats.compute_infer.count == 50
    assert stats.compute_infer.ns > 0 and stats.compute_input.ns > 0
    assert stats.latency.ns >= stats.compute_infer.ns + stats.compute_input.ns
    assert sum(stats.histogram) == 50 and len(stats.histogram) == len(BUCKETS_US) + 1
    p50, p90, p99 = (stats.percentile_us(q) for q in (50, 90, 99))
    assert p50 is not None and p90 is not None and p99 is not None
    assert 0 < p50 <= p90 <= p99
    assert sum(d.count for d in stats.instances) == 50
    assert abs(stats.last_inference_ms - time.time() * 1000) < 60_000
    json.dumps(stats.to_dict())  # plain JSON, as the daemon serves it


def test_no_percentile_before_the_first_success(rt: crossrt.Runtime) -> None:
    stats = rt.load(tiny()).statistics()
    assert stats.requests == 0 and stats.percentile_us(50) is None
    assert stats.last_inference_ms == 0


def test_failures_are_counted_by_status(rt: crossrt.Runtime) -> None:
    model = rt.load(tiny())
    with pytest.raises(crossrt.InvalidInputError):
        model.run({"x": np.ones((4, 9), np.float32)})
    with pytest.raises(crossrt.InvalidInputError):
        model.run_async({"wrong": X})
    model.run({"x": X})
    stats = model.statistics()
    assert stats.requests == 3 and stats.success == 1
    assert stats.failures == {StatusCode.EXEC_BAD_INPUT.name: 2}


def test_queued_requests_count_their_wait(rt: crossrt.Runtime) -> None:
    model = rt.load(tiny(), queue_depth=3)
    gated = gate(model)
    first = model.run_async({"x": X})
    assert gated.started.wait(10)
    second = model.run_async({"x": X})
    third = model.run_async({"x": X})
    with pytest.raises(crossrt.OutOfResourcesError):  # QUEUE_FULL, refused at the door
        model.run_async({"x": X}, block=False)
    assert third.cancel()  # still queued
    during = model.statistics()
    assert during.in_flight == 2 and during.failures == {"QUEUE_FULL": 1, "CANCELLED": 1}
    gated.gate.set()
    first.result(10)
    second.result(10)
    stats = model.statistics()
    assert (stats.requests, stats.success, stats.in_flight) == (4, 2, 0)
    assert stats.queue.count == 2 and stats.queue.ns > 0  # the second one waited


def test_counts_are_exact_under_concurrency(rt: crossrt.Runtime) -> None:
    model = rt.load(tiny(), instances=2, queue_depth=8)
    threads = [
        threading.Thread(target=lambda: [model.run({"x": X}) for _ in range(300)]) for _ in range(3)
    ]
    futures = [model.run_async({"x": X}) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result(10)
    stats = model.statistics()
    assert (stats.requests, stats.success, stats.in_flight) == (1000, 1000, 0)
    assert sum(d.count for d in stats.instances) == 1000


def test_many_successes_are_summed_as_they_come(rt: crossrt.Runtime) -> None:
    model = rt.load(tiny())
    runs = SUM_AT // 6 + 10  # past the point where the recording thread sums them
    for _ in range(runs):
        model.run({"x": X})
    assert len(model._statistics.pending) < SUM_AT  # summed on the way, not kept
    stats = model.statistics()
    assert stats.success == runs and sum(stats.histogram) == runs


def test_shape_stages_are_one_model(rt: crossrt.Runtime) -> None:
    b = crossrt.GraphBuilder("dyn")
    x = b.input("x", "float32", ["n", 8])
    b.output(b.op("Relu", [x]))
    exe = crossrt.compile(b.finish(), stages=[{"x": [1, 8]}, {"x": [2, 8]}])
    model = rt.load(exe)
    model.run({"x": np.ones((1, 8), np.float32)})
    model.run({"x": np.ones((2, 8), np.float32)})
    with pytest.raises(crossrt.InvalidInputError):
        model.run({"x": np.ones((3, 8), np.float32)})
    stats = model.statistics()
    assert (stats.requests, stats.success, stats.failure) == (3, 2, 1)


def test_statistics_read_back_from_their_dict(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """What another process sends (``crossrt monitor``) is the snapshot it took."""
    from crossrt.runtime.statistics import statistics_from_dict

    model = rt.load(tiny_exe)
    for _ in range(5):
        model.run({"x": np.ones((4, 8), np.float32)})
    with pytest.raises(crossrt.InvalidInputError):
        model.run({"x": np.ones((1, 1), np.float32)})
    taken = model.statistics()
    assert statistics_from_dict(json.loads(json.dumps(taken.to_dict()))) == taken
    for broken in ({}, {**taken.to_dict(), "success": "5"}, {**taken.to_dict(), "queue": 3}):
        with pytest.raises(crossrt.InvalidArgumentError, match="not the statistics"):
            statistics_from_dict(broken)


def test_one_caller_never_shows_more_than_one_request_in_flight(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """Snapshots taken while a thread runs the model in a loop (as ``crossrt top`` asks
    another process): one caller has at most one request in flight, however the threads
    interleave (counting the successes before the arrivals showed dozens)."""
    model = rt.load(tiny_exe)
    x = np.ones((4, 8), np.float32)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            model.run({"x": x})

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        seen = []
        for _ in range(400):
            seen.append(model.statistics())
            time.sleep(0.0005)  # let the caller run between snapshots
    finally:
        stop.set()
        thread.join()
    assert max(s.in_flight for s in seen) <= 1
    assert all(s.requests >= s.success for s in seen)
    assert seen[-1].success > seen[0].success
