"""The onnxruntime driver's artifact: the graph with its large weights beside it, mapped on load."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import crossrt
from crossrt import CrossrtError, StatusCode, UnsupportedError, host
from crossrt.drivers import get_driver
from crossrt.drivers.base import ArtifactFile, CompileOptions, CoreSet
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.drivers.onnxruntime import spill
from crossrt.errors import InvalidContainerError
from crossrt.model import GraphBuilder

PRELUDE = struct.Struct("<8sIIQ")
RNG = np.random.default_rng(7)

# (name, value): every dtype the format stores, a few below the threshold, one in float_data.
TENSORS: list[tuple[str, np.ndarray]] = [
    ("f32", RNG.standard_normal((16, 32)).astype(np.float32)),
    ("f64", RNG.standard_normal(200)),
    ("f16", RNG.standard_normal((8, 64)).astype(np.float16)),
    ("i8", RNG.integers(-128, 127, 1500).astype(np.int8)),
    ("i16", RNG.integers(-999, 999, 700).astype(np.int16)),
    ("i32", RNG.integers(-(2**31), 2**31 - 1, 300).astype(np.int32)),
    ("i64", RNG.integers(-(2**62), 2**62, 130)),
    ("u8", RNG.integers(0, 255, 1024).astype(np.uint8)),
    ("u16", RNG.integers(0, 2**16 - 1, 600).astype(np.uint16)),
    ("u32", RNG.integers(0, 2**32 - 1, 400).astype(np.uint32)),
    ("u64", RNG.integers(0, 2**63, 150).astype(np.uint64)),
    ("b", RNG.integers(0, 2, 2048).astype(bool)),
    ("small", np.arange(10, dtype=np.float32)),  # below the threshold: stays in the graph
    ("text", np.array(["a", "bc"] * 600, dtype=object)),  # strings always stay in the graph
    ("typed", RNG.standard_normal(400).astype(np.float32)),  # stored in float_data
]
INLINE = {"small", "text"}


def _tensor_model() -> bytes:
    """A model whose outputs are its initializers, one Identity each."""
    inits = []
    for name, value in TENSORS:
        if name == "typed":
            inits.append(helper.make_tensor(name, onnx.TensorProto.FLOAT, value.shape, value))
        else:
            inits.append(numpy_helper.from_array(value, name))
    nodes = [helper.make_node("Identity", [name], [f"out_{name}"]) for name, _ in TENSORS]
    outputs = [
        helper.make_tensor_value_info(f"out_{t.name}", t.data_type, list(t.dims)) for t in inits
    ]
    graph = helper.make_graph(nodes, "tensors", [], outputs, initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    assert not proto.graph.initializer[-1].raw_data  # the typed-field case is real
    return proto.SerializeToString()


def _mlp() -> crossrt.Model:
    """x[N,64] -> MatMul 64x64 (16 KiB) -> + bias -> Relu -> Gather of 256 columns (int64)."""
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", ["N", 64])
    w = b.constant(RNG.standard_normal((64, 64)).astype(np.float32) / 8, "W")
    bias = b.constant(RNG.standard_normal(64).astype(np.float32), "bias")
    index = b.constant(RNG.integers(0, 64, 256), "index")
    hidden = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, w]), bias])])
    b.output(b.op("Gather", [hidden, index], axis=1, outputs=["y"]))
    return b.finish()


X = RNG.standard_normal((5, 64)).astype(np.float32)


def _load(artifact: bytes | memoryview) -> Any:
    driver = get_driver("onnxruntime")
    (device,) = driver.devices()
    return driver.load(artifact, device, CoreSet((0,)), CompileOptions())


def _index(artifact: bytes) -> dict[str, Any]:
    _, _, _, length = PRELUDE.unpack_from(artifact)
    doc: dict[str, Any] = json.loads(artifact[PRELUDE.size : PRELUDE.size + length])
    return doc


def _with_index(artifact: bytes, change: Callable[[dict[str, Any]], Any]) -> bytes:
    """The artifact with its index edited: 128 bytes more room for it, the rest moved along."""
    index = _index(artifact)
    start = index["graph"]["offset"]
    buffers = [b for w in index["weights"] for p in w.get("prepacked", []) for b in p["buffers"]]
    for entry in (index["graph"], *index["weights"], *buffers):
        entry["offset"] += 128
    change(index)
    text = json.dumps(index, separators=(",", ":")).encode()
    room = start + 128 - PRELUDE.size
    assert len(text) <= room, "the edited index does not fit before the graph"
    text += b" " * (room - len(text))  # JSON allows trailing whitespace
    magic, version, reserved, _ = PRELUDE.unpack_from(artifact)
    return PRELUDE.pack(magic, version, reserved, len(text)) + text + artifact[start:]


def _plain(artifact: bytes | memoryview) -> bytes:
    """The artifact in the previous format: the optimized model's ONNX bytes, weights inside."""
    unpacked = ort_artifact.unpack(artifact)
    proto = onnx.ModelProto.FromString(bytes(unpacked.graph))
    values = dict(zip(unpacked.names, unpacked.arrays, strict=True))
    for init in proto.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return proto.SerializeToString()


