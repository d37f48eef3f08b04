"""The ``sim`` driver: devices and links from CROSSRT_SIM, device memory apart from the host,
programs that compute on device memory (on the real ONNX Runtime), the artifact's checks, the
latency model, and ``crossrt ls --topology``."""

from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points

import numpy as np
import pytest

import crossrt
from concurrency_models import tiny
from crossrt.config import SimSettings, parse_sim, settings
from crossrt.drivers import get_driver, registry, resolve_device, sim_artifact
from crossrt.drivers.base import (
    ArtifactFile,
    CancelToken,
    CompileOptions,
    CoreSet,
    DeviceArray,
    DeviceInfo,
    DeviceKind,
    Residence,
)
from crossrt.drivers.sim import SimDriver, grid, links
from crossrt.drivers.sim_memory import SimBuffer
from crossrt.errors import StatusCode
from crossrt.model import GraphBuilder
from crossrt.tools import ls as ls_tool
from small_models import sequence_length

OPTIONS = CompileOptions()
W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64  # tiny()'s weight


@pytest.fixture
def sim() -> SimDriver:
    return SimDriver(SimSettings(devices=4, cores=2, memory_bytes=1 << 20, topology="ring"))


def _info(sim: SimDriver, device: str) -> DeviceInfo:
    return next(d for d in sim.devices() if d.id == device)


def _upload(sim: SimDriver, device: str, array: np.ndarray) -> DeviceArray:
    """``array`` copied into a new buffer on ``device``."""
    buffer = sim.allocate(_info(sim, device), array.nbytes)
    sim.copy_in(_info(sim, device), buffer, array.data)
    return DeviceArray(buffer, device, array.dtype, array.shape)


def _download(sim: SimDriver, array: DeviceArray) -> np.ndarray:
    """A host copy of a device array."""
    out = np.empty(array.shape, array.dtype)
    sim.copy_out(_info(sim, array.device), out.data, array.buffer, array.offset)
    return out


def _loaded(sim: SimDriver, model: crossrt.Model, device: int = 0):
    info = sim.devices()[device]
    return sim.load(sim.compile(model, info, OPTIONS), info, CoreSet((0, 1)), OPTIONS)


