"""Backpressure: ``run_async`` and ``await infer`` wait in line for a queue slot by default
(as OpenVINO's AsyncInferQueue does), first come first admitted, and raise QUEUE_FULL only
when asked not to wait or when a bounded wait expires."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

import numpy as np
import pytest

import crossrt
from concurrency_models import gate
from crossrt import StatusCode
from crossrt.model import GraphBuilder

WAIT = 10  # seconds: the bound on every wait; reached only when something is broken


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


class WatchedLine(deque[Any]):
    """The scheduler's line of requests waiting for room, telling when one joins it."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = threading.Semaphore(0)

    def append(self, job: Any) -> None:
        super().append(job)
        self.joined.release()


def _watch(model: crossrt.LoadedModel) -> WatchedLine:
    line = WatchedLine()
    model._scheduler._admission._line = line
    return line


def test_gather_of_more_infers_than_the_queue_holds_runs_them_all(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    # The issue: 8 infer() on a model of 2 instances failed at once with QUEUE_FULL.
    model = rt.load(tiny_exe, instances=min(2, len(rt.cores)))
    assert model.instances.queue_depth < 8
    want = [model.run({"x": x(i)})["y"] for i in range(8)]

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(model.infer({"x": x(i)}) for i in range(8)))

    for got, expected in zip(asyncio.run(main()), want, strict=True):
        np.testing.assert_array_equal(got["y"], expected)


def test_infer_waits_for_room_without_blocking_the_event_loop(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=2)
    gated = gate(model)
    line = _watch(model)
    threads = threading.active_count()

    async def main() -> list[dict[str, np.ndarray]]:
        tasks = [asyncio.ensure_future(model.infer({"x": x(i)})) for i in range(8)]
        await asyncio.sleep(0)  # one pass of the loop: every task has asked for room
        # One running (held at the gate), one queued, six waiting in line: the loop still
        # runs (it is running this), and no thread was started to wait for them.
        assert len(line) == 6
        assert threading.active_count() <= threads + 1  # the watchdog at most
        gated.gate.set()  # only the loop can open it: a blocked loop would never get here
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert gated.calls == 8
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], model.run({"x": x(i)})["y"])


def test_requests_are_admitted_in_the_order_they_came(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=1)
    gated = gate(model)
    order: list[int] = []

    async def main() -> None:
        def record(i: int) -> Any:
            return lambda _: order.append(i)

        tasks = []
        for i in range(5):
            task = asyncio.ensure_future(model.infer({"x": x(i)}))
            task.add_done_callback(record(i))
            tasks.append(task)
        await asyncio.sleep(0)
        gated.gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == [0, 1, 2, 3, 4]


def test_infer_raises_queue_full_when_asked_not_to_wait_or_after_its_timeout(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=1)
    gated = gate(model)

    async def main() -> None:
        running = asyncio.ensure_future(model.infer({"x": x(1)}))
        await asyncio.sleep(0)
        with pytest.raises(crossrt.OutOfResourcesError) as full:
            await model.infer({"x": x(2)}, block=False)
        assert full.value.code is StatusCode.QUEUE_FULL
        with pytest.raises(crossrt.OutOfResourcesError) as late:
            await model.infer({"x": x(3)}, timeout=0.02)
        assert late.value.code is StatusCode.QUEUE_FULL
        assert "within 0.02 s" in late.value.message
        assert model._scheduler.waiting_for_room == 0  # the expired request left the line
        gated.gate.set()
        await running

    asyncio.run(main())
    assert gated.calls == 1  # neither refused request ran


def test_a_cancelled_infer_leaves_the_line_and_never_runs(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=1)
    want = model.run({"x": x(3)})["y"]
    gated = gate(model)

    async def main() -> None:
        running = asyncio.ensure_future(model.infer({"x": x(1)}))
        waiting = asyncio.ensure_future(model.infer({"x": x(2)}))
        after = asyncio.ensure_future(model.infer({"x": x(3)}))
        await asyncio.sleep(0)
        assert model._scheduler.waiting_for_room == 2
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert model._scheduler.waiting_for_room == 1
        gated.gate.set()
        await running
        np.testing.assert_array_equal((await after)["y"], want)

    asyncio.run(main())
    assert gated.calls == 2  # running and after: never the cancelled one


def test_run_async_waits_in_the_caller_s_thread_by_default(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=1)
    want = model.run({"x": x(2)})["y"]
    gated = gate(model)
    line = _watch(model)
    first = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    got: list[dict[str, np.ndarray]] = []
    returned = threading.Event()

    def producer() -> None:
        got.append(model.run_async({"x": x(2)}).result(WAIT))  # no block=: waits for room
        returned.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert line.joined.acquire(timeout=WAIT)  # it waits in line, holding its thread
    assert not returned.is_set()
    gated.gate.set()
    thread.join(WAIT)
    assert returned.is_set()
    first.result(WAIT)
    np.testing.assert_array_equal(got[0]["y"], want)


def test_unload_fails_the_requests_waiting_for_room(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=1)
    gated = gate(model)
    line = _watch(model)
    model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    outcome: list[BaseException] = []

    def producer() -> None:
        future = model.run_async({"x": x(2)})
        outcome.append(future.exception(WAIT) or AssertionError("it ran"))

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert line.joined.acquire(timeout=WAIT)
    # Unload in a thread: it fails the waiting request first, then joins the worker, which
    # is held at the gate until the waiting request's outcome is known.
    unloader = threading.Thread(target=model.unload, daemon=True)
    unloader.start()
    thread.join(WAIT)
    # INVALID_HANDLE, as every call after unload (a runtime's close gives CLOSED)
    assert len(outcome) == 1 and isinstance(outcome[0], crossrt.errors.InvalidHandleError), outcome
    assert "was unloaded" in str(outcome[0])
    gated.gate.set()
    unloader.join(WAIT)
    assert not unloader.is_alive()


def test_infer_on_a_staged_model_goes_to_each_stage_and_waits_there(
    rt: crossrt.Runtime,
) -> None:
    b = GraphBuilder("staged_relu")
    b.output(b.op("Relu", [b.input("x", "float32", ["N", 3])]))
    exe = crossrt.compile(b.finish(), stages=[{"x": [1, 3]}, {"x": [4, 3]}])
    model = rt.load(exe, cores=1)
    feeds = [np.full((1 if i % 2 else 4, 3), i - 6, np.float32) for i in range(12)]
    assert model.instances.queue_depth < 6  # each stage gets 6 requests: more than its queue holds

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(model.infer({"x": f}) for f in feeds))

    for feed, result in zip(feeds, asyncio.run(main()), strict=True):
        np.testing.assert_array_equal(next(iter(result.values())), np.maximum(feed, 0))
