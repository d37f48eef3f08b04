"""Where onnx.reference answers wrongly, the reference driver (the oracle ``device="auto"``
and the tests check other drivers against) replaces the operator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import crossrt


def _batchnorm(opset: int, outputs: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    stats = {
        "scale": rng.uniform(0.5, 2, 4),
        "bias": rng.standard_normal(4),
        "mean": rng.standard_normal(4),
        "var": rng.uniform(0.5, 2, 4),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()]
    names = ["y", "running_mean", "running_var"][:outputs]
    attrs = {"epsilon": 1e-5, "momentum": 0.9}  # as exporters write them
    node = helper.make_node("BatchNormalization", ["x", *stats], names, **attrs)
    graph = helper.make_graph(
        [node],
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4, 3, 3] if n == "y" else [4])
            for n in names
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, driver: str, x: np.ndarray) -> dict[str, np.ndarray]:
    with crossrt.Runtime() as rt:
        return rt.load(crossrt.compile(model, "cpu", driver=driver)).run({"x": x})


@pytest.mark.parametrize("opset", [9, 11, 13, 15])
def test_batchnorm_infers_with_the_running_statistics(opset: int) -> None:
    # onnx.reference used the batch's own statistics whenever `momentum` was set.
    model = _batchnorm(opset)
    x = np.random.default_rng(4).standard_normal((2, 4, 3, 3)).astype(np.float32) * 3 + 1
    inits = {i.name: numpy_helper.to_array(i).reshape(-1, 1, 1) for i in model.graph.initializer}
    want = (x - inits["mean"]) / np.sqrt(inits["var"] + 1e-5) * inits["scale"] + inits["bias"]
    got = _run(model, "reference", x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _run(model, "onnxruntime", x)["y"], rtol=1e-5, atol=1e-5)


def test_batchnorm_training_mode_still_uses_the_batch() -> None:
    model = _batchnorm(15, outputs=3)
    model.graph.node[0].attribute.append(helper.make_attribute("training_mode", 1))
    x = np.random.default_rng(5).standard_normal((2, 4, 3, 3)).astype(np.float32) * 3 + 1
    got = _run(model, "reference", x)
    mean = x.mean(axis=(0, 2, 3))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_allclose(got["running_mean"], inits["mean"] * 0.9 + mean * 0.1, rtol=1e-5)


def test_a_cancelled_run_stops_between_nodes() -> None:
    """NumPy cannot be interrupted, but the evaluator checks the token before each node: a
    run past its execution timeout ends within one node's time, not at the end."""
    from crossrt.drivers.base import CancelToken
    from crossrt.drivers.reference import ReferenceProgram
    from crossrt.errors import DeadlineExceededError

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    spec = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [spec("x", TensorProto.FLOAT, [2])], [spec("y", TensorProto.FLOAT, [2])]
    )
    program = ReferenceProgram(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    x = {"x": np.array([-1.0, 2.0], np.float32)}
    token = CancelToken()
    np.testing.assert_array_equal(program.run_cancellable(x, token)["y"], [0.0, -2.0])
    token.cancel()
    with pytest.raises(DeadlineExceededError, match="stopped between nodes"):
        program.run_cancellable(x, token)
    np.testing.assert_array_equal(program.run(x)["y"], [0.0, -2.0])  # and runs again
