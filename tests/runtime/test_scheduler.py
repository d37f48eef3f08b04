"""Instances, the request queue, run_async, callbacks, asyncio, timeouts and pipelining."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future

import numpy as np
import pytest

import crossrt
from concurrency_models import endless, gate, heavy, pipelined, tiny
from crossrt import StatusCode

WAIT = 10  # seconds: the bound on every wait; reached only when something is broken


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def ended(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised (None: it returned), called in a thread of its own and waited
    for at most WAIT seconds: a run of :func:`endless` that nothing stops fails the test
    instead of hanging it."""
    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert raised, f"still running after {WAIT} s: nothing stopped it"
    return raised[0]


class CancelledOnceHeard(crossrt.CancelToken):
    """A token cancelled, from a thread of its own, as soon as someone listens to it
    (``on_cancel``): the engine, for a run that holds an instance; the queue, for a request
    waiting in it. The cancel strikes a request known to be running or queued, with no timer
    to guess when it is (a timer struck before the run started on a loaded machine)."""

    __slots__ = ()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        super().on_cancel(callback)
        threading.Thread(target=self.cancel, daemon=True).start()


def test_run_async_matches_run(rt: crossrt.Runtime, tiny_exe: crossrt.Executable) -> None:
    model = rt.load(tiny_exe)
    future = model.run_async({"x": x(1)})
    assert isinstance(future, Future)
    np.testing.assert_array_equal(future.result(WAIT)["y"], model.run({"x": x(1)})["y"])


def test_full_queue_raises_queue_full_when_asked_not_to_wait_or_the_wait_expires(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, queue_depth=2)
    gated = gate(model)
    running = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    queued = model.run_async({"x": x(2)})
    with pytest.raises(crossrt.OutOfResourcesError) as full:
        model.run_async({"x": x(3)}, block=False)
    assert full.value.code is StatusCode.QUEUE_FULL
    assert "queue_depth" in full.value.message and "block=True" in full.value.message
    with pytest.raises(crossrt.OutOfResourcesError) as late:
        model.run_async({"x": x(3)}, timeout=0.01)
    assert late.value.code is StatusCode.QUEUE_FULL
    assert "no room in its queue of 2 requests within 0.01 s" in late.value.message
    assert late.value.details["timeout"] == 0.01
    assert model._scheduler.waiting_for_room == 0  # the expired wait left the line
    gated.gate.set()
    assert running.result(WAIT)["y"].shape == (4, 8)
    assert queued.result(WAIT)["y"].shape == (4, 8)
    assert model.run_async({"x": x(3)}, block=False).result(WAIT)["y"].shape == (4, 8)


def test_cancelled_queued_request_never_runs(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    gated = gate(model)
    first = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    second = model.run_async({"x": x(2)})
    assert second.cancel()
    gated.gate.set()
    first.result(WAIT)
    assert second.cancelled()
    model.run_async({"x": x(3)}).result(WAIT)  # the worker went past the cancelled one
    assert gated.calls == 2  # first and third: the cancelled request never ran


def test_queued_request_past_its_deadline_times_out_without_running(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    gated = gate(model)
    first = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    late = model.run_async({"x": x(2)}, deadline=time.monotonic())
    gated.gate.set()
    first.result(WAIT)
    with pytest.raises(crossrt.DeadlineExceededError) as info:
        late.result(WAIT)
    assert info.value.code is StatusCode.TIMEOUT
    assert gated.calls == 1


def test_a_request_past_its_deadline_while_running_logs_nothing_critical(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable, caplog: pytest.LogCaptureFixture
) -> None:
    """Its deadline fires while a worker runs it: TIMEOUT for the caller, and no CRITICAL
    line from concurrent.futures ("Future in unexpected state: RUNNING"), which every such
    request logged: the deadline's watch asked the running future to start again."""
    model = rt.load(tiny_exe, instances=1)
    gated = gate(model)
    deadline = time.monotonic() + 0.2
    with caplog.at_level("WARNING"):
        future = model.run_async({"x": x(1)}, deadline=deadline)
        assert gated.started.wait(WAIT)
        # The point is time passing: the deadline's watch fires while the request runs.
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.3)
        gated.gate.set()
        with pytest.raises(crossrt.DeadlineExceededError):
            future.result(WAIT)
    assert [r.getMessage() for r in caplog.records if r.levelname == "CRITICAL"] == []


def test_callback_gets_result_or_error_and_user_data(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    got: list[tuple[object, object]] = []
    done = threading.Event()

    def on_done(outcome: object, user_data: object) -> None:
        got.append((outcome, user_data))
        if len(got) == 2:
            done.set()

    want = model.run({"x": x(1)})["y"]
    model.run_async({"x": x(1)}, callback=on_done, user_data="ok").result(WAIT)
    gated = gate(model)
    gated.fail = crossrt.ExecutionError("engine broke")
    gated.gate.set()
    model.run_async({"x": x(2)}, callback=on_done, user_data=7)
    assert done.wait(WAIT)
    by_data = {data: outcome for outcome, data in got}
    result = by_data["ok"]
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["y"], want)
    assert isinstance(by_data[7], crossrt.ExecutionError)


def test_asyncio_infer_without_a_thread_per_request(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=1, queue_depth=64)
    before = threading.active_count()

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(model.infer({"x": x(i)}) for i in range(32)))

    results = asyncio.run(main())
    assert threading.active_count() <= before + 1  # the watchdog at most, none per request
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], model.run({"x": x(i)})["y"])