@pytest.fixture(scope="module")
def packed() -> bytes:
    return ort_artifact.pack(_tensor_model())


@pytest.fixture(scope="module")
def mlp_exe() -> crossrt.Executable:
    return crossrt.compile(_mlp(), "cpu", driver="onnxruntime")


# -- the format -----------------------------------------------------------------------------


def test_round_trip_of_every_stored_dtype(packed):
    unpacked = ort_artifact.unpack(packed)
    expected = {name: value for name, value in TENSORS if name not in INLINE}
    assert unpacked.names == list(expected)
    for name, array in zip(unpacked.names, unpacked.arrays, strict=True):
        assert array.dtype == expected[name].dtype and array.shape == expected[name].shape
        np.testing.assert_array_equal(array, expected[name])
    graph = onnx.ModelProto.FromString(bytes(unpacked.graph)).graph
    stubs = {t.name: t for t in graph.initializer}
    for name in expected:
        assert stubs[name].data_location == onnx.TensorProto.EXTERNAL
        assert not stubs[name].raw_data and not stubs[name].float_data
    for name in INLINE:
        assert stubs[name].data_location == onnx.TensorProto.DEFAULT
    # ORT, given the weights as views, returns every tensor as it was.
    program = _load(packed)
    results = program.run({})
    for name, value in TENSORS:
        got = results[f"out_{name}"]
        assert got.shape == value.shape
        if name == "text":
            assert got.tolist() == value.tolist()
        else:
            assert got.dtype == value.dtype and np.array_equal(got, value)
    program.close()


def test_layout_matches_the_documented_format(packed):
    magic, version, reserved, length = PRELUDE.unpack_from(packed)
    assert (magic, version, reserved) == (b"CRORTART", 2, 0)
    index = _index(packed)
    assert index["target"] == {"level": "extended", "features": []}
    graph = index["graph"]
    assert graph["offset"] >= PRELUDE.size + length
    padding = packed[PRELUDE.size + length : graph["offset"]]
    assert padding == bytes(len(padding)) and len(padding) < 64
    end = graph["offset"] + graph["length"]
    for entry, (name, value) in zip(
        index["weights"], [t for t in TENSORS if t[0] not in INLINE], strict=True
    ):
        assert entry["name"] == name
        assert entry["dtype"] == value.dtype.name and entry["shape"] == list(value.shape)
        assert entry["offset"] % 64 == 0 and entry["offset"] >= end
        assert packed[end : entry["offset"]] == bytes(entry["offset"] - end)
        blob = packed[entry["offset"] : entry["offset"] + entry["length"]]
        assert blob == value.astype(value.dtype.newbyteorder("<")).tobytes()
        end = entry["offset"] + entry["length"]
    assert end == len(packed)


def test_small_and_shape_tensors_stay_in_the_graph(mlp_exe):
    unpacked = ort_artifact.unpack(mlp_exe.nodes[0].artifact)
    # W (16 KiB) and the int64 index (2 KiB) move out; the 256-byte bias stays in the graph,
    # and so would the small shape and axes tensors ORT's shape inference reads on load.
    assert set(unpacked.names) == {"W", "index"}
    assert all(a.nbytes >= ort_artifact.THRESHOLD for a in unpacked.arrays)


def test_a_model_without_large_weights_still_packs():
    b = GraphBuilder("tiny")
    b.output(b.op("Relu", [b.input("x", "float32", [2])], outputs=["y"]))
    exe = crossrt.compile(b.finish(), driver="onnxruntime")
    artifact = exe.nodes[0].artifact
    assert bytes(artifact[:8]) == ort_artifact.MAGIC and ort_artifact.unpack(artifact).names == []
    with crossrt.Runtime() as rt:
        x = np.array([-1.0, 2.0], np.float32)
        assert rt.load(exe).run({"x": x})["y"].tolist() == [0.0, 2.0]


# -- zero copy --------------------------------------------------------------------------------


def test_ort_maps_the_weights_from_the_crm_file_itself(tmp_path, mlp_exe):
    mlp_exe.save(tmp_path / "mlp.crm")
    exe = crossrt.load_executable(tmp_path / "mlp.crm")
    node = exe.nodes[0]
    assert node.artifact_file is not None
    assert node.artifact_file.path == str((tmp_path / "mlp.crm").resolve())
    with open(tmp_path / "mlp.crm", "rb") as f:  # the recorded offset is the artifact's
        f.seek(node.artifact_file.offset)
        assert f.read(64) == bytes(node.artifact[:64])
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        assert model._programs[0].weights == ()  # none handed over in memory
        got = model.run({"x": X})["y"]
        # The same as from the bytes compile() returned, and as raw ORT on the plain graph.
        assert np.array_equal(got, rt.load(mlp_exe).run({"x": X})["y"])
    raw = ort.InferenceSession(_plain(node.artifact), providers=["CPUExecutionProvider"])
    assert np.array_equal(got, raw.run(None, {"x": X})[0])


