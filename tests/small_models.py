"""Small models that tests in several files build: import them by name (``from models import
relu``); tests/conftest.py puts this folder on ``sys.path``. The scheduler's models (``tiny``,
``heavy``, ``pipelined``) are in concurrency_models.py."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import crossrt
from crossrt import GraphBuilder


def relu() -> crossrt.Model:
    """y = Relu(x), float32 [2, 3]: one node every driver runs."""
    b = GraphBuilder("relu")
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Relu", [x], name="the_relu"))
    return b.finish()


def add_one(n: int | str) -> crossrt.Model:
    """y = x + 1, float32 [n]; a string ``n`` names a dynamic dimension."""
    b = GraphBuilder("add_one")
    x = b.input("x", "float32", [n])
    b.output(b.op("Add", [x, b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


def sequence_length() -> onnx.ModelProto:
    """n = SequenceLength(s), y = Identity(x): a sequence input beside a tensor one, whose
    values are not tensors (ORT cannot bind them)."""
    graph = helper.make_graph(
        [
            helper.make_node("SequenceLength", ["s"], ["n"]),
            helper.make_node("Identity", ["x"], ["y"]),
        ],
        "seq",
        [
            helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def three_outputs() -> crossrt.Model:
    """From x float32 [N]: ``plus`` = x + 1, ``times`` = x * 2, and ``trap`` = Reshape(x, [3]),
    which fails unless N is 3: a run that computes ``trap`` with another N fails."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["plus"]),
            helper.make_node("Mul", ["x", "two"], ["times"]),
            helper.make_node("Reshape", ["x", "three"], ["trap"]),
        ],
        "three_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [
            helper.make_tensor_value_info("plus", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("times", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("trap", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("three", TensorProto.INT64, [1], [3]),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return crossrt.load_model(proto)
