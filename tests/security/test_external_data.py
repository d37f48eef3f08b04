"""No file is read because a model or a container names it.

ONNX lets any tensor say "my bytes are in that file" (``data_location = EXTERNAL``): dense and
sparse initializers, ``Constant(value=...)`` and ``Constant(sparse_value=...)``, in the main
graph, in subgraphs and in function bodies. An engine handed such a graph as bytes reads the
file relative to the working directory, and a graph that outputs that tensor returns the file.

Each variant here plants a secret file in a temporary working directory (plain, in a subfolder,
one folder up for ``../``, and at an absolute path), builds a graph whose output is a tensor
naming it, and pushes it through the public API:

- as a crafted ``.crm``: a model compiled normally, its node's artifact replaced (hashes
  recomputed, as anyone can), loaded from bytes and from a file, on onnxruntime and reference;
- as a model: ``load_model`` / ``compile`` from a path (the model in a folder of its own), from
  bytes and from an ``onnx.ModelProto``.

Each must be refused with the error of its kind (InvalidContainerError for an artifact,
InvalidModelError for a model) before anything is read; and no output may hold the secret. A
model's own external data, inside its folder, still loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import crossrt
from crossrt import CrossrtError, InvalidModelError
from crossrt.drivers import sim_artifact
from crossrt.errors import InvalidContainerError
from crossrt.model.tensors import names_a_file, walk

SECRET = b"crossrt-test-secret/" + bytes(range(100, 144))  # 64 bytes
N = len(SECRET)
WEIGHTS = bytes(range(N))  # a model's own external data (positive controls)
OPSET = 17
LOCAL = "local.crossrt.test"

LOCATIONS = ["secret.bin", "sub/secret.bin", "../secret.bin", "ABSOLUTE"]


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the secret in it, in a subfolder and one folder up; and the
    secret at an absolute path elsewhere."""
    work = tmp_path / "cwd"
    (work / "sub").mkdir(parents=True)
    (tmp_path / "abs").mkdir()
    for path in (work / "secret.bin", work / "sub" / "secret.bin", tmp_path / "secret.bin"):
        path.write_bytes(SECRET)
    (tmp_path / "abs" / "secret.bin").write_bytes(SECRET)
    monkeypatch.chdir(work)
    return work


def _where(location: str, tmp_path: Path) -> str:
    return str(tmp_path / "abs" / "secret.bin") if location == "ABSOLUTE" else location


# -- tensors naming a file --------------------------------------------------------------------