def test_weights_from_memory_are_views_of_the_buffer_handed_to_ort(mlp_exe):
    exe = crossrt.load_executable(mlp_exe.to_bytes())
    assert exe.nodes[0].artifact_file is None
    program = _load(exe.nodes[0].artifact)
    buffer = np.frombuffer(exe.nodes[0].artifact.obj, np.uint8)
    assert len(program.weights) == 2
    assert all(np.shares_memory(w, buffer) and not w.flags.writeable for w in program.weights)
    program.close()


def test_a_crm_replaced_after_it_was_read_is_not_read_again(tmp_path, mlp_exe):
    mlp_exe.save(tmp_path / "mlp.crm")
    exe = crossrt.load_executable(tmp_path / "mlp.crm")
    (tmp_path / "other.crm").write_bytes(b"not this")
    (tmp_path / "other.crm").replace(tmp_path / "mlp.crm")  # a new file at the path
    assert not exe.nodes[0].artifact_file.unchanged()
    with crossrt.Runtime() as rt:
        model = rt.load(exe)  # the weights come from the mapping read and checked before
        assert len(model._programs[0].weights) == 2
        assert np.array_equal(model.run({"x": X})["y"], rt.load(mlp_exe).run({"x": X})["y"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda names: names.pop(), "is in no initializer"),
        (lambda names: names.append("ghost"), "has no stored bytes"),
    ],
)
def test_a_graph_and_index_that_disagree_are_refused_before_ort_reads_the_file(
    mlp_exe, edit, message
):
    unpacked = ort_artifact.unpack(mlp_exe.nodes[0].artifact)
    proto = onnx.ModelProto.FromString(bytes(unpacked.graph))
    stubs = [i for i in proto.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    names = [i.name for i in stubs]
    edit(names)
    if len(names) > len(stubs):  # a stub for a weight the index does not have
        ghost = proto.graph.initializer.add()
        ghost.CopyFrom(stubs[0])
        ghost.name = "ghost"
    else:
        proto.graph.initializer.remove(stubs[-1])
    changed = dataclasses.replace(unpacked, graph=memoryview(proto.SerializeToString()))
    with pytest.raises(InvalidContainerError, match=message):
        ort_artifact.graph_reading(changed, "mlp.crm", 0)


def test_the_program_keeps_the_mapping_alive(tmp_path, mlp_exe):
    mlp_exe.save(tmp_path / "mlp.crm")
    exe = crossrt.load_executable(tmp_path / "mlp.crm")
    program = _load(exe.nodes[0].artifact)  # no file given: the weights are views of the map
    expected = program.run({"x": X})["y"].copy()
    del exe  # the executable and its view go; the weights the session reads must not
    assert np.array_equal(program.run({"x": X})["y"], expected)
    program.close()


def test_weights_in_a_writable_buffer_are_copied(mlp_exe):
    # The caller may overwrite a bytearray after the load: the session must not read it.
    data = bytearray(mlp_exe.to_bytes())
    exe = crossrt.load_executable(data)
    program = _load(exe.nodes[0].artifact)
    buffer = np.frombuffer(data, np.uint8)
    assert program.weights and not any(np.shares_memory(w, buffer) for w in program.weights)
    expected = program.run({"x": X})["y"].copy()
    data[:] = bytes(len(data))
    assert np.array_equal(program.run({"x": X})["y"], expected)
    program.close()


# -- earlier formats: one version loads ---------------------------------------------------------


@pytest.mark.parametrize("from_file", [True, False])
def test_an_artifact_of_the_previous_format_is_refused_to_compile_again(
    tmp_path, mlp_exe, from_file
):
    # The optimized model's plain ONNX bytes, as crossrt wrote before it packed artifacts:
    # ORT would take them whole, with whatever files their tensors name.
    plain = _plain(mlp_exe.nodes[0].artifact)
    old = dataclasses.replace(
        mlp_exe, nodes=(dataclasses.replace(mlp_exe.nodes[0], artifact=plain),)
    )
    old.save(tmp_path / "old.crm")
    source = tmp_path / "old.crm" if from_file else old.to_bytes()
    with crossrt.Runtime() as rt, pytest.raises(InvalidContainerError) as info:
        rt.load(crossrt.load_executable(source))
    assert "plain ONNX model" in info.value.message
    assert "recompile the model" in info.value.message


def test_an_artifact_of_version_1_is_refused_to_compile_again(packed):
    def drop_target(index: dict[str, Any]) -> None:
        del index["target"]

    data = bytearray(_with_index(packed, drop_target))
    data[8:12] = struct.pack("<I", 1)
    with pytest.raises(UnsupportedError, match="artifact is version 1") as info:
        _load(bytes(data))
    assert info.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    assert "recompile the model" in info.value.message and "upgrade" not in info.value.message


# -- corrupt artifacts ------------------------------------------------------------------------


def _first(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda index: change(index["weights"][0])


BAD_INDEXES = [
    (_first(lambda w: w.update(offset=10**12)), "truncated: weights[0] ends at byte"),
    (_first(lambda w: w.update(offset=-64)), "weights[0].offset is negative"),
    (_first(lambda w: w.update(offset=w["offset"] + 4)), "not a multiple of 64"),
    (_first(lambda w: w.update(offset=0)), "weights[0] at byte 0 overlaps"),
    (lambda i: i["weights"][1].update(offset=i["weights"][0]["offset"]), "weights[1] at byte"),
    (_first(lambda w: w.update(length=w["length"] + 1)), "shape and dtype need a different"),
    (_first(lambda w: w.update(length=True)), "weights[0].length is missing or not an integer"),
    (_first(lambda w: w.update(shape=[-1, 512])), "weights[0].shape is not a list of sizes"),
    (_first(lambda w: w.update(shape=[2**40, 2**40])), "shape and dtype need a different"),
    (_first(lambda w: w.update(dtype="bfloat16")), "dtype 'bfloat16' is not one it stores"),
    (_first(lambda w: w.update(dtype="<f4")), "dtype '<f4' is not one it stores"),
    (_first(lambda w: w.pop("name")), "weights[0].name is missing"),
    (lambda i: i["weights"][1].update(name=i["weights"][0]["name"]), "repeats an earlier name"),
    (lambda i: i["weights"].append(7), "weights[13] is not an object"),
    (lambda i: i.update(weights={}), "index field weights is missing or not a list"),
    (lambda i: i["graph"].update(offset=8), "the graph at byte 8 overlaps"),
    (lambda i: i["graph"].update(length=10**9), "truncated: the graph ends at byte"),
    (lambda i: i.pop("graph"), "index field graph is missing or not an object"),
    (lambda i: i.pop("target"), "index field target is missing or not an object"),
    (lambda i: i["target"].update(level="fast"), "target has an unknown level"),
    (lambda i: i["target"].update(features=[1]), "features not strings"),
    (lambda i: i["target"].update(features="avx"), "target.features is missing or not a list"),
]


@pytest.mark.parametrize(("change", "message"), BAD_INDEXES)
def test_a_bad_index_is_refused_by_name(packed, change, message):
    with pytest.raises(InvalidContainerError, match="onnxruntime artifact is corrupt") as info:
        ort_artifact.unpack(_with_index(packed, change))
    assert message in info.value.message
    assert info.value.code is StatusCode.INVALID
    assert "recompile the model with `crossrt compile`" in info.value.message


@pytest.mark.parametrize(
    ("cut", "message"),
    [(10, "less than its 24-byte prelude"), (40, "its index needs"), (-1, "weights[12] ends at")],
)
def test_a_truncated_artifact(packed, cut, message):
    with pytest.raises(InvalidContainerError, match="truncated") as info:
        ort_artifact.unpack(packed[:cut])
    assert message in info.value.message


def test_a_bad_prelude(packed):
    with pytest.raises(InvalidContainerError, match="does not start with"):
        ort_artifact.unpack(b"X" + packed[1:])
    for field, value in ((8, 0), (12, 1)):
        data = bytearray(packed)
        data[field : field + 4] = struct.pack("<I", value)
        with pytest.raises(InvalidContainerError, match="prelude is damaged"):
            ort_artifact.unpack(bytes(data))
    data = bytearray(packed)
    data[8:12] = struct.pack("<I", 3)
    with pytest.raises(UnsupportedError, match="artifact is version 3") as info:
        _load(bytes(data))
    assert info.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION


@pytest.mark.parametrize("text", [b"[]", b"{", b"\xff", b'{"graph": NaN}', b"[" * 100_000])
def test_an_index_that_is_not_a_json_object(text):
    data = PRELUDE.pack(b"CRORTART", ort_artifact.VERSION, 0, len(text)) + text
    with pytest.raises(InvalidContainerError, match="its index is not"):
        ort_artifact.unpack(data)


def test_each_weight_is_checked_against_its_stub_before_ort_sees_it(packed):
    # A consistent index whose entries no longer match the graph: refused, nothing runs.
    def swap(index: dict[str, Any]) -> None:
        first, second = index["weights"][:2]
        first["name"], second["name"] = second["name"], first["name"]

    with pytest.raises(InvalidContainerError, match="and its stored bytes differ"):
        _load(_with_index(packed, swap))
    with pytest.raises(InvalidContainerError, match="has no stored bytes"):
        _load(_with_index(packed, _first(lambda w: w.update(name="nothing-of-that-name"))))


def test_damage_crossrt_finds_unpacking_is_not_blamed_on_ort(packed):
    # An empty weight of a shape NumPy cannot make: crossrt's own unpacking fails, and says
    # the artifact is damaged, not that ONNX Runtime could not load it.
    bad = _with_index(packed, _first(lambda w: w.update(shape=[0, 2**70], length=0)))
    with pytest.raises(InvalidContainerError, match="artifact is") as info:
        _load(bad)
    assert "ONNX Runtime" not in info.value.message
    assert "recompile the model" in info.value.message


def test_a_graph_ort_refuses_is_an_error_and_prints_nothing(packed, capfd):
    # ORT's Python wrapper, on a session it cannot create, prints "EP Error ... Falling back
    # to CPUExecutionProvider" to stdout and tries again: crossrt reports one coded error.
    start = _index(packed)["graph"]["offset"]
    at = packed.index(b"Identity", start)
    bad = packed[:at] + b"Identitx" + packed[at + len(b"Identity") :]
    with pytest.raises(CrossrtError, match=r"ONNX Runtime .* could not load the artifact"):
        _load(bad)
    printed = capfd.readouterr()
    assert "EP Error" not in printed.out + printed.err
    assert "Falling back" not in printed.out + printed.err


def test_sessions_never_fall_back_with_a_print(packed):
    # The wrapper's fallback prints to stdout on any ValueError/RuntimeError at creation.
    program = _load(packed)
    assert program.session._enable_fallback is False


def test_a_corrupt_artifact_in_an_unhashed_container_is_an_error(mlp_exe):
    bad = _with_index(bytes(mlp_exe.nodes[0].artifact), _first(lambda w: w.update(offset=64)))
    exe = dataclasses.replace(mlp_exe, nodes=(dataclasses.replace(mlp_exe.nodes[0], artifact=bad),))
    loaded = crossrt.load_executable(exe.to_bytes(), validate_hash=False)
    with crossrt.Runtime() as rt, pytest.raises(InvalidContainerError, match="overlaps"):
        rt.load(loaded)


def test_random_index_damage_raises_only_crossrt_errors(mlp_exe):
    artifact = bytes(mlp_exe.nodes[0].artifact)
    index_end = PRELUDE.size + PRELUDE.unpack_from(artifact)[3]  # the padding is not read
    rng = random.Random(1)
    refused = loaded = 0
    for _ in range(300):
        data = bytearray(artifact)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(index_end)] = rng.randrange(256)
        if rng.random() < 0.2:
            del data[rng.randrange(len(data)) :]
        try:
            program = _load(bytes(data))
        except CrossrtError:
            refused += 1
            continue
        loaded += 1  # a change the index tolerates (whitespace, a digit of a same-size dim...)
        program.run({"x": X})
        program.close()
    assert refused > 270, (refused, loaded)


# -- the target CPU ---------------------------------------------------------------------------


def _device(**changes: Any) -> Any:
    (device,) = get_driver("onnxruntime").devices()
    return dataclasses.replace(device, **changes)


def test_a_compile_is_for_this_cpu_and_records_its_features(mlp_exe):
    unpacked = ort_artifact.unpack(mlp_exe.nodes[0].artifact)
    assert unpacked.level == "all"
    assert unpacked.features == _device().features and unpacked.features[0]  # the machine


def _an_extension_this_cpu_lacks() -> str:
    """A vector extension the host's CPU does not report, read as the driver reads them."""
    have = set(host.cpu_features())
    known = ("avx512f", "avx512_fp16", "amx_tile", "avx10_2", "sve2", "sme2", "i8mm")
    return next((f for f in known if f not in have), "avx" + "_".join(sorted(have)))


def test_a_cpu_with_other_features_refuses_the_artifact_and_says_what_to_do(mlp_exe):
    machine, *extensions = _device().features
    added = _an_extension_this_cpu_lacks()
    assert added not in extensions
    other = _device(features=(machine, *extensions[:-1], added))
    driver = get_driver("onnxruntime")
    with pytest.raises(UnsupportedError, match="compiled for a CPU with") as info:
        driver.load(mlp_exe.nodes[0].artifact, other, CoreSet((0,)), CompileOptions())
    assert info.value.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    assert f"this CPU adds {added}" in info.value.message
    if extensions:  # the device given lacks the host's last extension
        assert f"this CPU lacks {extensions[-1]}" in info.value.message
    assert "portable=True" in info.value.message and "recompile" in info.value.message


def test_a_portable_compile_loads_on_any_cpu_of_the_architecture():
    exe = crossrt.compile(_mlp(), "cpu", driver="onnxruntime", portable=True)
    assert exe.options.portable
    unpacked = ort_artifact.unpack(exe.nodes[0].artifact)
    assert (unpacked.level, unpacked.features) == ("extended", ())
    machine = _device().features[0]
    program = get_driver("onnxruntime").load(
        exe.nodes[0].artifact, _device(features=(machine, "sse2")), CoreSet((0,)), exe.options
    )
    assert program.run({"x": X})["y"].shape == (5, 256)
    program.close()


# -- weights shared between instances -------------------------------------------------------


def _private_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


def _mappings_of(path: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(line.rstrip().endswith(path) for line in f)


def test_instances_share_the_weights_ort_maps_from_the_crm(tmp_path):
    # 32 MiB of weights: two instances from a .crm add far less private memory than that.
    crossrt.compile(_wide_model(), "cpu", driver="onnxruntime").save(tmp_path / "wide.crm")
    path = str((tmp_path / "wide.crm").resolve())
    exe = crossrt.load_executable(path)
    feed = {"x": np.ones((1, 2048), np.float32)}
    with crossrt.Runtime() as rt:
        before, mapped = _private_bytes(), _mappings_of(path)
        model = rt.load(exe, instances=2, cores_per_instance=1)
        for future in [model.run_async(feed, block=True) for _ in range(4)]:
            future.result(10)
        grown = _private_bytes() - before
        assert _mappings_of(path) >= mapped + 2  # each session maps the file itself
        assert grown < 8 * 2**20, f"{grown / 2**20:.1f} MiB private for 32 MiB of weights x 2"
        first = model.run(feed)["y"]
    assert np.allclose(first, feed["x"] @ np.asarray(exe_weights(path)), rtol=1e-4, atol=1e-3)


def exe_weights(path: str) -> np.ndarray:
    """W of the wide model, read back from the container the plain way."""
    unpacked = ort_artifact.unpack(crossrt.load_executable(path).nodes[0].artifact)
    return unpacked.arrays[unpacked.names.index("W")]


def _wide_artifact() -> bytes:
    b = GraphBuilder("wide-small")
    x = b.input("x", "float32", [1, 256])
    w = b.constant(RNG.standard_normal((256, 512)).astype(np.float32), "W")
    b.output(b.op("MatMul", [x, w], outputs=["y"]))
    return bytes(crossrt.compile(b.finish(), "cpu", driver="onnxruntime").nodes[0].artifact)


def test_the_weights_ort_prepacks_are_stored_beside_them():
    unpacked = ort_artifact.unpack(_wide_artifact())
    (packs,) = unpacked.prepacked
    (key, spans) = packs[0]
    assert key.startswith("MatMul") and spans and all(o % 4096 == 0 and n > 0 for o, n in spans)
    graph = onnx.ModelProto.FromString(ort_artifact.graph_reading(unpacked, "m.crm", 4096))
    fields = {e.key: e.value for e in graph.graph.initializer[0].external_data}
    assert fields["offset"] == str(4096 + unpacked.offsets[0])
    offset, length = spans[0]
    assert fields["prepacked_0"].startswith(f"{key}|{4096 + offset};{length};0")


def test_prepacked_weights_lie_at_pages_of_the_crm_file(tmp_path):
    # ORT 1.32 maps a pre-packed buffer only at a file offset that is a multiple of 256; at
    # another it copies the buffer into each session, silently.
    b = GraphBuilder("two")
    x = b.input("x", "float32", [1, 256])
    w1 = b.constant(RNG.standard_normal((256, 300)).astype(np.float32), "W1")
    w2 = b.constant(RNG.standard_normal((300, 100)).astype(np.float32), "W2")
    b.output(b.op("MatMul", [b.op("MatMul", [x, w1]), w2], outputs=["y"]))
    crossrt.compile(b.finish(), "cpu", driver="onnxruntime").save(tmp_path / "two.crm")
    node = crossrt.load_executable(tmp_path / "two.crm").nodes[0]
    unpacked = ort_artifact.unpack(node.artifact)
    offsets = [o for packs in unpacked.prepacked for _, spans in packs for o, _ in spans]
    assert len(offsets) >= 2
    assert all((node.artifact_file.offset + o) % 4096 == 0 for o in offsets)


@pytest.mark.parametrize(("at", "warned"), [(0, False), (64, True)])
def test_prepacked_weights_ort_would_copy_are_reported(tmp_path, caplog, at, warned):
    # An artifact or container written before the buffers were aligned still loads; the
    # copies ORT makes (and does not mention) are said.
    artifact = _wide_artifact()
    path = tmp_path / "old.crm"
    path.write_bytes(bytes(at) + artifact)
    file = ArtifactFile(str(path), at, ArtifactFile.identity_of(path.stat()))
    with caplog.at_level(logging.WARNING, logger="crossrt"):
        program = get_driver("onnxruntime").load(
            artifact, _device(), CoreSet((0,)), CompileOptions(), file=file
        )
    assert ("copies into every session" in caplog.text) is warned
    assert program.run({"x": np.ones((1, 256), np.float32)})["y"].shape == (1, 512)
    program.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(key="MatMul|0;1;0"), "holds '|' or ';'"),
        (lambda p: p.update(key=""), "holds '|' or ';'"),
        (lambda p: p.update(buffers=[]), "buffers is not a non-empty list"),
        (lambda p: p["buffers"][0].update(offset=64), "overlaps"),
        (lambda p: p["buffers"][0].update(offset=p["buffers"][0]["offset"] + 8), "multiple of"),
        (lambda p: p["buffers"][0].update(length=10**12), "truncated"),
    ],
)
def test_a_bad_prepacked_entry_is_refused(change, message):
    def edit(index: dict[str, Any]) -> None:
        change(index["weights"][0]["prepacked"][0])

    with pytest.raises(InvalidContainerError, match=message):
        ort_artifact.unpack(_with_index(_wide_artifact(), edit))


