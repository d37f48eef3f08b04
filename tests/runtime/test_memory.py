"""Device memory: allocator statistics, per-model budgets, device limits, the allocation log
and its CSV dump, Runtime.memory_stats and the copy counter."""

from __future__ import annotations

import csv
import dataclasses
import gc
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt import (
    InvalidArgumentError,
    InvalidOptionError,
    OutOfResourcesError,
    StatusCode,
    Tensor,
)
from crossrt.config import settings
from crossrt.drivers import DeviceInfo, Driver, get_driver
from crossrt.memory import Placement
from crossrt.runtime.memory import allocator, memlog
from crossrt.runtime.memory.allocation import HostMemory
from crossrt.runtime.memory.allocator import Allocator, allocator_for, copied_bytes
from small_models import add_one


@pytest.fixture(autouse=True)
def fresh_log(runtime_dir: Path) -> Iterator[None]:
    """Dumps go to a directory of this test's own, and each test starts a fresh log."""
    memlog.reset_memory_log()
    yield
    memlog.reset_memory_log()


def _small_allocator(limit: int) -> Allocator:
    hooks = HostMemory()
    return Allocator(hooks, dataclasses.replace(hooks.device(), id="small:0"), limit=limit)


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_statistics_follow_allocations_per_owner() -> None:
    a = _small_allocator(1 << 20)
    x = a.allocate(100, owner="m1", name="x")
    y = a.allocate(50, owner="m2")
    a.free(x)
    z = a.allocate(10, owner="m1")
    stats = a.stats()
    assert (stats.bytes_in_use, stats.peak_bytes, stats.allocations) == (60, 150, 2)
    assert stats.limit_bytes == 1 << 20 and stats.coherent
    m1 = stats.owners["m1"]
    assert (m1.bytes_in_use, m1.peak_bytes, m1.allocations) == (10, 100, 1)
    a.free(y)
    a.free(z)
    a.free(z)  # twice is harmless
    assert a.stats().bytes_in_use == 0 and a.stats().owners["m2"].allocations == 0
    json.dumps(a.stats().to_dict())


@pytest.mark.parametrize("size", [-1, 1.5, True, "8"])
def test_bad_sizes_are_invalid(size: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="whole number of bytes"):
        _small_allocator(100).allocate(size)


def test_budget_exceeded_names_the_model_the_request_and_what_is_left() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(256), "cpu")
        model.memory.set_budget(1000)
        assert model.memory.budget == 1000
        kept = Tensor((150,), "float32", owner=model)  # 600 bytes
        with pytest.raises(OutOfResourcesError) as info:
            Tensor((128,), "float32", name="extra", owner=model)  # 512 more
        err = info.value
        assert err.code is StatusCode.RESOURCE
        assert "model 'add_one'" in err.message and "'extra' (512 bytes)" in err.message
        assert "400 are left" in err.message and "memory.set_budget" in err.message
        assert err.details["requested"] == 512 and err.details["available"] == 400
        stats = model.memory.stats()
        assert (stats.bytes_in_use, stats.allocations, stats.budget_bytes) == (600, 1, 1000)
        kept.free()
        assert model.memory.stats().bytes_in_use == 0
        Tensor((250,), "float32", owner=model).free()  # fits now
        model.memory.set_budget(None)
        Tensor((1000,), "float32", owner=model).free()


def test_a_driver_registered_again_keeps_the_devices_books() -> None:
    """A driver loaded again (a fresh registry, a plugin reloaded) serves the same host
    memory: a model's budget set on the allocator it got stays the one its tensors are charged
    to (a new allocator left the budget behind: make test, order-dependent, DID NOT RAISE)."""
    first = get_driver("onnxruntime")
    device = first.devices()[0]
    again = type(first)()
    books = allocator.device_allocator(first, device)
    books.set_budget("a-model#1", 1000)
    try:
        assert allocator.device_allocator(again, device) is books
        assert books.budget("a-model#1") == 1000
    finally:
        books.set_budget("a-model#1", None)
        allocator.device_allocator(first, device)  # the registered driver's hooks back


def test_device_limit_exceeded() -> None:
    a = _small_allocator(1000)
    a.allocate(900)
    with pytest.raises(OutOfResourcesError, match=r"small:0 has 100 of its 1000 bytes left"):
        a.allocate(200, name="big")
    assert a.stats().failures == 1 and a.stats().bytes_in_use == 900


