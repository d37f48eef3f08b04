"""Dynamic batching (``Runtime.load(max_batch_size=, batch_delay=)``): queued requests run
together, each gets its own rows, and what cannot join runs alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

import crossrt
from concurrency_models import batchable, gate, tiny

WAIT = 30


def x(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 8), dtype=np.float32)


@pytest.fixture(scope="module")
def exe() -> crossrt.Executable:
    return crossrt.compile(batchable())


def _queued_behind_a_gate(
    model: crossrt.LoadedModel, feeds: list[np.ndarray], **kwargs: Any
) -> tuple[Any, list[Future[Any]]]:
    """The instance held by a first run_async at a gate, then ``feeds`` queued behind it."""
    gated = gate(model)
    first = model.run_async({"x": x(1, 99)})
    assert gated.started.wait(WAIT)
    futures = [model.run_async({"x": f}, **kwargs) for f in feeds]
    return gated, [first, *futures]


def test_queued_requests_run_as_one_batch_each_getting_its_rows(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    model = rt.load(exe, max_batch_size=16)
    alone = rt.load(exe)
    feeds = [x(rows, seed) for seed, rows in enumerate([1, 3, 2, 1, 4])]
    gated, futures = _queued_behind_a_gate(model, feeds)
    gated.gate.set()
    results = [f.result(WAIT)["y"] for f in futures[1:]]
    for feed, y in zip(feeds, results, strict=True):
        np.testing.assert_allclose(y, alone.run({"x": feed})["y"], rtol=1e-6)
        assert y.shape == feed.shape
    assert gated.calls == 2  # the first request, then one batch of the five
    stats = model.statistics()
    assert stats.success == 6
    assert sum(d.count for d in stats.instances) == 2  # executions: the batch counts once
    assert model.instances.batching == crossrt.runtime.batching.Batching(16, 0.0)


def test_a_batch_holds_at_most_max_batch_size_rows(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    model = rt.load(exe, max_batch_size=4, queue_depth=16)
    alone = rt.load(exe)
    feeds = [x(1, seed) for seed in range(10)]
    gated, futures = _queued_behind_a_gate(model, feeds)
    gated.gate.set()
    for feed, future in zip(feeds, futures[1:], strict=True):
        np.testing.assert_allclose(future.result(WAIT)["y"], alone.run({"x": feed})["y"])
    assert gated.calls == 1 + 3  # the first, then batches of 4, 4 and 2


def test_what_cannot_join_runs_alone(rt: crossrt.Runtime, exe: crossrt.Executable) -> None:
    """Other trailing dimensions or dtype, device tensors, outputs= buffers: each alone."""
    model = rt.load(exe, max_batch_size=8)
    gated = gate(model)
    first = model.run_async({"x": x(1, 0)})
    assert gated.started.wait(WAIT)
    out = {"y": np.empty((2, 8), np.float32)}
    bound = model.run_async({"x": x(2, 1)}, out)
    plain = [model.run_async({"x": x(1, s)}) for s in (2, 3)]
    gated.gate.set()
    assert bound.result(WAIT)["y"] is out["y"]
    for f in (first, *plain):
        assert f.result(WAIT)["y"].shape == (1, 8)
    assert gated.calls == 3  # the first, the bound one alone, the two plain ones together


def test_a_request_resolved_while_queued_is_left_out_of_the_batch(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    model = rt.load(exe, max_batch_size=8)
    feeds = [x(1, seed) for seed in range(4)]
    gated, futures = _queued_behind_a_gate(model, feeds)
    assert futures[2].cancel()
    late = model.run_async({"x": x(1, 9)}, deadline=time.monotonic() - 1)
    gated.gate.set()
    with pytest.raises(crossrt.DeadlineExceededError):
        late.result(WAIT)
    for i in (1, 3, 4):
        np.testing.assert_allclose(
            futures[i].result(WAIT)["y"], model.run({"x": feeds[i - 1]})["y"]
        )
    stats = model.statistics()
    assert stats.failures == {"CANCELLED": 1, "TIMEOUT": 1}


def test_run_callers_are_batched_when_they_queue(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    """run() takes an idle instance at once, alone; callers that find it busy queue, and
    queued ones are batched: the daemon's request threads get batching this way."""
    model = rt.load(exe, max_batch_size=8)
    alone = rt.load(exe)
    gated = gate(model)
    holder = threading.Thread(target=lambda: model.run({"x": x(1, 0)}))
    holder.start()
    assert gated.started.wait(WAIT)
    got: dict[int, np.ndarray] = {}
    callers = [
        threading.Thread(target=lambda s=s: got.__setitem__(s, model.run({"x": x(2, s)})["y"]))
        for s in range(1, 5)
    ]
    for c in callers:
        c.start()
    deadline = time.monotonic() + WAIT
    while model.statistics().in_flight < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    gated.gate.set()
    for c in (holder, *callers):
        c.join(WAIT)
    for s in range(1, 5):
        np.testing.assert_allclose(got[s], alone.run({"x": x(2, s)})["y"], rtol=1e-6)
    assert gated.calls == 2


def test_batch_delay_waits_for_more_requests(rt: crossrt.Runtime, exe: crossrt.Executable) -> None:
    # The first request waits for more, and a full batch does not wait: with a delay longer
    # than WAIT, four rows run as one batch (the gate is open: the first would have run alone
    # at once had it not waited), and as soon as the fourth fills it.
    model = rt.load(exe, max_batch_size=4, batch_delay=120.0)
    gated = gate(model)
    gated.gate.set()
    futures = [model.run_async({"x": x(1, s)}) for s in range(4)]
    for f in futures:
        f.result(WAIT)
    assert gated.calls == 1
    # A delay that passes runs what came: a batch that never fills.
    partial = rt.load(exe, max_batch_size=8, batch_delay=0.05)
    futures = [partial.run_async({"x": x(1, s)}) for s in range(3)]
    for f in futures:
        assert f.result(WAIT)["y"].shape == (1, 8)


def test_an_output_that_does_not_follow_the_batch_runs_each_alone(
    rt: crossrt.Runtime,
) -> None:
    model = rt.load(crossrt.compile(batchable(doubled=True)), max_batch_size=8)
    feeds = [x(1, s) for s in range(3)]
    gated, futures = _queued_behind_a_gate(model, feeds)
    gated.gate.set()
    for feed, future in zip(feeds, futures[1:], strict=True):
        np.testing.assert_array_equal(future.result(WAIT)["y"], np.concatenate([feed, feed]))
    assert model.statistics().success == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": -1}, "whole number >= 0"),
        ({"max_batch_size": "8"}, "whole number >= 0"),
        ({"max_batch_size": True}, "whole number >= 0"),
        ({"max_batch_size": 4, "batch_delay": -1}, "seconds >= 0"),
        ({"max_batch_size": 4, "batch_delay": float("nan")}, "seconds >= 0"),
        ({"batch_delay": 0.1}, "without batching"),
    ],
)
def test_bad_batching_arguments_are_refused(
    rt: crossrt.Runtime, exe: crossrt.Executable, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(crossrt.InvalidArgumentError, match=match):
        rt.load(exe, **kwargs)


def test_a_model_with_a_fixed_first_dimension_cannot_be_batched(rt: crossrt.Runtime) -> None:
    with pytest.raises(crossrt.InvalidArgumentError, match="fixed first dimension"):
        rt.load(crossrt.compile(tiny()), max_batch_size=4)
    assert not rt.models  # nothing left loaded