def _wide_model() -> crossrt.Model:
    b = GraphBuilder("wide")
    x = b.input("x", "float32", [1, 2048])
    w = b.constant(np.random.default_rng(3).standard_normal((2048, 4096)).astype(np.float32), "W")
    b.output(b.op("MatMul", [x, w], outputs=["y"]))
    return b.finish()


def _crossrt_files() -> set[str]:
    """This process's spilled files (other processes, a parallel test's, spill too: a compile
    checks its artifact from a file)."""
    folder = spill.SHM if spill.SHM.is_dir() else None
    mine = f"-{os.getpid()}-"
    return (
        {p.name for p in folder.iterdir() if p.name.startswith("crossrt-") and mine in p.name}
        if folder
        else set()
    )


def test_instances_of_a_model_compiled_in_memory_share_it_through_one_file():
    exe = crossrt.compile(_wide_model(), "cpu", driver="onnxruntime")
    feed = {"x": np.ones((1, 2048), np.float32)}
    leftovers = _crossrt_files()
    with crossrt.Runtime() as rt:
        before = _private_bytes()
        model = rt.load(exe, instances=2, cores_per_instance=1)
        for future in [model.run_async(feed, block=True) for _ in range(4)]:
            future.result(10)
        grown = _private_bytes() - before
        assert grown < 8 * 2**20, f"{grown / 2**20:.1f} MiB private for 32 MiB of weights x 2"
        assert _crossrt_files() == leftovers  # the file went once the instances mapped it
        got = model.run(feed)["y"]
    with crossrt.Runtime() as rt:  # one instance: from memory, as before
        assert np.array_equal(got, rt.load(exe).run(feed)["y"])


