"""``compile(precision="int8", calibration=...)``: static quantization to QDQ from the user's
samples, measured against fp32 on held-back samples and refused when over the tolerance
(issue 28.5). The model: a convolution and a matrix product, big enough that ORT's quantizer
quantizes them and small enough to take a second."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import crossrt
from crossrt.compiler.calibrate import METADATA_KEY, quantize
from crossrt.errors import InvalidContainerError
from crossrt.model import Model
from crossrt.tools import compile as compile_tool
from crossrt.tools import inspect as inspect_tool

RNG = np.random.default_rng(11)
CONV_W = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
FC_W = RNG.standard_normal((8 * 8 * 8, 10)).astype(np.float32) * 0.05


def _model(tolerance: str | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("MatMul", ["f", "fw"], ["y"]),
        ],
        "convnet",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 10])],
        [numpy_helper.from_array(CONV_W, "cw"), numpy_helper.from_array(FC_W, "fw")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if tolerance is not None:
        model.metadata_props.add(key="crossrt.tolerance", value=tolerance)
    return model


def _samples(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def _fp32(x: np.ndarray) -> np.ndarray:
    with crossrt.Runtime() as rt:
        return rt.load(crossrt.compile(_model(), driver="onnxruntime")).run({"x": x})["y"]


@pytest.mark.parametrize("driver", ["onnxruntime", "openvino"])
def test_an_int8_model_is_qdq_and_close_to_fp32(driver: str):
    if driver == "openvino":
        pytest.importorskip("openvino")
    exe = crossrt.compile(_model(), driver=driver, precision="int8", calibration=_samples(10))
    report = exe.quantization
    assert report is not None and report["calibration_samples"] == 8
    assert report["holdout_samples"] == 2 and 0 <= report["error"] <= report["tolerance"]
    assert report["quantized_nodes"] >= 2  # the convolution's and the product's inputs
    assert report["max_abs_error"] > 0 and 0 < report["relative_error"] < 0.1
    assert report["top1_agreement"] in (0.0, 0.5, 1.0)  # y is [batch, classes]: 2 rows
    assert exe.placement[0]["quantization"] == report
    x = _samples(1, seed=99)[0]["x"]
    with crossrt.Runtime() as rt:
        got = rt.load(exe).run({"x": x})["y"]
    want = _fp32(x)
    error = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
    assert 0 < error <= 0.1  # quantized: close, and not bit-equal to fp32


def test_openvino_computes_what_is_not_int8_in_bf16_where_the_cpu_has_it():
    pytest.importorskip("openvino")
    from crossrt.drivers import get_driver
    from crossrt.drivers.openvino import artifact

    (cpu,) = [d for d in get_driver("openvino").devices() if d.id == "cpu:0"]
    exe = crossrt.compile(_model(), driver="openvino", precision="int8", calibration=_samples(10))
    bf16 = cpu.capabilities.bf16
    assert artifact.unpack(exe.nodes[0].artifact).precision == ("bf16" if bf16 else None)
    with crossrt.Runtime() as rt:
        program = rt.load(exe)._instances[0].programs[0]  # type: ignore[attr-defined]
        hint = str(program._compiled.get_property("INFERENCE_PRECISION_HINT"))
    assert hint == ("<Type: 'bfloat16'>" if bf16 else "<Type: 'float32'>")
    # a model of the user's own keeps its precision
    plain = crossrt.compile(_model(), driver="openvino")
    assert artifact.unpack(plain.nodes[0].artifact).precision is None
    with pytest.raises(InvalidContainerError, match="names precision 'int4'"):
        artifact.unpack(artifact.pack(b"blob", ["x"], ["y"], precision="int4"))


def test_an_outlier_channel_is_smoothed_into_the_weights():
    """SmoothQuant: one channel 40x the others (as transformer activations have) would leave
    the rest a handful of uint8 levels; divided out per channel into the weights' rows, the
    relative error on held-back samples was 0.018 against 0.044 without."""
    rng = np.random.default_rng(7)
    gain = np.ones(16, np.float32)
    gain[0] = 40.0
    weight = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "gain"], ["h"]),
            helper.make_node("MatMul", ["h", "w"], ["y"]),
        ],
        "outlier",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 16])],
        [numpy_helper.from_array(gain, "gain"), numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calibration = [{"x": rng.standard_normal((1, 64, 16)).astype(np.float32)} for _ in range(8)]
    quantized = quantize(Model(model), calibration)
    assert quantized.report["relative_error"] < 0.03
    smoothing = [n for n in quantized.model.proto.graph.node if n.name == "h_smooth"]
    assert len(smoothing) == 1 and smoothing[0].input[0] == "h"


def test_auto_weighs_every_engine_at_int8_by_the_int8_tolerance():
    pytest.importorskip("openvino")
    exe = crossrt.compile(
        _model(), device="auto", precision="int8", calibration=_samples(10), auto_seconds=0.2
    )
    assert exe.quantization is not None and exe.decision["tolerance"] == 0.1
    rows = {r["driver"]: r for r in exe.decision["candidates"]}
    # engines round int8 their own way (here ~0.005 apart): not a fp32 tolerance of 1e-4
    assert rows["openvino"]["status"] == "ok" and rows["onnxruntime"]["status"] == "ok"


def test_an_error_over_the_tolerance_is_refused_with_the_number():
    with pytest.raises(crossrt.CompileError, match=r"off by .* over the tolerance 1e-09") as e:
        crossrt.compile(_model(tolerance="1e-9"), precision="int8", calibration=_samples(5))
    # each measure named: the one checked, and what a user of a classifier reads
    assert "relative to max(1, max |fp32|) (max abs " in e.value.message
    assert "relative 2-norm" in e.value.message and "top-1 agreement" in e.value.message
    assert e.value.details["tolerance"] == 1e-9 and e.value.details["error"] > 1e-9


def _attention(heads: int = 2, seq: int = 6, width: int = 8) -> onnx.ModelProto:
    """Self-attention's core: projections by constant weights (quantized), and the products
    of two activations, scores = q x k^T and scores x v (left in float)."""
    rng = np.random.default_rng(5)
    weights = [
        numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.1, n)
        for n in ("wq", "wk", "wv")
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "wq"], ["q"]),
            helper.make_node("MatMul", ["x", "wk"], ["k"]),
            helper.make_node("MatMul", ["x", "wv"], ["v"]),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["scores"]),
            helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        "attention",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [heads, seq, width])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [heads, seq, width])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_weights_are_int8_symmetric_activations_uint8_and_attention_stays_float():
    rng = np.random.default_rng(3)
    calibration = [{"x": rng.standard_normal((2, 6, 8)).astype(np.float32)} for _ in range(6)]
    proto = quantize(Model(_attention()), calibration).model.proto
    made_by = {o: n for n in proto.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    products = [n for n in proto.graph.node if n.op_type == "MatMul"]
    quantized = [
        n for n in products if all(made_by[i].op_type == "DequantizeLinear" for i in n.input)
    ]
    assert len(quantized) == 3  # x @ wq, wk, wv; not q @ k^T nor p @ v
    for node in quantized:
        activation, weight = (made_by[i] for i in node.input)
        zero = inits[made_by[activation.input[0]].input[2]]  # its QuantizeLinear's zero point
        assert zero.dtype == np.uint8  # u8 x s8: the form VNNI and ORT's x86 kernels run fast
        weight_zero = inits[weight.input[2]]
        assert weight_zero.dtype == np.int8 and not weight_zero.any()  # symmetric
        assert inits[weight.input[1]].shape == (8,)  # a scale per output channel
    # the products of two activations are not quantized: nothing quantizes the softmax
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "p" for n in proto.graph.node)


@pytest.mark.parametrize(
    ("calibration", "message"),
    [
        (None, "give calibration="),
        (_samples(1), "at least 2 calibration samples"),
        ([{"z": np.zeros((1, 3, 8, 8), np.float32)}] * 3, r"has inputs \['z'\]"),
        ([{"x": np.zeros((1, 3, 8, 8), np.float64)}] * 3, "is float64"),
        ([{"x": np.zeros((1, 3, 4, 4), np.float32)}] * 3, r"has shape \[1, 3, 4, 4\]"),
        (42, "calibration= takes"),
    ],
)
def test_bad_calibration_is_refused_before_any_work(calibration, message):
    with pytest.raises(crossrt.CrossrtError, match=message):
        crossrt.compile(_model(), precision="int8", calibration=calibration)


def test_calibration_without_int8_is_refused():
    with pytest.raises(crossrt.InvalidOptionError, match="is for precision='int8'"):
        crossrt.compile(_model(), calibration=_samples(3))


def test_the_command_line_quantizes_from_a_folder_and_inspect_says_so(tmp_path: Path, capsys):
    model = tmp_path / "convnet.onnx"
    onnx.save(_model(), model)
    folder = tmp_path / "calibration"
    folder.mkdir()
    np.save(folder / "x.npy", np.concatenate([s["x"] for s in _samples(10)]))  # 10 samples
    out = tmp_path / "convnet.crm"
    argv = [str(model), "-o", str(out), "--precision", "int8", "--calibration", str(folder)]
    assert compile_tool.main(argv) == 0
    exe = crossrt.load_executable(out)
    assert json.loads(exe.metadata[METADATA_KEY])["calibration_samples"] == 8
    capsys.readouterr()
    assert inspect_tool.main([str(out)]) == 0
    printed = capsys.readouterr().out
    assert "quantization    int8 static (SmoothQuant, then QDQ" in printed
    assert "relative to max(1, max |fp32|) (max abs " in printed and "top-1 agreement" in printed
    empty = tmp_path / "empty"
    empty.mkdir()
    argv[-1] = str(empty)
    assert compile_tool.main(argv) == 1
    assert "holds no .npz or .npy files" in capsys.readouterr().err
