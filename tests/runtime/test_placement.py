"""Heterogeneous placement: compile(fallback=...) splits a graph across drivers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import GraphBuilder, StatusCode

X = np.array([[1.5, -2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)


def mixed_model() -> crossrt.Model:
    """Relu -> Cast(int16) -> Max(int16) -> Cast(float) -> Add: ORT has no int16 Max."""
    b = GraphBuilder("mixed")
    x = b.input("x", "float32", [2, 3])
    as_int = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.INT16)
    biggest = b.op("Max", [as_int, as_int], name="int16_max")
    back = b.op("Cast", [biggest], to=TensorProto.FLOAT)
    b.output(
        b.op("Add", [back, x]),
    )
    b.output(as_int)  # a graph output made by the first region and read by the second
    return b.finish()


def reference_outputs(model: crossrt.Model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with crossrt.Runtime() as rt:
        return rt.load(model, driver="reference").run(feed)


def test_strict_placement_names_the_node_and_suggests_fallback() -> None:
    with pytest.raises(crossrt.UnsupportedError) as info:
        crossrt.compile(mixed_model())
    assert info.value.code is StatusCode.UNSUPPORTED_OPERATOR
    assert "int16_max (Max)" in info.value.message
    assert "fallback" in info.value.message
    assert [n["name"] for n in info.value.details["nodes"]] == ["int16_max"]


def test_fallback_splits_into_ort_and_reference_nodes_and_runs_right() -> None:
    model = mixed_model()
    exe = crossrt.compile(model, fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference", "onnxruntime"]
    assert exe.nodes[1].op_types == {"Max": 1}
    assert sum(sum(n.op_types.values()) for n in exe.nodes) == len(model.nodes)
    # Each node reads only what the graph or earlier nodes produce.
    available = {s.name for s in exe.inputs}
    for node in exe.nodes:
        assert set(node.inputs) <= available, node.name
        available |= set(node.outputs)
    assert {s.name for s in exe.outputs} <= available

    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": X})
    want = reference_outputs(model, {"x": X})
    assert out.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(out[name], want[name])


def test_fallback_is_not_used_when_the_target_runs_everything() -> None:
    b = GraphBuilder("plain")
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Relu", [x]))
    exe = crossrt.compile(b.finish(), fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime"]


def test_parallel_branches_give_an_acyclic_plan() -> None:
    """Two branches from one input, one of them unsupported by ORT, joined at the end."""
    b = GraphBuilder("branches")
    x = b.input("x", "float32", [2, 3])
    left = b.op("Sigmoid", [b.op("Relu", [x])])
    as_int = b.op("Cast", [x], to=TensorProto.INT16)
    right = b.op("Cast", [b.op("Max", [as_int, as_int])], to=TensorProto.FLOAT)
    b.output(b.op("Add", [left, right]))
    model = b.finish()
    exe = crossrt.compile(model, fallback=["cpu"])
    assert {n.driver for n in exe.nodes} == {"onnxruntime", "reference"}
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": X})
    want = reference_outputs(model, {"x": X})
    np.testing.assert_allclose(next(iter(out.values())), next(iter(want.values())), rtol=1e-6)


def test_subgraph_reads_from_outer_scope_are_dependencies() -> None:
    """An If whose branches read a value made outside them, after an unsupported node."""
    then_graph = helper.make_graph(
        [helper.make_node("Cast", ["biggest"], ["then_out"], to=TensorProto.FLOAT)],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3])],
    )
    else_graph = helper.make_graph(
        [
            helper.make_node("Cast", ["biggest"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Neg", ["as_float"], ["else_out"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 3])],
    )
    nodes = [
        helper.make_node("Cast", ["x"], ["as_int"], to=TensorProto.INT16),
        helper.make_node("Max", ["as_int", "as_int"], ["biggest"]),
        helper.make_node("If", ["flag"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    graph = helper.make_graph(
        nodes,
        "outer",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    model = crossrt.load_model(proto)
    exe = crossrt.compile(model, fallback="cpu")
    if_node = next(n for n in exe.nodes if "If" in n.op_types)
    assert if_node.driver == "onnxruntime"
    assert "biggest" in if_node.inputs  # read inside the branches only, made by reference
    with crossrt.Runtime() as rt:
        loaded = rt.load(exe)
        for flag in (True, False):
            feed = {"x": X, "flag": np.array(flag)}
            np.testing.assert_array_equal(
                loaded.run(feed)["y"], reference_outputs(model, feed)["y"]
            )


def test_no_candidate_can_run_a_node() -> None:
    b = GraphBuilder("custom", opsets={"com.example": 1})
    x = b.input("x", "float32", [2])
    b.output(b.op("Frobnicate", [x], domain="com.example", name="frob"), dtype="float32", shape=[2])
    with pytest.raises(crossrt.UnsupportedError) as info:
        crossrt.compile(b.finish(), fallback="cpu")
    message = info.value.message
    assert "frob (Frobnicate)" in message
    assert "onnxruntime" in message and "reference" in message


def test_fallback_to_a_device_nobody_serves() -> None:
    with pytest.raises(crossrt.DeviceUnavailableError) as info:
        crossrt.compile(mixed_model(), fallback="tpu")
    assert "tpu" in info.value.message


def test_preallocated_outputs_on_a_multi_node_executable() -> None:
    exe = crossrt.compile(mixed_model(), fallback="cpu")
    name = exe.outputs[0].name
    buffer = np.empty((2, 3), np.float32)
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": X}, outputs={name: buffer})
    assert out[name] is buffer
    np.testing.assert_array_equal(buffer, np.maximum(X, 0).astype(np.int16) + X)


def test_unload_releases_every_node() -> None:
    exe = crossrt.compile(mixed_model(), fallback="cpu")
    with crossrt.Runtime() as rt:
        loaded = rt.load(exe)
        loaded.unload()
        with pytest.raises(crossrt.errors.InvalidHandleError):
            loaded.run({"x": X})


def test_onnx_is_not_modified_by_partitioning() -> None:
    model = mixed_model()
    before = model.proto.SerializeToString(deterministic=True)
    crossrt.compile(model, fallback="cpu")
    assert model.proto.SerializeToString(deterministic=True) == before
    assert onnx.checker.check_model(model.proto) is None


def test_placement_is_a_value_and_survives_a_crm_round_trip(tmp_path) -> None:
    exe = crossrt.compile(mixed_model(), fallback="cpu")
    assert [(p["driver"], p["operators"]) for p in exe.placement] == [
        ("onnxruntime", 2),
        ("reference", 1),
        ("onnxruntime", 2),
    ]
    assert exe.placement_summary() == (
        "onnxruntime 2 nodes (4 operators), reference 1 node (1 operator)"
    )
    path = tmp_path / "mixed.crm"
    exe.save(path)
    again = crossrt.load_executable(path)
    assert again.placement == exe.placement
    with crossrt.Runtime() as rt:
        first = rt.load(exe).run({"x": X})
        second = rt.load(again).run({"x": X})
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])


def test_a_reduced_precision_allows_fallback_nodes_to_keep_the_models() -> None:
    # precision= permits a reduced precision; a fallback driver that has none computes in the
    # model's own precision instead of failing the compile.
    ov = next(
        (s for s in crossrt.drivers.driver_statuses() if s.name == "openvino" and s.driver), None
    )
    if ov is None or ov.driver is None:
        pytest.skip("the openvino driver is not available")
    cpu = next(d for d in ov.driver.devices() if d.id == "cpu:0")
    if not cpu.capabilities.bf16:
        pytest.skip("OpenVINO has no bf16 on this CPU")
    b = GraphBuilder("topk_relu")
    x = b.input("x", "float32", [2, 3])
    k = b.constant(np.array([2], np.int64))
    values, _ = b.op("TopK", [b.op("Relu", [x]), k], outputs=2)  # OpenVINO's TopK is refused
    b.output(values)
    exe = crossrt.compile(b.finish(), "cpu", driver="openvino", precision="bf16", fallback="cpu")
    assert {n.driver for n in exe.nodes} == {"openvino", "onnxruntime"}
    assert exe.options.precision == "bf16"
    with crossrt.Runtime() as rt:
        (got,) = rt.load(exe).run({"x": X}).values()
    np.testing.assert_allclose(got, -np.sort(-np.maximum(X, 0), axis=1)[:, :2], rtol=1e-2)


def test_a_constant_read_across_regions_is_copied_into_the_reader() -> None:
    # The constant is made in the first region and read by the second (int16 Max runs on
    # the reference driver): it is copied in, not passed between drivers, so the reader's
    # engine sees its value.
    b = GraphBuilder("constant_across")
    x = b.input("x", "float32", [2, 3])
    two = b.op("Constant", [], outputs=["two"], value=helper.make_tensor("v", 5, [], [2]))
    as_int = b.op("Cast", [b.op("Mul", [x, b.op("Cast", [two], to=TensorProto.FLOAT)])], to=5)
    biggest = b.op("Max", [as_int, two], name="int16_max")
    b.output(b.op("Cast", [biggest], to=TensorProto.FLOAT))
    exe = crossrt.compile(b.finish(), "cpu", fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference", "onnxruntime"]
    assert all("two" not in n.inputs and "two" not in n.outputs for n in exe.nodes)
    assert exe.nodes[1].op_types == {"Constant": 1, "Max": 1}
    with crossrt.Runtime() as rt:
        (got,) = rt.load(exe).run({"x": X}).values()
    np.testing.assert_array_equal(got, np.maximum((X * 2).astype(np.int16), 2))