def _external(name: str, location: str, data_type: int = TensorProto.UINT8) -> TensorProto:
    """A tensor of N elements whose bytes ``location`` holds."""
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    tensor = TensorProto(name=name, data_type=data_type, dims=[N // itemsize])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(N))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _sparse(name: str, location: str, part: str = "values") -> onnx.SparseTensorProto:
    """A sparse uint8 tensor of N elements, every one given; ``part`` names the file."""
    if part == "values":
        values = _external(name, location)
        indices = numpy_helper.from_array(np.arange(N, dtype=np.int64), f"{name}_indices")
    else:  # indices in the file, read as 8 int64s (they point anywhere: refused before)
        values = numpy_helper.from_array(np.ones(N // 8, np.uint8), name)
        indices = _external(f"{name}_indices", location, TensorProto.INT64)
    return helper.make_sparse_tensor(values, indices, [N])


def _branch(name: str, build: Callable[[str], tuple[list[Any], dict[str, Any]]]) -> Any:
    """A subgraph whose output ``name`` comes from ``build``'s nodes and tensors."""
    nodes, extra = build(name)
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.UINT8, [N])
    nodes = [*nodes, helper.make_node("Identity", [name], [f"{name}_out"])]
    return helper.make_graph(nodes, f"{name}_branch", [], [out], **extra)


def _graph_parts(kind: str, location: str) -> tuple[list[Any], dict[str, Any], list[Any]]:
    """Nodes, make_graph keywords and local functions producing ``leak`` for ``kind``."""

    def initializer(name: str) -> tuple[list[Any], dict[str, Any]]:
        return [], {"initializer": [_external(name, location)]}

    def sparse(name: str) -> tuple[list[Any], dict[str, Any]]:
        return [], {"sparse_initializer": [_sparse(name, location)]}

    def constant(name: str) -> tuple[list[Any], dict[str, Any]]:
        return [helper.make_node("Constant", [], [name], value=_external("c", location))], {}

    def constant_sparse(name: str) -> tuple[list[Any], dict[str, Any]]:
        node = helper.make_node("Constant", [], [name], sparse_value=_sparse("c", location))
        return [node], {}

    def if_of(inner: Callable[[str], tuple[list[Any], dict[str, Any]]]) -> list[Any]:
        cond = helper.make_node(
            "Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True), "t")
        )
        node = helper.make_node(
            "If",
            ["cond"],
            ["leak"],
            then_branch=_branch("then", inner),
            else_branch=_branch("else", inner),
        )
        return [cond, node]

    simple = {
        "initializer": initializer,
        "sparse-initializer": sparse,
        "sparse-indices": lambda name: (
            [],
            {"sparse_initializer": [_sparse(name, location, "indices")]},
        ),
        "constant": constant,
        "constant-sparse": constant_sparse,
    }
    if kind in simple:
        nodes, extra = simple[kind]("leak")
        return nodes, extra, []
    nested = {
        "subgraph-initializer": initializer,
        "subgraph-constant": constant,
        "subgraph-sparse": sparse,
        "subgraph-constant-sparse": constant_sparse,
    }
    if kind in nested:
        return if_of(nested[kind]), {}, []
    body = {"function": constant("body")[0], "function-subgraph": if_of(initializer)}[kind]
    if kind == "function":
        body = [*body, helper.make_node("Identity", ["body"], ["leak"])]
    function = helper.make_function(
        LOCAL,
        "Leak",
        [],
        ["leak"],
        body,
        [helper.make_opsetid("", OPSET)],
    )
    return [helper.make_node("Leak", [], ["leak"], domain=LOCAL)], {}, [function]


KINDS = [
    "initializer",
    "sparse-initializer",
    "sparse-indices",
    "constant",
    "constant-sparse",
    "subgraph-initializer",
    "subgraph-constant",
    "subgraph-sparse",
    "subgraph-constant-sparse",
    "function",
    "function-subgraph",
]


def _model(kind: str, location: str) -> onnx.ModelProto:
    """``x[N] uint8 -> y = x``, ``out = leak``: ``leak`` being the tensor ``kind`` builds,
    whose bytes ``location`` holds."""
    nodes, extra, functions = _graph_parts(kind, location)
    nodes = [
        *nodes,
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Identity", ["leak"], ["out"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [N])
    outs = [helper.make_tensor_value_info(n, TensorProto.UINT8, [N]) for n in ("y", "out")]
    graph = helper.make_graph(nodes, "leaky", [x], outs, **extra)
    opsets = [helper.make_opsetid("", OPSET)]
    if functions:
        opsets.append(helper.make_opsetid(LOCAL, 1))
    proto = helper.make_model(graph, opset_imports=opsets, functions=functions)
    proto.ir_version = 8
    return proto


X = np.zeros(N, np.uint8)


def _leaks(outputs: dict[str, Any]) -> bool:
    return any(SECRET[:16] in np.asarray(v).tobytes() for v in outputs.values())


def _outcome(attempt: Callable[[], dict[str, Any]]) -> tuple[str, BaseException | None]:
    """``"leaked"``, ``"ran"`` or ``"refused"`` (with the error)."""
    try:
        outputs = attempt()
    except CrossrtError as error:
        return "refused", error
    return ("leaked" if _leaks(outputs) else "ran"), None


def _assert_refused(
    attempt: Callable[[], dict[str, Any]], kind: type[CrossrtError], says: str = "the file"
) -> None:
    outcome, error = _outcome(attempt)
    assert outcome != "leaked", "LEAK: the secret file's bytes came back as a model output"
    assert outcome == "refused", "a tensor naming a file outside was accepted"
    assert isinstance(error, kind), f"refused, but as {error!r}"
    assert says in error.message, f"refused for another reason: {error.message}"


# -- crafted containers -----------------------------------------------------------------------


def _base(driver: str) -> crossrt.Executable:
    """A real executable of the same inputs and outputs as the crafted graphs."""
    nodes = [helper.make_node("Identity", ["x"], [name]) for name in ("y", "out")]
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [N])
    outs = [helper.make_tensor_value_info(n, TensorProto.UINT8, [N]) for n in ("y", "out")]
    graph = helper.make_graph(nodes, "leaky", [x], outs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = 8
    device = "sim:0" if driver == "sim" else "cpu"
    return crossrt.compile(crossrt.load_model(proto), device, driver=driver)


BASES: dict[str, crossrt.Executable] = {}


def _base_of(driver: str) -> crossrt.Executable:
    if driver not in BASES:
        BASES[driver] = _base(driver)
    return BASES[driver]


def _crafted(driver: str, artifact: bytes) -> crossrt.Executable:
    exe = _base_of(driver)
    node = dataclasses.replace(exe.nodes[0], artifact=artifact)
    return dataclasses.replace(exe, nodes=(node,))


def ort_artifact(graph: onnx.ModelProto, weights: dict[str, np.ndarray] | None = None) -> bytes:
    """An onnxruntime artifact as docs/drivers.md describes it, written from scratch."""
    data = graph.SerializeToString()
    start = 4096
    at = start + len(data)
    entries, placed = [], []
    for name, array in (weights or {}).items():
        at = -(-at // 64) * 64
        entries.append(
            {
                "name": name,
                "dtype": array.dtype.name,
                "shape": list(array.shape),
                "offset": at,
                "length": array.nbytes,
            }
        )
        placed.append((at, array.tobytes()))
        at += array.nbytes
    index = {
        "target": {"level": "extended", "features": []},
        "graph": {"offset": start, "length": len(data)},
        "weights": entries,
    }
    text = json.dumps(index).encode()
    out = bytearray(struct.pack("<8sIIQ", b"CRORTART", 2, 0, len(text)) + text)
    out += bytes(start - len(out)) + data
    for offset, blob in placed:
        out += bytes(offset - len(out)) + blob
    return bytes(out)


def _run_crm(exe: crossrt.Executable, mode: str, folder: Path) -> dict[str, Any]:
    """Write ``exe`` as a ``.crm``, read it back (from bytes or from the file), load, run."""
    if mode == "file":
        exe.save(folder / "crafted.crm")  # beside the secret: ORT resolves files from here
        loaded = crossrt.load_executable(folder / "crafted.crm")
    else:
        loaded = crossrt.load_executable(crossrt.compiler.executables_to_bytes([exe]))
    with crossrt.Runtime() as rt:
        outputs = rt.load(loaded).run({"x": X})
        return {name: np.array(value) for name, value in outputs.items()}


def _stub_kind(location: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A stored weight whose stub in the graph names a file of its own."""
    proto = _model("initializer", location)
    return proto, {"leak": np.frombuffer(WEIGHTS, np.uint8)}


@pytest.mark.parametrize("mode", ["memory", "file"])
@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("kind", [*KINDS, "stored-weight-stub"])
def test_a_crafted_onnxruntime_artifact_reads_no_file(cwd, tmp_path, kind, location, mode):
    where = _where(location, tmp_path)
    if kind == "stored-weight-stub":
        proto, weights = _stub_kind(where)
        artifact = ort_artifact(proto, weights)
    else:
        artifact = ort_artifact(_model(kind, where))
    exe = _crafted("onnxruntime", artifact)
    _assert_refused(lambda: _run_crm(exe, mode, cwd), InvalidContainerError)


@pytest.mark.parametrize("mode", ["memory", "file"])
@pytest.mark.parametrize("location", LOCATIONS)
def test_a_plain_onnx_artifact_section_is_refused(cwd, tmp_path, location, mode):
    # The form of artifacts from before the packed format: ORT would take it whole.
    plain = _model("initializer", _where(location, tmp_path)).SerializeToString()
    exe = _crafted("onnxruntime", plain)
    _assert_refused(lambda: _run_crm(exe, mode, cwd), InvalidContainerError, "plain ONNX model")


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_reference_artifact_reads_no_file(cwd, tmp_path, kind, location):
    artifact = _model(kind, _where(location, tmp_path)).SerializeToString()
    exe = _crafted("reference", artifact)
    _assert_refused(lambda: _run_crm(exe, "memory", cwd), InvalidContainerError)


@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_sim_artifact_reads_no_file(cwd, kind):
    # The simulated devices hand their inner artifact to onnxruntime or reference.
    header, _ = sim_artifact.unpack(_base_of("sim").nodes[0].artifact)
    graph = _model(kind, "secret.bin")
    inner = ort_artifact(graph) if header.engine == "onnxruntime" else graph.SerializeToString()
    exe = _crafted("sim", sim_artifact.pack(header, inner))
    _assert_refused(lambda: _run_crm(exe, "memory", cwd), InvalidContainerError)


def test_an_honest_artifact_still_loads_from_memory_and_file(cwd):
    # The artifact's own weight stubs are external data that crossrt resolves itself.
    weights = np.arange(4096, dtype=np.float32)
    b = crossrt.GraphBuilder("weighted")
    x = b.input("x", "float32", [4096])
    b.output(b.op("Add", [x, b.constant(weights, "W")], outputs=["y"]))
    exe = crossrt.compile(b.finish(), "cpu", driver="onnxruntime")
    exe.save(cwd / "honest.crm")
    for source in (cwd / "honest.crm", exe.to_bytes()):
        with crossrt.Runtime() as rt:
            y = rt.load(crossrt.load_executable(source)).run({"x": np.ones(4096, np.float32)})
            assert np.array_equal(y["y"], weights + 1)


# -- models -----------------------------------------------------------------------------------


def _model_file(tmp_path: Path, proto: onnx.ModelProto) -> Path:
    """The model saved in a folder of its own (not the working directory), with its own
    external data file ``weights.bin`` beside it."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "weights.bin").write_bytes(WEIGHTS)
    path = folder / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


def _compile_and_run(source: Any, driver: str) -> dict[str, Any]:
    exe = crossrt.compile(source, "cpu", driver=driver)
    with crossrt.Runtime() as rt:
        outputs = rt.load(exe).run({"x": X})
        return {name: np.array(value) for name, value in outputs.items()}


SOURCES = ["path", "bytes", "proto"]
DRIVERS = ("onnxruntime", "reference")
RUNNABLE = ("initializer", "constant", "subgraph-initializer", "subgraph-constant")


def _source(how: str, tmp_path: Path, proto: onnx.ModelProto) -> Any:
    if how == "path":
        return _model_file(tmp_path, proto)
    return proto.SerializeToString() if how == "bytes" else proto


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_model_naming_a_file_outside_its_folder_is_refused(cwd, tmp_path, kind, how, location):
    source = _source(how, tmp_path, _model(kind, _where(location, tmp_path)))
    outcomes = {d: _outcome(lambda d=d: _compile_and_run(source, d)) for d in DRIVERS}
    leaked = [d for d, (outcome, _) in outcomes.items() if outcome == "leaked"]
    assert not leaked, f"LEAK: the secret file's bytes came back as an output on {leaked}"
    for driver in DRIVERS:
        _assert_refused(lambda d=driver: _compile_and_run(source, d), InvalidModelError)
    _assert_refused(lambda: {"_": crossrt.load_model(source)}, InvalidModelError)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "sparse-indices"])
def test_a_model_s_own_external_data_loads_from_its_folder(cwd, tmp_path, kind):
    path = _model_file(tmp_path, _model(kind, "weights.bin"))
    data = path.read_bytes()
    # Bytes and protos carry no folder: given one, they load from it.
    for source, folder in (
        (path, None),
        (data, path.parent),
        (onnx.ModelProto.FromString(data), path.parent),
    ):
        # Not validated: ONNX's shape inference refuses Identity of a sparse tensor.
        model = crossrt.load_model(source, validate=False, base_dir=folder)
        held = [found.tensor.raw_data for found in walk(model.proto)]
        assert WEIGHTS in held and not any(names_a_file(f.tensor) for f in walk(model.proto))
    if kind in RUNNABLE:
        for driver in DRIVERS:
            assert _compile_and_run(path, driver)["out"].tobytes() == WEIGHTS


@pytest.mark.parametrize("how", ["bytes", "proto"])
def test_bytes_naming_a_file_in_the_working_directory_are_refused_without_a_folder(
    cwd, tmp_path, how
):
    # Even a file the model could name from its own folder: bytes have none.
    (cwd / "weights.bin").write_bytes(WEIGHTS)
    source = _source(how, tmp_path, _model("initializer", "weights.bin"))
    with pytest.raises(InvalidModelError, match="base_dir"):
        crossrt.load_model(source)


def test_a_link_out_of_the_model_s_folder_is_refused(cwd, tmp_path):
    path = _model_file(tmp_path, _model("constant", "link.bin"))
    os.symlink(cwd / "secret.bin", path.parent / "link.bin")
    _assert_refused(lambda: {"_": crossrt.load_model(path)}, InvalidModelError)


def test_a_model_built_around_a_file_reference_is_refused(cwd):
    # crossrt.Model straight from a proto: nothing may reach a driver still naming a file.
    _assert_refused(
        lambda: {"_": crossrt.Model(_model("constant-sparse", "secret.bin"))}, InvalidModelError
    )