def test_without_room_for_the_file_instances_load_from_memory(monkeypatch):
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill.tempfile, "NamedTemporaryFile", full)
    exe = crossrt.compile(_wide_model(), "cpu", driver="onnxruntime")
    with crossrt.Runtime() as rt:
        model = rt.load(exe, instances=2, cores_per_instance=1)
        assert all(len(p.weights) == 1 for p in model._programs)  # handed over in memory
        assert model.run({"x": np.ones((1, 2048), np.float32)})["y"].shape == (1, 4096)


def test_a_spilled_artifact_is_an_owner_only_file_gone_after_the_load():
    data = bytes(range(256)) * 40
    with spill.spilled(data) as file:
        assert file is not None and file.unchanged()
        path = Path(file.path)
        assert path.read_bytes() == data and path.stat().st_mode & 0o077 == 0
    assert not path.exists()


def test_instances_of_a_model_without_large_weights_load_from_a_spilled_file():
    b = GraphBuilder("small")
    b.output(b.op("Relu", [b.input("x", "float32", [2])], outputs=["y"]))
    exe = crossrt.compile(b.finish(), "cpu", driver="onnxruntime")
    with crossrt.Runtime() as rt:
        model = rt.load(exe, instances=2, cores_per_instance=1)
        assert model.run({"x": np.array([-1, 1], np.float32)})["y"].tolist() == [0, 1]


