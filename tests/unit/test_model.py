"""The model image (crossrt.model): loading, IO description, hashing, naming and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import crossrt
from crossrt.errors import (
    CrossrtError,
    InvalidModelError,
    ModelNotFoundError,
    StatusCode,
)
from crossrt.model import Model, TensorSpec, load_model

OPSET = 21


def make_proto(weight: np.ndarray | None = None, *, producer: str = "tests") -> onnx.ModelProto:
    """A small valid model: two dynamic inputs, one static, named and unnamed nodes.

    x: float32 [N,4] -> MatMul(W) -> Add(B) -> Relu -> out: float32 [N,3]
                                           -> ArgMax(axis=1) -> idx: int64 [N]
    s: float32 [2,3] -> Identity (named "copy_s") -> s_out
    k: int64 [?] -> Neg -> k_out
    """
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 if weight is None else weight
    b = np.array([0.5, -1.0, 0.25], dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "B"], ["z"]),
        helper.make_node("Relu", ["z"], ["out"], name="act"),
        helper.make_node("ArgMax", ["out"], ["idx"], axis=1, keepdims=0),
        helper.make_node("Identity", ["s"], ["s_out"], name="copy_s"),
        helper.make_node("Neg", ["k"], ["k_out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [None]),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("k_out", TensorProto.INT64, [None]),
        ],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=producer
    )
    proto.ir_version = 10
    return proto


def one_node_proto(node: onnx.NodeProto, inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", inputs, outputs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = 10
    return proto


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return make_proto().SerializeToString()


@pytest.fixture
def model_path(tmp_path: Path, model_bytes: bytes) -> Path:
    path = tmp_path / "small.onnx"
    path.write_bytes(model_bytes)
    return path


# -- loading ---------------------------------------------------------------------------


def test_load_from_str_path_and_pathlike(model_path: Path) -> None:
    for source in (model_path, str(model_path)):
        m = load_model(source)
        assert isinstance(m, Model)
        assert m.name == "small"
        assert [n.op_type for n in m.nodes] == [
            "MatMul",
            "Add",
            "Relu",
            "ArgMax",
            "Identity",
            "Neg",
        ]


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview], ids=lambda w: w.__name__)
def test_load_from_bytes_like(model_bytes: bytes, wrap: type) -> None:
    m = load_model(wrap(model_bytes))
    assert m.name == "small"
    assert m.opsets == {"": OPSET}


def test_load_from_proto_copies_it() -> None:
    proto = make_proto()
    m = load_model(proto)
    assert m.proto is not proto
    assert all(n.name for n in m.nodes)
    # The caller's proto is left as it was: its unnamed nodes stay unnamed.
    assert [n.name for n in proto.graph.node] == ["", "", "act", "", "copy_s", ""]


def test_load_from_model_returns_it() -> None:
    m = load_model(make_proto())
    assert load_model(m) is m


def test_crossrt_load_model_is_the_same_function() -> None:
    assert crossrt.load_model is load_model


def test_to_bytes_and_save_round_trip(tmp_path: Path) -> None:
    m = load_model(make_proto())
    assert load_model(m.to_bytes()).content_hash == m.content_hash
    path = tmp_path / "saved.onnx"
    m.save(path)
    again = load_model(path)
    assert again.content_hash == m.content_hash
    assert [n.name for n in again.nodes] == [n.name for n in m.nodes]


def test_validate_false_skips_the_checker() -> None:
    node = helper.make_node("Relu", ["undefined"], ["y"], name="r")
    proto = one_node_proto(node, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(InvalidModelError):
        load_model(proto)
    assert load_model(proto, validate=False).nodes[0].name == "r"


def test_graph_without_name_is_called_model() -> None:
    proto = make_proto()
    proto.graph.name = ""
    assert load_model(proto, validate=False).name == "model"


def test_load_model_with_external_data_from_its_path(tmp_path: Path, monkeypatch) -> None:
    proto = make_proto()
    expected = numpy_helper.to_array(proto.graph.initializer[0])  # save_model edits proto
    onnx.save_model(
        proto,
        tmp_path / "big.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a path relative to the current directory must not matter
    m = load_model(tmp_path / "big.onnx")
    weights = {t.name: numpy_helper.to_array(t) for t in m.proto.graph.initializer}
    np.testing.assert_array_equal(weights["W"], expected)


def test_missing_external_data_file_is_invalid_model(tmp_path: Path) -> None:
    onnx.save_model(
        make_proto(),
        tmp_path / "big.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(crossrt.InvalidModelError) as info:
        load_model(tmp_path / "big.onnx")
    assert info.value.code is crossrt.StatusCode.INVALID_MODEL
    assert "external" in info.value.message


# -- IO description ----------------------------------------------------------------------


def test_inputs_and_outputs_described() -> None:
    m = load_model(make_proto())
    by_name = {s.name: s for s in m.inputs}
    assert list(by_name) == ["x", "s", "k"], "initializers are not inputs a caller feeds"
    x, s, k = by_name["x"], by_name["s"], by_name["k"]

    assert x.dtype is crossrt.dtypes.from_name("float32")
    assert x.shape == ("N", 4)
    assert x.dynamic_axes == (0,)
    assert not x.is_static
    assert x.rank == 2

    assert s.shape == (2, 3)
    assert s.dynamic_axes == ()
    assert s.is_static

    assert k.dtype.name == "int64"
    assert k.shape == (None,)
    assert k.dynamic_axes == (0,)
    assert not k.is_static

    outs = {o.name: o for o in m.outputs}
    assert list(outs) == ["out", "idx", "s_out", "k_out"]
    assert outs["out"].dtype.name == "float32" and outs["out"].shape == ("N", 3)
    assert outs["idx"].dtype.name == "int64" and outs["idx"].shape == ("N",)


def test_spec_text_forms() -> None:
    m = load_model(make_proto())
    x, _, k = m.inputs
    assert x.shape_str() == "[N,4]"
    assert k.shape_str() == "[?]"
    assert x.describe() == "float32 [N,4]"
    assert x.to_dict() == {
        "name": "x",
        "kind": "tensor",
        "dtype": "float32",
        "shape": ["N", 4],
        "dynamic_axes": [0],
    }
    text = repr(m)
    assert "'small'" in text and "6 nodes" in text and "x: float32 [N,4]" in text


def test_initializer_listed_as_graph_input_is_not_an_input() -> None:
    proto = make_proto()
    proto.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]))
    proto.graph.input.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [3]))
    assert [s.name for s in load_model(proto).inputs] == ["x", "s", "k"]


def test_unknown_rank_and_scalar_specs() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    proto = one_node_proto(
        node,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    (x,) = load_model(proto, validate=False).inputs
    assert x.shape is None and x.rank is None
    assert x.dynamic_axes == () and not x.is_static
    assert x.shape_str() == "[*]"
    (y,) = load_model(proto, validate=False).outputs
    assert y.shape == () and y.is_static and y.rank == 0


def test_sequence_input_is_described_by_kind() -> None:
    node = helper.make_node("SequenceLength", ["seq"], ["n"])
    proto = one_node_proto(
        node,
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    (seq,) = load_model(proto).inputs
    assert seq == TensorSpec("seq", None, None, "sequence", "seq(tensor(float))")
    assert seq.describe() == "sequence [*]"
    assert TensorSpec.from_dict(seq.to_dict()) == seq  # as a .crm header keeps it


def test_value_types_cover_intermediates_and_weights() -> None:
    types = load_model(make_proto()).value_types()
    for name in ("x", "W", "B", "h", "z", "out", "idx"):
        assert name in types, name
    assert types["h"].tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in types["W"].tensor_type.shape.dim] == [4, 3]


# -- content hash --------------------------------------------------------------------------


def test_content_hash_is_hex_sha256(model_bytes: bytes) -> None:
    h = load_model(model_bytes).content_hash
    assert len(h) == 64
    int(h, 16)


def test_content_hash_stable_across_loads_and_sources(model_path: Path, model_bytes: bytes) -> None:
    hashes = {
        load_model(model_path).content_hash,
        load_model(str(model_path)).content_hash,
        load_model(model_bytes).content_hash,
        load_model(onnx.ModelProto.FromString(model_bytes)).content_hash,
        load_model(make_proto()).content_hash,
    }
    assert len(hashes) == 1


def test_content_hash_changes_with_one_weight_value() -> None:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    changed = w.copy()
    changed[2, 1] = np.nextafter(changed[2, 1], np.float32(10))  # one ulp
    assert load_model(make_proto(w)).content_hash != load_model(make_proto(changed)).content_hash


def test_content_hash_changes_with_opset_and_structure() -> None:
    base = load_model(make_proto()).content_hash
    other_opset = make_proto()
    other_opset.opset_import[0].version = 20
    assert load_model(other_opset).content_hash != base
    other_attr = make_proto()
    other_attr.graph.node[3].attribute[0].i = 0  # ArgMax axis 1 -> 0
    assert load_model(other_attr, validate=False).content_hash != base


def test_content_hash_ignores_model_metadata() -> None:
    base = load_model(make_proto()).content_hash
    proto = make_proto(producer="someone-else")
    proto.producer_version = "9.9"
    proto.doc_string = "a different description"
    proto.model_version = 7
    helper.set_model_props(proto, {"author": "x"})
    assert load_model(proto).content_hash == base


# -- node names ---------------------------------------------------------------------------


def test_unnamed_nodes_get_unique_names() -> None:
    names = [n.name for n in load_model(make_proto()).nodes]
    assert names == ["MatMul_0", "Add_1", "act", "ArgMax_3", "copy_s", "Neg_5"]


def test_generated_names_do_not_collide_with_given_ones() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="Relu_1"),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "g",
        [x],
        [y],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    names = [n.name for n in load_model(proto).nodes]
    assert names[0] == "Relu_1"
    assert names[1] and names[1] != "Relu_1"


# -- refusals -----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model.onnx"
    with pytest.raises(ModelNotFoundError) as info:
        load_model(missing)
    err = info.value
    assert err.code is StatusCode.NOT_FOUND
    assert isinstance(err, FileNotFoundError)
    assert str(missing) in err.message
    assert err.details == {"path": str(missing)}


def test_directory_is_not_a_model_and_not_missing(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="not a regular file"):
        load_model(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(InvalidModelError) as info:
        load_model(path)
    assert info.value.code is StatusCode.INVALID_MODEL
    assert str(path) in info.value.message
    assert "no graph" in info.value.message


@pytest.mark.parametrize("fraction", [0.5, 0.01, 0.25, 0.75, 0.99])
def test_truncated_file(tmp_path: Path, model_bytes: bytes, fraction: float) -> None:
    cut = max(1, int(len(model_bytes) * fraction))
    path = tmp_path / "cut.onnx"
    path.write_bytes(model_bytes[:cut])
    with pytest.raises(InvalidModelError) as info:
        load_model(path)
    err = info.value
    assert err.code is StatusCode.INVALID_MODEL
    assert str(path) in err.message, "the message names the file"
    assert "truncated" in err.message, "the message says what is likely wrong"
    assert err.details == {"source": repr(str(path))}


def test_last_byte_missing(model_bytes: bytes) -> None:
    with pytest.raises(InvalidModelError):
        load_model(model_bytes[:-1])


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(seed: int) -> None:
    data = np.random.default_rng(seed).integers(0, 256, size=64 + 97 * seed, dtype=np.uint8)
    with pytest.raises(InvalidModelError) as info:
        load_model(data.tobytes())
    assert info.value.code is StatusCode.INVALID_MODEL


@pytest.mark.parametrize("source", [123, None, 1.5, ["a"], {"x": 1}])
def test_unloadable_source_type(source: object) -> None:
    with pytest.raises(InvalidModelError, match=type(source).__name__):
        load_model(source)


def test_checker_failure_names_the_problem() -> None:
    node = helper.make_node("Relu", ["undefined_value"], ["y"], name="lonely")
    proto = one_node_proto(node, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(InvalidModelError) as info:
        load_model(proto)
    err = info.value
    assert err.code is StatusCode.INVALID_MODEL
    assert "checker" in err.message
    assert "undefined_value" in err.message and "lonely" in err.message
    assert err.details == {"stage": "checker"}


def test_unknown_operator_named() -> None:
    node = helper.make_node("NoSuchOperator", ["x"], ["y"])
    proto = one_node_proto(
        node,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(InvalidModelError, match="NoSuchOperator"):
        load_model(proto)


@pytest.mark.parametrize("node_name", ["my_add", ""])
def test_type_error_names_node_and_op_type(node_name: str) -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"], name=node_name)
    proto = one_node_proto(
        node,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("b", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidModelError) as info:
        load_model(proto)
    err = info.value
    expected_name = node_name or "Add_0"  # unnamed nodes are named before validation
    assert expected_name in err.message
    assert "Add" in err.message
    assert "int64" in err.message
    assert err.details == {"stage": "shape_inference"}


def test_shape_mismatch_is_refused() -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")
    proto = one_node_proto(
        node,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 5]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 5])],
    )
    with pytest.raises(InvalidModelError, match="mm"):
        load_model(proto)


# -- properties: nothing but a CrossrtError escapes load_model ------------------------------

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _load_and_describe(data: bytes) -> None:
    """Load; when it loads, everything that describes it must work too."""
    try:
        m = load_model(data)
    except CrossrtError:
        return
    repr(m)
    assert len(m.content_hash) == 64
    for spec in (*m.inputs, *m.outputs):
        spec.to_dict()
        spec.describe()
    m.value_types()


@PROPERTY
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_property_every_truncation_is_an_invalid_model(model_bytes: bytes, cut: int) -> None:
    cut %= len(model_bytes)  # 0 .. len-1: always strictly shorter than the model
    with pytest.raises(InvalidModelError):
        load_model(model_bytes[:cut])


@PROPERTY
@given(
    flips=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
        min_size=1,
        max_size=6,
    ),
    cut=st.one_of(st.none(), st.integers(min_value=0)),
)
def test_property_corrupted_bytes_raise_only_crossrt_errors(
    model_bytes: bytes, flips: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(model_bytes)
    for pos, value in flips:
        data[pos % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    _load_and_describe(bytes(data))


@PROPERTY
@given(data=st.binary(max_size=512))
def test_property_arbitrary_bytes_raise_only_crossrt_errors(data: bytes) -> None:
    _load_and_describe(data)


# -- large weights: validated and hashed through the skeleton ----------------------------------


def big_proto(
    weight: np.ndarray | None = None, extra: onnx.NodeProto | None = None
) -> onnx.ModelProto:
    """x[N,64] -> MatMul(W: 64x64 float32, 16 KiB: a stub in the skeleton) -> y[N,64]."""
    w = np.ones((64, 64), np.float32) if weight is None else weight
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])] + ([extra] if extra else [])
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        [numpy_helper.from_array(w, "W")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = 10
    return proto


def test_a_large_weight_is_left_in_place_and_typed() -> None:
    model = load_model(big_proto())
    assert model.skeleton.stubbed == (0,)
    assert len(model.proto.graph.initializer[0].raw_data) == 64 * 64 * 4  # untouched
    assert not model.skeleton.proto.graph.initializer[0].raw_data
    types = model.value_types()
    assert [d.dim_value for d in types["W"].tensor_type.shape.dim] == [64, 64]
    assert types["y"].tensor_type.shape.dim[1].dim_value == 64
    np.testing.assert_array_equal(
        numpy_helper.to_array(onnx.load_from_string(model.to_bytes()).graph.initializer[0]),
        np.ones((64, 64), np.float32),
    )


def test_content_hash_changes_with_one_value_of_a_large_weight() -> None:
    w = np.ones((64, 64), np.float32)
    changed = w.copy()
    changed[63, 63] = 2
    assert load_model(big_proto(w)).content_hash == load_model(big_proto(w.copy())).content_hash
    assert load_model(big_proto(w)).content_hash != load_model(big_proto(changed)).content_hash


def test_large_weight_bytes_that_do_not_fit_their_shape_are_refused() -> None:
    proto = big_proto()
    proto.graph.initializer[0].raw_data = proto.graph.initializer[0].raw_data[:-4]
    with pytest.raises(InvalidModelError, match="failed the ONNX checker") as info:
        load_model(proto)
    assert "'W' holds 16380 bytes" in info.value.message and "need 16384" in info.value.message


def test_a_bad_node_is_found_with_large_weights_too() -> None:
    stray = helper.make_node("Relu", ["nothing"], ["z"])
    with pytest.raises(InvalidModelError, match="checker"):
        load_model(big_proto(extra=stray))


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2", "uint2"])
def test_a_large_packed_weight_is_not_mistaken_for_a_misfit(dtype: str) -> None:
    # ONNX packs int4 two and int2 four to a byte: its raw data is not one byte per element.
    dt = crossrt.dtypes.from_name(dtype)
    values = np.ones(8192, dt.numpy)
    w = numpy_helper.from_array(values, "W")
    assert len(w.raw_data) == 8192 * dt.bits // 8 >= 1024
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])],
        "packed",
        [],
        [helper.make_tensor_value_info("y", dt.onnx, [8192])],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    proto.ir_version = 11
    model = load_model(proto)
    assert model.skeleton.stubbed == ()  # left to the checker, which knows the packing


def test_a_model_without_weights_to_stub_is_its_own_skeleton_and_hashes_as_before() -> None:
    """Nothing to stub: no copy (a tree ensemble's bulk is in its attributes); the hash cut
    out of the bytes validation kept is the one serialized on its own, and the value types
    read from inference's output are those of the whole inferred model."""
    proto = big_proto(np.ones((64, 2), np.float32))  # 512 bytes: under the stub size
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 2
    model = load_model(proto)
    assert model.skeleton.stubbed == () and model.skeleton.proto is model.proto
    assert model.content_hash == load_model(proto, validate=False).content_hash
    inferred = onnx.shape_inference.infer_shapes(model.proto, check_type=True, strict_mode=True)
    whole = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    assert {n: model.value_types()[n] for n in whole} == whole


def test_graph_fields_are_sliced_out_of_the_bytes_and_malformed_bytes_refused() -> None:
    from crossrt.model import wire

    data = big_proto().SerializeToString()
    slim = wire.graph_fields(data, frozenset({wire.INPUT, wire.OUTPUT}))
    assert [v.name for v in slim.input] == ["x"] and [v.name for v in slim.output] == ["y"]
    assert not slim.node and not slim.initializer
    graph = onnx.load_from_string(data).graph.SerializeToString()
    assert bytes(wire.graph_bytes(data) or b"") == graph
    for bad in (data[:-3], b"\x3f\x01", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"):
        with pytest.raises(ValueError):
            wire.graph_fields(bad, frozenset({wire.INPUT}))
