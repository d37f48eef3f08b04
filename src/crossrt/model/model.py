"""The model image: an ONNX graph held in memory, validated, described and hashed."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx.onnx_cpp2py_export import shape_inference as _cpp_inference

from ..errors import InvalidModelError, ModelNotFoundError, OutOfResourcesError, StatusCode
from . import limits, wire
from .skeleton import Skeleton, checkable, misfit_weights, skeleton
from .spec import TensorSpec, spec_from_value_info
from .tensors import files_named, location, read_external


class Model:
    """A validated ONNX model held in memory (OH_NNModel, a MindIR or NEFF's source).

    Build one with :func:`load_model` or :class:`GraphBuilder`. Unnamed nodes are given
    ``<OpType>_<index>`` names so that every message and placement can name them. A proto
    whose tensors still name files (ONNX external data) is refused with InvalidModelError:
    :func:`load_model` reads them, from the model's folder only.

    Attributes:
        proto: the ``onnx.ModelProto``.
    """

    def __init__(self, proto: onnx.ModelProto, *, validate: bool = True) -> None:
        _refuse_files(proto)
        _refuse_long_names(proto)
        _refuse_unsavable(proto)
        self.proto = proto
        _name_nodes(proto.graph)
        self._typed: onnx.GraphProto | None = None
        self._light_bytes: bytes | None = None
        if validate:
            try:
                self._typed, self._light_bytes = _validate(proto, self.skeleton)
            except MemoryError:
                # onnx's checker and inference run in C++: std::bad_alloc arrives as a bare
                # MemoryError, which callers cannot tell from their own.
                raise _out_of_memory("validating the model") from None

    @cached_property
    def skeleton(self) -> Skeleton:
        """A copy of the model without its large weights' bytes (``model/skeleton.py``):
        validated, hashed and handed to engines with the weights beside it, so that nothing
        serializes hundreds of megabytes of weights."""
        return skeleton(self.proto)

    def skeleton_bytes(self) -> bytes:
        """The skeleton serialized: kept from validation when the skeleton is the model
        itself (nothing to stub, as in a tree ensemble), so that it is serialized once."""
        if self._light_bytes is not None:
            return self._light_bytes
        return bytes(self.skeleton.proto.SerializeToString())

    @property
    def name(self) -> str:
        """The graph's name (``"model"`` when the file gives none)."""
        return self.proto.graph.name or "model"

    @property
    def opsets(self) -> dict[str, int]:
        """Opset version per operator domain (``""`` is ai.onnx)."""
        return {(o.domain or ""): o.version for o in self.proto.opset_import}

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        """The top-level graph's nodes, in order."""
        return list(self.proto.graph.node)

    @cached_property
    def inputs(self) -> list[TensorSpec]:
        """The inputs a caller feeds (graph inputs that are not initializers)."""
        return _input_specs(self.proto)

    @cached_property
    def outputs(self) -> list[TensorSpec]:
        """The graph outputs."""
        return _output_specs(self.proto)

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 over opsets, graph structure and weights (hex).

        Two models that differ only in a weight value get different hashes; metadata such as
        the producer name does not count.
        """
        h = hashlib.sha256()
        for domain, version in sorted(self.opsets.items()):
            h.update(f"{domain}:{version};".encode())
        # The skeleton (every name, type and shape), then the bytes it leaves out, in order:
        # serializing a graph with its weights would copy them all first.
        light = self.skeleton
        h.update(self._graph_bytes())
        initializers = self.proto.graph.initializer
        for index in light.stubbed:
            h.update(initializers[index].raw_data)
        for fn in self.proto.functions:
            h.update(fn.SerializeToString(deterministic=True))
        return h.hexdigest()

    def _graph_bytes(self) -> bytes | memoryview:
        """The skeleton's graph serialized: cut out of the skeleton's bytes validation kept
        (the same bytes: ONNX has no map fields, whose order would vary), else serialized."""
        if self._light_bytes is not None:
            try:
                found = wire.graph_bytes(self._light_bytes)
            except ValueError:
                found = None
            if found is not None:
                return found
        return bytes(self.skeleton.proto.graph.SerializeToString(deterministic=True))

    def value_types(self) -> dict[str, onnx.TypeProto]:
        """The ONNX type of every named value shape inference could type."""
        graph = self._typed if self._typed is not None else self.proto.graph
        types: dict[str, onnx.TypeProto] = {}
        for info in (*graph.input, *graph.value_info, *graph.output):
            types[info.name] = info.type
        for init in graph.initializer:
            t = onnx.TypeProto()
            t.tensor_type.elem_type = init.data_type
            t.tensor_type.shape.SetInParent()  # known rank, 0 for a scalar
            for d in init.dims:
                t.tensor_type.shape.dim.add().dim_value = d
            types[init.name] = t
        return types

    def node_alone(self, index: int, types: Mapping[str, onnx.TypeProto] | None = None) -> bytes:
        """Node ``index`` as a model of its own (serialized): its typed inputs as graph
        inputs (initializers kept as they are), its outputs as graph outputs, the opsets and
        local functions of this model. What an engine is asked when it must say whether it
        runs one node. ``types``: :meth:`value_types`, when the caller has them already."""
        node = self.nodes[index]
        graph = self.proto.graph
        weights = {t.name: t for t in graph.initializer}
        types = self.value_types() if types is None else types
        inputs, initializers = [], []
        for name in dict.fromkeys(n for n in node.input if n):
            if name in weights:
                initializers.append(weights[name])
            elif name in types:
                inputs.append(onnx.helper.make_value_info(name, types[name]))
        outputs = [
            onnx.helper.make_value_info(name, types[name])
            if name in types
            else onnx.ValueInfoProto(name=name)
            for name in node.output
            if name
        ]
        one = onnx.helper.make_graph([node], "one_node", inputs, outputs, initializer=initializers)
        proto = onnx.helper.make_model(one, opset_imports=list(self.proto.opset_import))
        proto.ir_version = self.proto.ir_version
        proto.functions.extend(self.proto.functions)
        return bytes(proto.SerializeToString())

    def to_bytes(self) -> bytes:
        """The serialized ONNX model."""
        return bytes(self.proto.SerializeToString())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model as an ``.onnx`` file."""
        Path(path).write_bytes(self.to_bytes())

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.describe()}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {s.describe()}" for s in self.outputs)
        return f"Model({self.name!r}, {len(self.proto.graph.node)} nodes, ({ins}) -> ({outs}))"


