"""Models on an NVIDIA GPU through onnxruntime-gpu (the cuda extra). Skipped, with the reason,
on a machine without one: CI has none; the device machine of a session runs them."""

from __future__ import annotations

import numpy as np
import pytest

import crossrt
from crossrt.drivers import get_driver

GPUS = [d for d in get_driver("onnxruntime").devices() if d.id.startswith("cuda:")]
pytestmark = pytest.mark.skipif(
    not GPUS, reason="no CUDA device: onnxruntime-gpu and an NVIDIA GPU are needed"
)


def _mlp() -> crossrt.Model:
    rng = np.random.default_rng(0)
    b = crossrt.GraphBuilder("mlp")
    x = b.input("x", "float32", ["n", 256])
    w1 = b.constant(rng.standard_normal((256, 512)).astype(np.float32) / 16)
    w2 = b.constant(rng.standard_normal((512, 10)).astype(np.float32) / 23)
    b.output(b.op("MatMul", [b.op("Relu", [b.op("MatMul", [x, w1])]), w2]))
    return b.finish()


X = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)


def _run(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        (y,) = rt.load(exe).run({"x": X}).values()
    return y


def test_a_model_on_the_gpu_gives_the_cpus_answer() -> None:
    exe = crossrt.compile(_mlp(), "cuda:0")
    assert exe.device == "cuda:0" and exe.nodes[0].driver == "onnxruntime"
    np.testing.assert_allclose(_run(exe), _run(crossrt.compile(_mlp(), "cpu")), atol=1e-3)


def test_fp16_on_the_gpu() -> None:
    exe = crossrt.compile(_mlp(), "cuda:0", precision="fp16")
    assert exe.options.precision == "fp16"
    np.testing.assert_allclose(_run(exe), _run(crossrt.compile(_mlp(), "cpu")), atol=5e-2)


def test_a_crm_for_the_gpu_loads_again(tmp_path) -> None:
    path = tmp_path / "mlp.crm"
    crossrt.compile(_mlp(), "cuda:0").save(path)
    np.testing.assert_allclose(
        _run(crossrt.load_executable(path)), _run(crossrt.compile(_mlp(), "cpu")), atol=1e-3
    )


def _cpu_answer() -> np.ndarray:
    return _run(crossrt.compile(_mlp(), "cpu"))


def test_device_resident_inputs_and_outputs_move_nothing() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(_mlp(), "cuda:0"))
        x = crossrt.Tensor(list(X.shape), "float32", device="cuda:0")
        x.write(X)  # the caller's upload
        (y,) = model.run({"x": x}, outputs={model.outputs[0].name: None}).values()
        assert y.device == "cuda:0" and not y.is_host
        assert model.memory.transfer_stats().host_to_device_bytes == 0
        assert model.memory.transfer_stats().device_to_host_bytes == 0
        np.testing.assert_allclose(y.numpy(), _cpu_answer(), atol=1e-3)


def test_host_inputs_are_copied_in_once_and_counted() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(_mlp(), "cuda:0"))
        (y,) = model.run({"x": X}).values()
        assert model.memory.transfer_stats().host_to_device_bytes == X.nbytes
        np.testing.assert_allclose(y, _cpu_answer(), atol=1e-3)


def test_dlpack_to_and_from_torch_without_copies() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    source = torch.from_numpy(X).cuda()
    x = crossrt.from_dlpack(source)
    assert x.device == "cuda:0" and x.__cuda_array_interface__["data"][0] == source.data_ptr()
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(_mlp(), "cuda:0"))
        (y,) = model.run({"x": x}, outputs={model.outputs[0].name: None}).values()
        out = torch.from_dlpack(y)
        assert out.is_cuda and out.data_ptr() == y.__cuda_array_interface__["data"][0]
        np.testing.assert_allclose(out.cpu().numpy(), _cpu_answer(), atol=1e-3)
        viewed = torch.as_tensor(y, device="cuda")  # the CUDA array interface
        assert viewed.data_ptr() == out.data_ptr()
