"""The ``openvino`` driver: OpenVINO's exported blob in the ``.crm``, loaded in a new process
through ``import_model``; the model's own precision (never OpenVINO's bf16 default); the
artifact's checks; nodes OpenVINO cannot convert, placed elsewhere with fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")

import crossrt
from concurrency_models import tiny
from crossrt import StatusCode
from crossrt.drivers import get_driver
from crossrt.drivers.base import CompileOptions, CoreSet
from crossrt.drivers.openvino import artifact as ov_artifact
from crossrt.errors import InvalidContainerError, UnsupportedError
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")


def _conv() -> crossrt.Model:
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv")
    x = b.input("x", "float32", [None, 3, 16, 16])
    w = b.constant(rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    b.output(b.op("Relu", [b.op("Conv", [x, w], pads=[1, 1, 1, 1])]), shape=[None, 8, 16, 16])
    return b.finish()


def _x(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(6).standard_normal((batch, 3, 16, 16)).astype(np.float32)


def test_a_crm_loads_in_a_new_process_through_import_model(tmp_path: Path) -> None:
    exe = crossrt.compile(_conv(), "cpu", driver="openvino")
    assert [n.driver for n in exe.nodes] == ["openvino"]
    path = tmp_path / "conv.crm"
    exe.save(path)
    np.save(tmp_path / "x.npy", _x())
    code = (
        "import sys, numpy as np, crossrt\n"
        "exe = crossrt.load_executable(sys.argv[1])\n"
        "with crossrt.Runtime() as rt:\n"
        "    (y,) = rt.load(exe).run({'x': np.load(sys.argv[2])}).values()\n"
        "np.save(sys.argv[3], y)\n"
    )
    args = [str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with crossrt.Runtime() as rt:
        (here,) = rt.load(exe).run({"x": _x()}).values()
        (ort,) = rt.load(_conv(), "cpu", driver="onnxruntime").run({"x": _x()}).values()
    there = np.load(tmp_path / "y.npy")
    assert np.array_equal(here, there)
    np.testing.assert_allclose(here, ort, atol=1e-4)  # fp32, not OpenVINO's bf16 default


def test_the_model_runs_in_its_own_precision() -> None:
    exe = crossrt.compile(_conv(), "cpu", driver="openvino")
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        program = model._instances[0].programs[0]  # type: ignore[attr-defined]
        assert (
            str(program._compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
        )


def test_dynamic_shapes_and_threads_from_the_cores() -> None:
    exe = crossrt.compile(_conv(), "cpu", driver="openvino")
    with crossrt.Runtime() as rt:
        model = rt.load(exe, cores=1)
        for batch in (1, 3, 2):
            (y,) = model.run({"x": _x(batch)}).values()
            assert y.shape == (batch, 8, 16, 16)
    driver = get_driver("openvino")
    (device,) = [d for d in driver.devices() if d.id == "cpu:0"]
    program = driver.load(exe.nodes[0].artifact, device, CoreSet((0,)), CompileOptions())
    assert program._compiled.get_property("INFERENCE_NUM_THREADS") == 1
    program.close()


def test_outputs_land_in_the_callers_buffers_and_bound_calls_repeat() -> None:
    exe = crossrt.compile(tiny(), "cpu", driver="openvino")
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        x = np.ones((4, 8), np.float32)
        y = np.empty((4, 8), np.float32)
        model.run({"x": x}, outputs={"y": y})
        expected = rt.load(tiny(), "cpu", driver="onnxruntime").run({"x": x})["y"]
        np.testing.assert_allclose(y, expected, rtol=1e-6)
        request = model.request({"x": x}, outputs={"y": y})
        for value in (2.0, -1.0):
            x[...] = value
            request.run()
            expected = (np.full((4, 8), value, np.float32) @ (np.arange(64).reshape(8, 8) / 64)) + 1
            np.testing.assert_allclose(y, expected.astype(np.float32), rtol=1e-5)


def test_a_damaged_or_foreign_artifact_is_refused() -> None:
    driver = get_driver("openvino")
    (device,) = [d for d in driver.devices() if d.id == "cpu:0"]
    good = bytes(crossrt.compile(tiny(), "cpu", driver="openvino").nodes[0].artifact)
    cores = CoreSet((0,))
    with pytest.raises(InvalidContainerError, match="does not start with its header"):
        driver.load(b"CRORTART" + good[8:], device, cores, CompileOptions())
    with pytest.raises(InvalidContainerError, match="do not fill"):
        driver.load(good[:-10], device, cores, CompileOptions())
    other = bytearray(good)
    other[8] = 9
    with pytest.raises(UnsupportedError) as info:
        driver.load(bytes(other), device, cores, CompileOptions())
    assert info.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    damaged = bytearray(good)
    damaged[-200:-100] = bytes(100)  # inside OpenVINO's own blob
    try:
        driver.load(bytes(damaged), device, cores, CompileOptions()).close()
    except crossrt.CrossrtError as exc:  # OpenVINO noticed: a coded error, never a crash
        assert exc.code in (StatusCode.INVALID, StatusCode.FAILURE)
    unpacked = ov_artifact.unpack(good)
    assert unpacked.inputs == ("x",) and unpacked.outputs == ("y",)


def test_a_node_openvino_cannot_convert_falls_back() -> None:
    b = GraphBuilder("ml", opsets={"ai.onnx.ml": 3})
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Binarizer", [x], domain="ai.onnx.ml", threshold=0.5))
    b.output(b.op("Relu", [x]))
    model = b.finish()
    driver = get_driver("openvino")
    (device,) = [d for d in driver.devices() if d.id == "cpu:0"]
    reasons = driver.unsupported_reasons(model, device)
    assert reasons == [
        "OpenVINO's ONNX frontend cannot convert Binarizer: No conversion rule found for "
        "operations: ai.onnx.ml.Binarizer",
        None,
    ]
    with pytest.raises(crossrt.CrossrtError, match="Binarizer"):
        crossrt.compile(model, "cpu", driver="openvino")
    exe = crossrt.compile(model, "cpu", driver="openvino", fallback="cpu")
    assert {n.driver for n in exe.nodes} == {"openvino", "onnxruntime"}
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.array([[-1, 2, 0.25], [4, -5, 0.75]], np.float32)})
    binary, relu = out.values()
    assert binary.tolist() == [[0, 1, 0], [1, 0, 1]]
    assert relu.tolist() == [[0, 2, 0.25], [4, 0, 0.75]]


def test_nodes_of_types_openvino_lacks_or_computes_differently_are_refused() -> None:
    driver = get_driver("openvino")
    (device,) = [d for d in driver.devices() if d.id == "cpu:0"]
    b = GraphBuilder("refused")
    x = b.input("x", "float32", [4])
    words = b.constant(np.array(["a", "b"], dtype=object))
    b.output(b.op("StringConcat", [words, words]))
    values, _ = b.op("TopK", [x, b.constant(np.array([2]))], outputs=2)
    b.output(values)
    b.output(b.op("Relu", [x]))
    strings, topk, relu = driver.unsupported_reasons(b.finish(), device)
    assert strings is not None and "takes no STRING tensors" in strings
    assert topk is not None and "orders equal values differently" in topk
    assert relu is None


def test_a_crash_of_openvino_is_a_compile_error_and_the_process_lives_on() -> None:
    # OpenVINO converts and compiles in a worker process: crafted models crash it (the
    # fuzzer found a SIGFPE and a SIGSEGV). A real crash of the worker, then a compile.
    from crossrt.drivers.openvino.isolated import Crashed, Worker

    worker = Worker()
    blob, error = worker.compile(tiny().to_bytes(), "CPU", {"INFERENCE_NUM_THREADS": 1})
    assert blob and not error
    process = worker._process
    assert process is not None
    os.kill(process.pid, signal.SIGSEGV)  # as OpenVINO's compiler did on crafted models
    process.wait()
    blob, error = worker.compile(tiny().to_bytes(), "CPU", {"INFERENCE_NUM_THREADS": 1})
    assert blob and not error  # a new worker took over
    with pytest.raises(Crashed, match="died"):  # the worker dies while it handles the call
        worker._call("an operation it does not know", b"", "CPU", {})
    blob, error = worker.compile(tiny().to_bytes(), "CPU", {"INFERENCE_NUM_THREADS": 1})
    assert blob and not error  # a new worker took over
    blob, error = worker.compile(b"not a model", "CPU", {})
    assert not blob and error
    worker.close()


def test_reduced_precision_only_when_asked_for_and_where_supported(tmp_path: Path) -> None:
    driver = get_driver("openvino")
    (device,) = [d for d in driver.devices() if d.id == "cpu:0"]
    model, x = _conv(), _x()
    with crossrt.Runtime() as rt:
        (fp32,) = rt.load(crossrt.compile(model, "cpu", driver="openvino")).run({"x": x}).values()
        if not device.capabilities.bf16:
            with pytest.raises(crossrt.CrossrtError, match="precision='bf16'") as info:
                crossrt.compile(model, "cpu", driver="openvino", precision="bf16")
            assert info.value.code is StatusCode.INVALID_OPTION
            pytest.skip("this CPU has no bfloat16 arithmetic")
        exe = crossrt.compile(model, "cpu", driver="openvino", precision="bf16", cache_dir=tmp_path)
        assert exe.options.precision == "bf16"
        (bf16,) = rt.load(exe).run({"x": x}).values()
        (again,) = rt.load(crossrt.load_executable(exe.to_bytes())).run({"x": x}).values()
    difference = float(np.abs(bf16 - fp32).max())
    assert 0 < difference < 0.5  # computed in bfloat16: close, not equal
    assert np.array_equal(bf16, again)  # the .crm keeps the precision
    # The cache keys on the precision: fp32 is a second entry, not the bf16 one.
    fp32_exe = crossrt.compile(model, "cpu", driver="openvino", cache_dir=tmp_path)
    assert fp32_exe.options.precision is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"precision": "int4"}, "precision takes"),
        ({"precision": "bf16", "fp16": True}, "give one of them"),
    ],
)
def test_a_precision_that_is_no_precision_is_refused(options: dict, message: str) -> None:
    with pytest.raises(crossrt.CrossrtError, match=message) as info:
        crossrt.compile(tiny(), "cpu", driver="openvino", **options)
    assert info.value.code is StatusCode.INVALID_OPTION


def test_onnxruntime_refuses_bf16_by_name() -> None:
    # fp16 and int8-dynamic: tests/drivers/test_onnxruntime_precision.py
    for precision in ("bf16",):
        with pytest.raises(crossrt.CrossrtError, match="driver 'onnxruntime'") as info:
            crossrt.compile(tiny(), "cpu", driver="onnxruntime", precision=precision)
        assert info.value.code is StatusCode.INVALID_OPTION
    exe = crossrt.compile(tiny(), "cpu", driver="onnxruntime", precision="fp32")
    assert exe.options.precision == "fp32"
