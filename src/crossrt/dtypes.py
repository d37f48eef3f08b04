"""The one table of element types.

Each :class:`DType` row carries every name the type has in the systems crossrt talks to: NumPy,
ONNX (``TensorProto`` element type), the KServe v2 protocol, and the three seed runtimes'
enums (Neuron ``nrt_dtype_t``, NNRt ``OH_NN_DataType``, BMRuntime ``bm_data_type_t``). ``None``
means the system has no such type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class DType:
    """One element type and its names elsewhere.

    Attributes:
        name: crossrt's name (``"float32"``).
        itemsize: bytes per element; 0 for variable-size strings.
        numpy: the NumPy dtype.
        onnx: the ONNX ``TensorProto.DataType`` number.
        kserve: the KServe v2 datatype string (``"FP32"``).
        nrt: Neuron ``nrt_dtype_t`` value.
        oh_nn: OpenHarmony ``OH_NN_DataType`` value.
        bm: Sophgo ``bm_data_type_t`` value.
        bits: bits per element in ONNX raw data, which packs int4 two and int2 four to a
            byte (NumPy, through ``ml_dtypes``, keeps one per byte: ``itemsize`` 1); 0 for
            strings.
        native: NumPy's own type (not an ``ml_dtypes`` one), which other libraries' NumPy
            bindings (ONNX Runtime's) take and return.
    """

    name: str
    itemsize: int
    numpy: np.dtype[Any]
    onnx: int
    kserve: str | None
    nrt: int | None
    oh_nn: int | None
    bm: int | None
    bits: int
    native: bool

    def __str__(self) -> str:
        return self.name


def _row(
    name: str,
    numpy: Any,
    onnx: int,
    kserve: str | None,
    nrt: int | None,
    oh_nn: int | None,
    bm: int | None,
) -> DType:
    dt = np.dtype(numpy)
    itemsize = 0 if dt.kind == "O" else dt.itemsize
    bits = _PACKED_BITS.get(name, itemsize * 8)
    native = dt.type.__module__ == "numpy"
    return DType(name, itemsize, dt, onnx, kserve, nrt, oh_nn, bm, bits, native)


_PACKED_BITS = {"uint4": 4, "int4": 4, "uint2": 2, "int2": 2}


# name, numpy, ONNX, KServe, NRT, OH_NN, BM
TABLE: tuple[DType, ...] = (
    _row("float32", np.float32, 1, "FP32", 0xA, 11, 0),
    _row("uint8", np.uint8, 2, "UINT8", 3, 6, 3),
    _row("int8", np.int8, 3, "INT8", 2, 2, 2),
    _row("uint16", np.uint16, 4, "UINT16", 5, 7, 5),
    _row("int16", np.int16, 5, "INT16", 4, 3, 4),
    _row("int32", np.int32, 6, "INT32", 8, 4, 6),
    _row("int64", np.int64, 7, "INT64", 0xC, 5, None),
    _row("string", object, 8, "BYTES", None, None, None),
    _row("bool", np.bool_, 9, "BOOL", None, 1, None),
    _row("float16", np.float16, 10, "FP16", 7, 10, 1),
    _row("float64", np.float64, 11, "FP64", None, 12, None),
    _row("uint32", np.uint32, 12, "UINT32", 9, 8, 7),
    _row("uint64", np.uint64, 13, "UINT64", 1, 9, None),
    _row("complex64", np.complex64, 14, None, None, None, None),
    _row("complex128", np.complex128, 15, None, None, None, None),
    _row("bfloat16", ml_dtypes.bfloat16, 16, "BF16", 6, None, 8),
    _row("float8e4m3fn", ml_dtypes.float8_e4m3fn, 17, None, 0xE, None, None),
    _row("float8e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 18, None, None, None, None),
    _row("float8e5m2", ml_dtypes.float8_e5m2, 19, None, 0xF, None, None),
    _row("float8e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 20, None, None, None, None),
    _row("uint4", ml_dtypes.uint4, 21, None, None, None, 10),
    _row("int4", ml_dtypes.int4, 22, None, None, None, 9),
    _row("uint2", ml_dtypes.uint2, 25, None, None, None, None),
    _row("int2", ml_dtypes.int2, 26, None, None, None, None),
)

_BY_NAME = {d.name: d for d in TABLE}
_BY_ONNX = {d.onnx: d for d in TABLE}
_BY_NUMPY = {d.numpy: d for d in TABLE}
_BY_KSERVE = {d.kserve: d for d in TABLE if d.kserve}


def from_name(name: str) -> DType:
    """Look a type up by crossrt name (``"float32"``), also accepting NumPy spellings."""
    row = _BY_NAME.get(name)
    if row is not None:
        return row
    try:
        return from_numpy(np.dtype(name))
    except (TypeError, InvalidArgumentError):
        pass
    raise InvalidArgumentError(
        f"unknown dtype {name!r}; known dtypes: {', '.join(_BY_NAME)}",
        details={"dtype": name},
    )


def from_onnx(elem_type: int) -> DType:
    """Look a type up by ONNX ``TensorProto`` element type number."""
    row = _BY_ONNX.get(elem_type)
    if row is None:
        raise InvalidArgumentError(f"ONNX element type {elem_type} has no crossrt dtype")
    return row


def from_numpy(dtype: Any) -> DType:
    """Look a type up by NumPy dtype (or anything ``np.dtype()`` accepts)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"{dtype!r} is not a NumPy dtype") from None
    row = _BY_NUMPY.get(dt)
    if row is None:
        if dt.kind in "US":
            return _BY_NAME["string"]
        raise InvalidArgumentError(f"NumPy dtype {dt} has no crossrt dtype")
    return row


def from_kserve(datatype: str) -> DType:
    """Look a type up by KServe v2 datatype string (``"FP32"``)."""
    row = _BY_KSERVE.get(datatype.upper())
    if row is None:
        raise InvalidArgumentError(
            f"unknown KServe datatype {datatype!r}; known: {', '.join(_BY_KSERVE)}"
        )
    return row
