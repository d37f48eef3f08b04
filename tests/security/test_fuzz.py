"""Fuzzing what a user loads, through load and run on every driver: whatever the bytes, only a
CrossrtError escapes, and the process survives.

Containers: one ``.crm`` with a network per available driver, mutated three ways (raw bytes,
header fields with the header's hash recomputed, and section bytes with every hash recomputed
so that the damaged artifact reaches the driver's ``load``), then ``load_executable`` +
``Runtime.load`` + ``run`` on each network.

Models: small random ONNX graphs (dense, sparse and external initializers, ``Constant`` with
``value`` / ``sparse_value``, a subgraph), often with their protos mutated afterwards (op types,
attributes, dtypes, dims, opsets, dangling edges, external-data markers, raw bytes), then
``load_model`` (from bytes, or from a file beside a weights file) + ``compile`` + ``Runtime.load``
+ ``run`` on each available driver.

The budget is small in the normal test run. ``make fuzz`` sets ``CROSSRT_FUZZ_CONTAINERS`` and
``CROSSRT_FUZZ_MODELS`` (the totals, split evenly over the tests of each kind) and runs
random examples instead of the fixed ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import crossrt
from crm_layout import build, split
from crossrt.drivers import available_drivers

_CONTAINER_TESTS, _MODEL_TESTS = 3, 1
_LONG = "CROSSRT_FUZZ_CONTAINERS" in os.environ or "CROSSRT_FUZZ_MODELS" in os.environ


def _budget(variable: str, default: int, tests: int) -> settings:
    total = int(os.environ.get(variable, default))
    return settings(
        max_examples=max(1, -(-total // tests)),
        deadline=None,
        derandomize=not _LONG,  # the normal run is the same on every run; `make fuzz` explores
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


# The reference driver computes in NumPy, which warns on log(0) and 0/0 of fuzzed inputs.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CONTAINERS = _budget("CROSSRT_FUZZ_CONTAINERS", 600, _CONTAINER_TESTS)
MODELS = _budget("CROSSRT_FUZZ_MODELS", 300, _MODEL_TESTS)

DEVICES = {"onnxruntime": "cpu", "openvino": "cpu", "reference": "cpu", "sim": "sim:0"}
DRIVERS = sorted(d.name for d in available_drivers() if d.name in DEVICES)

_MAX_ELEMENTS = 1 << 16  # inputs larger than this are not fed: the fuzzer tests parsing, not RAM


@pytest.fixture(scope="module")
def runtime() -> Iterator[crossrt.Runtime]:
    with crossrt.Runtime() as rt:
        yield rt


def _feed(specs: Any) -> dict[str, np.ndarray] | None:
    """An input per spec, dynamic dims as 2; ``None`` when some input cannot be made."""
    feed = {}
    for spec in specs:
        if spec.kind != "tensor" or spec.dtype is None or spec.shape is None:
            return None
        shape = tuple(d if isinstance(d, int) else 2 for d in spec.shape)
        if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.float64)) > _MAX_ELEMENTS:
            return None
        numpy_type = spec.dtype.numpy
        if numpy_type.kind in "OUS":
            feed[spec.name] = np.full(shape, "a", dtype=object)
        else:
            feed[spec.name] = (np.arange(int(np.prod(shape))) % 5).astype(numpy_type).reshape(shape)
    return feed


def _load_and_run(rt: crossrt.Runtime, exe: crossrt.Executable) -> None:
    """Load, run once, unload; a CrossrtError anywhere is a fine answer."""
    try:
        model = rt.load(exe)
    except crossrt.CrossrtError:
        return
    try:
        feed = _feed(model.inputs)
        if feed is not None:
            with contextlib.suppress(crossrt.CrossrtError):
                model.run(feed)
    finally:
        model.unload()


# -- containers ------------------------------------------------------------------------------


def _tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _valid_container() -> bytes:
    model = crossrt.load_model(_tiny_model())
    return crossrt.compiler.executables_to_bytes(
        {name: crossrt.compile(model, DEVICES[name], driver=name) for name in DRIVERS}
    )


VALID = _valid_container()
HEADER, BLOBS = split(VALID)
_HEADER_END = 64 + struct.unpack_from("<Q", VALID, 16)[0]


def _header_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _header_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _header_paths(value, (*prefix, i))
    return found


# The paths a change there reaches the runtime behind the container reader: not the sections.
PATHS = [p for p in _header_paths(HEADER)[1:] if p[0] != "sections" and p[0] != "sections_sha256"]

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.sampled_from([0, 1, 2, 3, -1, 1 << 31, 1 << 62])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
    | st.sampled_from(
        [
            *["", "cpu:0", "sim:0", "sim:15", "sim:99", "gpu", "onnxruntime", "reference", "sim"],
            *["float32", "float16", "int64", "string", "bool", "NONE", "HIGH", "x", "y", "N"],
        ]
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["x", "y", "N", "dtype", "shape"]), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def header_edits(draw: st.DrawFn) -> bytes:
    """The header with 1-3 fields replaced, deleted or added, and every hash recomputed."""
    header = json.loads(json.dumps(HEADER))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = header
        try:
            for step in path[:-1]:
                parent = parent[step]
            action = draw(st.sampled_from(["replace", "replace", "delete", "insert"]))
            if action == "replace":
                parent[path[-1]] = draw(JSON_VALUES)
            elif action == "delete":
                del parent[path[-1]]
            elif isinstance(parent, list):
                parent.insert(path[-1], draw(JSON_VALUES))
            else:
                parent[draw(st.text(max_size=6))] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or retyped this path
    return build(header, list(BLOBS))


@st.composite
def section_edits(draw: st.DrawFn) -> bytes:
    """One driver's artifact damaged (flips, cuts, overwrites, inserts), every hash recomputed:
    the container is intact, the artifact is not."""
    blobs = list(BLOBS)
    index = draw(st.integers(0, len(blobs) - 1))
    data = bytearray(blobs[index])
    where = st.integers(0, max(0, len(data) - 1))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "overwrite", "insert", "zero"]))
        if not data:
            break
        position = min(draw(where), len(data) - 1)
        if kind == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[position:]
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[position : position + len(chunk)] = chunk
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=40))
        else:
            data[position : position + draw(st.integers(1, 64))] = bytes(64)[: len(data)]
    blobs[index] = bytes(data)
    return build(json.loads(json.dumps(HEADER)), blobs)


@st.composite
def byte_edits(draw: st.DrawFn) -> bytes:
    """Raw damage anywhere, hashes left as they were (most stop at a hash check)."""
    data = bytearray(VALID)
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    where = st.integers(0, len(data) - 1) | st.integers(0, _HEADER_END)
    if kind == "flip":
        for position in draw(st.lists(where, min_size=1, max_size=8)):
            data[position] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del data[draw(where) :]
    elif kind == "insert":
        position = draw(where)
        data[position:position] = draw(st.binary(min_size=1, max_size=80))
    else:
        position = draw(where)
        chunk = draw(st.binary(min_size=1, max_size=16))
        data[position : position + len(chunk)] = chunk
    return bytes(data)


def check_container(rt: crossrt.Runtime, data: bytes) -> None:
    """Every network of ``data`` through load_executable, Runtime.load and run."""
    try:
        names = crossrt.compiler.list_networks(data)
    except crossrt.CrossrtError:
        return
    for name in names:
        try:
            exe = crossrt.load_executable(data, name)
        except crossrt.CrossrtError:
            continue
        _load_and_run(rt, exe)


def test_the_unmutated_container_loads_and_runs_on_every_driver(runtime) -> None:
    assert crossrt.compiler.list_networks(VALID) == DRIVERS
    for name in DRIVERS:
        model = runtime.load(crossrt.load_executable(VALID, name))
        out = model.run({"x": np.ones((2, 3), np.float32)})
        np.testing.assert_array_equal(out["y"], np.full((2, 3), [9, 12, 15], np.float32))
        model.unload()


@CONTAINERS
@given(data=section_edits())
def test_damaged_artifacts_raise_only_crossrt_errors(runtime, data) -> None:
    check_container(runtime, data)


@CONTAINERS
@given(data=header_edits())
def test_edited_headers_raise_only_crossrt_errors(runtime, data) -> None:
    check_container(runtime, data)


@CONTAINERS
@given(data=byte_edits())
def test_damaged_bytes_raise_only_crossrt_errors(runtime, data) -> None:
    check_container(runtime, data)


# -- models ----------------------------------------------------------------------------------

ELEMS = [
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.DOUBLE,
    TensorProto.INT64,
    TensorProto.INT32,
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.BOOL,
    TensorProto.STRING,
    TensorProto.BFLOAT16,
]
FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE}
UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Floor", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Less"]
SHAPED = ["Reshape", "Transpose", "Unsqueeze", "Squeeze", "Slice", "Gather", "Concat", "Expand"]
OTHER = ["MatMul", "Softmax", "Cast", "ReduceSum", "Tile", "Where", "Clip", "ArgMax", "TopK"]
OTHER += ["Shape", "ConstantOfShape", "NonZero", "Unique", "Pad", "Conv", "If", "Flatten"]
OP_TYPES = UNARY + BINARY + SHAPED + OTHER
CONST_KINDS = ["raw", "typed", "sparse", "constant", "constant_sparse", "external", "value_floats"]
LOCATIONS = [
    "weights.bin",
    "missing.bin",
    "../outside.bin",
    "/etc/hostname",
    "",
    "a/../weights.bin",
]

small_ints = st.integers(-3, 5)


class _Graph:
    """A graph under construction: nodes, initializers, and the value last made."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.sparse: list[onnx.SparseTensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"