def _ort_result(model: crossrt.Model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ort = get_driver("onnxruntime")
    cpu = ort.devices()[0]
    program = ort.load(ort.compile(model, cpu, OPTIONS), cpu, CoreSet((0,)), OPTIONS)
    return program.run(feed)


# -- CROSSRT_SIM ------------------------------------------------------------------------------


def test_default_is_a_trn1_32xlarge() -> None:
    sim = settings({}).sim
    assert (sim.devices, sim.cores, sim.memory_bytes, sim.topology) == (16, 2, 32 << 30, "torus")
    assert sim.copy_gbps == 0 and sim.op_us == 0


def test_custom_settings() -> None:
    sim = settings({"CROSSRT_SIM": " devices=4, cores=3,memory=4GiB,topology=RING,op_us=5 "}).sim
    assert sim == SimSettings(4, 3, 4 << 30, "ring", 0.0, 5.0)
    assert parse_sim("copy_gbps=2.5").copy_gbps == 2.5


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("devices=0", "devices='0'"),
        ("devices=1025", "devices='1025'"),
        ("cores=two", "cores='two'"),
        ("memory=lots", "memory='lots'"),
        ("memory=0", "memory must be more than 0"),
        ("topology=star", "'star'"),
        ("copy_gbps=-1", "copy_gbps='-1'"),
        ("op_us=nan", "op_us='nan'"),
        ("speed=3", "'speed=3'"),
        ("devices", "'devices'"),
        ("devices=2,devices=3", "repeats a key"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(text: str, named: str) -> None:
    with pytest.raises(crossrt.InvalidOptionError) as info:
        _ = settings({"CROSSRT_SIM": text}).sim
    assert info.value.code is StatusCode.INVALID_OPTION
    assert "CROSSRT_SIM" in info.value.message and named in info.value.message


# -- devices and links ------------------------------------------------------------------------

# neuron-ls --topology on a trn1.32xlarge (the seed's table): device -> connected devices.
TRN1 = {
    0: (12, 3, 4, 1), 1: (13, 0, 5, 2), 2: (14, 1, 6, 3), 3: (15, 2, 7, 0),
    4: (0, 7, 8, 5), 5: (1, 4, 9, 6), 6: (2, 5, 10, 7), 7: (3, 6, 11, 4),
    8: (4, 11, 12, 9), 9: (5, 8, 13, 10), 10: (6, 9, 14, 11), 11: (7, 10, 15, 8),
    12: (8, 15, 0, 13), 13: (9, 12, 1, 14), 14: (10, 13, 2, 15), 15: (11, 14, 3, 12),
}  # fmt: skip


def test_the_default_torus_links_as_neuron_ls_shows_a_trn1() -> None:
    devices = SimDriver(SimSettings()).devices()
    assert [d.id for d in devices] == [f"sim:{i}" for i in range(16)]
    assert {i: d.links for i, d in enumerate(devices)} == {
        i: tuple(f"sim:{j}" for j in linked) for i, linked in TRN1.items()
    }


def test_topologies() -> None:
    assert [grid(n) for n in (16, 12, 6, 7, 1)] == [(4, 4), (3, 4), (2, 3), (1, 7), (1, 1)]
    assert links(4, "ring") == [(3, 1), (0, 2), (1, 3), (2, 0)]
    assert links(2, "ring") == [(1,), (0,)]
    assert links(1, "torus") == [()]
    assert links(6, "mesh") == [(3, 1), (0, 4, 2), (1, 5), (0, 4), (1, 3, 5), (2, 4)]
    assert links(4, "torus") == [(2, 1), (3, 0), (0, 3), (1, 2)]  # 2x2: one link each way
    assert links(3, "none") == [(), (), ()]
    for n, topology in ((16, "torus"), (9, "mesh"), (5, "ring")):
        table = links(n, topology)
        assert all(i in table[j] for i, linked in enumerate(table) for j in linked), "symmetric"


def test_devices_say_what_they_are(sim: SimDriver) -> None:
    devices = sim.devices()
    assert [d.links for d in devices] == [
        ("sim:3", "sim:1"), ("sim:0", "sim:2"), ("sim:1", "sim:3"), ("sim:2", "sim:0")
    ]  # fmt: skip
    for d in devices:
        assert (d.kind, d.vendor, d.driver) == (DeviceKind.ACCELERATOR, "crossrt", "sim")
        assert d.name == "crossrt simulated accelerator"
        assert (d.cores, d.memory_bytes) == (2, 1 << 20)
        caps = d.capabilities
        assert not caps.fp16 and not caps.priority and len(caps.performance_modes) == 1


def test_registered_below_the_cpu_default(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setenv("CROSSRT_SIM", "devices=3,topology=ring")
    driver = get_driver("sim")
    assert isinstance(driver, SimDriver) and len(driver.devices()) == 3
    assert driver.preference < get_driver("onnxruntime").preference
    assert resolve_device("cpu")[0].name == "onnxruntime"
    assert resolve_device("sim:2")[1].id == "sim:2"
    assert driver.install_hint and driver.version.endswith(
        f"onnxruntime-{get_driver('onnxruntime').version}"
    )
    targets = {ep.name: ep.value for ep in entry_points(group="crossrt.drivers")}
    assert targets["sim"] == "crossrt.drivers.sim:SimDriver"


def test_without_an_engine_to_compute_on_the_driver_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setenv("CROSSRT_DISABLE_DRIVERS", "onnxruntime,reference")
    status = registry.driver_status("sim")
    assert status is not None and not status.available
    assert "CROSSRT_DISABLE_DRIVERS" in status.reason


# -- device memory ----------------------------------------------------------------------------


def test_the_host_reads_device_memory_only_through_copy_out(sim: SimDriver) -> None:
    data = np.arange(16, dtype=np.uint8)
    array = _upload(sim, "sim:0", data)
    with pytest.raises(TypeError):
        memoryview(array.buffer)  # no buffer protocol
    assert np.asarray(array.buffer).dtype == object  # no __array__: not its bytes
    np.testing.assert_array_equal(_download(sim, array), data)
    part = np.empty(4, np.uint8)
    sim.copy_out(sim.devices()[0], part.data, array.buffer, 10)
    assert part.tolist() == [10, 11, 12, 13]


def test_a_buffer_of_another_device_is_refused_naming_both(sim: SimDriver) -> None:
    zero, one, two = sim.devices()[:3]
    buffer = sim.allocate(one, 8)
    calls = {
        "copy_in": lambda: sim.copy_in(zero, buffer, memoryview(bytes(8))),
        "copy_out": lambda: sim.copy_out(zero, memoryview(bytearray(8)), buffer),
        "free": lambda: sim.free(zero, buffer),
        "copy_device": lambda: sim.copy_device(two, sim.allocate(two, 8), sim.allocate(zero, 8), 8),
    }
    for what, call in calls.items():
        with pytest.raises(crossrt.CrossrtError) as info:
            call()
        assert info.value.code is StatusCode.OPERATION_FORBIDDEN, what
        assert "sim:1" in info.value.message or "sim:0" in info.value.message
        assert "through the host" in info.value.message
    with pytest.raises(crossrt.CrossrtError) as info:
        sim.copy_in(zero, buffer, memoryview(bytes(8)))
    assert "on sim:0" in info.value.message and "memory of sim:1" in info.value.message
    with pytest.raises(crossrt.CrossrtError) as info:
        sim.copy_in(zero, np.zeros(8, np.uint8), memoryview(bytes(8)))
    assert info.value.code is StatusCode.INVALID and "allocate" in info.value.message


def test_copy_device_within_a_device_and_over_a_link(sim: SimDriver) -> None:
    zero, one = sim.devices()[:2]
    src = _upload(sim, "sim:0", np.arange(8, dtype=np.uint8))
    here, peer = sim.allocate(zero, 8), sim.allocate(one, 8)
    sim.copy_device(zero, here, src.buffer, 4, dst_offset=4)
    sim.copy_device(zero, peer, src.buffer, 8)  # sim:0 and sim:1 are linked in the ring
    got = np.empty(8, np.uint8)
    sim.copy_out(zero, got.data, here)
    assert got.tolist() == [0, 0, 0, 0, 0, 1, 2, 3]
    sim.copy_out(one, got.data, peer)
    assert got.tolist() == list(range(8))


def test_freed_and_out_of_range_accesses_are_refused(sim: SimDriver) -> None:
    zero = sim.devices()[0]
    buffer = sim.allocate(zero, 8)
    with pytest.raises(crossrt.CrossrtError) as info:
        sim.copy_in(zero, buffer, memoryview(bytes(4)), offset=6)
    assert (
        info.value.code is StatusCode.INVALID and "outside the 8-byte buffer" in info.value.message
    )
    sim.free(zero, buffer)
    assert buffer.freed
    for call in (
        lambda: sim.copy_in(zero, buffer, memoryview(bytes(8))),
        lambda: sim.copy_out(zero, memoryview(bytearray(8)), buffer),
        lambda: sim.free(zero, buffer),
    ):
        with pytest.raises(crossrt.CrossrtError) as info:
            call()
        assert info.value.code is StatusCode.INVALID_HANDLE and "freed" in info.value.message


def test_capacity_is_enforced_per_device_and_freeing_makes_room(sim: SimDriver) -> None:
    zero, one = sim.devices()[:2]
    first = sim.allocate(zero, 768 << 10)
    with pytest.raises(crossrt.OutOfResourcesError) as info:
        sim.allocate(zero, 512 << 10)
    assert info.value.code is StatusCode.RESOURCE
    assert "sim:0" in info.value.message
    assert info.value.details == {"device": "sim:0", "requested": 512 << 10, "free": 256 << 10}
    sim.allocate(one, 512 << 10)  # another device's memory is its own
    sim.free(zero, first)
    assert sim.memory(zero).used == 0
    sim.allocate(zero, 1 << 20)  # the whole device again


def test_concurrent_allocations_never_overcommit(sim: SimDriver) -> None:
    zero = sim.devices()[0]
    start = threading.Barrier(8)

    def grab(_: int) -> int:
        start.wait()
        taken = 0
        while True:
            try:
                sim.allocate(zero, 4096)
            except crossrt.OutOfResourcesError:
                return taken
            taken += 1

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(grab, range(8))) == (1 << 20) // 4096
    assert sim.memory(zero).used == 1 << 20


# -- programs on device memory ----------------------------------------------------------------


def test_run_computes_on_device_memory_as_onnxruntime_does(sim: SimDriver) -> None:
    model = tiny()
    program = _loaded(sim, model)
    assert program.residence() == {"x": Residence.DEVICE, "y": Residence.DEVICE}
    x = np.random.default_rng(0).random((4, 8), dtype=np.float32)
    result = program.run({"x": _upload(sim, "sim:0", x)})
    y = result["y"]
    assert isinstance(y, DeviceArray) and isinstance(y.buffer, SimBuffer)
    assert (y.device, y.shape, y.dtype) == ("sim:0", (4, 8), np.float32)
    np.testing.assert_allclose(_download(sim, y), _ort_result(model, {"x": x})["y"], rtol=1e-6)
    given = DeviceArray(sim.allocate(sim.devices()[0], 128), "sim:0", np.dtype(np.float32), (4, 8))
    assert program.run({"x": _upload(sim, "sim:0", 2 * x)}, {"y": given})["y"] is given
    np.testing.assert_allclose(_download(sim, given), 2 * x @ W + 1, rtol=1e-6)
    program.close()


def test_bind_computes_the_new_contents_on_every_call(sim: SimDriver) -> None:
    program = _loaded(sim, tiny())
    zero = sim.devices()[0]
    x = _upload(sim, "sim:0", np.zeros((4, 8), np.float32))
    call = program.bind({"x": x})
    used = sim.memory(zero).used
    for k in range(1, 4):
        contents = np.full((4, 8), k, np.float32)
        sim.copy_in(zero, x.buffer, contents.data)
        y = call()["y"]
        np.testing.assert_allclose(_download(sim, y), contents @ W + 1, rtol=1e-6)
    assert call()["y"] is y  # the output bind allocated, written in place each time
    assert sim.memory(zero).used == used  # nothing allocated per call
    del call, y
    gc.collect()
    assert sim.memory(zero).used == x.nbytes  # the binding's output went with it


def test_dynamic_outputs_get_a_buffer_of_the_shape_each_run(sim: SimDriver) -> None:
    b = GraphBuilder("dyn")
    x = b.input("x", "float32", ["n", 3])
    b.output(b.op("Relu", [x], outputs=["y"]))
    program = _loaded(sim, b.finish())
    call = program.bind({"x": _upload(sim, "sim:0", -np.ones((5, 3), np.float32))})
    for rows in (2, 7):
        data = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - 4
        y = program.run({"x": _upload(sim, "sim:0", data)})["y"]
        assert y.shape == (rows, 3)
        np.testing.assert_array_equal(_download(sim, y), np.maximum(data, 0))
    first, second = call()["y"], call()["y"]
    assert first.buffer is not second.buffer and first.shape == (5, 3)


def test_values_that_are_not_tensors_pass_as_they_are(sim: SimDriver) -> None:
    proto = sequence_length()
    program = _loaded(sim, crossrt.load_model(proto))
    assert program.residence() == {
        "x": Residence.DEVICE,
        "n": Residence.DEVICE,
        "y": Residence.DEVICE,
    }
    seq = [np.ones(3, np.float32), np.ones(2, np.float32)]
    result = program.run({"s": seq, "x": _upload(sim, "sim:0", np.arange(2, dtype=np.float32))})
    assert int(_download(sim, result["n"])) == 2
    assert _download(sim, result["y"]).tolist() == [0, 1]


def test_inputs_must_lie_in_the_programs_device_memory(sim: SimDriver) -> None:
    program = _loaded(sim, tiny(), device=0)
    x = np.ones((4, 8), np.float32)
    with pytest.raises(crossrt.InvalidInputError) as info:
        program.run({"x": _upload(sim, "sim:1", x)})
    assert info.value.code is StatusCode.EXEC_BAD_INPUT
    assert "memory of sim:1" in info.value.message and "runs on sim:0" in info.value.message
    with pytest.raises(crossrt.InvalidInputError, match="takes it in device memory"):
        program.run({"x": x})
    forged = DeviceArray(_upload(sim, "sim:1", x).buffer, "sim:0", x.dtype, x.shape)
    with pytest.raises(crossrt.CrossrtError) as info:
        program.run({"x": forged})
    assert info.value.code is StatusCode.OPERATION_FORBIDDEN
    wrong = DeviceArray(sim.allocate(sim.devices()[0], 256), "sim:0", np.dtype(np.float64), (4, 8))
    with pytest.raises(crossrt.InvalidInputError, match="float32 \\[4,8\\]"):
        program.run({"x": _upload(sim, "sim:0", x)}, {"y": wrong})
    used = sim.memory(sim.devices()[0]).used
    with pytest.raises(crossrt.InvalidInputError):
        program.bind({"x": x})
    assert sim.memory(sim.devices()[0]).used == used  # a refused bind keeps no buffer


def test_cores_outside_the_device_are_refused(sim: SimDriver) -> None:
    info = sim.devices()[0]
    artifact = sim.compile(tiny(), info, OPTIONS)
    with pytest.raises(crossrt.CrossrtError) as error:
        sim.load(artifact, info, CoreSet((1, 2)), OPTIONS)
    assert error.value.code is StatusCode.INVALID and "[2]" in error.value.message


def _wide() -> crossrt.Model:
    """y = x @ W + 1 with a 16 KiB weight: stored beside ORT's graph, mapped from a file."""
    b = GraphBuilder("wide")
    x = b.input("x", "float32", [4, 64])
    w = b.constant(np.eye(64, dtype=np.float32) * 2)
    b.output(b.op("Add", [b.op("MatMul", [x, w]), b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


def test_an_artifact_is_loaded_from_its_place_in_a_file(sim: SimDriver, tmp_path) -> None:
    info = sim.devices()[2]
    artifact = sim.compile(_wide(), info, OPTIONS)
    assert sim_artifact.unpack(artifact)[1] % 4096 == 0  # ORT's pre-packed pages stay pages
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(4096) + artifact)  # as a .crm section: at a page
    x = np.ones((4, 64), np.float32)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        file = ArtifactFile(str(path), 4096, ArtifactFile.identity_of(os.stat(path)))
        view = memoryview(mapped)[4096:]
        program = sim.load(view, info, CoreSet((0,)), OPTIONS, file=file)
        y = program.run({"x": _upload(sim, "sim:2", x)})["y"]
        np.testing.assert_array_equal(_download(sim, y), 2 * x + 1)
        program.close()
        view.release()


def test_instances_share_what_the_engine_shares(sim: SimDriver) -> None:
    info = sim.devices()[0]
    artifact = sim.compile(_wide(), info, OPTIONS)
    with sim.sharing(artifact, None, 2) as file:
        assert file is not None and file.offset == 0  # ORT wrote the artifact to one file
        with open(file.path, "rb") as f:
            assert f.read(8) == sim_artifact.MAGIC  # ours, whole: load() finds ORT's inside
        programs = [sim.load(artifact, info, CoreSet((k,)), OPTIONS, file=file) for k in (0, 1)]
    x = _upload(sim, "sim:0", np.ones((4, 64), np.float32))
    for program in programs:
        np.testing.assert_array_equal(
            _download(sim, program.run({"x": x})["y"]), np.full((4, 64), 3)
        )
        program.close()


# -- the artifact -----------------------------------------------------------------------------


def test_damaged_or_foreign_artifacts_are_refused(sim: SimDriver) -> None:
    info = sim.devices()[0]
    artifact = sim.compile(tiny(), info, OPTIONS)
    assert sim.describe_artifact(artifact)["engine"].startswith("onnxruntime ")
    ort = get_driver("onnxruntime")
    foreign = ort.compile(tiny(), ort.devices()[0], OPTIONS)
    newer = artifact[:8] + (2).to_bytes(4, "little") + artifact[12:]
    text_at = artifact.index(b"{")
    cases = {
        "foreign": foreign,
        "truncated": artifact[:20],
        "not json": artifact[:text_at] + b"!" + artifact[text_at + 1 :],
        "missing field": artifact.replace(b'"ops"', b'"opz"'),
        "bad tensor": artifact.replace(b'"float32"', b'"float99"', 1),
    }
    for what, damaged in cases.items():
        with pytest.raises(crossrt.errors.InvalidContainerError) as error:
            sim.load(damaged, info, CoreSet((0,)), OPTIONS)
        assert "the sim artifact is corrupt" in error.value.message, what
        assert "recompile" in error.value.message
    with pytest.raises(crossrt.CrossrtError) as error:
        sim.load(newer, info, CoreSet((0,)), OPTIONS)
    assert error.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    version = ort.version.encode()
    other_version = artifact.replace(version, b"9" * len(version), 1)  # the same length
    with pytest.raises(crossrt.CrossrtError) as error:
        sim.load(other_version, info, CoreSet((0,)), OPTIONS)
    assert error.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    assert "9" * len(version) in error.value.message and ort.version in error.value.message


# -- the latency model ------------------------------------------------------------------------


def test_copies_take_at_least_the_configured_time() -> None:
    sim = SimDriver(SimSettings(devices=1, memory_bytes=1 << 22, topology="none", copy_gbps=0.1))
    zero = sim.devices()[0]
    data = np.ones(1 << 21, np.uint8)  # 2 MiB at 0.1 GB/s: 21 ms a copy
    buffer = sim.allocate(zero, data.nbytes)
    start = time.perf_counter()
    sim.copy_in(zero, buffer, data.data)
    sim.copy_out(zero, data.data, buffer)
    assert time.perf_counter() - start >= 2 * data.nbytes / 0.1e9


def test_runs_take_at_least_op_us_per_operator_and_stop_when_cancelled() -> None:
    sim = SimDriver(SimSettings(devices=1, topology="none", op_us=5000))
    program = _loaded(sim, tiny(), device=0)  # MatMul and Add: 10 ms
    x = _upload(sim, "sim:0", np.ones((4, 8), np.float32))
    start = time.perf_counter()
    y = program.run({"x": x})["y"]
    assert time.perf_counter() - start >= 2 * 5000e-6
    sim.free(sim.devices()[0], y.buffer)
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(crossrt.CrossrtError) as error:
        program.run_cancellable({"x": x}, cancel)
    assert error.value.code is StatusCode.TIMEOUT
    assert sim.memory(sim.devices()[0]).used == x.nbytes  # the cancelled run kept nothing


# -- crossrt ls --topology --------------------------------------------------------------------


def test_ls_draws_the_torus_as_neuron_ls_does(monkeypatch, capsys) -> None:
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.delenv("CROSSRT_SIM", raising=False)
    assert ls_tool.main(["--topology", "--all"]) == 0
    out = capsys.readouterr().out
    assert "TOPOLOGY of sim: 16 devices, a 4x4 torus" in out
    assert "sim:5        2   32.0 GiB  sim:1, sim:4, sim:9, sim:6" in out
    drawing = out[out.index("TOPOLOGY of sim") :].splitlines()
    assert "  *––►[ 0 ]◄––►[ 1 ]◄––►[ 2 ]◄––►[ 3 ]◄––*" in drawing
    assert "  *––►[12 ]◄––►[13 ]◄––►[14 ]◄––►[15 ]◄––*" in drawing
    assert drawing[-1].split() == ["*"] * 4
    assert next(line for line in out.splitlines() if line.strip().startswith("sim:15"))


def test_ls_lists_simulated_devices_only_when_asked(monkeypatch, capsys) -> None:
    """A newcomer's ``crossrt ls`` shows the machine's devices; the 16 default ``sim:N`` are
    one line saying how to see them (``--all``, or ``CROSSRT_SIM`` set), in natural order."""
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.delenv("CROSSRT_SIM", raising=False)
    assert ls_tool.main([]) == 0
    out = capsys.readouterr().out
    assert not any(line.strip().startswith("sim:") for line in out.splitlines())
    assert "simulated devices sim:0-15 not shown: crossrt ls --all" in out
    assert ls_tool.main(["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(d["driver"] != "sim" for d in doc["devices"])
    assert doc["hidden_devices"] == "sim:0-15"
    assert ls_tool.main(["--all", "--json"]) == 0
    ids = [d["id"] for d in json.loads(capsys.readouterr().out)["devices"] if d["driver"] == "sim"]
    assert ids == [f"sim:{i}" for i in range(16)]
    monkeypatch.setenv("CROSSRT_SIM", "devices=12")
    monkeypatch.setattr(registry, "_statuses", None)  # the sim driver reads it when made
    assert ls_tool.main([]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "sim:" in line]
    assert listed == [f"sim:{i}" for i in range(12)]
    with crossrt.Runtime() as rt:
        assert [d.id for d in rt.devices(simulated=True) if d.driver == "sim"] == listed
        assert all(d.driver != "sim" for d in rt.devices(simulated=False))


def test_a_missing_device_names_the_others_in_natural_order(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.delenv("CROSSRT_SIM", raising=False)
    with pytest.raises(crossrt.DeviceUnavailableError, match=r"devices: cpu:0, sim:0-15 \("):
        registry.resolve_device("sim:99")
    assert registry.describe_devices(["sim:10", "sim:2", "cpu:0", "sim:3", "x"]) == (
        "cpu:0, sim:2-3, sim:10, x"
    )


@pytest.mark.parametrize(
    ("n", "topology", "shape"),
    [(16, "torus", (4, 4, True)), (6, "mesh", (2, 3, False)), (5, "ring", (1, 5, True))],
)
def test_ls_finds_the_grid_the_links_form(n: int, topology: str, shape: tuple) -> None:
    devices = [
        {"id": f"sim:{i}", "links": [f"sim:{j}" for j in linked]}
        for i, linked in enumerate(links(n, topology))
    ]
    assert ls_tool.grid_of(devices) == shape
    devices[0]["links"] = devices[0]["links"][:1]
    assert ls_tool.grid_of(devices) is None


def test_ls_topology_json_and_a_ring(monkeypatch, capsys) -> None:
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setenv("CROSSRT_SIM", "devices=3,topology=ring")
    assert ls_tool.main(["--topology", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["topology"] == [
        {
            "driver": "sim",
            "devices": ["sim:0", "sim:1", "sim:2"],
            "rows": 1,
            "cols": 3,
            "wraps": True,
        }
    ]
    assert ls_tool.main(["--topology"]) == 0
    assert "  *––►[ 0 ]◄––►[ 1 ]◄––►[ 2 ]◄––*" in capsys.readouterr().out.splitlines()


def test_ls_topology_as_a_user_types_it() -> None:
    env = {**os.environ, "CROSSRT_SIM": "devices=6,topology=mesh", "CROSSRT_DISABLE_DRIVERS": ""}
    done = subprocess.run(
        [sys.executable, "-m", "crossrt", "ls", "--topology"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "TOPOLOGY of sim: 6 devices, a 2x3 mesh" in done.stdout
    assert "      [ 3 ]◄––►[ 4 ]◄––►[ 5 ]" in done.stdout.splitlines()
    device_line = next(line for line in done.stdout.splitlines() if line.startswith("  sim:4 "))
    assert device_line.split()[1:4] == ["sim", "accelerator", "2"]
