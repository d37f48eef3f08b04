"""Profiles (``runtime/profiler.py``): what they record, what the trace holds, and that they
leave nothing behind."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import crossrt
import crossrt.profiling
from concurrency_models import pipelined

WAIT = 30


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((4, 8), dtype=np.float32)


def test_a_profile_records_each_request_and_its_phases(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable, tmp_path: Path
) -> None:
    model = rt.load(tiny_exe)
    for i in range(20):  # before the profile: not recorded
        model.run({"x": x(i)})
    path = tmp_path / "trace.json"
    with rt.profile(path) as profile:
        for i in range(50):
            model.run({"x": x(i)})
        futures = [model.run_async({"x": x(i)}, block=True, timeout=WAIT) for i in range(10)]
        for future in futures:
            future.result(WAIT)
    model.run({"x": x(0)})  # after: not recorded
    (summary,) = profile.summary()
    assert summary["model"] == model.name
    assert (summary["requests"], summary["failed"], summary["dropped"]) == (60, 0, 0)
    rows = profile.requests()
    finished, arrived, queue, checked, infer = (rows[:, i] for i in range(5))
    assert (finished >= arrived + checked + queue + infer).all()
    assert (queue >= 0).all() and (infer > 0).all()
    trace = json.loads(path.read_text())  # written on exit, and what stop() returns
    assert trace == json.loads(json.dumps(profile.stop()))
    events = trace["traceEvents"]
    begins = Counter(e["name"] for e in events if e["ph"] == "b")
    ends = Counter(e["name"] for e in events if e["ph"] == "e")
    assert begins == ends
    assert begins[model.name] == 60 and begins["infer"] == 60
    runs = [e for e in events if e["ph"] == "X"]
    assert len(runs) == 60 and {e["name"] for e in runs} == {"infer"}
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert tracks[runs[0]["tid"]] == f"{model.name} instance 0 (cpu:0)"
    # The phases of each request follow one another inside it.
    for ident in {e["id"] for e in events if e.get("cat") == "request"}:
        mine = [e for e in events if e.get("id") == ident]
        times = [e["ts"] for e in mine]
        assert mine[0]["name"] == model.name and mine[-1]["name"] == model.name
        assert times == sorted(times)


def test_a_multi_node_executable_has_a_track_per_node(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(pipelined(size=32, chain=2), fallback="cpu")
    assert len(exe.nodes) == 3
    model = rt.load(exe, queue_depth=16)
    a = np.random.default_rng(0).random((32, 32), dtype=np.float32)
    with crossrt.profiling.Profile(model) as profile:
        for _ in range(4):
            model.run({"x": a})  # the walk in the caller's thread
        futures = [model.run_async({"x": a}, block=True, timeout=WAIT) for _ in range(4)]
        for future in futures:
            future.result(WAIT)  # the pipeline's stage threads
    (summary,) = profile.summary()
    assert summary["requests"] == 8
    assert [n["driver"] for n in summary["nodes"]] == ["onnxruntime", "reference", "onnxruntime"]
    assert [n["runs"] for n in summary["nodes"]] == [8, 8, 8]
    events = profile.stop()["traceEvents"]
    nodes = [e for e in events if e["ph"] == "X"]
    assert len(nodes) == 24 and {e["cat"] for e in nodes} == {"node"}
    assert len({e["tid"] for e in nodes}) == 3
    assert all(inst.trace is None for inst in model._instances)


def test_a_profile_keeps_at_most_its_limit_and_counts_failures(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    profile = crossrt.profiling.Profile(model, max_requests=10, drawn_requests=3).start()
    assert profile.recording
    for i in range(30):
        model.run({"x": x(i)})
    with pytest.raises(crossrt.InvalidInputError):
        model.run({"x": np.zeros((2, 2), np.float32)})
    trace = profile.stop()
    assert not profile.recording
    (summary,) = profile.summary()
    assert (summary["requests"], summary["dropped"], summary["failed"]) == (10, 20, 1)
    drawn = [e for e in trace["traceEvents"] if e["ph"] == "b" and e["name"] == model.name]
    assert len(drawn) == 3
    assert model._statistics.taps == []
    assert profile.stop() is trace  # stopping again gives the same trace


def test_misuse_is_refused_with_a_clear_error(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    with pytest.raises(crossrt.InvalidArgumentError, match="never started"):
        crossrt.profiling.Profile(model).stop()
    profile = crossrt.profiling.Profile(model).start()
    with pytest.raises(crossrt.InvalidArgumentError, match="started already"):
        profile.start()
    profile.stop()
    with pytest.raises(crossrt.InvalidArgumentError, match="max_requests"):
        crossrt.profiling.Profile(model, max_requests=-1)
    rt.close()
    with pytest.raises(crossrt.ClosedError):
        rt.profile()


def test_an_empty_profile_has_no_numbers(rt: crossrt.Runtime, tiny_exe: crossrt.Executable) -> None:
    model = rt.load(tiny_exe)
    with crossrt.profiling.Profile(model) as profile:
        pass
    (summary,) = profile.summary()
    assert summary["requests"] == 0
    assert summary["latency_us"] == {"mean": None, "p50": None, "p99": None}


def test_spans_of_your_own_are_drawn_on_their_tracks(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    before = time.perf_counter_ns()
    with crossrt.profiling.Profile(model) as profile:
        began = time.perf_counter_ns()
        batch = {"x": x(1)}
        profile.mark("prepare", began, time.perf_counter_ns(), "my app", images=1)
        model.run(batch)
        profile.mark("too early", before, time.perf_counter_ns())  # began before the start
    events = profile.stop()["traceEvents"]
    (mine,) = [e for e in events if e.get("cat") == "mark"]
    assert (mine["name"], mine["args"]) == ("prepare", {"images": 1})
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[mine["tid"]] == "my app"


def test_copies_between_host_and_device_memory_are_drawn(rt: crossrt.Runtime) -> None:
    """On the simulated accelerator (its own memory), a plain run copies its input in and
    its output out: each copy a span, summed per direction."""
    from concurrency_models import tiny

    model = rt.load(crossrt.compile(tiny(), "sim:0"))
    with crossrt.profiling.Profile(model) as profile:
        for i in range(3):
            model.run({"x": x(i)})
    (summary,) = profile.summary()
    copies = summary["copies"]
    assert set(copies) == {"host_to_device", "device_to_host"}
    assert copies["host_to_device"]["count"] == 3
    assert copies["host_to_device"]["bytes"] == 3 * 4 * 8 * 4
    events = [e for e in profile.stop()["traceEvents"] if e.get("cat") == "copy"]
    assert len(events) == 6 and {e["name"] for e in events} == {
        "host to device",
        "device to host",
    }
    assert model.memory.transfers.spans is None  # stopped
