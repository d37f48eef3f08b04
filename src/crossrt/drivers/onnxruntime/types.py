"""Element types ORT's Python binding cannot exchange as NumPy arrays, exchanged as OrtValues.

crossrt holds bfloat16, the four float8 types, int4/uint4 and int2/uint2 as ``ml_dtypes``
arrays (one element per byte or two bytes, as NumPy stores them). ORT's binding refuses such
arrays as inputs ("Numpy_type ... can't be converted") and cannot turn such outputs into
arrays, though its CPU kernels compute them. This module builds the OrtValues ORT wants from
those arrays, and arrays from the OrtValues it returns:

- bfloat16 and float8: the array's bytes as they are (``ortvalue_from_numpy_with_onnx_type``
  on a ``uint16``/``uint8`` view: no copy); results are copied out of ORT's buffer.
- int4/uint4 and int2/uint2: ONNX packs two (four) elements per byte, the first in the
  lowest bits; ``ml_dtypes`` keeps one per byte. Inputs are packed into a new OrtValue,
  results unpacked (sign-extended for the signed types).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto

from ...dtypes import TABLE, DType

KINDS = {f"tensor({TensorProto.DataType.Name(d.onnx).lower()})": d for d in TABLE if not d.native}
"""The element types handled here, by ORT's name for them (``"tensor(bfloat16)"``): the
``ml_dtypes`` rows of the one table of element types."""
_STORAGE: dict[int, np.dtype[Any]] = {
    16: np.dtype(np.uint16),
    8: np.dtype(np.uint8),
    4: np.dtype(np.uint8),
}


def special_kinds(args: Sequence[Any]) -> dict[str, DType]:
    """The inputs or outputs (``session.get_inputs()``...) of such types, by name."""
    return {a.name: KINDS[a.type] for a in args if a.type in KINDS}


def to_ortvalue(value: Any, kind: DType) -> Any:
    """A C ``OrtValue`` of ``kind`` holding ``value`` (an array of the kind's dtype)."""
    array = np.ascontiguousarray(value, dtype=kind.numpy)
    if kind.bits > 4:  # the same bytes: ORT reads the array in place
        storage = array.view(_STORAGE[kind.bits])
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(storage, kind.onnx)._ortvalue
    packed = _pack(array, kind.bits)
    result = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), kind.onnx)._ortvalue
    ctypes.memmove(result.data_ptr(), packed.ctypes.data, packed.nbytes)
    return result


def from_ortvalue(value: Any, kind: DType) -> np.ndarray:
    """The array of an ORT result of ``kind`` (a copy: ORT's buffer goes with the value)."""
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if kind.bits > 4:
        out = np.empty(shape, _STORAGE[kind.bits])
        if count:
            ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
        result: np.ndarray = out.view(kind.numpy)
        return result
    per_byte = 8 // kind.bits
    packed = np.empty(-(-count // per_byte), np.uint8)
    if count:
        ctypes.memmove(packed.ctypes.data, value.data_ptr(), packed.nbytes)
    return _unpack(packed, count, kind).reshape(shape)


def run_converting(
    session: Any,
    inputs: Mapping[str, Any],
    kinds_in: Mapping[str, DType],
    names: Sequence[str],
    kinds_out: Mapping[str, DType],
    options: ort.RunOptions,
) -> list[np.ndarray]:
    """Run ``session`` (the C session) on ``inputs``, converting the inputs and outputs of
    special kinds; outputs in ``names`` order."""
    feed = {}
    for name, value in inputs.items():
        kind = kinds_in.get(name)
        if kind is not None:
            feed[name] = to_ortvalue(value, kind)
        elif isinstance(value, np.ndarray):
            feed[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))._ortvalue
        else:
            raise TypeError(
                f"input {name!r} is a {type(value).__name__}: a model with bfloat16, float8 or "
                "int4 tensors takes arrays only"
            )
    results = session.run_with_ort_values(feed, list(names), options)
    return [
        from_ortvalue(value, kinds_out[name]) if name in kinds_out else _plain(value)
        for name, value in zip(names, results, strict=True)
    ]


def _plain(value: Any) -> Any:
    if not value.is_tensor():
        raise TypeError("a model with bfloat16, float8 or int4 tensors returns tensors only")
    return value.numpy()


def _pack(array: np.ndarray, bits: int) -> np.ndarray:
    """Elements of ``bits`` bits each (one per byte in ``array``), packed low bits first."""
    per_byte, mask = 8 // bits, (1 << bits) - 1
    fields = array.reshape(-1).view(np.uint8) & mask
    fields = np.append(fields, np.zeros(-fields.size % per_byte, np.uint8))
    packed = np.zeros(fields.size // per_byte, np.uint8)
    for k in range(per_byte):
        packed |= fields[k::per_byte] << (k * bits)
    return packed


def _unpack(packed: np.ndarray, count: int, kind: DType) -> np.ndarray:
    """``count`` elements of ``kind`` out of ``packed`` bytes, one per byte."""
    per_byte, mask = 8 // kind.bits, (1 << kind.bits) - 1
    fields = np.empty(packed.size * per_byte, np.uint8)
    for k in range(per_byte):
        fields[k::per_byte] = (packed >> (k * kind.bits)) & mask
    fields = fields[:count]
    if kind.name.startswith("int"):  # sign-extend: the upper half of the range is negative
        values = fields.astype(np.int8)
        values[values >= 1 << (kind.bits - 1)] -= 1 << kind.bits
        return values.view(kind.numpy)
    return fields.view(kind.numpy)
