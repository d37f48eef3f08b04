"""The model image: an ONNX graph held in memory, validated, described and hashed."""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from ..errors import InvalidModelError, ModelNotFoundError
from .skeleton import Skeleton, checkable, misfit_weights, skeleton
from .spec import TensorSpec, spec_from_value_info


class Model:
    """A validated ONNX model held in memory (OH_NNModel, a MindIR or NEFF's source).

    Build one with :func:`load_model` or :class:`GraphBuilder`. Unnamed nodes are given
    ``<OpType>_<index>`` names so that every message and placement can name them.

    Attributes:
        proto: the ``onnx.ModelProto``.
    """

    def __init__(self, proto: onnx.ModelProto, *, validate: bool = True) -> None:
        self.proto = proto
        _name_nodes(proto.graph)
        self._inferred: onnx.ModelProto | None = None
        if validate:
            self._inferred = _validate(proto, self.skeleton)

    @cached_property
    def skeleton(self) -> Skeleton:
        """A copy of the model without its large weights' bytes (``model/skeleton.py``):
        validated, hashed and handed to engines with the weights beside it, so that nothing
        serializes hundreds of megabytes of weights."""
        return skeleton(self.proto)

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
        weights = {t.name for t in self.proto.graph.initializer}
        return [spec_from_value_info(v) for v in self.proto.graph.input if v.name not in weights]

    @cached_property
    def outputs(self) -> list[TensorSpec]:
        """The graph outputs."""
        return [spec_from_value_info(v) for v in self.proto.graph.output]

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
        h.update(light.proto.graph.SerializeToString(deterministic=True))
        initializers = self.proto.graph.initializer
        for index in light.stubbed:
            h.update(initializers[index].raw_data)
        for fn in self.proto.functions:
            h.update(fn.SerializeToString(deterministic=True))
        return h.hexdigest()

    def value_types(self) -> dict[str, onnx.TypeProto]:
        """The ONNX type of every named value shape inference could type."""
        model = self._inferred or self.proto
        graph = model.graph
        types: dict[str, onnx.TypeProto] = {}
        for info in (*graph.input, *graph.value_info, *graph.output):
            types[info.name] = info.type
        for init in graph.initializer:
            t = onnx.TypeProto()
            t.tensor_type.elem_type = init.data_type
            for d in init.dims:
                t.tensor_type.shape.dim.add().dim_value = d
            types[init.name] = t
        return types

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


def load_model(source: Any, *, validate: bool = True) -> Model:
    """Load and validate an ONNX model.

    Args:
        source: a path, the serialized bytes, an ``onnx.ModelProto``, or a :class:`Model`
            (returned as is).
        validate: run the ONNX checker and strict shape inference (default). Turn it off
            only for models already known to be valid.

    Returns:
        The :class:`Model`.

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidModelError: the bytes are not a model, or the graph fails validation; the
            message names the node and what is wrong.
    """
    if isinstance(source, Model):
        return source
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        return Model(proto, validate=validate)
    if isinstance(source, bytes | bytearray | memoryview):
        return Model(_parse(bytes(source), "the given bytes"), validate=validate)
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise ModelNotFoundError(
                f"model file {str(path)!r} does not exist; check the path",
                details={"path": str(path)},
            )
        proto = _parse(path.read_bytes(), repr(str(path)))
        _load_external_data(proto, path)
        return Model(proto, validate=validate)
    raise InvalidModelError(
        f"cannot load a model from {type(source).__name__}; "
        "give a path, bytes, an onnx.ModelProto or a crossrt.Model"
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


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Read weights stored beside the model file into the model (ONNX external data)."""
    tensors = onnx.external_data_helper._get_all_tensors(proto)
    if not any(onnx.external_data_helper.uses_external_data(t) for t in tensors):
        return
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise InvalidModelError(
            f"model {str(path)!r} keeps weights in external files that cannot be read ({exc}); "
            "keep the data files next to the model as they were saved",
            details={"path": str(path)},
        ) from None


def _name_nodes(graph: onnx.GraphProto) -> None:
    taken = {n.name for n in graph.node if n.name}
    for index, node in enumerate(graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def _validate(proto: onnx.ModelProto, light: Skeleton) -> onnx.ModelProto:
    """The checker and strict shape inference, on the skeleton; the model with types."""
    try:
        onnx.checker.check_model(checkable(light))
        misfit = misfit_weights(proto, light.stubbed)
        if misfit is not None:
            raise onnx.checker.ValidationError(misfit)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise InvalidModelError(
            f"model failed the ONNX checker: {_first_lines(str(exc))}",
            details={"stage": "checker"},
        ) from None
    try:
        return _infer(light.proto)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as exc:
        # onnx infers the body of a function operator (MeanVarianceNormalization...) without
        # the schema's defaults for attributes the node omits, and fails on a valid node.
        # An omitted attribute means its default, so infer again with defaults written out.
        explicit = _with_default_attributes(light.proto)
        if explicit is not None:
            try:
                return _infer(explicit)
            except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
                pass
        raise InvalidModelError(
            f"model failed shape inference: {_first_lines(str(exc))}",
            details={"stage": "shape_inference"},
        ) from None


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(
        proto, check_type=True, strict_mode=True, data_prop=True
    )


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
