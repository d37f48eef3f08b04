"""bfloat16, float8, int4 and int2 tensors in and out of ONNX Runtime (onnxruntime/types.py)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt.drivers.onnxruntime import types as ort_types
from crossrt.dtypes import DType

RNG = np.random.default_rng(5)
KINDS = sorted(ort_types.KINDS.values(), key=lambda k: k.onnx)


def _values(kind: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Random values of ``kind`` covering its range (both ends for the small integers)."""
    info = ml_dtypes.iinfo(kind.numpy) if kind.bits <= 4 else None
    if info is not None:
        raw = RNG.integers(int(info.min), int(info.max) + 1, shape)
        return raw.astype(kind.numpy)
    return (RNG.standard_normal(shape) * 4).astype(kind.numpy)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("shape", [(7,), (2, 3), (0,), (1, 1, 5)])
def test_an_ortvalue_round_trip_keeps_every_value(kind: DType, shape: tuple[int, ...]):
    values = _values(kind, shape)
    back = ort_types.from_ortvalue(ort_types.to_ortvalue(values, kind), kind)
    assert back.dtype == kind.numpy and back.shape == shape
    # By value: ml_dtypes leaves the unused high bits of an int4 or int2 byte unspecified.
    assert np.array_equal(back.astype(np.float32), values.astype(np.float32), equal_nan=True)


@pytest.mark.parametrize(
    ("kind", "values", "packed"),
    [
        (ort_types.KINDS["tensor(int4)"], [1, -2, 7], [0xE1, 0x07]),  # low nibble first
        (ort_types.KINDS["tensor(uint4)"], [15, 0, 3], [0x0F, 0x03]),
        (ort_types.KINDS["tensor(int2)"], [1, -1, -2, 0, 1], [0b00_10_11_01, 0b01]),
        (ort_types.KINDS["tensor(uint2)"], [3, 2, 1, 0], [0b00_01_10_11]),
    ],
)
def test_packed_types_follow_the_onnx_layout(kind: DType, values: list[int], packed: list[int]):
    value = ort_types.to_ortvalue(np.array(values).astype(kind.numpy), kind)
    raw = np.ctypeslib.as_array(
        (np.ctypeslib.ctypes.c_uint8 * len(packed)).from_address(value.data_ptr())
    )
    assert raw.tolist() == packed


def _cast_model(src: int, dst: int, shape: list[int]) -> Any:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=dst)],
        "cast",
        [helper.make_tensor_value_info("x", src, shape)],
        [helper.make_tensor_value_info("y", dst, shape)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    proto.ir_version = 11  # opset 25: the first with 2-bit types
    return proto


@pytest.mark.parametrize(
    "onnx_type",
    [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.UINT2],
    ids=["bfloat16", "float8e4m3fn", "int4", "uint2"],
)
def test_such_tensors_cross_a_sessions_boundary_both_ways(onnx_type: int):
    kind = next(k for k in KINDS if k.onnx == onnx_type)
    x = np.array([[0, 1, 1], [2, 3, 1]], np.float32)
    with crossrt.Runtime() as rt:
        to_kind = rt.load(crossrt.compile(_cast_model(TensorProto.FLOAT, onnx_type, [2, 3])))
        from_kind = rt.load(crossrt.compile(_cast_model(onnx_type, TensorProto.FLOAT, [2, 3])))
        y = to_kind.run({"x": x})["y"]
        assert y.dtype == kind.numpy and y.astype(np.float32).tolist() == x.tolist()
        assert from_kind.run({"x": y})["y"].tolist() == x.tolist()
        assert from_kind.run_async({"x": y}).result(10)["y"].tolist() == x.tolist()
        out = np.empty((2, 3), kind.numpy)  # a preallocated output gets the values too
        assert to_kind.run({"x": x}, outputs={"y": out})["y"] is out
        assert out.astype(np.float32).tolist() == x.tolist()