def test_failed_allocation_dumps_the_log_as_csv(runtime_dir: Path) -> None:
    a = _small_allocator(1000)
    first = a.allocate(300, owner="m", name="first")
    a.allocate(500, owner="m", name="second")
    a.free(first)
    with pytest.raises(OutOfResourcesError) as info:
        a.allocate(900, owner="m", name="too-big")
    path = info.value.details["memlog"]
    assert path and Path(path).parent == runtime_dir and path in info.value.message
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    rows = _rows(path)
    assert list(rows[0]) == list(memlog.COLUMNS)
    assert [(r["event"], r["name"], r["bytes"]) for r in rows] == [
        ("alloc", "first", "300"),
        ("alloc", "second", "500"),
        ("free", "first", "300"),
        ("fail", "too-big", "900"),
    ]
    failing = rows[-1]
    assert (failing["device"], failing["owner"], failing["device_in_use"]) == (
        "small:0",
        "m",
        "500",
    )
    assert "500 of its 1000 bytes left" in failing["note"]


def test_the_log_is_a_bounded_ring() -> None:
    log = memlog.reset_memory_log(3)
    a = _small_allocator(1 << 20)
    for i in range(5):
        a.allocate(i + 1, name=f"t{i}")
    rows = log.rows()
    assert [r.name for r in rows] == ["t2", "t3", "t4"]
    assert [r.seq for r in rows] == [3, 4, 5]


def test_a_log_of_size_zero_still_dumps_the_failure() -> None:
    memlog.reset_memory_log(0)
    a = _small_allocator(10)
    a.allocate(5)
    with pytest.raises(OutOfResourcesError) as info:
        a.allocate(6, name="x")
    assert [r["event"] for r in _rows(info.value.details["memlog"])] == ["fail"]


def test_memlog_size_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings({}).memlog_max_entries == 65536
    assert settings({"CROSSRT_MEMLOG_MAX_SIZE": "12"}).memlog_max_entries == 12
    with pytest.raises(InvalidOptionError, match="CROSSRT_MEMLOG_MAX_SIZE='lots'"):
        _ = settings({"CROSSRT_MEMLOG_MAX_SIZE": "lots"}).memlog_max_entries
    monkeypatch.setenv("CROSSRT_MEMLOG_MAX_SIZE", "2")
    assert memlog.reset_memory_log().max_entries == 2


def test_driver_out_of_memory_becomes_out_of_resources() -> None:
    class Exhausted(HostMemory):
        def allocate(self, device: DeviceInfo, nbytes: int) -> Any:
            raise MemoryError("no pages")

    hooks = Exhausted()
    a = Allocator(hooks, hooks.device())
    with pytest.raises(OutOfResourcesError, match="driver is out of memory") as info:
        a.allocate(64)
    assert Path(info.value.details["memlog"]).exists() and a.stats().bytes_in_use == 0


def test_cpu_drivers_are_coherent_and_share_one_allocator() -> None:
    for name in ("onnxruntime", "reference"):
        driver = get_driver(name)
        cpu = driver.devices()[0]
        assert cpu.id == "cpu:0" and crossrt.runtime.memory.allocation.is_coherent(driver, cpu)
        assert isinstance(driver, Driver)
    assert allocator_for("cpu") is allocator_for("cpu:0")


def test_runtime_memory_stats_show_devices_and_models() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(256), "cpu")
        host = Tensor((8,), "float32", placement=Placement.HOST)
        stats = rt.memory_stats()
        assert {"cpu:0", "host"} <= set(stats)
        assert model.memory.owner in stats["cpu:0"].owners
        result = model.run({"x": np.zeros(256, np.float32)}, outputs={"y": None})
        stats = rt.memory_stats()
        assert stats["cpu:0"].owners[model.memory.owner].bytes_in_use == 1024
        assert stats["host"].bytes_in_use >= 32
        json.dumps({k: v.to_dict() for k, v in stats.items()})
        result["y"].free()
        host.free()
        assert rt.memory_stats()["cpu:0"].owners[model.memory.owner].bytes_in_use == 0
        kept = model.run({"x": np.zeros(256, np.float32)}, outputs={"y": None})["y"]
        model.unload()
        assert model.memory.owner in allocator.all_stats()["cpu:0"].owners
        kept.free()  # the unloaded model's account goes with its last tensor
        assert model.memory.owner not in allocator.all_stats()["cpu:0"].owners


def test_copied_bytes_counts_only_runtime_copies() -> None:
    gc.collect()
    with crossrt.Runtime() as rt:
        model = rt.load(add_one("N"), "cpu")
        x = np.ones(16, np.float32)
        before = copied_bytes()
        model.run({"x": x})
        Tensor((4,), "float32").write(np.zeros(4, np.float32))  # asked for: not counted
        assert copied_bytes() == before
        out = Tensor.allocate(64)
        model.run({"x": x}, outputs={"y": out})  # a dynamic output: copied in
        assert copied_bytes() == before + 64
        assert out.shape == (16,) and out.numpy().tolist() == [2.0] * 16