def test_large_tensors_inside_subgraphs_survive_a_compile_for_this_cpu(tmp_path):
    # ORT writes every large tensor to its data file, those of an If's branches too: they
    # go back into the graph (only the main graph's weights are stored beside it).
    big = RNG.standard_normal((32, 32)).astype(np.float32)
    branches = []
    for sign, name in ((1, "then"), (-1, "else")):
        weight = numpy_helper.from_array(sign * big, f"{name}_w")
        body = helper.make_graph(
            [helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", onnx.TensorProto.FLOAT, [1, 32])],
            initializer=[weight],
        )
        branches.append(body)
    node = helper.make_node("If", ["c"], ["y"], then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph(
        [node],
        "branches",
        [
            helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 32]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 32])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    crossrt.compile(proto, "cpu", driver="onnxruntime").save(tmp_path / "if.crm")
    exe = crossrt.load_executable(tmp_path / "if.crm")
    assert ort_artifact.unpack(exe.nodes[0].artifact).level == "all"
    x = RNG.standard_normal((1, 32)).astype(np.float32)
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        for cond, sign in ((True, 1), (False, -1)):
            got = model.run({"c": np.array(cond), "x": x})["y"]
            np.testing.assert_allclose(got, x @ (sign * big), rtol=1e-5, atol=1e-5)


def test_a_full_shared_memory_falls_back_to_the_temporary_directory(monkeypatch, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(spill, "SHM", shm)
    real = spill.tempfile.NamedTemporaryFile

    def picky(*args: Any, dir: str | None = None, **kwargs: Any) -> Any:
        if dir == str(shm):
            raise OSError(28, "No space left on device")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(spill.tempfile, "NamedTemporaryFile", picky)
    with spill.spilled(b"weights" * 100) as file:
        assert file is not None
        assert Path(file.path).parent == Path(spill.tempfile.gettempdir())
        assert Path(file.path).read_bytes() == b"weights" * 100
    assert not Path(file.path).exists() and not list(shm.iterdir())


@pytest.mark.parametrize("from_file", [True, False])
def test_a_tensor_inside_the_graph_may_not_name_a_file(tmp_path, from_file):
    # A crafted artifact whose subgraph tensor points at a file beside the .crm (or in the
    # working directory) is refused before ORT would read that file.
    (tmp_path / "secret.txt").write_bytes(b"s" * 4096)
    artifact = _wide_artifact()
    unpacked = ort_artifact.unpack(artifact)
    proto = onnx.ModelProto.FromString(bytes(unpacked.graph))
    leak = onnx.TensorProto(name="leak", data_type=onnx.TensorProto.UINT8, dims=[4096])
    leak.data_location = onnx.TensorProto.EXTERNAL
    leak.external_data.add(key="location", value="secret.txt")
    const = helper.make_node("Constant", [], ["leaked"], value=leak)
    proto.graph.node.append(const)
    forged = dataclasses.replace(unpacked, graph=memoryview(proto.SerializeToString()))
    with pytest.raises(InvalidContainerError, match=r"'leak' .* refers to the file 'secret\.txt'"):
        if from_file:
            ort_artifact.graph_reading(forged, "m.crm", 0)
        else:
            ort_artifact.parse_graph(forged)


def test_a_large_initializer_no_node_reads_does_not_stop_a_compile():
    # ORT drops unused initializers before it takes those handed beside the graph, then
    # looks for such a stub's data as a file: the driver leaves unread stubs out.
    proto = _wide_model().proto
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(1024, np.float32), "unused"))
    exe = crossrt.compile(crossrt.load_model(proto), "cpu", driver="onnxruntime")
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.ones((1, 2048), np.float32)})["y"]
    assert out.shape == (1, 4096)


