"""A model like skl2onnx's export of a default scikit-learn classifier, built by hand with
onnx.helper (the tests need no scikit-learn): a LinearClassifier whose probabilities go
through ZipMap, so ``output_probability`` is a sequence of maps (int64 -> float)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def classifier() -> onnx.ModelProto:
    """X float32 [N,2] -> label int64 [N], output_probability seq(map(int64, float))."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])
    zipped = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, []))
    )
    probability = helper.make_value_info("output_probability", zipped)
    nodes = [
        helper.make_node(
            "LinearClassifier",
            ["X"],
            ["label", "probabilities"],
            domain="ai.onnx.ml",
            coefficients=[1.0, -1.0, -0.5, 2.0],
            intercepts=[0.1, -0.1],
            classlabels_ints=[0, 1],
            post_transform="SOFTMAX",
        ),
        helper.make_node(
            "ZipMap",
            ["probabilities"],
            ["output_probability"],
            domain="ai.onnx.ml",
            classlabels_int64s=[0, 1],
        ),
    ]
    graph = helper.make_graph(nodes, "classifier", [x], [label, probability])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    onnx.checker.check_model(model)
    return model