def _dense(array: np.ndarray, name: str, typed: bool) -> onnx.TensorProto:
    tensor = numpy_helper.from_array(array, name)
    if typed and array.dtype == np.float32:  # float_data instead of raw_data
        tensor.ClearField("raw_data")
        tensor.float_data.extend(array.ravel().tolist())
    return tensor


def _sparse(array: np.ndarray, name: str) -> onnx.SparseTensorProto:
    flat = array.ravel()
    indices = np.flatnonzero(flat).astype(np.int64)
    values = numpy_helper.from_array(flat[indices], name)
    return helper.make_sparse_tensor(
        values, numpy_helper.from_array(indices, name + "_indices"), list(array.shape)
    )


@st.composite
def constants(draw: st.DrawFn, g: _Graph, array: np.ndarray) -> str:
    """``array`` stored one of the ways ONNX allows, under a new name."""
    name = g.name("c")
    kind = draw(st.sampled_from(CONST_KINDS))
    if kind in ("raw", "typed"):
        g.initializers.append(_dense(array, name, kind == "typed"))
    elif kind == "sparse":
        g.sparse.append(_sparse(array, name))
    elif kind == "constant":
        g.nodes.append(helper.make_node("Constant", [], [name], value=_dense(array, name, False)))
    elif kind == "constant_sparse":
        g.nodes.append(helper.make_node("Constant", [], [name], sparse_value=_sparse(array, name)))
    elif kind == "value_floats":
        node = helper.make_node("Constant", [], [name])
        floats = [float(v) for v in array.ravel()]
        node.attribute.append(
            helper.make_attribute("value_floats", floats, attr_type=onnx.AttributeProto.FLOATS)
        )
        g.nodes.append(node)
    else:  # external data: a marker, resolved (or refused) by load_model
        tensor = numpy_helper.from_array(array, name)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", draw(st.sampled_from(LOCATIONS))),
            ("offset", str(draw(st.sampled_from([0, 4, 64, 1 << 40, -8])))),
            ("length", str(array.nbytes if draw(st.booleans()) else draw(small_ints))),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        g.initializers.append(tensor)
    return name


