"""Threads pinned to their instance's cores: crossrt's workers, ONNX Runtime's pool threads,
and a caller's thread in ``pinned_runs`` (a user's thread is otherwise left where it is)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import crossrt
from concurrency_models import tiny, watch_affinity
from crossrt.drivers import get_driver
from crossrt.drivers.base import CoreSet
from crossrt.host import host_cpus
from crossrt.runtime.cores.pinning import pinned_runs

WAIT = 10
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = pytest.mark.skipif(
    len(CPUS) < 2 or host_cpus().limit < 2, reason="pinning needs 2 usable CPUs and Linux"
)
X = np.ones((4, 8), np.float32)


def affinities() -> dict[int, set[int]]:
    """Each thread of this process (by native id) and the CPUs it may run on."""
    return {
        int(t.name): os.sched_getaffinity(int(t.name)) for t in Path("/proc/self/task").iterdir()
    }


def _new_threads(before: set[int]) -> dict[int, set[int]]:
    return {tid: cpus for tid, cpus in affinities().items() if tid not in before}


def test_each_worker_runs_pinned_to_the_instance_it_serves(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=2, cores_per_instance=1)
    instances = model._scheduler.instances
    assert [inst.pin for inst in instances] == [(rt.cores[0],), (rt.cores[1],)]
    seen: list[set[int]] = []
    lock = threading.Lock()

    def record(result: object, user_data: object) -> None:
        with lock:
            seen.append(os.sched_getaffinity(0))

    futures = [model.run_async({"x": X}, block=True, callback=record) for _ in range(8)]
    for future in futures:
        future.result(WAIT)
    # Each callback ran on its worker right after the run: pinned to one instance's CPU.
    assert len(seen) == 8 and all(cpus in ({rt.cores[0]}, {rt.cores[1]}) for cpus in seen)


def test_the_callers_thread_is_never_pinned(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=2, cores_per_instance=1)
    seen = watch_affinity(model)
    before = os.sched_getaffinity(0)
    for _ in range(4):
        model.run({"x": X})
        model._line.idle.rotate(1)  # the other instance next
    assert os.sched_getaffinity(0) == before
    assert [cpus for _, cpus in seen] == [before] * 4  # the engine ran where the caller was


def test_a_thread_in_pinned_runs_computes_on_each_instance_s_cores(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe, instances=2, cores_per_instance=1)
    seen = watch_affinity(model)
    before = os.sched_getaffinity(0)
    with pinned_runs():
        for _ in range(6):
            model.run({"x": X})
            model._line.idle.rotate(1)  # the other instance next: the thread moves
        model.run_async({"x": X}).result(WAIT)  # a worker's run, as before
    assert os.sched_getaffinity(0) == before  # given back on leaving
    pins = {(rt.cores[0],), (rt.cores[1],)}
    assert len(seen) == 7 and {pin for pin, _ in seen} == pins
    assert all(pin is not None and cpus == set(pin) for pin, cpus in seen), seen


def test_a_thread_in_pinned_runs_goes_back_to_its_cpus_for_a_model_on_every_core(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    split = rt.load(tiny_exe, instances=2, cores_per_instance=1)
    whole = rt.load(tiny_exe)
    on_split, on_whole = watch_affinity(split), watch_affinity(whole)
    before = os.sched_getaffinity(0)
    with pinned_runs():
        split.run({"x": X})
        whole.run({"x": X})  # not pinned: on the CPUs the thread had, not the last instance's
        split.run({"x": X})
    assert [cpus for _, cpus in on_whole] == [before]
    pin = on_split[0][0]
    assert pin is not None and [cpus for _, cpus in on_split] == [set(pin)] * 2


def test_a_model_on_every_core_is_not_pinned(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    model = rt.load(tiny_exe)
    assert model._scheduler.instances[0].pin is None
    model.unload()
    one = rt.load(tiny_exe, cores=1)
    assert one._scheduler.instances[0].pin == (rt.cores[0],)


def test_ort_pins_its_pool_threads_to_the_cores_after_the_first() -> None:
    driver = get_driver("onnxruntime")
    (device,) = driver.devices()
    artifact = crossrt.compile(tiny()).nodes[0].artifact
    before = set(affinities())
    options = crossrt.compile(tiny()).options
    cores = CoreSet((0, 1), host_cpus=(CPUS[1], CPUS[0]), pinned=True)
    program = driver.load(artifact, device, cores, options)
    try:
        assert program.run({"x": X})["y"].shape == (4, 8)
        # Two cores: the calling thread plus one pool thread, which pins itself to pin[1] as it
        # starts (soon after the session exists, not before it returns).
        deadline = time.monotonic() + WAIT
        while {CPUS[0]} not in (new := _new_threads(before)).values():
            assert time.monotonic() < deadline, new
            os.sched_yield()
    finally:
        program.close()


def test_a_runtime_that_owns_its_cores_pins_a_load_on_all_of_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_exe: crossrt.Executable
) -> None:
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(tmp_path))
    with crossrt.Runtime(visible_cores=CPUS[1]) as owner:
        assert owner.exclusive and owner.cores == (CPUS[1],)
        model = owner.load(tiny_exe)
        assert model._scheduler.instances[0].pin == (CPUS[1],)
        seen: list[set[int]] = []
        model.run_async({"x": X}, callback=lambda r, d: seen.append(os.sched_getaffinity(0)))
        model.run_async({"x": X}, block=True).result(WAIT)
        assert seen == [{CPUS[1]}]


def test_a_load_from_a_pinned_thread_starts_its_threads_on_every_cpu(
    rt: crossrt.Runtime, tiny_exe: crossrt.Executable
) -> None:
    """A thread inherits its creator's affinity: a model loaded from a request thread the
    last run() moved onto one core must not have its engine's and workers' threads there."""
    split = rt.load(tiny_exe, instances=2, cores_per_instance=1)
    with pinned_runs():
        split.run({"x": X})
        assert len(os.sched_getaffinity(0)) == 1  # moved onto that instance's core
        before = set(affinities())
        whole = rt.load(tiny_exe)  # on every core: 2 ORT threads, a worker, not pinned
        new = _new_threads(before)
        assert whole._scheduler.instances[0].pin is None
        assert new and all(cpus == set(CPUS) for cpus in new.values()), new
        split.run({"x": X})  # and run() moves it back where it was
        assert len(os.sched_getaffinity(0)) == 1


WATCHDOG = """
import os, threading, time
import numpy as np
import crossrt
from crossrt.runtime import watchdog
from crossrt.runtime.cores.pinning import pinned_runs
from concurrency_models import tiny
with crossrt.Runtime() as rt:
    model = rt.load(crossrt.compile(tiny()), instances=2, cores_per_instance=1)
    x = {"x": np.ones((4, 8), np.float32)}
    with pinned_runs():
        model.run(x)
        assert watchdog._thread is None and len(os.sched_getaffinity(0)) == 1
        model.run(x, deadline=time.monotonic() + 60)  # the watchdog starts from this thread
        print(sorted(os.sched_getaffinity(watchdog._thread.native_id)))
"""


def test_the_watchdog_started_from_a_pinned_thread_is_not_pinned(tmp_path: Path) -> None:
    """One watchdog per process, started by the first call with a deadline: from a thread
    run() moved onto one core, it must not stay on that core for good."""
    tests = Path(__file__).resolve().parents[1]
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(tmp_path), PYTHONPATH=str(tests))
    done = subprocess.run(
        [sys.executable, "-c", WATCHDOG], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == str(CPUS), done.stdout
