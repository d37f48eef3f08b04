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