def _numpy(elem: int) -> Any:
    return np.int64 if elem == TensorProto.STRING else helper.tensor_dtype_to_np_dtype(elem)


def _array(draw: st.DrawFn, shape: list[int], dtype: Any = np.float32) -> np.ndarray:
    shape = [max(d, 1) for d in shape]  # -1: a dim the generator does not know; 1 broadcasts
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    values = draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size))
    return np.asarray(values).astype(dtype).reshape(shape)  # -1 wraps around in unsigned types


@st.composite
def _node(draw: st.DrawFn, g: _Graph, value: str, shape: list[int], elem: int) -> Any:
    """One more node on ``value`` (of ``shape`` and ``elem``, as far as is known): the new
    value, its shape and its element type."""
    op = draw(st.sampled_from(OP_TYPES))
    out = g.name("v")
    rank = len(shape)
    axis = draw(st.integers(-rank - 1, rank))
    const = constants  # shorthand
    if op in UNARY:
        g.nodes.append(helper.make_node(op, [value], [out]))
        return out, shape, elem
    if op in BINARY:
        other_shape = shape[draw(st.integers(0, rank)) :] if draw(st.booleans()) else [2]
        other = draw(const(g, _array(draw, other_shape, _numpy(elem))))
        g.nodes.append(helper.make_node(op, [value, other], [out]))
        return out, shape, TensorProto.BOOL if op in ("Equal", "Less") else elem
    if op == "MatMul":
        k = shape[-1] if shape and draw(st.booleans()) else draw(st.integers(1, 4))
        weight = draw(const(g, _array(draw, [k, draw(st.integers(1, 4))])))
        g.nodes.append(helper.make_node(op, [value, weight], [out]))
        return out, [*shape[:-1], -1], elem
    if op == "Cast":
        to = draw(st.sampled_from(ELEMS))
        g.nodes.append(helper.make_node(op, [value], [out], to=to))
        return out, shape, to
    if op in ("Softmax", "Flatten", "ArgMax"):
        g.nodes.append(helper.make_node(op, [value], [out], axis=axis))
        return out, [-1] * rank, TensorProto.INT64 if op == "ArgMax" else elem
    if op == "Transpose":
        perm = draw(st.permutations(range(rank))) if rank and draw(st.booleans()) else [1, 0]
        g.nodes.append(helper.make_node(op, [value], [out], perm=list(perm)))
        return out, [shape[p] for p in perm if p < rank], elem
    if op in ("Reshape", "Expand", "Tile", "ConstantOfShape"):
        length = rank if op == "Tile" else draw(st.integers(0, 4))
        dims = draw(st.lists(st.integers(-1 if op == "Reshape" else 0, 4), min_size=length,
                             max_size=length))  # fmt: skip
        target = draw(const(g, np.asarray(dims, np.int64)))
        if op == "ConstantOfShape":
            filler = numpy_helper.from_array(np.asarray([1.5], np.float32), "value")
            g.nodes.append(helper.make_node(op, [target], [out], value=filler))
            return out, dims, TensorProto.FLOAT
        g.nodes.append(helper.make_node(op, [value, target], [out]))
        return out, [-1] * len(dims), elem
    if op in ("Unsqueeze", "Squeeze", "ReduceSum"):
        axes = draw(const(g, np.asarray(draw(st.lists(small_ints, max_size=2)), np.int64)))
        g.nodes.append(helper.make_node(op, [value, axes], [out]))
        return out, [-1] * max(0, rank - 1), elem
    if op == "Slice":
        parts = [np.asarray(draw(st.lists(small_ints, min_size=1, max_size=1)), np.int64)]
        parts = [draw(const(g, p)) for p in parts * 3]
        g.nodes.append(helper.make_node(op, [value, *parts], [out]))
        return out, [-1] * rank, elem
    if op == "Gather":
        indices = draw(const(g, _array(draw, [draw(st.integers(1, 3))], np.int64)))
        g.nodes.append(helper.make_node(op, [value, indices], [out], axis=axis))
        return out, [-1] * rank, elem
    if op == "Concat":
        g.nodes.append(helper.make_node(op, [value, value], [out], axis=axis))
        return out, [-1] * rank, elem
    if op == "Where":
        cond = draw(const(g, _array(draw, shape, np.bool_)))
        g.nodes.append(helper.make_node(op, [cond, value, value], [out]))
        return out, shape, elem
    if op == "Clip":
        low = draw(const(g, _array(draw, [], _numpy(elem))))
        g.nodes.append(helper.make_node(op, [value, low], [out]))
        return out, shape, elem
    if op == "TopK":
        k = draw(const(g, np.asarray([draw(small_ints)], np.int64)))
        g.nodes.append(helper.make_node(op, [value, k], [out, g.name("i")], axis=axis))
        return out, [-1] * rank, elem
    if op in ("Shape", "NonZero"):
        g.nodes.append(helper.make_node(op, [value], [out]))
        return out, [-1] * (1 if op == "Shape" else 2), TensorProto.INT64
    if op == "Unique":
        g.nodes.append(helper.make_node(op, [value], [out], sorted=draw(st.integers(0, 1))))
        return out, [-1], elem
    if op == "Pad":
        pads = draw(const(g, np.asarray(draw(st.lists(small_ints, min_size=2 * rank,
                                                      max_size=2 * rank)), np.int64)))  # fmt: skip
        mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
        g.nodes.append(helper.make_node(op, [value, pads], [out], mode=mode))
        return out, [-1] * rank, elem
    if op == "Conv":
        channels = shape[1] if rank == 4 else 1
        weight = draw(const(g, _array(draw, [2, channels, 1, draw(st.integers(1, 2))])))
        g.nodes.append(helper.make_node(op, [value, weight], [out], group=draw(st.integers(1, 2))))
        return out, [-1] * rank, elem
    # If: both branches read the outer value (a subgraph, as crafted files may carry).
    cond = draw(const(g, np.asarray(draw(st.booleans()))))
    branches = [
        helper.make_graph(
            [helper.make_node(draw(st.sampled_from(UNARY)), [value], [f"{out}_{side}"])],
            f"{out}_{side}",
            [],
            [helper.make_tensor_value_info(f"{out}_{side}", elem, None)],
        )
        for side in ("then", "else")
    ]
    g.nodes.append(
        helper.make_node(op, [cond], [out], then_branch=branches[0], else_branch=branches[1])
    )
    return out, shape, elem


