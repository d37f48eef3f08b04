"""A load across devices (``Runtime.load(exe, ["sim:0", "sim:1"])``): instances on each device,
allowed only along the devices' links (issue 9: core groups across devices follow the links).

The sim driver's default topology is a 4x4 torus: ``sim:0`` links to ``sim:1``, ``sim:3``,
``sim:4`` and ``sim:12``; ``sim:5`` links to ``sim:1`` but not to ``sim:0``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt import InvalidArgumentError


@pytest.fixture(autouse=True)
def _default_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROSSRT_SIM", raising=False)


@pytest.fixture(scope="module")
def exe() -> crossrt.Executable:
    b = crossrt.GraphBuilder("relu")
    x = b.input("x", "float32", [4])
    b.output(b.op("Relu", [x]))
    return crossrt.compile(b.finish(), "sim")


X = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)


def test_linked_devices_each_get_their_instances(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    model = rt.load(exe, ["sim:0", "sim:1"], instances=2, cores_per_instance=1)
    assert model.instances.devices == ["sim:0", "sim:0", "sim:1", "sim:1"]
    assert model.instances.cores == [(0,), (1,), (0,), (1,)]
    assert model.device.id == "sim:0"
    results: list[np.ndarray] = []

    def run() -> None:  # several at once: every instance busy, each on its device
        for _ in range(20):
            results.append(model.run({"x": X}))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80
    for result in results:
        (value,) = result.values()
        np.testing.assert_array_equal(value, np.maximum(X, 0))
    moved = model.memory.transfer_stats()
    assert moved.host_to_device_copies == 80 and moved.device_to_host_copies == 80
    assert moved.host_to_device_bytes == 80 * X.nbytes


def test_devices_reached_through_the_others_are_linked(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    model = rt.load(exe, ["sim:0", "sim:1", "sim:5"])  # sim:5 through sim:1
    assert model.instances.devices == ["sim:0", "sim:1", "sim:5"]
    (value,) = model.run({"x": X}).values()
    np.testing.assert_array_equal(value, np.maximum(X, 0))


def test_devices_without_a_link_are_refused(rt: crossrt.Runtime, exe: crossrt.Executable) -> None:
    with pytest.raises(InvalidArgumentError, match=r"sim:5 are not linked to sim:0") as info:
        rt.load(exe, ["sim:0", "sim:5"])
    assert info.value.details["not_linked"] == ["sim:5"]
    assert "crossrt ls --topology" in info.value.message
    assert rt.models == []


@pytest.mark.parametrize("devices", [["sim:0", "sim:0"], []])
def test_a_list_of_devices_is_distinct_and_not_empty(
    rt: crossrt.Runtime, exe: crossrt.Executable, devices: list[str]
) -> None:
    with pytest.raises(InvalidArgumentError, match="distinct devices"):
        rt.load(exe, devices)


def test_a_list_of_one_device_is_that_device(rt: crossrt.Runtime, exe: crossrt.Executable) -> None:
    model = rt.load(exe, ["sim:3"])
    assert model.device.id == "sim:3" and model.instances.devices == ["sim:3"]


def test_a_model_compiled_for_another_kind_is_refused_on_a_list(
    rt: crossrt.Runtime, exe: crossrt.Executable
) -> None:
    with pytest.raises(crossrt.CrossrtError):
        rt.load(exe, ["cpu:0"])


def test_a_load_that_fails_on_a_later_device_closes_the_earlier_devices_programs(
    rt: crossrt.Runtime, exe: crossrt.Executable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sim:0's instances load, sim:1's load fails: sim:0's programs are closed again, not left
    holding their engines (they were, before the load plan closed every device's)."""
    from crossrt.drivers import DeviceInfo, Program, get_driver
    from crossrt.drivers.sim_program import SimProgram
    from crossrt.errors import OutOfResourcesError

    driver = get_driver("sim")
    load = driver.load
    loaded: list[Program] = []
    closed: list[SimProgram] = []

    def failing_on_sim1(artifact: Any, device: DeviceInfo, *args: Any, **kw: Any) -> Program:
        if device.id == "sim:1":
            raise OutOfResourcesError("sim:1 is full")
        loaded.append(load(artifact, device, *args, **kw))
        return loaded[-1]

    close = SimProgram.close

    def counted_close(self: SimProgram) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(driver, "load", failing_on_sim1)
    monkeypatch.setattr(SimProgram, "close", counted_close)
    with pytest.raises(OutOfResourcesError, match="sim:1 is full"):
        rt.load(exe, ["sim:0", "sim:1"], instances=2, cores_per_instance=1)
    assert len(loaded) == 2 and {id(p) for p in closed} == {id(p) for p in loaded}
    assert rt.models == [] and rt.core_groups == []


def test_a_model_not_compiled_yet_is_compiled_for_the_first_device_of_the_list(
    rt: crossrt.Runtime,
) -> None:
    b = crossrt.GraphBuilder("relu")
    x = b.input("x", "float32", [4])
    b.output(b.op("Relu", [x]))
    model = rt.load(b.finish(), ["sim:1", "sim:0"])
    assert model.executable.device == "sim:1" and model.instances.devices == ["sim:1", "sim:0"]
    (value,) = model.run({"x": X}).values()
    np.testing.assert_array_equal(value, np.maximum(X, 0))