def load_model(
    source: Any, *, validate: bool = True, base_dir: str | os.PathLike[str] | None = None
) -> Model:
    """Load and validate an ONNX model.

    Weights a model keeps in files of their own (ONNX external data) are read from the
    model's folder, and only from inside it: a location that is absolute, climbs out with
    ``..`` or leads out through a symbolic link is refused. Bytes and an ``onnx.ModelProto``
    have no folder: one that names such files needs ``base_dir``.

    Args:
        source: a path, the serialized bytes, an ``onnx.ModelProto``, or a :class:`Model`
            (returned as is).
        validate: run the ONNX checker and strict shape inference (default). Turn it off
            only for models already known to be valid.
        base_dir: the folder the model's external data files lie in; for a path, the
            file's own folder unless given.

    Returns:
        The :class:`Model`.

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidModelError: the bytes are not a model, the graph fails validation (the
            message names the node and what is wrong), or a tensor's external data file lies
            outside the folder, is missing, or is bytes' or a proto's with no ``base_dir``.
    """
    if isinstance(source, Model):
        return source
    try:
        return _load(source, validate, base_dir)
    except OutOfResourcesError:
        raise
    except MemoryError:
        raise _out_of_memory("loading the model") from None


def _load(source: Any, validate: bool, base_dir: str | os.PathLike[str] | None) -> Model:
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        _external_data(proto, base_dir, "given as an onnx.ModelProto")
        return Model(proto, validate=validate)
    if isinstance(source, bytes | bytearray | memoryview):
        proto = _parse(bytes(source), "the given bytes")
        _external_data(proto, base_dir, "given as bytes")
        return Model(proto, validate=validate)
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        proto = _parse(_read_regular(path), repr(str(path)))
        _external_data(proto, path.parent if base_dir is None else base_dir, repr(str(path)))
        return Model(proto, validate=validate)
    raise InvalidModelError(
        f"cannot load a model from {type(source).__name__}; "
        "give a path, bytes, an onnx.ModelProto or a crossrt.Model"
    )


def _out_of_memory(doing: str) -> OutOfResourcesError:
    return OutOfResourcesError(
        f"{doing} ran out of host memory: the model (or what the ONNX checker and shape "
        "inference make of it) needs more than this process may allocate; raise the memory "
        "limit, or, for a trusted model, load it with validate=False",
        code=StatusCode.FAIL_HOST_MEM_ALLOC,
    )


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(
            f"{where} is not a valid ONNX model: the protobuf cannot be parsed "
            f"({exc}); the file is truncated or corrupt, re-export or re-download it",
            details={"source": where},
        ) from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise InvalidModelError(
            f"{where} is not a valid ONNX model: it has no graph or no opset imports; "
            "the file is truncated, corrupt or not ONNX",
            details={"source": where},
        )
    return proto


