"""Models newer than ONNX Runtime reads, lowered when nothing in them is new to it.

The installed ORT may read everything the installed onnx writes (ORT 1.32 and onnx 1.23: IR 14,
opset 28), so the driver is told that ORT reads less than it does (``ort_reads``): the lowering
runs whatever ORT is installed, and the lowered model really runs on it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt.drivers import get_driver
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.drivers.onnxruntime import lower as ort_lower

X = np.array([[-1.0, 2.0, -3.0]], np.float32)


def _model(nodes: list[onnx.NodeProto], opset: int, ir: int, **io: int) -> onnx.ModelProto:
    out_type = io.get("out", TensorProto.FLOAT)
    graph = helper.make_graph(
        nodes,
        "newer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", out_type, [1, 3])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = ir
    return proto


def _limits() -> tuple[int, int]:
    known = get_driver("onnxruntime")._registry()
    return known.max_ir, known.max_opset


def _engine_versions(exe: crossrt.Executable) -> tuple[int, int]:
    """The IR version and ai.onnx opset of the model ORT compiled (its optimized graph keeps
    those of the model it was handed)."""
    (node,) = exe.nodes
    graph = ort_artifact.parse_graph(ort_artifact.unpack(node.artifact))
    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    return graph.ir_version, opset


def test_a_model_newer_than_ort_of_old_operators_is_lowered_and_runs_on_ort(ort_reads):
    ir, opset = _limits()
    max_ir, max_opset = ort_reads(ir - 1, opset - 1)  # an ORT one IR version and opset older
    proto = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"])],
        max_opset + 1,
        max_ir + 1,
    )
    exe = crossrt.compile(proto, "cpu", driver="onnxruntime")  # strict: every node on ORT
    assert _engine_versions(exe) == (max_ir, max_opset)
    assert (proto.ir_version, proto.opset_import[0].version) == (max_ir + 1, max_opset + 1)
    with crossrt.Runtime() as rt:
        assert rt.load(exe).run({"x": X})["y"].tolist() == [[0.0, 4.0, 0.0]]


def test_a_model_ort_reads_is_handed_over_as_it_is():
    ir, opset = _limits()
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], opset, ir)
    exe = crossrt.compile(proto, "cpu", driver="onnxruntime")
    assert _engine_versions(exe) == (ir, opset)


def test_an_operator_newer_than_ort_is_named_and_can_fall_back(ort_reads):
    newest = onnx.defs.onnx_opset_version()
    cast = helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)
    proto = _model([helper.make_node("Relu", ["x"], ["r"]), cast], newest, onnx.IR_VERSION)
    since = onnx.defs.get_schema("Cast", newest).since_version
    ort_reads(onnx.IR_VERSION, since - 1)  # an ORT older than this Cast
    with pytest.raises(crossrt.UnsupportedError, match=f"Cast-{since} is newer than"):
        crossrt.compile(proto, "cpu", driver="onnxruntime")
    exe = crossrt.compile(proto, "cpu", driver="onnxruntime", fallback="cpu")
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference"]
    with crossrt.Runtime() as rt:
        assert rt.load(exe).run({"x": X})["y"].tolist() == [[0.0, 2.0, 0.0]]


def test_lowered_sets_the_versions_and_leaves_the_original_alone():
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], 28, 14)
    low = ort_lower.lowered(proto, 13, 26)
    assert (low.ir_version, low.opset_import[0].version) == (13, 26)
    assert (proto.ir_version, proto.opset_import[0].version) == (14, 28)
    assert low.graph == proto.graph


def test_node_blocker_names_a_subgraph_operator_and_a_newer_type():
    newest = onnx.defs.onnx_opset_version()
    body = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["z"], to=TensorProto.FLOAT)],
        "then",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    since = onnx.defs.get_schema("Cast", newest).since_version
    why = ort_lower.node_blocker(node, newest, since - 1, None, {})
    assert why is not None and f"Cast-{since}" in why
    assert ort_lower.node_blocker(node, newest, since, None, {}) is None
    six = onnx.TypeProto()
    six.tensor_type.elem_type = TensorProto.FLOAT6E2M3
    relu = helper.make_node("Relu", ["a"], ["b"])
    why = ort_lower.node_blocker(relu, newest, newest, ort_lower.newest_type(13), {"a": six})
    assert why is not None and "float6e2m3" in why


def test_a_function_body_ort_cannot_inline_at_the_models_opset_is_refused():
    # Swish-24's body uses CastLike-24, which became CastLike-25: ORT inlines it in an
    # opset-24 model, not in an opset-25 or 26 one.
    swish = [helper.make_node("Swish", ["x"], ["y"])]
    driver = get_driver("onnxruntime")
    (device,) = driver.devices()
    at24 = crossrt.load_model(_model(swish, 24, 10))
    at26 = crossrt.load_model(_model(swish, 26, 13))
    assert driver.unsupported_reasons(at24, device) == [None]
    (why,) = driver.unsupported_reasons(at26, device)
    assert why is not None and "Swish" in why
