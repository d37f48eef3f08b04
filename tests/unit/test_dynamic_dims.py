"""How a dynamic dimension prints: its name, or ``?`` for none or a generated one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import dtypes
from crossrt.model import TensorSpec
from crossrt.model.spec import spec_from_value_info

# Paddle2ONNX names every dynamic dimension like this; onnx's shape inference writes unk__N.
PADDLE = ["p2o.DynamicDimension.0", 3, "p2o.DynamicDimension.1"]


def _paddle_like() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, PADDLE)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "unk__7"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "paddle_like", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("shape", "printed"),
    [
        (("p2o.DynamicDimension.0", 3, "DynamicDimension.12"), "[?,3,?]"),
        (("unk__0", "Reshape_471_o0__d2", 64), "[?,?,64]"),
        (("batch", None, "N", "seq_len"), "[batch,?,N,seq_len]"),
        ((1, 3, 224, 224), "[1,3,224,224]"),
    ],
)
def test_shape_str_keeps_real_names_and_hides_generated_ones(shape, printed):
    spec = TensorSpec("x", dtypes.from_name("float32"), shape)
    assert spec.shape_str() == printed
    assert spec.describe() == f"float32 {printed}"
    assert "DynamicDimension" not in spec.describe()
    assert spec.to_dict()["shape"] == list(shape)  # the data keeps the names as they are


def test_an_input_error_does_not_print_a_generated_dimension_name():
    model = crossrt.load_model(_paddle_like().SerializeToString())
    assert spec_from_value_info(_paddle_like().graph.input[0]).shape == tuple(PADDLE)
    with crossrt.Runtime() as rt:
        loaded = rt.load(model)
        with pytest.raises(crossrt.InvalidInputError) as info:
            loaded.run({"x": np.zeros((2, 4, 5), np.float32)})
        assert "expected float32 [?,3,?]" in info.value.message
        assert "DynamicDimension" not in info.value.message
        assert [o.describe() for o in loaded.outputs] == ["float32 [batch,3,?]"]