def test_only_drivers_that_read_files_get_a_spilled_one(monkeypatch):
    # The reference evaluator parses its artifact in memory: writing it out would be waste.
    written: list[int] = []
    real = spill.spilled

    def counting(artifact: Any) -> Any:
        written.append(len(artifact))
        return real(artifact)

    b = GraphBuilder("small")
    b.output(b.op("Relu", [b.input("x", "float32", [2])], outputs=["y"]))
    reference = crossrt.compile(b.finish(), "cpu", driver="reference")
    ort_exe = crossrt.compile(_wide_model(), "cpu", driver="onnxruntime")  # spills to check it
    monkeypatch.setattr(spill, "spilled", counting)  # only the loads counted
    with crossrt.Runtime() as rt:
        rt.load(reference, instances=2)
        assert written == []
        rt.load(ort_exe, instances=2)
        assert len(written) == 1
        rt.load(ort_exe, instances=1)
        assert len(written) == 1  # one instance: nothing to share


@pytest.mark.parametrize("portable", [True, False])
def test_a_model_whose_bytes_spell_ort_format_is_read_as_onnx(portable):
    # ORT takes bytes with "ORTM" at offset 4 for its own ORT format unless told otherwise: a
    # one-byte ir_version then a producer name "ORTM..." spell that (and crossrt checks only
    # ONNX). The driver always says ONNX.
    proto = _wide_model().proto
    proto.producer_name = "ORTM-exporter"
    assert proto.SerializeToString()[4:8] == b"ORTM"
    exe = crossrt.compile(proto, "cpu", driver="onnxruntime", portable=portable)
    with crossrt.Runtime() as rt:
        out = rt.load(exe).run({"x": np.ones((1, 2048), np.float32)})["y"]
    assert out.shape == (1, 4096)
