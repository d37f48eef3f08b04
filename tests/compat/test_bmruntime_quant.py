"""A quantized bmodel: ``bm_net_info_t``'s scales and zero points are the model's (read from
the QuantizeLinear / DequantizeLinear at its boundary when it was compiled, kept in the
``.crm``), and a launch computes the quantized arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_INT8,
    BM_SUCCESS,
    bm_memcpy_d2s,
    bm_memcpy_s2d,
    bm_shape_t,
    bm_tensor_t,
    bm_thread_sync,
    bmrt_get_network_info,
    bmrt_launch_tensor,
    bmrt_tensor,
)
from crossrt.model import GraphBuilder


def quantized_double() -> crossrt.Model:
    """int8 x (scale 0.5, zero point 3) -> x + x -> int8 y (scale 0.25, zero point -2)."""
    b = GraphBuilder("qdouble")
    x = b.input("x", "int8", [4])
    real = b.op("DequantizeLinear", [x, b.constant(np.float32(0.5)), b.constant(np.int8(3))])
    total = b.op("Add", [real, real])
    y = b.op("QuantizeLinear", [total, b.constant(np.float32(0.25)), b.constant(np.int8(-2))])
    b.output(b.op("Identity", [y], outputs=["y"]))
    return b.finish()


@pytest.fixture(scope="module")
def bmodel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bmq") / "qdouble.crm"
    crossrt.compile(quantized_double(), "sim:0").save(path)
    return path


def test_scales_and_zero_points_are_the_models(p_bmrt) -> None:
    info = bmrt_get_network_info(p_bmrt, "qdouble")
    assert (info.input_scales, info.input_zero_point) == ([0.5], [3])  # main: [1.0], [0]
    assert (info.output_scales, info.output_zero_point) == ([0.25], [-2])
    assert info.input_dtypes == [BM_INT8] and info.output_dtypes == [BM_INT8]


def test_a_launch_computes_on_real_values(handle, p_bmrt) -> None:
    x = np.array([3, 5, 10, -20], np.int8)
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p_bmrt, BM_INT8, bm_shape_t.of([4]))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor(p_bmrt, "qdouble", inputs, 1, outputs, 1)
    assert bm_thread_sync(handle) == BM_SUCCESS
    got = np.empty(4, np.int8)
    assert bm_memcpy_d2s(handle, got, outputs[0].device_mem) == BM_SUCCESS
    real = 2 * (x.astype(float) - 3) * 0.5
    assert got.tolist() == np.clip(np.rint(real / 0.25) - 2, -128, 127).tolist()


def test_a_float_model_keeps_scale_one(tmp_path: Path) -> None:
    b = GraphBuilder("plain")
    x = b.input("x", "float32", [2])
    b.output(b.op("Add", [x, x], outputs=["y"]))
    exe = crossrt.compile(b.finish(), "sim:0")
    assert "crossrt.io_quantization" not in exe.metadata
