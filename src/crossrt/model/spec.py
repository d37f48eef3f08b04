"""Descriptions of a model's inputs and outputs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import onnx

from .. import dtypes
from ..dtypes import DType
from ..errors import InvalidArgumentError

Dim = int | str | None
"""One dimension: a size, a symbolic name (dynamic), or ``None`` (unknown, dynamic)."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of one model input or output.

    Attributes:
        name: the tensor's name in the graph.
        dtype: element type; ``None`` when the value is not a tensor of a known type.
        shape: one entry per dimension: ``int`` when static, ``str`` (a symbolic name) or
            ``None`` when dynamic; ``None`` for the whole shape when even the rank is unknown.
        kind: ``"tensor"``, or ``"sequence"``, ``"optional"``, ``"map"``, ``"sparse"`` for
            the other ONNX value types.
        value_type: for those other types, the whole type in ONNX's notation
            (``"seq(map(int64,tensor(float)))"``: what a ZipMap gives); ``None`` for a tensor.
    """

    name: str
    dtype: DType | None
    shape: tuple[Dim, ...] | None
    kind: str = "tensor"
    value_type: str | None = None

    @property
    def rank(self) -> int | None:
        """Number of dimensions, or ``None`` when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        """Indices of the dimensions that are not fixed."""
        if self.shape is None:
            return ()
        return tuple(i for i, d in enumerate(self.shape) if not isinstance(d, int))

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a fixed size."""
        return self.shape is not None and not self.dynamic_axes

    def shape_str(self) -> str:
        """``[1,3,?,W]``: the shape as messages print it.

        A dynamic dimension prints as its name, or ``?`` when it has none or only a name an
        exporter made up (``p2o.DynamicDimension.0``, ``unk__3``): such a name tells a reader
        nothing the ``?`` does not.
        """
        if self.shape is None:
            return "[*]"
        return "[" + ",".join(_dim_str(d) for d in self.shape) + "]"

    def describe(self) -> str:
        """``float32 [1,3,224,224]``."""
        return f"{self.dtype or self.kind} {self.shape_str()}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (``value_type`` only where there is one: a tensor's costs
        nothing in a ``.crm`` header)."""
        form = {
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype.name if self.dtype else None,
            "shape": list(self.shape) if self.shape is not None else None,
            "dynamic_axes": list(self.dynamic_axes),
        }
        if self.value_type is not None:
            form["value_type"] = self.value_type
        return form

    @classmethod
    def from_dict(cls, data: Any) -> TensorSpec:
        """Rebuild a spec from :meth:`to_dict`'s form (``dynamic_axes`` is derived, so ignored).

        Every field is type-checked: the dict may come from a file.

        Raises:
            InvalidArgumentError: naming the field that is missing or has the wrong type.
        """
        if not isinstance(data, dict):
            raise _bad_field("the tensor spec", "an object", data)
        name, kind = data.get("name"), data.get("kind", "tensor")
        value_type = data.get("value_type")
        if not isinstance(name, str):
            raise _bad_field("name", "a string", name)
        if not isinstance(kind, str):
            raise _bad_field(f"{name!r}: kind", "a string", kind)
        if value_type is not None and not isinstance(value_type, str):
            raise _bad_field(f"{name!r}: value_type", "null or a string", value_type)
        raw_dtype, raw_shape = data.get("dtype"), data.get("shape")
        dtype = None
        if raw_dtype is not None:
            # crossrt's own names only, the ones to_dict writes (no NumPy spellings).
            dtype = next((d for d in dtypes.TABLE if d.name == raw_dtype), None)
            if dtype is None:
                known = ", ".join(d.name for d in dtypes.TABLE)
                raise _bad_field(f"{name!r}: dtype", f"null or one of {known}", raw_dtype)
        shape: tuple[Dim, ...] | None = None
        if raw_shape is not None:
            if not isinstance(raw_shape, list) or not all(_is_dim(d) for d in raw_shape):
                raise _bad_field(
                    f"{name!r}: shape",
                    "null or a list of sizes (int >= 0), names (str) or nulls",
                    raw_shape,
                )
            shape = tuple(raw_shape)
        return cls(name, dtype, shape, kind, value_type)


# Dimension names that exporters and shape inference generate: Paddle2ONNX's
# "p2o.DynamicDimension.0" and "Reshape_471_o0__d2", onnx's and ORT's "unk__0".
_GENERATED_DIM = re.compile(r"(?:^|\.)DynamicDimension\.\d+$|^unk__\d+$|_o\d+__d\d+$")


def _dim_str(d: Dim) -> str:
    if d is None or (isinstance(d, str) and _GENERATED_DIM.search(d)):
        return "?"
    return str(d)


def _is_dim(d: Any) -> bool:
    if isinstance(d, bool):
        return False
    return d is None or isinstance(d, str) or (isinstance(d, int) and d >= 0)


def _bad_field(field: str, expected: str, got: Any) -> InvalidArgumentError:
    # Only scalars are shown: a nested value from a file could be huge.
    scalar = got is None or isinstance(got, str | int | float)
    shown = repr(got)[:60] if scalar else f"a {type(got).__name__}"
    return InvalidArgumentError(
        f"tensor spec field {field} must be {expected}, got {shown}; "
        "give the form TensorSpec.to_dict() writes",
        details={"field": field},
    )


def type_notation(t: onnx.TypeProto) -> str:
    """An ONNX type in ONNX's own notation: ``tensor(float)``, ``seq(map(int64,tensor(float)))``;
    ``?`` where the file leaves a type out."""
    which = t.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        name = _elem_name(getattr(t, which).elem_type)
        return f"{'tensor' if which == 'tensor_type' else 'sparse_tensor'}({name})"
    if which == "sequence_type":
        return f"seq({type_notation(t.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({type_notation(t.optional_type.elem_type)})"
    if which == "map_type":
        key = _elem_name(t.map_type.key_type)
        return f"map({key},{type_notation(t.map_type.value_type)})"
    return "?"


def _elem_name(elem: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem).lower() if elem else "?"
    except ValueError:  # a number no ONNX version names
        return "?"


def spec_from_value_info(info: onnx.ValueInfoProto) -> TensorSpec:
    """Describe a graph input or output from its ONNX ``ValueInfoProto``."""
    vtype = info.type
    which = vtype.WhichOneof("value")
    if which != "tensor_type":
        kind = {
            "sequence_type": "sequence",
            "optional_type": "optional",
            "map_type": "map",
            "sparse_tensor_type": "sparse",
        }.get(which or "", "unknown")
        return TensorSpec(info.name, None, None, kind, type_notation(vtype))
    ttype = vtype.tensor_type
    try:
        dtype: DType | None = dtypes.from_onnx(ttype.elem_type) if ttype.elem_type else None
    except ValueError:
        dtype = None
    shape: tuple[Dim, ...] | None = None
    if ttype.HasField("shape"):
        dims: list[Dim] = []
        for d in ttype.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return TensorSpec(info.name, dtype, shape)