def _external_data(
    proto: onnx.ModelProto, folder: str | os.PathLike[str] | None, source: str
) -> None:
    """Read the files ``proto``'s tensors name from inside ``folder`` into the tensors."""
    if folder is None:
        named = next(files_named(proto), None)
        if named is not None:
            file = location(named.tensor)[:100]
            raise InvalidModelError(
                f"the model {source} keeps the bytes of its {named.where} in the file "
                f"{file!r}, and has no folder to read it from; load it from its path, or "
                "give the folder: load_model(..., base_dir=...)",
                details={"source": source, "location": file},
            )
        return
    read_external(proto, folder, source)


def _refuse_files(proto: onnx.ModelProto) -> None:
    """Refuse a model that still names a file for some tensor: an engine handed it would read
    that file from its working directory (:func:`load_model` reads a model's own files)."""
    named = next(files_named(proto), None)
    if named is not None:
        file = location(named.tensor)[:100]
        raise InvalidModelError(
            f"the {named.where} keeps its bytes in the file {file!r}: crossrt reads such "
            "files only through load_model, from the model's folder (or base_dir=)",
            details={"location": file},
        )


def _refuse_long_names(proto: onnx.ModelProto) -> None:
    """Refuse a name longer than any exporter writes (``limits.MAX_NAME``): each is copied
    into messages, logs and engines' tables."""
    for kind, name in _names(proto):
        if len(name) > limits.MAX_NAME:
            raise InvalidModelError(
                f"the model has a {kind} name of {len(name):,} characters, more than the "
                f"{limits.MAX_NAME:,} allowed ({name[:40]!r}...); rename it in the exporter",
                details={"kind": kind, "length": len(name), "limit": limits.MAX_NAME},
            )


def _input_specs(proto: onnx.ModelProto) -> list[TensorSpec]:
    weights = {t.name for t in proto.graph.initializer}
    return [spec_from_value_info(v) for v in proto.graph.input if v.name not in weights]


def _output_specs(proto: onnx.ModelProto) -> list[TensorSpec]:
    return [spec_from_value_info(v) for v in proto.graph.output]


def _refuse_unsavable(proto: onnx.ModelProto) -> None:
    """Refuse a model that no ``.crm`` header could describe: an input or output of more
    dimensions than a NumPy array holds, or inputs, outputs and metadata over what a header
    holds for them (``model/limits.py``). Refused here, it is refused the same way by every
    tool, compile, the cache and the daemon. (Its own specs: the model's are cached only
    once a stage has written what inference found into its outputs.)"""
    inputs, outputs = _input_specs(proto), _output_specs(proto)
    for where, specs in (("input", inputs), ("output", outputs)):
        for spec in specs:
            if spec.rank is not None and spec.rank > limits.MAX_RANK:
                raise InvalidModelError(
                    f"the model's {where} {spec.name[:100]!r} has {spec.rank} dimensions, more "
                    f"than the {limits.MAX_RANK} a NumPy array holds, and crossrt takes and "
                    "returns tensors as NumPy arrays; reshape it inside the model",
                    details={"tensor": spec.name, "rank": spec.rank, "limit": limits.MAX_RANK},
                )
    metadata = {p.key: p.value for p in proto.metadata_props}
    try:
        breach = limits.signature_breach(
            (s.to_dict() for s in inputs), (s.to_dict() for s in outputs), metadata
        )
    except (TypeError, ValueError):  # protobuf hands back bytes for a string that is not UTF-8
        raise InvalidModelError(
            "the model's input or output names or metadata are not UTF-8 text; the file is "
            "corrupt or not ONNX"
        ) from None
    if breach is not None:
        name = proto.graph.name or "model"
        raise InvalidModelError(
            f"the model {name[:100]!r} cannot be compiled: {breach}",
            details={"inputs": len(inputs), "outputs": len(outputs)},
        )


def _names(proto: onnx.ModelProto) -> Iterator[tuple[str, str]]:
    yield from _graph_names(proto.graph)
    for function in proto.functions:
        yield "function", function.name
        for node in function.node:
            yield from _node_names(node)


def _graph_names(graph: onnx.GraphProto) -> Iterator[tuple[str, str]]:
    yield "graph", graph.name
    for info in (*graph.input, *graph.output, *graph.value_info):
        yield "value", info.name
        yield from _dim_names(info.type)
    for init in graph.initializer:
        yield "value", init.name
    for node in graph.node:
        yield from _node_names(node)


