"""compile(precision=...) on the onnxruntime driver: float16 through onnxconverter-common,
int8 weights with run-time quantized activations through ORT's quantize_dynamic; bf16
refused by name; the precision recorded and keyed in the cache."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

import crossrt
from crossrt import StatusCode
from crossrt.compiler.cache import CompileCache
from crossrt.drivers import get_driver
from crossrt.drivers.onnxruntime import precision
from crossrt.model import GraphBuilder


def _mlp() -> crossrt.Model:
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", ["n", 64])
    w1 = b.constant(rng.standard_normal((64, 128)).astype(np.float32) / 8)
    w2 = b.constant(rng.standard_normal((128, 10)).astype(np.float32) / 11)
    hidden = b.op("Relu", [b.op("MatMul", [x, w1])])
    b.output(b.op("Softmax", [b.op("MatMul", [hidden, w2])], axis=-1))
    return b.finish()


_OPS = ("MatMul", "Relu", "Softmax")
X = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)


def _run(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        (y,) = rt.load(exe).run({"x": X}).values()
    return y


def test_int8_dynamic_is_close_but_not_the_same() -> None:
    full = _run(crossrt.compile(_mlp(), "cpu", driver="onnxruntime"))
    exe = crossrt.compile(_mlp(), "cpu", driver="onnxruntime", precision="int8-dynamic")
    assert exe.options.precision == "int8-dynamic"
    reduced = _run(exe)
    assert reduced.dtype == np.float32  # the model's own inputs and outputs
    assert not np.array_equal(reduced, full)  # it really computed otherwise
    np.testing.assert_allclose(reduced, full, atol=5e-2)


def test_fp16_is_offered_where_the_build_computes_in_it() -> None:
    registry = get_driver("onnxruntime")._registry()
    if precision.has_float16_arithmetic(registry):  # an ARM64 build, say
        exe = crossrt.compile(_mlp(), "cpu", driver="onnxruntime", precision="fp16")
        np.testing.assert_allclose(_run(exe), _run(crossrt.compile(_mlp(), "cpu")), atol=1e-2)
        return
    with pytest.raises(crossrt.InvalidOptionError) as info:  # x86: no float16 MatMul or Conv
        crossrt.compile(_mlp(), "cpu", driver="onnxruntime", precision="fp16")
    assert "onnxruntime" in info.value.message and "fp32, int8-dynamic" in info.value.message


def test_float16_conversion_keeps_float32_io() -> None:
    # As on a build with float16 kernels for every operator of the model.
    known = get_driver("onnxruntime")._registry()
    every = {("", op): [(1, 2**31 - 1, {"T": ["tensor(float16)"]})] for op in _OPS}
    registry = dataclasses.replace(known, kernels={**known.kernels, **every})
    converted = precision.convert(_mlp(), "fp16", registry).proto
    assert {t.data_type for t in converted.graph.initializer} == {onnx.TensorProto.FLOAT16}
    io = [*converted.graph.input, *converted.graph.output]
    assert {v.type.tensor_type.elem_type for v in io} == {onnx.TensorProto.FLOAT}
    # ORT runs it (in float32 between the casts it inserts here), within float16's error.
    got = _run(crossrt.compile(crossrt.Model(converted), "cpu"))
    np.testing.assert_allclose(got, _run(crossrt.compile(_mlp(), "cpu")), atol=1e-2)


def test_int8_dynamic_quantizes_the_matmuls() -> None:
    registry = get_driver("onnxruntime")._registry()
    converted = precision.convert(_mlp(), "int8-dynamic", registry).proto
    ops = {n.op_type for n in converted.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    assert onnx.TensorProto.INT8 in {t.data_type for t in converted.graph.initializer}


def test_bf16_is_refused_naming_the_driver() -> None:
    with pytest.raises(crossrt.InvalidOptionError) as info:
        crossrt.compile(_mlp(), "cpu", driver="onnxruntime", precision="bf16")
    assert info.value.code is StatusCode.INVALID_OPTION
    assert "onnxruntime" in info.value.message and "int8-dynamic" in info.value.message


def test_the_cache_keeps_precisions_apart(tmp_path) -> None:
    one = crossrt.compile(_mlp(), "cpu", driver="onnxruntime", cache_dir=tmp_path)
    two = crossrt.compile(
        _mlp(), "cpu", driver="onnxruntime", cache_dir=tmp_path, precision="int8-dynamic"
    )
    assert one.options.precision is None and two.options.precision == "int8-dynamic"
    assert len(CompileCache(tmp_path).entries()) == 2


def _benchmark_models() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "models.py"
    spec = importlib.util.spec_from_file_location("crossrt_benchmark_models_precision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_int8_dynamic_on_the_resnet_like_model() -> None:
    # Conv stays float (ConvInteger is slower than float on ORT's CPU provider); the
    # classifier's Gemm gets int8 weights, so the logits move a little, not much.
    model = _benchmark_models().build_resnet(
        layers=(1, 1), width=8, num_classes=10, image_size=32, batch=1
    )
    image = {"input": np.random.default_rng(2).standard_normal((1, 3, 32, 32), np.float32)}
    exe = crossrt.compile(model, "cpu", driver="onnxruntime", precision="int8-dynamic")
    with crossrt.Runtime() as rt:
        (full,) = rt.load(crossrt.compile(model, "cpu", driver="onnxruntime")).run(image).values()
        (reduced,) = rt.load(exe).run(image).values()
    assert not np.array_equal(reduced, full)
    np.testing.assert_allclose(reduced, full, atol=0.05 * float(np.abs(full).max()))
