"""The compile step: strict placement, option checks, device resolution, the Executable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import crossrt
from crossrt import (
    DeviceUnavailableError,
    InvalidArgumentError,
    InvalidOptionError,
    StatusCode,
    UnsupportedError,
)
from crossrt.compiler import KNOWN_OPTIONS
from crossrt.drivers import PerformanceMode, Priority, get_driver
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.model import GraphBuilder
from small_models import relu

DRIVERS = ("onnxruntime", "reference")


def _custom_op_model() -> crossrt.Model:
    """Relu, then an operator of a domain no engine knows (com.example Foo)."""
    b = GraphBuilder("custom", opsets={"com.example": 1})
    x = b.input("x", "float32", [2, 3])
    y = b.op("Relu", [x], name="fine_relu")
    b.output(b.op("Foo", [y], domain="com.example", name="my_foo"), "float32", [2, 3])
    return b.finish()


def _image_decoder_model() -> crossrt.Model:
    b = GraphBuilder("decode", opset=20)
    data = b.input("encoded", "uint8", [None])
    b.output(b.op("ImageDecoder", [data], name="decoder"))
    return b.finish()


def _raw_opset_model(opset: int, ir_version: int | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu_new")],
        "newer",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version or helper.find_min_ir_version_for(opsets)
    return model


# -- strict placement -------------------------------------------------------------------------


def test_custom_domain_op_is_refused_on_onnxruntime_listing_the_node():
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(_custom_op_model(), driver="onnxruntime")
    err = info.value
    assert err.code is StatusCode.UNSUPPORTED_OPERATOR
    assert "my_foo" in err.message and "Foo" in err.message
    assert "com.example" in err.message
    assert "1 of 2 nodes" in err.message
    assert err.details["driver"] == "onnxruntime"
    assert err.details["device"] == "cpu:0"
    nodes = err.details["nodes"]
    assert [(n["name"], n["op_type"]) for n in nodes] == [("my_foo", "Foo")]
    assert nodes[0]["reason"]
    # The code is in the printed form too.
    assert str(err).startswith("[UNSUPPORTED_OPERATOR (2001)]")


def test_custom_domain_op_is_refused_on_reference_too():
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(_custom_op_model(), driver="reference")
    assert info.value.code is StatusCode.UNSUPPORTED_OPERATOR
    assert [n["name"] for n in info.value.details["nodes"]] == ["my_foo"]


def test_image_decoder_is_refused_on_onnxruntime():
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(_image_decoder_model(), driver="onnxruntime")
    err = info.value
    assert err.code is StatusCode.UNSUPPORTED_OPERATOR
    assert "decoder" in err.message and "ImageDecoder" in err.message
    (node,) = err.details["nodes"]
    assert (node["name"], node["op_type"]) == ("decoder", "ImageDecoder")
    assert "ImageDecoder" in node["reason"]


def test_image_decoder_on_reference_compiles_or_names_the_missing_package():
    try:
        import PIL  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedError) as info:
            crossrt.compile(_image_decoder_model(), driver="reference")
        assert "PIL" in info.value.details["nodes"][0]["reason"]
    else:
        exe = crossrt.compile(_image_decoder_model(), driver="reference")
        assert exe.nodes[0].driver == "reference"


def test_default_device_picks_onnxruntime_and_refusal_does_not_fall_back():
    # Strict placement: no silent fallback to the reference driver.
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(_image_decoder_model())
    assert info.value.details["driver"] == "onnxruntime"


def test_many_unsupported_nodes_are_summarised():
    b = GraphBuilder("many", opsets={"com.example": 1})
    v = b.input("x", "float32", [2])
    for i in range(13):
        v = b.op("Foo", [v], domain="com.example", name=f"foo{i}")
    b.output(v, "float32", [2])
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(b.finish(), driver="onnxruntime")
    err = info.value
    assert len(err.details["nodes"]) == 13  # details keep all of them
    assert "13 of 13 nodes" in err.message
    assert "and 3 more" in err.message


def _engine_versions(exe: crossrt.Executable) -> tuple[int, int]:
    """IR version and ai.onnx opset of the model ORT compiled (its optimized graph keeps them)."""
    graph = ort_artifact.parse_graph(ort_artifact.unpack(exe.nodes[0].artifact))
    return graph.ir_version, next(o.version for o in graph.opset_import if o.domain == "")


def test_opset_newer_than_ort_is_lowered_when_its_operators_are_old(ort_reads):
    installed = get_driver("onnxruntime")._registry()
    max_ir, max_opset = ort_reads(installed.max_ir, installed.max_opset - 1)
    model = _raw_opset_model(max_opset + 1)  # Relu means the same at max_opset
    assert model.ir_version <= max_ir
    exe = crossrt.compile(model, driver="onnxruntime")
    assert _engine_versions(exe) == (model.ir_version, max_opset)
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.array([-1, 2], np.float32)})["y"]
    assert out.tolist() == [0, 2]


def test_an_operator_newer_than_ort_is_refused_naming_its_version(ort_reads):
    newest = onnx.defs.onnx_opset_version()
    model = _raw_opset_model(newest)
    model.graph.node[0].op_type = "Cast"  # Relu(x) -> Cast(x, to=FLOAT): Cast changes often
    model.graph.node[0].attribute.append(helper.make_attribute("to", onnx.TensorProto.FLOAT))
    since = onnx.defs.get_schema("Cast", newest).since_version
    ort_reads(onnx.IR_VERSION, since - 1)  # an ORT older than this Cast
    with pytest.raises(UnsupportedError) as info:
        crossrt.compile(model, driver="onnxruntime")
    err = info.value
    assert err.code is StatusCode.UNSUPPORTED_OPERATOR
    assert f"Cast-{since} is newer than the newest opset" in err.message
    assert "relu_new" in err.message and err.details["nodes"][0]["name"] == "relu_new"
    # The reference evaluator implements the newest opsets onnx defines.
    exe = crossrt.compile(model, driver="reference")
    assert exe.nodes[0].driver == "reference"


def test_ir_version_newer_than_ort_is_lowered_when_nothing_new_is_used(ort_reads):
    installed = get_driver("onnxruntime")._registry()
    max_ir, max_opset = ort_reads(installed.max_ir - 1, installed.max_opset)
    model = _raw_opset_model(max_opset, max_ir + 1)
    exe = crossrt.compile(model, driver="onnxruntime")
    assert exe.nodes[0].driver == "onnxruntime"
    assert _engine_versions(exe) == (max_ir, max_opset)
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.array([-1, 2], np.float32)})["y"]
    assert out.tolist() == [0, 2]


def test_constant_node_compiles_on_onnxruntime():
    # Regression: ORT has no kernel for Constant (it folds Constants into initializers), and
    # the driver once refused every Constant node, so no exported model compiled.
    b = GraphBuilder("with_constant")
    x = b.input("x", "float32", [3])
    c = b.op("Constant", [], name="k", value=onnx.numpy_helper.from_array(np.ones(3, np.float32)))
    b.output(b.op("Add", [x, c]))
    exe = crossrt.compile(b.finish(), driver="onnxruntime")
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), [1, 2, 3])


@pytest.mark.parametrize("driver", DRIVERS)
def test_supported_model_compiles_on_each_driver(driver):
    exe = crossrt.compile(relu(), driver=driver)
    assert exe.nodes[0].driver == driver
    assert exe.device == "cpu:0"
    assert exe.nodes[0].artifact


# -- options ----------------------------------------------------------------------------------


def test_unknown_option_is_rejected_listing_known_ones():
    with pytest.raises(InvalidOptionError) as info:
        crossrt.compile(relu(), turbo=True)
    err = info.value
    assert err.code is StatusCode.INVALID_OPTION
    assert "'turbo'" in err.message
    for known in KNOWN_OPTIONS:
        assert known in err.message
    assert err.details["unknown"] == ["turbo"]
    assert isinstance(err, ValueError)


def test_several_unknown_options_are_all_named():
    with pytest.raises(InvalidOptionError) as info:
        crossrt.compile(relu(), turbo=True, threads=4)
    assert info.value.details["unknown"] == ["threads", "turbo"]
    assert "'threads'" in info.value.message and "'turbo'" in info.value.message


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("performance_mode", "warp"),
        ("performance_mode", 9),
        ("performance_mode", True),
        ("performance_mode", 2.0),
        ("priority", "urgent"),
        ("priority", -1),
        ("fp16", "yes"),
        ("fp16", 1),
        ("extensions", {1: "x"}),
        ("extensions", ["a"]),
        ("extensions", "a=b"),
    ],
)
def test_bad_option_values_are_rejected(option, value):
    with pytest.raises(InvalidOptionError) as info:
        crossrt.compile(relu(), **{option: value})
    err = info.value
    assert err.code is StatusCode.INVALID_OPTION
    assert f"{option}=" in err.message
    assert KNOWN_OPTIONS[option] in err.message  # says what it takes
    assert err.details == {"option": option}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"precision": "bf16"}, "precision='bf16'"),
        ({"priority": "high"}, "priority"),
        ({"priority": Priority.LOW}, "priority"),
        ({"extensions": {"intra_op_spin": 0}}, "extensions (intra_op_spin)"),
    ],
)
@pytest.mark.parametrize("driver", DRIVERS)
def test_options_a_driver_cannot_honour_are_refused_by_name(driver, options, named):
    with pytest.raises(crossrt.InvalidOptionError) as info:
        crossrt.compile(relu(), driver=driver, **options)
    err = info.value
    assert err.code is StatusCode.INVALID_OPTION
    assert f"option {named}" in err.message
    assert driver in err.message and "cpu:0" in err.message
    assert err.details["driver"] == driver


@pytest.mark.parametrize("mode", ["high", "HIGH", 3, PerformanceMode.HIGH])
def test_reference_refuses_performance_modes(mode):
    with pytest.raises(crossrt.InvalidOptionError) as info:
        crossrt.compile(relu(), driver="reference", performance_mode=mode)
    assert "performance_mode" in info.value.message
    assert "NONE" in info.value.message  # what it supports


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("low", PerformanceMode.LOW),
        ("Low", PerformanceMode.LOW),
        (1, PerformanceMode.LOW),
        (PerformanceMode.LOW, PerformanceMode.LOW),
        ("none", PerformanceMode.NONE),
    ],
)
def test_performance_mode_as_str_int_or_enum_on_onnxruntime(value, expected):
    exe = crossrt.compile(relu(), driver="onnxruntime", performance_mode=value)
    assert exe.options.performance_mode is expected
    assert exe.describe()["options"]["performance_mode"] == expected.name


@pytest.mark.parametrize("mode", ["high", "extreme"])
def test_onnxruntime_claims_only_the_modes_it_honours(mode):
    # LOW and MEDIUM change an ORT session (threads, no spinning); these would be a no-op.
    with pytest.raises(crossrt.InvalidOptionError) as info:
        crossrt.compile(relu(), driver="onnxruntime", performance_mode=mode)
    assert info.value.code is StatusCode.INVALID_OPTION
    assert "onnxruntime" in info.value.message and "NONE, LOW, MEDIUM" in info.value.message


def test_low_performance_mode_reaches_the_session():
    exe = crossrt.compile(relu(), driver="onnxruntime", performance_mode="low")
    with crossrt.Runtime() as rt:
        loaded = rt.load(exe)
        so = loaded._programs[0].session.get_session_options()
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_neutral_options_are_accepted_everywhere():
    for driver in DRIVERS:
        exe = crossrt.compile(
            relu(),
            driver=driver,
            performance_mode="none",
            priority=Priority.NONE,
            fp16=False,
            extensions={},
        )
        assert exe.options == crossrt.drivers.CompileOptions()


# -- the executable ---------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_describe_has_one_node(driver):
    model = relu()
    exe = crossrt.compile(model, driver=driver)
    d = exe.describe()
    assert d["name"] == "relu"
    assert d["device"] == "cpu:0"
    assert d["content_hash"] == model.content_hash
    assert [i["name"] for i in d["inputs"]] == ["x"]
    assert d["inputs"][0] == {
        "name": "x",
        "kind": "tensor",
        "dtype": "float32",
        "shape": [2, 3],
        "dynamic_axes": [],
    }
    assert len(d["nodes"]) == 1
    node = d["nodes"][0]
    assert node["driver"] == driver
    assert node["device_kind"] == "cpu"
    assert node["inputs"] == ["x"]
    assert node["outputs"] == [o.name for o in model.outputs]
    assert node["op_types"] == {"Relu": 1}
    assert node["artifact_bytes"] == len(exe.nodes[0].artifact) > 0
    assert "artifact" not in node
    assert exe.device_kind == "cpu"


def test_compile_accepts_path_bytes_proto_and_model(tmp_path):
    model = relu()
    path = tmp_path / "relu.onnx"
    model.save(path)
    hashes = {
        crossrt.compile(src).content_hash
        for src in (model, str(path), path, model.to_bytes(), model.proto)
    }
    assert hashes == {model.content_hash}


# -- devices and drivers ----------------------------------------------------------------------


def test_unknown_device_kind():
    with pytest.raises(DeviceUnavailableError) as info:
        crossrt.compile(relu(), device="tpu")
    err = info.value
    assert err.code is StatusCode.DEVICE_UNAVAILABLE
    assert "'tpu'" in err.message and "cpu:0" in err.message  # what exists
    assert "crossrt ls" in err.message


def test_device_index_out_of_range():
    with pytest.raises(DeviceUnavailableError) as info:
        crossrt.compile(relu(), device="cpu:7")
    assert "'cpu:7'" in info.value.message


@pytest.mark.parametrize("device", ["cpu:x", "cpu:", ":0", "cpu:-1"])
def test_malformed_device(device):
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.compile(relu(), device=device)
    err = info.value
    assert err.code is StatusCode.INVALID
    assert repr(device) in err.message
    assert "KIND:INDEX" in err.message


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "CPU", " cpu:0 "])
def test_device_spellings(device):
    assert crossrt.compile(relu(), device=device).device == "cpu:0"


def test_unknown_driver():
    with pytest.raises(DeviceUnavailableError) as info:
        crossrt.compile(relu(), driver="tensorrt")
    err = info.value
    assert err.code is StatusCode.DEVICE_UNAVAILABLE
    assert "'tensorrt'" in err.message
    assert "onnxruntime" in err.message and "reference" in err.message  # the known ones


def test_default_device_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", "tpu")
    with pytest.raises(DeviceUnavailableError, match="'tpu'"):
        crossrt.compile(relu())
    monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", "cpu:0")
    assert crossrt.compile(relu()).device == "cpu:0"


def test_invalid_model_is_refused_before_any_driver_runs():
    with pytest.raises(crossrt.InvalidModelError) as info:
        crossrt.compile(b"definitely not onnx", driver="nonexistent")
    assert info.value.code is StatusCode.INVALID_MODEL
