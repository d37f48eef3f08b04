"""The nodes the openvino driver refuses though OpenVINO converts them, because its results
differ from ONNX's (drivers/openvino/refusals.py): each rule and a case it must not catch."""

from __future__ import annotations

import numpy as np
import pytest

import crossrt
from crossrt.model import GraphBuilder

pytest.importorskip("openvino")
from crossrt.drivers.openvino.refusals import refusals


def _reasons(model: crossrt.Model) -> dict[str, str | None]:
    return {n.op_type: why for n, why in zip(model.nodes, refusals(model), strict=True)}


def test_tile_with_repeats_computed_at_run_time() -> None:
    b = GraphBuilder("tile")
    x = b.input("x", "float32", [2, 3])
    repeats = b.input("repeats", "int64", [2])
    b.output(b.op("Tile", [x, repeats]))
    assert "Tile with repeats computed at run time" in str(_reasons(b.finish())["Tile"])
    b = GraphBuilder("tile_constant")
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Tile", [x, b.constant(np.array([2, 1], np.int64))]))
    assert _reasons(b.finish())["Tile"] is None


def test_reduce_max_of_a_slice_of_minus_infinity_is_minus_infinity() -> None:
    # OpenVINO's ReduceMax starts from the lowest finite float: a row masked entirely gave
    # -3.4e38. Inputs computed from an infinite constant are rewritten (exact_infinities).
    b = GraphBuilder("masked")
    x = b.input("x", "float32", [3, 2])
    mask = b.input("mask", "bool", [3, 2])
    minus_inf = b.constant(np.array(-np.inf, np.float32))
    biased = b.op("Where", [mask, x, minus_inf])
    axes = b.constant(np.array([1], np.int64))
    b.output(b.op("ReduceMax", [biased, axes], keepdims=0))
    b.output(b.op("ReduceMin", [b.op("Neg", [biased]), axes], keepdims=0))
    model = b.finish()
    assert _reasons(model)["ReduceMax"] is None
    exe = crossrt.compile(model, "cpu", driver="openvino")
    x_value = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    mask = np.array([[True, False], [False, False], [True, True]])
    with crossrt.Runtime() as rt:
        top, bottom = rt.load(exe).run({"x": x_value, "mask": mask}).values()
    np.testing.assert_array_equal(top, [1, -np.inf, 6])
    np.testing.assert_array_equal(bottom, [-1, np.inf, -6])


def test_reduce_min_of_nothing() -> None:
    b = GraphBuilder("empty")
    x = b.input("x", "float32", [2, 0, 4])
    b.output(b.op("ReduceMin", [x, b.constant(np.array([1], np.int64))], keepdims=1))
    assert "of nothing" in str(_reasons(b.finish())["ReduceMin"])


@pytest.mark.parametrize(
    ("size", "pads", "refused"), [(4, [0, 0, 1, 1], True), (5, [0, 0, 0, 0], False)]
)
def test_max_pool_ceil_mode_window_in_the_end_padding(
    size: int, pads: list[int], refused: bool
) -> None:
    # kernel 2, stride 2, ceil: on 4 with one of end padding the third window starts in the
    # padding, and ONNX drops it (output 2, where OpenVINO gives 3); on 5 it starts inside.
    b = GraphBuilder("pool")
    x = b.input("x", "float32", [1, 1, size, size])
    b.output(b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2], pads=pads, ceil_mode=1))
    why = _reasons(b.finish())["MaxPool"]
    assert (why is not None and "ceil_mode" in why) is refused


def test_refused_nodes_run_with_fallback_and_give_onnx_results() -> None:
    b = GraphBuilder("tile_fallback")
    x = b.input("x", "float32", [2, 3])
    repeats = b.input("repeats", "int64", [2])
    b.output(b.op("Relu", [b.op("Tile", [x, repeats])]))
    exe = crossrt.compile(b.finish(), "cpu", driver="openvino", fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "openvino"]
    x_value = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with crossrt.Runtime() as rt:
        (got,) = rt.load(exe).run({"x": x_value, "repeats": np.array([2, 2])}).values()
    np.testing.assert_array_equal(got, np.maximum(np.tile(x_value, (2, 2)), 0))