@st.composite
def graphs(draw: st.DrawFn) -> onnx.ModelProto:
    """A small ONNX model: 1-4 nodes chained on one input, float32 most of the time."""
    g = _Graph()
    elem = TensorProto.FLOAT if draw(st.integers(0, 4)) else draw(st.sampled_from(ELEMS))
    shape = draw(st.lists(st.integers(1, 3), max_size=4))
    dims: list[Any] = [("N" if draw(st.integers(0, 3)) == 0 else d) for d in shape]
    value, known, out_elem = "x", shape, elem
    outputs = []
    for _ in range(draw(st.integers(1, 4))):
        value, known, out_elem = draw(_node(g, value, known, out_elem))
        if draw(st.integers(0, 4)) == 0:
            outputs.append(helper.make_tensor_value_info(value, out_elem, None))
    outputs.append(helper.make_tensor_value_info(value, out_elem, None))
    graph = helper.make_graph(
        g.nodes,
        "fuzz",
        [helper.make_tensor_value_info("x", elem, dims)],
        list({o.name: o for o in outputs}.values()),
        g.initializers,
        sparse_initializer=g.sparse,
    )
    opset = draw(st.sampled_from([13, 17, 18, 21]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return _typed_outputs(model)


def _typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The outputs' types as ONNX infers them (the checker wants a shape on each)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        return model  # an invalid graph: the loader will say so
    types = {v.name: v.type for v in [*inferred.value_info, *inferred.output]}
    for output in model.graph.output:
        if output.name in types:
            output.type.CopyFrom(types[output.name])
    return model


ATTRIBUTE_VALUES = (
    st.integers(-(2**62), 2**62)
    | small_ints
    | st.floats(allow_nan=True, allow_infinity=True, width=32)
    | st.lists(small_ints, min_size=1, max_size=4)
    | st.binary(max_size=8).filter(bool)
    | st.builds(lambda v: numpy_helper.from_array(np.asarray(v, np.float32)), small_ints)
)
ATTRIBUTE_NAMES = ["axis", "axes", "perm", "to", "keepdims", "value", "sparse_value", "mode"]
ATTRIBUTE_NAMES += ["group", "kernel_shape", "pads", "strides", "then_branch", "x"]


def _pick(draw: st.DrawFn, items: Any) -> Any:
    return items[draw(st.integers(0, len(items) - 1))] if len(items) else None


@st.composite
def proto_edits(draw: st.DrawFn, model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with 1-3 fields changed where a crafted file would change them."""
    g = model.graph
    for _ in range(draw(st.integers(1, 3))):
        what = draw(
            st.sampled_from(
                [
                    *["op_type", "domain", "attribute", "drop_attribute", "tensor", "sparse"],
                    *["external", "opset", "input", "edge", "arity"],
                ]
            )
        )
        node = _pick(draw, g.node)
        if what == "op_type" and node is not None:
            node.op_type = draw(st.sampled_from([*OP_TYPES, "", "Foo", "Loop", "Scan", "Col2Im"]))
        elif what == "domain" and node is not None:
            node.domain = draw(st.sampled_from(["", "ai.onnx.ml", "com.microsoft", "x.y"]))
        elif what == "attribute" and node is not None:
            name = draw(st.sampled_from(ATTRIBUTE_NAMES))
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute(name, draw(ATTRIBUTE_VALUES))])
        elif what == "drop_attribute" and node is not None and node.attribute:
            del node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
        elif what == "tensor" and (tensor := _pick(draw, g.initializer)) is not None:
            field = draw(st.sampled_from(["data_type", "dims", "raw_data", "typed"]))
            if field == "data_type":
                tensor.data_type = draw(st.integers(0, 25))
            elif field == "dims":
                del tensor.dims[:]
                tensor.dims.extend(draw(st.lists(st.sampled_from([0, 1, 3, -1, 1 << 40]))))
            elif field == "raw_data":
                tensor.raw_data = tensor.raw_data[: draw(st.integers(0, 8))]
            else:
                tensor.ClearField("raw_data")
                tensor.int64_data.extend(draw(st.lists(small_ints, max_size=5)))
        elif what == "sparse" and (sparse := _pick(draw, g.sparse_initializer)) is not None:
            field = draw(st.sampled_from(["indices", "values", "dims"]))
            if field == "indices":
                indices = draw(st.lists(st.sampled_from([-1, 0, 2, 7, 1 << 40]), max_size=4))
                sparse.indices.CopyFrom(numpy_helper.from_array(np.asarray(indices, np.int64)))
                sparse.indices.name = sparse.values.name + "_indices"
            elif field == "values":
                sparse.values.raw_data = sparse.values.raw_data[: draw(st.integers(0, 6))]
            else:
                del sparse.dims[:]
                sparse.dims.extend(draw(st.lists(st.sampled_from([0, 1, 2, -3, 1 << 40]))))
        elif what == "external" and (tensor := _pick(draw, g.initializer)) is not None:
            tensor.data_location = TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            del tensor.external_data[:]
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", draw(st.sampled_from(LOCATIONS))
        elif what == "opset":
            model.opset_import[0].version = draw(st.integers(1, 30))
            model.ir_version = draw(st.integers(0, 12))
        elif what == "input":
            dims = g.input[0].type.tensor_type.shape.dim
            if dims:
                dims[0].dim_value = draw(st.sampled_from([0, 1, 7, 1 << 40]))
            g.input[0].type.tensor_type.elem_type = draw(st.sampled_from([*ELEMS, 0, 99]))
        elif what == "edge" and node is not None and node.input:
            position = draw(st.integers(0, len(node.input) - 1))
            node.input[position] = draw(st.sampled_from(["dangling", "x", node.output[0], ""]))
        elif what == "arity" and node is not None:
            if draw(st.booleans()) and node.input:
                del node.input[-1]
            else:
                node.input.append(draw(st.sampled_from(["x", ""])))
    return model


@st.composite
def model_files(draw: st.DrawFn) -> tuple[bytes, bool]:
    """Serialized model bytes, and whether to load them from a file (beside ``weights.bin``)."""
    model = draw(graphs())
    if draw(st.integers(0, 2)):
        model = draw(proto_edits(model))
    data = bytearray(model.SerializeToString())
    if draw(st.integers(0, 9)) == 0 and data:  # raw damage: protobuf's parser meets garbage
        for position in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[position] ^= 1 << draw(st.integers(0, 7))
    return bytes(data), draw(st.booleans())


@pytest.fixture(scope="module")
def model_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="crossrt-fuzz-") as d:
        folder = Path(d) / "models"
        folder.mkdir()
        (folder / "weights.bin").write_bytes(np.arange(256, dtype=np.float32).tobytes())
        (Path(d) / "outside.bin").write_bytes(np.full(256, 7.0, np.float32).tobytes())
        yield folder


def check_model(rt: crossrt.Runtime, data: bytes, from_file: bool, folder: Path) -> None:
    """Load, then compile, load and run on every driver."""
    source: Any = data
    if from_file:
        source = folder / "model.onnx"
        source.write_bytes(data)
    try:
        model = crossrt.load_model(source)
    except crossrt.CrossrtError:
        return
    for name in DRIVERS:
        try:
            exe = crossrt.compile(model, DEVICES[name], driver=name)
        except crossrt.CrossrtError:
            continue
        _load_and_run(rt, exe)


def test_the_generator_makes_models_that_run(runtime) -> None:
    """The generator makes models the drivers run, not only ones every check refuses."""
    ran = []

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(model=graphs())
    def count(model: onnx.ModelProto) -> None:
        try:
            exe = crossrt.compile(crossrt.load_model(model), "cpu", driver=DRIVERS[0])
        except crossrt.CrossrtError:
            return
        loaded = runtime.load(exe)
        feed = _feed(loaded.inputs)
        try:
            if feed is not None:
                loaded.run(feed)
                ran.append(exe)
        except crossrt.CrossrtError:
            pass  # a Gather index out of range, say
        finally:
            loaded.unload()

    count()
    assert len(ran) >= 8


@MODELS
@given(case=model_files())
def test_crafted_models_raise_only_crossrt_errors(runtime, model_dir, case) -> None:
    check_model(runtime, *case, model_dir)
