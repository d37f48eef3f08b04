"""The dtype table (crossrt.dtypes): every row consistent with NumPy, ONNX and the seed enums."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from crossrt import dtypes
from crossrt.dtypes import TABLE, DType
from crossrt.errors import InvalidArgumentError, StatusCode

ROWS = list(TABLE)


def _id(row: DType) -> str:
    return row.name


def test_table_has_no_duplicate_keys() -> None:
    for attr in ("name", "onnx", "numpy"):
        values = [getattr(r, attr) for r in ROWS]
        assert len(values) == len(set(values)), f"duplicate {attr} in the dtype table"
    for attr in ("kserve", "nrt", "oh_nn", "bm"):
        values = [getattr(r, attr) for r in ROWS if getattr(r, attr) is not None]
        assert len(values) == len(set(values)), f"two dtypes share a {attr} value"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_row_round_trips_by_every_key(row: DType) -> None:
    assert dtypes.from_name(row.name) is row
    assert dtypes.from_onnx(row.onnx) is row
    assert dtypes.from_numpy(row.numpy) is row
    if row.kserve is not None:
        assert dtypes.from_kserve(row.kserve) is row
        assert dtypes.from_kserve(row.kserve.lower()) is row
    assert str(row) == row.name


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_onnx_id_matches_onnx(row: DType) -> None:
    assert onnx.TensorProto.DataType.Name(row.onnx), f"{row.onnx} is not an ONNX element type"
    try:
        expected = helper.tensor_dtype_to_np_dtype(row.onnx)
    except (KeyError, ValueError):
        pytest.skip(f"onnx defines no NumPy dtype for {row.onnx}")
    assert np.dtype(expected) == row.numpy


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_itemsize_matches_numpy(row: DType) -> None:
    if row.name == "string":
        assert row.itemsize == 0
    else:
        assert row.itemsize == row.numpy.itemsize > 0


@pytest.mark.parametrize(
    ("name", "onnx_name"),
    [
        ("float32", "FLOAT"),
        ("float64", "DOUBLE"),
        ("float16", "FLOAT16"),
        ("bfloat16", "BFLOAT16"),
        ("int64", "INT64"),
        ("bool", "BOOL"),
        ("string", "STRING"),
        ("uint4", "UINT4"),
    ],
)
def test_onnx_numbers_by_name(name: str, onnx_name: str) -> None:
    assert dtypes.from_name(name).onnx == getattr(onnx.TensorProto, onnx_name)


@pytest.mark.parametrize(
    ("name", "kserve"),
    [
        ("float32", "FP32"),
        ("float16", "FP16"),
        ("float64", "FP64"),
        ("bfloat16", "BF16"),
        ("int8", "INT8"),
        ("int64", "INT64"),
        ("uint8", "UINT8"),
        ("bool", "BOOL"),
        ("string", "BYTES"),
    ],
)
def test_kserve_strings(name: str, kserve: str) -> None:
    assert dtypes.from_name(name).kserve == kserve


@pytest.mark.parametrize(
    ("name", "system", "value"),
    [
        # Neuron nrt_dtype_t (nrt.h): the header's device codes.
        ("float32", "nrt", 0xA),
        ("int64", "nrt", 0xC),
        ("bfloat16", "nrt", 6),
        ("float16", "nrt", 7),
        ("uint64", "nrt", 1),
        ("int8", "nrt", 2),
        ("float8e4m3fn", "nrt", 0xE),
        ("float8e5m2", "nrt", 0xF),
        ("bool", "nrt", None),
        # OpenHarmony OH_NN_DataType.
        ("bool", "oh_nn", 1),
        ("int8", "oh_nn", 2),
        ("int64", "oh_nn", 5),
        ("uint8", "oh_nn", 6),
        ("float16", "oh_nn", 10),
        ("float32", "oh_nn", 11),
        ("float64", "oh_nn", 12),
        ("bfloat16", "oh_nn", None),
        # Sophgo bm_data_type_t.
        ("float32", "bm", 0),
        ("float16", "bm", 1),
        ("int8", "bm", 2),
        ("uint32", "bm", 7),
        ("bfloat16", "bm", 8),
        ("int4", "bm", 9),
        ("uint4", "bm", 10),
        ("int64", "bm", None),
    ],
)
def test_seed_enum_values(name: str, system: str, value: int | None) -> None:
    assert getattr(dtypes.from_name(name), system) == value


def test_oh_nn_enum_is_the_full_sequence() -> None:
    # OH_NN_DataType: UNKNOWN=0, BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32,
    # UINT64, FLOAT16, FLOAT32, FLOAT64=12.
    order = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64"
    assert [dtypes.from_name(n).oh_nn for n in order.split()] == list(range(1, 13))


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("f4", "float32"),
        ("<f4", "float32"),
        ("float", "float64"),
        ("i8", "int64"),
        ("?", "bool"),
        ("U", "string"),
    ],
)
def test_from_name_accepts_numpy_spellings(spelling: str, name: str) -> None:
    assert dtypes.from_name(spelling).name == name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (np.float32, "float32"),
        (np.dtype("int16"), "int16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (np.array(["a"]).dtype, "string"),
        (np.array([b"a"]).dtype, "string"),
        (object, "string"),
        (bool, "bool"),
    ],
)
def test_from_numpy(value: object, name: str) -> None:
    assert dtypes.from_numpy(value).name == name


@pytest.mark.parametrize("bad", ["nope", "float33", "FP32", ""])
def test_unknown_name_lists_known_dtypes(bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        dtypes.from_name(bad)
    err = info.value
    assert err.code is StatusCode.INVALID
    assert repr(bad) in err.message
    for row in ROWS:
        assert row.name in err.message
    assert err.details == {"dtype": bad}


@pytest.mark.parametrize("bad", [0, 23, 999, -1])
def test_unknown_onnx_number(bad: int) -> None:
    with pytest.raises(InvalidArgumentError, match=str(bad)):
        dtypes.from_onnx(bad)


@pytest.mark.parametrize("bad", ["FP8", "float32", "TF32"])
def test_unknown_kserve_string_lists_known(bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        dtypes.from_kserve(bad)
    assert "FP32" in info.value.message and "BYTES" in info.value.message


@pytest.mark.parametrize("bad", ["M8[s]", "V8", "c8" + "," + "c8"])
def test_numpy_dtype_without_a_row(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        dtypes.from_numpy(np.dtype(bad))


def test_dtype_rows_are_immutable() -> None:
    row = dtypes.from_name("float32")
    with pytest.raises(AttributeError):
        row.name = "float"  # type: ignore[misc]