def _node_names(node: onnx.NodeProto) -> Iterator[tuple[str, str]]:
    yield "node", node.name
    for value in (*node.input, *node.output):
        yield "value", value
    for attr in node.attribute:
        for sub in (attr.g, *attr.graphs) if attr.HasField("g") else attr.graphs:
            yield from _graph_names(sub)


def _dim_names(t: onnx.TypeProto) -> Iterator[tuple[str, str]]:
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        for dim in getattr(t, kind).shape.dim:
            yield "symbolic dimension", dim.dim_param
    elif kind in ("sequence_type", "optional_type"):
        yield from _dim_names(getattr(t, kind).elem_type)
    elif kind == "map_type":
        yield from _dim_names(t.map_type.value_type)


def _name_nodes(graph: onnx.GraphProto) -> None:
    taken = {n.name for n in graph.node if n.name}
    for index, node in enumerate(graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def _validate(proto: onnx.ModelProto, light: Skeleton) -> tuple[onnx.GraphProto, bytes | None]:
    """The checker and strict shape inference, on the skeleton serialized once: the graph's
    typed values (:func:`_infer`), and the skeleton's bytes when they are the model's own."""
    checked = checkable(light)
    data = bytes(checked.SerializeToString())
    try:
        onnx.checker.check_model(data)
        misfit = misfit_weights(proto, light.stubbed)
        if misfit is not None:
            raise onnx.checker.ValidationError(misfit)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise InvalidModelError(
            f"model failed the ONNX checker: {_first_lines(str(exc))}",
            details={"stage": "checker"},
        ) from None
    kept = data if checked is light.proto else None
    try:
        return _infer(data), kept
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as exc:
        # onnx infers the body of a function operator (MeanVarianceNormalization...) without
        # the schema's defaults for attributes the node omits, and fails on a valid node.
        # An omitted attribute means its default, so infer again with defaults written out.
        explicit = _with_default_attributes(checked)
        if explicit is not None:
            try:
                return _infer(bytes(explicit.SerializeToString())), kept
            except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
                pass
        raise InvalidModelError(
            f"model failed shape inference: {_first_lines(str(exc))}",
            details={"stage": "shape_inference"},
        ) from None


_TYPED = frozenset({wire.INITIALIZER, wire.INPUT, wire.OUTPUT, wire.VALUE_INFO})


def _infer(data: bytes) -> onnx.GraphProto:
    """Strict shape inference on the serialized model ``data``: its main graph with only
    inputs, outputs, initializers and the inferred value types."""
    # No data propagation: it computes the values of shape-like tensors, and a 178-byte model
    # (Range(0, 2**40, 1) into Add) makes it allocate terabytes. Without it, types are still
    # checked and static shapes inferred; only shapes computed at run time stay symbolic.
    # onnx's own binding (onnx.shape_inference.infer_shapes wraps it) returns the model as
    # bytes; parsing them whole would parse every node again (0.7 s of a 160 MB tree
    # ensemble) for the value types only.
    inferred = _cpp_inference.infer_shapes(data, True, True, False)
    try:
        return wire.graph_fields(inferred, _TYPED)
    except ValueError:  # not expected of onnx's own encoding: parse it whole
        return onnx.load_from_string(inferred).graph


def _with_default_attributes(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy whose top-level nodes spell out their schemas' attribute defaults, or ``None``
    when no node omits one."""
    opsets = {(o.domain or ""): o.version for o in proto.opset_import}
    missing: list[tuple[int, list[onnx.AttributeProto]]] = []
    for index, node in enumerate(proto.graph.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            continue
        given = {a.name for a in node.attribute}
        defaults = [
            a.default_value
            for name, a in schema.attributes.items()
            if name not in given and a.default_value.type != onnx.AttributeProto.UNDEFINED
        ]
        if defaults:
            missing.append((index, defaults))
    if not missing:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for index, defaults in missing:
        copy.graph.node[index].attribute.extend(defaults)
    return copy


def _first_lines(text: str, limit: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[:limit])


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, opened without blocking: a FIFO would wait
    for a writer forever, and a directory, device or socket is no model."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"model file {str(path)!r} does not exist; check the path",
            details={"path": str(path)},
        ) from None
    except OSError as exc:
        raise InvalidModelError(
            f"cannot read the model file {str(path)!r}: {exc.strerror or exc}",
            details={"path": str(path)},
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "directory"
                if stat.S_ISDIR(mode)
                else "FIFO"
                if stat.S_ISFIFO(mode)
                else ("special file")
            )
            raise InvalidModelError(
                f"cannot read the model {str(path)!r}: it is not a regular file (a {kind}); "
                "give an .onnx file",
                details={"path": str(path)},
            )
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)
