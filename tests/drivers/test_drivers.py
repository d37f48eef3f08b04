"""The driver layer: the registry, devices, supported_nodes, and ORT session settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import crossrt
from crossrt import DeviceUnavailableError, StatusCode
from crossrt.drivers import DeviceKind, available_drivers, get_driver, registry
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.drivers.registry import resolve_device
from crossrt.model import GraphBuilder
from small_models import relu

DRIVERS = ("onnxruntime", "reference")
CORES = len(os.sched_getaffinity(0))


@pytest.fixture
def fresh_registry(monkeypatch):
    """Make the registry load drivers again; the cached table comes back afterwards."""
    monkeypatch.setattr(registry, "_statuses", None)
    return monkeypatch


def _by_name() -> dict[str, crossrt.drivers.DriverStatus]:
    return {s.name: s for s in crossrt.drivers.driver_statuses()}


# -- the registry -----------------------------------------------------------------------------


def test_builtin_drivers_pass():
    statuses = _by_name()
    for name in DRIVERS:
        status = statuses[name]
        assert status.available, status.reason
        assert status.reason == ""
        assert status.driver is not None and status.driver.name == name
        assert status.target.startswith(f"crossrt.drivers.{name}:")
    assert statuses["onnxruntime"].driver.version == ort.__version__
    assert statuses["reference"].driver.version == onnx.__version__


def test_driver_statuses_are_cached():
    first = crossrt.drivers.driver_statuses()
    second = crossrt.drivers.driver_statuses()
    assert [s.driver for s in first] == [s.driver for s in second]
    assert all(a.driver is b.driver for a, b in zip(first, second, strict=True))


def test_a_driver_asked_for_by_name_is_loaded_alone(fresh_registry):
    driver = get_driver("onnxruntime")
    assert set(registry._statuses) == {"onnxruntime"}  # the reference driver is not imported
    assert registry.driver_names() == sorted((*DRIVERS, "openvino", "sim"))
    with pytest.raises(DeviceUnavailableError, match="registered drivers: onnxruntime, openvino"):
        get_driver("tpu9000")
    assert set(registry._statuses) == {"onnxruntime"}
    # Listing loads the rest and keeps the instance already made.
    assert set(_by_name()) == {*DRIVERS, "openvino", "sim"}
    assert _by_name()["onnxruntime"].driver is driver is get_driver("onnxruntime")


def test_loading_a_compiled_model_imports_only_its_driver(tmp_path):
    crossrt.compile(relu(), driver="onnxruntime").save(tmp_path / "relu.crm")
    code = (
        "import sys, numpy as np, crossrt\n"
        f"exe = crossrt.load_executable({str(tmp_path / 'relu.crm')!r})\n"
        "with crossrt.Runtime() as rt:\n"
        "    y = rt.load(exe).run({'x': -np.ones((2, 3), np.float32)})\n"
        "print(float(next(iter(y.values())).sum()), 'crossrt.drivers.reference' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSRT_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.0", "False"]


def test_available_drivers_most_preferred_first():
    names = [d.name for d in available_drivers()]
    assert names.index("onnxruntime") < names.index("reference")
    assert get_driver("onnxruntime").name == "onnxruntime"


def test_disabling_a_driver(fresh_registry):
    fresh_registry.setenv("CROSSRT_DISABLE_DRIVERS", " reference , nothing-else")
    statuses = _by_name()
    assert not statuses["reference"].available
    assert statuses["reference"].driver is None
    assert "CROSSRT_DISABLE_DRIVERS" in statuses["reference"].reason
    assert statuses["onnxruntime"].available
    with pytest.raises(DeviceUnavailableError) as info:
        get_driver("reference")
    assert info.value.code is StatusCode.DEVICE_UNAVAILABLE
    assert "unavailable" in info.value.message and "CROSSRT_DISABLE_DRIVERS" in info.value.message
    with pytest.raises(DeviceUnavailableError):
        crossrt.compile(relu(), driver="reference")
    assert crossrt.compile(relu()).nodes[0].driver == "onnxruntime"


def test_disabling_the_preferred_driver_falls_back(fresh_registry):
    fresh_registry.setenv("CROSSRT_DISABLE_DRIVERS", "onnxruntime")
    exe = crossrt.compile(relu(), device="cpu")
    assert exe.nodes[0].driver == "reference"


def test_disabling_every_driver_gives_a_clear_device_error(fresh_registry):
    fresh_registry.setenv("CROSSRT_DISABLE_DRIVERS", "onnxruntime,openvino,reference")
    with pytest.raises(DeviceUnavailableError) as info:
        crossrt.compile(relu())
    assert "devices: none" in info.value.message
    assert "crossrt ls" in info.value.message


def test_the_registry_reads_the_environment_again_when_reset(fresh_registry):
    fresh_registry.setenv("CROSSRT_DISABLE_DRIVERS", "reference")
    assert not _by_name()["reference"].available
    fresh_registry.delenv("CROSSRT_DISABLE_DRIVERS")
    fresh_registry.setattr(registry, "_statuses", None)
    assert _by_name()["reference"].available


@pytest.fixture
def extra_targets(fresh_registry, tmp_path):
    """Register drivers from modules in tmp_path next to the real ones."""
    (tmp_path / "crossrt_test_needs_engine.py").write_text(
        "raise ImportError('the fooengine package is missing; pip install fooengine')\n"
    )
    (tmp_path / "crossrt_test_boom.py").write_text(
        "from crossrt.drivers.reference import ReferenceDriver\n"
        "class Boom(ReferenceDriver):\n"
        "    name = 'boom'\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('the device is on fire')\n"
    )
    fresh_registry.syspath_prepend(str(tmp_path))
    for module in ("crossrt_test_needs_engine", "crossrt_test_boom"):
        fresh_registry.delitem(sys.modules, module, raising=False)
    real = registry._targets
    extra = {
        "missing": "crossrt_test_no_such_module_xyz:Driver",
        "needs_engine": "crossrt_test_needs_engine:Driver",
        "boom": "crossrt_test_boom:Boom",
        "not_a_driver": "collections:OrderedDict",
        "no_such_class": "crossrt.drivers.reference:NoSuchDriver",
    }
    fresh_registry.setattr(registry, "_targets", lambda: {**real(), **extra})
    return extra


def test_broken_entry_points_are_reported_and_the_others_still_work(extra_targets):
    statuses = _by_name()
    assert set(extra_targets) | set(DRIVERS) <= set(statuses)
    for name in extra_targets:
        assert not statuses[name].available
        assert statuses[name].target == extra_targets[name]
    assert "No module named 'crossrt_test_no_such_module_xyz'" in statuses["missing"].reason
    assert "engine not installed" in statuses["missing"].reason
    assert "pip install fooengine" in statuses["needs_engine"].reason
    assert "RuntimeError" in statuses["boom"].reason
    assert "the device is on fire" in statuses["boom"].reason
    assert "not a crossrt Driver" in statuses["not_a_driver"].reason
    assert "NoSuchDriver" in statuses["no_such_class"].reason
    for name in DRIVERS:
        assert statuses[name].available
    # The working drivers still compile and run.
    exe = crossrt.compile(relu(), driver="reference")
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": -np.ones((2, 3), np.float32)})
    assert (next(iter(out.values())) == 0).all()
    with pytest.raises(DeviceUnavailableError) as info:
        get_driver("missing")
    assert "No module named" in info.value.message


def test_unregistered_driver_lists_the_registered_ones():
    with pytest.raises(DeviceUnavailableError) as info:
        get_driver("tensorrt")
    assert "no driver called 'tensorrt'" in info.value.message
    assert "onnxruntime" in info.value.message and "reference" in info.value.message


# -- devices ----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_devices(driver):
    (device,) = get_driver(driver).devices()
    assert device.id == "cpu:0"
    assert device.kind is DeviceKind.CPU
    assert device.driver == driver
    assert device.cores == CORES
    assert device.memory_bytes > 0
    assert device.status == "available"
    assert device.name
    as_dict = json.loads(json.dumps(device.to_dict()))
    assert as_dict["cores"] == CORES and as_dict["kind"] == "cpu"


def test_device_capabilities():
    from crossrt.drivers.onnxruntime import precision

    ort = get_driver("onnxruntime")
    ort_cpu = next(d for d in ort.devices() if d.id == "cpu:0")  # cuda:N too with a GPU
    (ref_cpu,) = get_driver("reference").devices()
    modes = set(ort_cpu.capabilities.performance_modes)  # only what changes a session
    assert modes == {crossrt.drivers.PerformanceMode(m) for m in range(3)}  # NONE, LOW, MEDIUM
    assert ref_cpu.capabilities.performance_modes == (crossrt.drivers.PerformanceMode.NONE,)
    assert not ort_cpu.capabilities.priority and ort_cpu.capabilities.int8
    assert ort_cpu.capabilities.fp16 == precision.has_float16_arithmetic(ort._registry())


def test_resolve_device():
    drv, info = resolve_device("cpu")
    assert drv.name == "onnxruntime" and info.id == "cpu:0"
    drv, info = resolve_device("cpu:0", "reference")
    assert drv.name == "reference" and info.driver == "reference"


# -- supported_nodes --------------------------------------------------------------------------


def _mixed_model() -> crossrt.Model:
    b = GraphBuilder("mixed", opsets={"com.example": 1})
    x = b.input("x", "float32", [2, 3])
    y = b.op("Relu", [x], name="a")
    y = b.op("Foo", [y], domain="com.example", name="b")
    y = b.op("Sigmoid", [y], name="c")
    y = b.op("Transpose", [y], name="d", perm=[1, 0])
    b.output(y, "float32", [3, 2])
    return b.finish()


@pytest.mark.parametrize("driver", DRIVERS)
def test_supported_nodes_has_one_entry_per_node(driver):
    drv = get_driver(driver)
    (device,) = drv.devices()
    model = _mixed_model()
    supported = drv.supported_nodes(model, device)
    assert len(supported) == len(model.nodes) == 4
    assert supported == [True, False, True, True]
    reasons = drv.unsupported_reasons(model, device)
    assert len(reasons) == 4
    assert reasons[0] is None and reasons[2] is None and reasons[3] is None
    assert isinstance(reasons[1], str)
    assert "Foo" in reasons[1] or "com.example" in reasons[1]


@pytest.mark.parametrize("driver", DRIVERS)
def test_supported_nodes_of_an_empty_graph(driver):
    b = GraphBuilder("empty")
    x = b.input("x", "float32", [2])
    b.output(x)
    model = b.finish()
    drv = get_driver(driver)
    assert drv.supported_nodes(model, drv.devices()[0]) == []


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        ("Relu", "float32"),
        ("Relu", "int8"),
        ("Relu", "int16"),
        ("Relu", "float16"),
        ("Sigmoid", "float16"),
        ("Sigmoid", "float64"),
        ("Neg", "int64"),
        ("Abs", "uint16"),
    ],
)
def test_onnxruntime_answer_matches_what_ort_loads(op, dtype):
    """supported_nodes agrees with ORT itself, type by type (ORT is the oracle)."""
    b = GraphBuilder(f"{op}_{dtype}")
    x = b.input("x", dtype, [4])
    b.output(b.op(op, [x], name="the_node"))
    model = b.finish()
    drv = get_driver("onnxruntime")
    assert drv.supported_nodes(model, drv.devices()[0]) == [_ort_runs(model)]


def test_onnxruntime_names_the_types_it_has_no_kernel_for():
    b = GraphBuilder("relu_int16")
    x = b.input("x", "int16", [4])
    b.output(b.op("Relu", [x], name="int_relu"))
    model = b.finish()
    assert not _ort_runs(model)
    with pytest.raises(crossrt.UnsupportedError) as info:
        crossrt.compile(model, driver="onnxruntime")
    assert "int_relu" in info.value.message and "tensor(int16)" in info.value.message


def _ort_runs(model: crossrt.Model) -> bool:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model.to_bytes(), so, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


# -- ORT sessions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores",
    [1, pytest.param(2, marks=pytest.mark.skipif(CORES < 2, reason="needs 2 usable cores"))],
)
def test_ort_intra_op_threads_follow_cores(cores):
    exe = crossrt.compile(relu(), driver="onnxruntime")
    with crossrt.Runtime() as rt:
        loaded = rt.load(exe, cores=cores)
        so = loaded._programs[0].session.get_session_options()
        assert so.intra_op_num_threads == cores
        assert so.inter_op_num_threads == 1
        assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL


def test_ort_threads_for_a_core_list():
    exe = crossrt.compile(relu(), driver="onnxruntime")
    with crossrt.Runtime() as rt:
        loaded = rt.load(exe, cores=[CORES - 1])
        assert loaded._programs[0].session.get_session_options().intra_op_num_threads == 1


def test_ort_artifact_holds_an_onnx_model():
    exe = crossrt.compile(relu(), driver="onnxruntime")
    proto = onnx.ModelProto.FromString(bytes(ort_artifact.unpack(exe.nodes[0].artifact).graph))
    assert [n.op_type for n in proto.graph.node] == ["Relu"]


def test_reference_artifact_is_the_model():
    model = relu()
    exe = crossrt.compile(model, driver="reference")
    assert crossrt.load_model(exe.nodes[0].artifact).content_hash == model.content_hash


# -- memory hooks (host-coherent defaults) ----------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_default_memory_hooks_round_trip(driver):
    drv = get_driver(driver)
    (device,) = drv.devices()
    buf = drv.allocate(device, 16)
    data = np.arange(8, dtype=np.uint8)
    drv.copy_in(device, buf, memoryview(data.tobytes()), offset=4)
    back = bytearray(8)
    drv.copy_out(device, memoryview(back), buf, offset=4)
    assert bytes(back) == data.tobytes()
    other = drv.allocate(device, 16)
    drv.copy_device(device, other, buf, 8, dst_offset=0, src_offset=4)
    assert bytes(other[:8]) == data.tobytes()
    drv.free(device, buf)
    drv.free(device, other)
