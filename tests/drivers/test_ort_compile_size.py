"""What an onnxruntime compile leaves behind: an artifact no larger than the model needs, and
no log lines of ORT's own on stderr unless asked for.

ORT's constant folding materialises every tensor a graph computes from constants. A model that
generates its weights from small constants (weights-stripped model-zoo files) would become an
artifact of hundreds of megabytes; the driver compiles such a model without folding, and each
load folds instead.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import crossrt
from crossrt.drivers.onnxruntime import artifact as ort_artifact

N = 1024  # a generated 1024 x 1024 float32 weight: 4 MiB, 8 MiB with its pre-packed form
RNG = np.random.default_rng(11)


def _generated(kind: str) -> onnx.ModelProto:
    """``y = x @ W`` (x: float32[1, N]) where the graph generates W from a small constant."""
    inits = [numpy_helper.from_array(np.array([N, N], np.int64), "shape")]
    if kind == "Expand":
        inits.append(numpy_helper.from_array(np.array([[0.01]], np.float32), "c"))
        make = helper.make_node("Expand", ["c", "shape"], ["W"])
    elif kind == "ConstantOfShape":
        value = numpy_helper.from_array(np.array([0.01], np.float32))
        make = helper.make_node("ConstantOfShape", ["shape"], ["W"], value=value)
    else:  # Tile of a 4 x 4 block: W's values differ, so a wrong layout would show
        block = RNG.standard_normal((4, 4)).astype(np.float32) / 8
        inits = [
            numpy_helper.from_array(block, "c"),
            numpy_helper.from_array(np.array([N // 4, N // 4], np.int64), "reps"),
        ]
        make = helper.make_node("Tile", ["c", "reps"], ["W"])
    graph = helper.make_graph(
        [make, helper.make_node("MatMul", ["x", "W"], ["y"])],
        f"generated-{kind}",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, N])],
        initializer=inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def _raw_ort(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"x": x})[0]
    return result


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("kind", ["Expand", "ConstantOfShape", "Tile"])
def test_weights_the_graph_generates_are_not_stored(tmp_path, caplog, kind, portable):
    proto = _generated(kind)
    size = len(proto.SerializeToString())
    with caplog.at_level(logging.INFO, logger="crossrt"):
        exe = crossrt.compile(proto, "cpu", driver="onnxruntime", portable=portable)
    artifact = exe.nodes[0].artifact
    # Folded, W and its pre-packed form alone are 8 MiB.
    assert len(artifact) <= 4 * size + 4096, f"{len(artifact)} bytes for a {size}-byte model"
    assert "compiled without it" in caplog.text
    assert ort_artifact.unpack(artifact).names == []  # no weight stored beside the graph
    exe.save(tmp_path / "generated.crm")
    assert (tmp_path / "generated.crm").stat().st_size < 16 * 1024
    x = RNG.standard_normal((1, N)).astype(np.float32)
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.load_executable(tmp_path / "generated.crm"), instances=2)
        got = [model.run({"x": x})["y"] for _ in range(2)]
    expected = _raw_ort(proto, x)
    for y in got:
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_folding_that_keeps_the_size_is_kept():
    # W^T folded into the weight the MatMul reads, and a small generated table: the artifact
    # holds the folded weight, optimized for this CPU as usual.
    w = RNG.standard_normal((512, 256)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["Wt"], ["W"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("ConstantOfShape", ["bias_shape"], ["bias"], value=_scalar(0.5)),
        helper.make_node("Add", ["h", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "transposed",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 512])],
        initializer=[
            numpy_helper.from_array(w, "Wt"),
            numpy_helper.from_array(np.array([1, 512], np.int64), "bias_shape"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    exe = crossrt.compile(proto, "cpu", driver="onnxruntime")
    unpacked = ort_artifact.unpack(exe.nodes[0].artifact)
    assert unpacked.level == "all"
    optimized = onnx.ModelProto.FromString(bytes(unpacked.graph))
    assert "Transpose" not in {n.op_type for n in optimized.graph.node}  # folded
    stored = dict(zip(unpacked.names, unpacked.arrays, strict=True))
    np.testing.assert_array_equal(stored["W"], w.T)
    np.testing.assert_array_equal(stored["bias"], np.full((1, 512), 0.5, np.float32))
    x = RNG.standard_normal((1, 256)).astype(np.float32)
    with crossrt.Runtime() as rt:
        got = rt.load(exe).run({"x": x})["y"]
    np.testing.assert_allclose(got, _raw_ort(proto, x), rtol=1e-5, atol=1e-5)


def _scalar(value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], np.float32))


# Compiling warns in ORT (an initializer nothing reads; a level-ALL model saved), and the
# second run fails in ORT, which logs the failed node as an error before it raises.
_WARNS_AND_FAILS = """
import numpy as np
import onnx
from onnx import helper, numpy_helper
import crossrt

graph = helper.make_graph(
    [helper.make_node("Reshape", ["x", "shape"], ["y"])],
    "noisy",
    [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N"])],
    [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])],
    initializer=[
        numpy_helper.from_array(np.array([2, 2], np.int64), "shape"),
        numpy_helper.from_array(np.zeros(3, np.float32), "unused"),
    ],
)
proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
proto.ir_version = 8
exe = crossrt.compile(proto, "cpu", driver="onnxruntime")
with crossrt.Runtime() as rt:
    model = rt.load(exe)
    print(model.run({"x": np.arange(4, dtype=np.float32)})["y"].tolist())
    try:
        model.run({"x": np.arange(5, dtype=np.float32)})
    except crossrt.CrossrtError as exc:
        print("refused:", exc.code.name)
"""


@pytest.mark.parametrize(
    ("level", "printed"),
    [
        (None, []),
        ("ERROR", ["[E:onnxruntime"]),
        ("WARNING", ["Removing initializer 'unused'", "[E:onnxruntime"]),
    ],
)
def test_ort_prints_only_what_crossrt_log_level_asks_for(level, printed):
    env = {k: v for k, v in os.environ.items() if k != "CROSSRT_LOG_LEVEL"}
    if level is not None:
        env["CROSSRT_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-c", _WARNS_AND_FAILS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[[0.0, 1.0], [2.0, 3.0]]", "refused: FAILURE"]
    ort_lines = [line for line in done.stderr.splitlines() if ":onnxruntime:" in line]
    if not printed:
        assert ort_lines == []
    for text in printed:
        assert any(text in line for line in ort_lines), done.stderr
    if level == "ERROR":
        assert not any("[W:onnxruntime" in line for line in ort_lines)
