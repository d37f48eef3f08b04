"""Models shaped like the ones issue 23 found refused or mis-served: a detector whose
dimension names are a torch exporter's shape expressions, a graph of rank-65 values, sklearn
classifiers with ZipMap outputs (built with skl2onnx from a small fit: no wheel found ships
one), and a model whose output is a sequence of tensors. tests/conftest.py puts this folder
on ``sys.path``."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = [helper.make_opsetid("", 17)]


def exporter_expression(levels: int) -> str:
    """A dimension name as a current torch exporter writes it for a detector's strided feature
    maps: nested floors of the input's named size (over 330 characters from 5 levels)."""
    expr = "height"
    for _ in range(levels):
        expr = f"(floor(floor({expr}/2 - 1/2)/2 + 1/2) + floor({expr}/4))"
    return expr


def detector_like() -> tuple[onnx.ModelProto, str]:
    """Two stride-2 max pools whose output carries an exporter-written expression as a dim;
    the model and that name."""
    expr = exporter_expression(5)
    graph = helper.make_graph(
        [
            helper.make_node("MaxPool", ["images"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("MaxPool", ["p1"], ["boxes"], kernel_shape=[2, 2], strides=[2, 2]),
        ],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", 8])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 3, expr, 2])],
    )
    return helper.make_model(graph, opset_imports=OPSET), expr


def rank_model(rank_in: int, rank_inside: int) -> onnx.ModelProto:
    """x of ``rank_in`` dims of 1 -> reshaped to ``rank_inside`` dims -> Relu -> back."""
    inside = helper.make_tensor("inside", TensorProto.INT64, [rank_inside], [1] * rank_inside)
    back = helper.make_tensor("back", TensorProto.INT64, [rank_in], [1] * rank_in)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "inside"], ["deep"]),
            helper.make_node("Relu", ["deep"], ["r"]),
            helper.make_node("Reshape", ["r", "back"], ["y"]),
        ],
        "ranks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1] * rank_in)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1] * rank_in)],
        [inside, back],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def zipmap_classifier(string_labels: bool = False) -> tuple[onnx.ModelProto, np.ndarray]:
    """A 3-class LogisticRegression through skl2onnx, ZipMap on (its default): outputs
    ``output_label`` [N] and ``output_probability`` seq(map(int64|string, float)); the model
    and a batch of inputs."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(23)
    x = rng.standard_normal((90, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    labels = np.array(["cat", "dog", "emu"])[y] if string_labels else y
    fitted = LogisticRegression(max_iter=500).fit(x, labels)
    model = to_onnx(fitted, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    model.graph.name = "zipmap_str" if string_labels else "zipmap"
    return model, x[:5]


def sequence_of_tensors() -> onnx.ModelProto:
    """x [n] -> seq(tensor(float)) of x and x+x: no KServe form carries it."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "x"], ["twice"]),
            helper.make_node("SequenceConstruct", ["x", "twice"], ["both"]),
        ],
        "sequence",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_sequence_value_info("both", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def many_inputs(count: int) -> onnx.ModelProto:
    """``count`` inputs x0... of [1], summed into y [1]."""
    graph = helper.make_graph(
        [helper.make_node("Sum", [f"x{i}" for i in range(count)], ["y"])],
        "many",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1]) for i in range(count)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def fanout(count: int, name_length: int = 0) -> onnx.ModelProto:
    """x [n,4] into ``count`` Identity outputs of [n,4]: named y0, y1... or, with
    ``name_length``, each with that many characters. A header holds each output's spec and
    its name in the node's list."""
    names = [f"y{i:08d}".ljust(name_length, "y") if name_length else f"y{i}" for i in range(count)]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [n]) for n in names],
        "fanout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in names],
    )
    return helper.make_model(graph, opset_imports=OPSET)