def test_eight_threads_of_200_requests_get_their_own_results(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    cores = len(rt.cores)
    model = rt.load(tiny_exe, instances=min(2, cores), queue_depth=16)
    inputs = [x(i) for i in range(50)]
    want = [model.run({"x": a})["y"] for a in inputs]
    errors: list[str] = []

    def client(t: int) -> None:
        for n in range(200):
            i = (t * 200 + n) % len(inputs)
            if n % 2:
                got = model.run({"x": inputs[i]})["y"]
            else:
                got = model.run_async({"x": inputs[i]}, block=True, timeout=WAIT).result(WAIT)["y"]
            if not np.array_equal(got, want[i]):
                errors.append(f"thread {t} request {n}: wrong result for input {i}")

    run_clients(client, 8)
    assert errors == []


def test_instances_use_disjoint_cores_and_that_many_threads(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(tiny())
    cores = len(rt.cores)
    model = rt.load(exe, instances=cores, cores_per_instance=1)
    assert len(model.instances) == cores
    assert model.instances.cores == [(i,) for i in range(cores)]
    for program in model._programs:
        assert program.session.get_session_options().intra_op_num_threads == 1
    whole = rt.load(exe)
    assert whole._programs[0].session.get_session_options().intra_op_num_threads == cores
    with pytest.raises(crossrt.OutOfResourcesError) as info:
        rt.load(exe, instances=cores + 1, cores_per_instance=1)
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC


def test_unload_stops_the_workers(rt: crossrt.Runtime, tiny_exe: crossrt.Executable) -> None:
    model = rt.load(tiny_exe, instances=1)
    workers = list(model._scheduler._threads)
    assert all(t.is_alive() and t.daemon for t in workers)
    model.unload()
    assert not any(t.is_alive() for t in workers)
    with pytest.raises(crossrt.errors.InvalidHandleError):
        model.run_async({"x": x(1)})


def test_exec_timeout_stops_an_ort_run(rt: crossrt.Runtime) -> None:
    model = rt.load(crossrt.compile(heavy()), exec_timeout=0.001)
    a = np.ones((512, 512), np.float32)
    with pytest.raises(crossrt.DeadlineExceededError) as info:
        model.run({"x": a})
    assert info.value.code is StatusCode.TIMEOUT
    with pytest.raises(crossrt.DeadlineExceededError):
        model.run_async({"x": a}).result(WAIT)
    # A run that cannot be stopped (results bound into caller buffers) is reported late.
    with pytest.raises(crossrt.DeadlineExceededError):
        model.run({"x": a}, outputs={model.outputs[0].name: np.empty((512, 512), np.float32)})


def test_run_with_a_deadline_stops_in_the_callers_thread(rt: crossrt.Runtime) -> None:
    """``run(deadline=)``: a run that would never end stopped at its deadline, in the caller's
    thread; one past its deadline before it starts is not run; a generous one changes
    nothing."""
    model = rt.load(crossrt.compile(endless()))
    a = np.ones((64, 64), np.float32)
    # Room to start before the deadline on a loaded machine; the run ends only if stopped.
    stopped = ended(lambda: model.run({"x": a}, deadline=time.monotonic() + 0.25))
    assert isinstance(stopped, crossrt.DeadlineExceededError), stopped
    assert "deadline passed while it ran" in stopped.message
    with pytest.raises(crossrt.DeadlineExceededError, match="before it could start"):
        model.run({"x": a}, deadline=time.monotonic() - 1)
    assert model.statistics().failures == {"TIMEOUT": 2}
    small = rt.load(crossrt.compile(tiny()))
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(
        small.run({"x": x}, deadline=time.monotonic() + WAIT)["y"], small.run({"x": x})["y"]
    )
    out = {"y": np.empty((4, 8), np.float32)}
    assert small.run({"x": x}, out, deadline=time.monotonic() + WAIT)["y"] is out["y"]


def test_run_with_a_deadline_waits_in_the_queue_no_longer(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    gated = gate(model)
    busy = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    try:
        with pytest.raises(crossrt.DeadlineExceededError, match="queued"):
            model.run({"x": x(2)}, deadline=time.monotonic() + 0.05)
        # run_async's future too fails at its deadline, not when a worker gets to it.
        late = model.run_async({"x": x(3)}, deadline=time.monotonic() + 0.05)
        with pytest.raises(crossrt.DeadlineExceededError, match="queued"):
            late.result(WAIT)
    finally:
        gated.gate.set()
    busy.result(WAIT)
    assert model.statistics().failures == {"TIMEOUT": 2}
    assert gated.calls == 1  # neither late request ran
    np.testing.assert_array_equal(model.run({"x": x(4)})["y"], model.run({"x": x(4)})["y"])


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_a_request_waiting_for_an_instance_a_caller_holds_is_resolved_at_once(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable, how: str
) -> None:
    """The instance is held by a ``run()`` caller, so the worker that took the queued request
    waits for it: the request is still queued then, and its deadline or its cancel token
    resolves it on time (it used to wait for the instance, however long the run held it)."""
    model = rt.load(tiny_exe)
    gated = gate(model)
    holder = threading.Thread(target=lambda: model.run({"x": x(1)}))  # in its own thread
    holder.start()
    assert gated.started.wait(WAIT)
    token = crossrt.CancelToken()
    try:
        if how == "deadline":
            with pytest.raises(crossrt.DeadlineExceededError, match="queued"):
                model.run({"x": x(2)}, deadline=time.monotonic() + 0.05)
        else:
            threading.Timer(0.05, token.cancel).start()
            with pytest.raises(CancelledError):
                model.run({"x": x(2)}, cancel=token)
        assert gated.calls == 1  # returned while the instance is still held
    finally:
        gated.gate.set()
    holder.join(WAIT)
    assert model.statistics().failures == {"TIMEOUT" if how == "deadline" else "CANCELLED": 1}
    np.testing.assert_array_equal(model.run({"x": x(4)})["y"], model.run({"x": x(4)})["y"])


def test_exec_timeout_from_the_environment(
    rt: crossrt.Runtime, monkeypatch: pytest.MonkeyPatch, tiny_exe: crossrt.Executable
) -> None:
    monkeypatch.setenv("CROSSRT_EXEC_TIMEOUT", "2.5")
    assert rt.load(tiny_exe).instances.exec_timeout == 2.5
    assert rt.load(tiny_exe, exec_timeout=1).instances.exec_timeout == 1
    with pytest.raises(crossrt.InvalidArgumentError):
        rt.load(tiny_exe, exec_timeout=-1)
    monkeypatch.setenv("CROSSRT_EXEC_TIMEOUT", "soon")
    with pytest.raises(crossrt.InvalidOptionError):
        rt.load(tiny_exe)
    monkeypatch.setenv("CROSSRT_EXEC_TIMEOUT", "0")
    assert rt.load(tiny_exe).instances.exec_timeout is None


def test_nodes_of_different_requests_overlap_in_the_pipeline(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(pipelined(), fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference", "onnxruntime"]
    model = rt.load(exe, queue_depth=16)
    trace: list[tuple[int, int, int, int, int]] = []
    for inst in model._scheduler.instances:
        inst.trace = trace
    inputs = [np.random.default_rng(i).random((256, 256), dtype=np.float32) for i in range(12)]
    futures = [model.run_async({"x": a}, block=True, timeout=WAIT) for a in inputs]
    for future, a in zip(futures, inputs, strict=True):
        np.testing.assert_array_equal(
            future.result(WAIT)[model.outputs[0].name], model.run({"x": a})[model.outputs[0].name]
        )
    order = {id(f): i for i, f in enumerate(futures)}
    spans = {(order[r], node): (start, end) for _, node, r, start, end in trace if r in order}
    assert len(spans) == 3 * len(futures)
    overlaps = [
        (i, k)
        for i in range(1, len(futures))
        for k in range(2)
        if spans[(i, k)][0] < spans[(i - 1, k + 1)][1]
        and spans[(i - 1, k + 1)][0] < spans[(i, k)][1]
    ]
    assert overlaps, "no node of a request ran while the next node ran the request before it"


def test_cancelled_future_callback_gets_cancelled_error(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    gated = gate(model)
    model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    got: list[object] = []
    queued = model.run_async({"x": x(2)}, callback=lambda o, d: got.append(o))
    assert queued.cancel()
    gated.gate.set()
    assert len(got) == 1 and isinstance(got[0], CancelledError)


def test_run_queues_and_waits_when_every_instance_is_busy(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    want = model.run({"x": x(2)})["y"]
    gated = gate(model)
    busy = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    got: list[np.ndarray] = []
    caller = threading.Thread(target=lambda: got.append(model.run({"x": x(2)})["y"]))
    caller.start()
    gated.gate.set()
    caller.join(WAIT)
    busy.result(WAIT)
    assert not caller.is_alive()
    np.testing.assert_array_equal(got[0], want)
    assert gated.calls == 2


def test_threads_mixing_run_and_run_async_on_a_pipeline_get_their_own_results(
    rt: crossrt.Runtime,
) -> None:
    model = rt.load(crossrt.compile(pipelined(size=32, chain=2), fallback="cpu"), queue_depth=8)
    name = model.outputs[0].name
    inputs = [np.random.default_rng(i).random((32, 32), dtype=np.float32) for i in range(10)]
    want = [model.run({"x": a})[name] for a in inputs]
    errors: list[str] = []

    def client(t: int) -> None:
        for n in range(60):
            i = (t + n) % len(inputs)
            if (t + n) % 2:
                got = model.run({"x": inputs[i]})[name]
            else:
                future = model.run_async({"x": inputs[i]}, block=True, timeout=WAIT)
                got = future.result(WAIT)[name]
            if not np.array_equal(got, want[i]):
                errors.append(f"thread {t} request {n}")

    run_clients(client, 4)
    assert errors == []


def test_an_unclosed_runtime_with_models_is_collected_and_its_workers_stop(
    tiny_exe: crossrt.Executable,
) -> None:
    import gc
    import weakref

    runtime = crossrt.Runtime()
    model = runtime.load(tiny_exe, instances=1)
    model.run_async({"x": x(1)}).result(WAIT)
    workers = list(model._scheduler._threads)
    alive = weakref.ref(runtime)
    del runtime, model
    gc.collect()
    assert alive() is None  # the worker threads do not keep the runtime (or its cores) alive
    for worker in workers:
        worker.join(WAIT)
    assert not any(w.is_alive() for w in workers)


def test_a_refused_run_of_a_pipeline_leaves_its_nodes_free(rt: crossrt.Runtime) -> None:
    model = rt.load(crossrt.compile(pipelined(size=8, chain=1), fallback="cpu"))
    name = model.outputs[0].name
    a = np.ones((8, 8), np.float32)
    with pytest.raises(crossrt.InvalidInputError):
        model.run({"x": a}, outputs={name: np.empty((8, 8), np.int64)})  # refused before it runs
    done: list[dict[str, np.ndarray]] = []
    caller = threading.Thread(target=lambda: done.append(model.run({"x": a})), daemon=True)
    caller.start()
    caller.join(WAIT)
    assert done and done[0][name].shape == (8, 8)  # not stuck behind a lock left held
    assert all(not lock.locked() for lock in model._instances[0].locks)


def run_clients(client: Callable[[int], None], count: int) -> None:
    """Run ``client(0..count-1)`` in threads and wait for all of them (bounded)."""
    threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_exec_timeout_applies_to_pipelined_requests(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(pipelined(size=256, chain=6), fallback="cpu")
    model = rt.load(exe, exec_timeout=1e-4)
    a = np.ones((256, 256), np.float32)
    with pytest.raises(crossrt.DeadlineExceededError) as queued:
        model.run_async({"x": a}).result(WAIT)
    assert queued.value.code is StatusCode.TIMEOUT
    with pytest.raises(crossrt.DeadlineExceededError):
        model.run({"x": a})
    assert all(not lock.locked() for lock in model._instances[0].locks)


def test_a_worker_waits_for_the_instance_a_run_holds(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    want = model.run({"x": x(2)})["y"]
    gated = gate(model)
    inline = threading.Thread(target=lambda: model.run({"x": x(1)}), daemon=True)
    inline.start()
    assert gated.started.wait(WAIT)  # run() holds the only instance, in its own thread
    queued = model.run_async({"x": x(2)})
    gated.gate.set()
    np.testing.assert_array_equal(queued.result(WAIT)["y"], want)
    inline.join(WAIT)
    assert gated.calls == 2 and list(model._scheduler.line.idle) == list(model._instances)


def test_callers_in_a_loop_share_one_instance_fairly(rt: crossrt.Runtime) -> None:
    # Two threads calling run() in a loop on one instance: the one given back goes to the
    # caller already waiting, not to the one that just gave it back (which used to keep it
    # for the whole loop while the other waited seconds).
    # Counted in runs, not seconds: while both wait, they take turns, so each has a fair
    # share of the first half of the runs (the bug gave the first caller all of its runs
    # before the other's first one). A caller descheduled between its calls lets the other
    # run a few in a row: a share of a quarter leaves room for that on a loaded machine.
    model = rt.load(crossrt.compile(heavy(chain=4, size=256), "cpu"), instances=1)
    x = np.eye(256, dtype=np.float32)
    runs = 40
    order: list[int] = []  # who finished each run, in order
    together = threading.Barrier(2)

    def loop(i: int) -> None:
        together.wait(WAIT)
        for _ in range(runs):
            model.run({"x": x})
            order.append(i)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(order) == 2 * runs
    first_half = order[:runs]
    assert min(first_half.count(0), first_half.count(1)) >= runs // 4, order


def test_a_cancel_token_stops_a_run_and_drops_a_queued_one(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """``run(cancel=)``: the caller went away. A run in the caller's thread is stopped, and
    one waiting in the queue is dropped; both raise CancelledError, counted CANCELLED."""
    model = rt.load(crossrt.compile(endless()))
    token = CancelledOnceHeard()  # cancelled once the engine listens: the run is starting
    stopped = ended(lambda: model.run({"x": np.ones((64, 64), np.float32)}, cancel=token))
    assert isinstance(stopped, CancelledError), stopped  # the run never ends unless stopped
    assert model.statistics().failures == {"CANCELLED": 1}
    # Queued behind a running request (held at a gate), then abandoned: it never runs.
    queued = rt.load(tiny_exe)
    gated = gate(queued)
    busy = queued.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    waiting = CancelledOnceHeard()  # cancelled once the queue listens: it waits there
    with pytest.raises(CancelledError):
        queued.run({"x": x(2)}, cancel=waiting)
    gated.gate.set()
    busy.result(WAIT)
    assert gated.calls == 1
    assert queued.statistics().failures == {"CANCELLED": 1}


def test_a_request_resolved_while_queued_gives_its_slot_back_at_once(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """Queue depth 2: one request runs (held at a gate), one waits and passes its deadline.
    Its slot is free again at once: a third request is admitted, not QUEUE_FULL."""
    model = rt.load(tiny_exe, queue_depth=2)
    gated = gate(model)
    running = model.run_async({"x": x(1)})
    assert gated.started.wait(WAIT)
    try:
        late = model.run_async({"x": x(2)}, deadline=time.monotonic() + 0.05)
        with pytest.raises(crossrt.DeadlineExceededError):
            late.result(WAIT)
        admitted = model.run_async({"x": x(3)}, block=False)  # QUEUE_FULL before
        cancelled = model.run_async({"x": x(4)}, block=False) if admitted.cancel() else None
        assert cancelled is not None  # the slot the cancelled one held is free too
    finally:
        gated.gate.set()
    running.result(WAIT)
    cancelled.result(WAIT)
    assert model.statistics().failures == {"TIMEOUT": 1, "CANCELLED": 1}
    assert gated.calls == 2  # the late and the cancelled requests never ran


def test_run_callers_in_line_for_an_instance_fail_at_once_on_unload(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """run() callers waiting in line for the instance another caller holds get the model's
    reason as soon as it is unloaded, not after the run holding it; the one holding it
    finishes."""
    model = rt.load(tiny_exe)
    gated = gate(model)
    results: list[object] = []

    def call(seed: int) -> None:
        try:
            results.append(model.run({"x": x(seed)})["y"].shape)
        except crossrt.CrossrtError as exc:
            results.append(exc.code)

    holder = threading.Thread(target=call, args=(1,))
    holder.start()
    assert gated.started.wait(WAIT)
    waiting = [threading.Thread(target=call, args=(s,)) for s in (2, 3)]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + WAIT
    while len(model._scheduler.line.waiting) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(model._scheduler.line.waiting) == 2
    unloading = threading.Thread(target=model.unload)
    unloading.start()
    for t in waiting:
        t.join(WAIT)
    assert results == [StatusCode.INVALID_HANDLE] * 2  # the run holding it has not ended
    gated.gate.set()
    holder.join(WAIT)
    unloading.join(WAIT)
    assert len(results) == 3


def test_a_request_done_and_dropped_is_freed_without_the_cycle_collector(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """A future and its job made a cycle (future -> callback -> job -> future): a caller that
    dropped the future left its inputs and outputs to the cyclic garbage collector, which a
    long-lived daemon runs rarely (issue 24: posted requests of clients that died)."""
    import gc
    import weakref

    model = rt.load(tiny_exe)
    gc.disable()
    try:
        future = model.run_async({"x": x(0)})
        future.result(timeout=WAIT)  # the outputs: a future holds them until freed
        kept = weakref.ref(future)
        del future
        assert _freed(kept)
    finally:
        gc.enable()


def _freed(ref: Callable[[], object]) -> bool:
    """Whether ``ref``'s object is freed within WAIT seconds (a worker drops a request as
    it resolves it: a moment after its caller has the result)."""
    deadline = time.monotonic() + WAIT
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ref() is None


@pytest.mark.parametrize("how", ["run_async", "queued run", "pipeline"])
def test_a_worker_keeps_no_request_it_has_resolved(rt: crossrt.Runtime, how: str) -> None:
    """A worker waiting for the next request holds nothing of the last: the daemon maps a
    client's shared memory as a request's inputs and outputs, and a worker that kept the
    last request until the next kept the memory of a client that had died mapped (CI:
    tests/security/test_daemon_bounds.py, a lane client's memfd left after 15 s)."""
    import gc
    import weakref

    from concurrency_models import pipelined

    gc.disable()  # freed by reference counts alone: the daemon seldom runs the collector
    try:
        if how == "pipeline":
            model = rt.load(crossrt.compile(pipelined(16, 1), fallback="cpu"))
            given = np.ones((16, 16), np.float32)
        else:
            model = rt.load(crossrt.compile(tiny(), "cpu", driver="onnxruntime"), instances=1)
            given = x(0)
        kept = weakref.ref(given)
        if how == "queued run":
            # its one instance held: run() with a cancel token waits in the queue, then a
            # worker runs it (as the daemon runs a request whose client may go away)
            gated = gate(model)
            holder = threading.Thread(target=lambda: model.run({"x": x(1)}))
            holder.start()
            assert gated.started.wait(WAIT)
            queued = threading.Thread(
                target=model.run, args=({"x": given},), kwargs={"cancel": crossrt.CancelToken()}
            )
            queued.start()
            while model.statistics().in_flight < 2 and queued.is_alive():
                time.sleep(0.01)
            gated.gate.set()
            for thread in (holder, queued):
                thread.join(WAIT)
            assert gated.calls == 2
        else:
            model.run_async({"x": given}).result(timeout=WAIT)
        del given
        assert _freed(kept), "a worker still holds the inputs of the request it ran"
    finally:
        gc.enable()


def test_a_request_settled_before_a_worker_takes_it_logs_nothing(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable, caplog: pytest.LogCaptureFixture
) -> None:
    """A queued request failed (the model closing) or cancelled before a worker starts it, or
    before its deadline fires, is passed over quietly: concurrent.futures logs CRITICAL
    ("Future ... in unexpected state: FINISHED") when a settled future is marked running,
    which a daemon printed to its log as if something had broken."""
    from crossrt.runtime.queued import QueuedRequest, RequestFuture

    model = rt.load(tiny_exe)
    scheduler = model._scheduler
    settled = [QueuedRequest(RequestFuture(), {}, None, None) for _ in range(3)]
    scheduler.fail(settled[0], RuntimeError("closed"))
    settled[1].future.set_result({})
    settled[2].future.cancel()
    with caplog.at_level(logging.DEBUG, logger="concurrent.futures"):
        for job in settled:
            assert scheduler.start(job) is False
            scheduler.fail(job, RuntimeError("again"))
            scheduler._expire(job)
    assert not [r for r in caplog.records if r.name == "concurrent.futures"]
    assert isinstance(settled[0].future.exception(), RuntimeError)
    assert settled[1].future.result() == {}
