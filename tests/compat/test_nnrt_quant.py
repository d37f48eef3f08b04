"""Quantized NNRt graphs compute on real values: a tensor with OH_NN_QuantParam holds
q = round(x / scale) + zero_point, saturated to its bits. Checked against the quantized
arithmetic computed by hand, on the reference driver and on onnxruntime (where the
QuantizeLinear / DequantizeLinear pairs become int8 kernels) and OpenVINO where installed."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from crossrt.compat import nnrt as nn

pytestmark = pytest.mark.usefixtures("runtime_dir")
R = nn.OH_NN_ReturnCode


def _devices() -> list[Any]:
    """The reference driver and every int8 engine installed here (OpenVINO is optional)."""
    found = []
    for driver in ("reference", "onnxruntime", "openvino"):
        with contextlib.suppress(KeyError):
            found.append(pytest.param(nn.device_id(driver), id=driver))
    return found


DEVICES = _devices()
_NN = {np.dtype(v): k for k, v in nn.types._NUMPY.items()}


def quant(scales: Sequence[float], zero_points: Sequence[int] = (), bits: int = 8) -> Any:
    q = nn.OH_NNQuantParam_Create()
    assert nn.OH_NNQuantParam_SetScales(q, list(scales)) == R.OH_NN_SUCCESS
    if zero_points:
        assert nn.OH_NNQuantParam_SetZeroPoints(q, list(zero_points)) == R.OH_NN_SUCCESS
    assert nn.OH_NNQuantParam_SetNumBits(q, [bits] * len(scales)) == R.OH_NN_SUCCESS
    return q


def tensor(model: Any, dtype: Any, shape: Sequence[int], q: Any = None, data: Any = None) -> int:
    d = nn.OH_NNTensorDesc_Create()
    nn.OH_NNTensorDesc_SetDataType(d, _NN[np.dtype(dtype)])
    nn.OH_NNTensorDesc_SetShape(d, list(shape))
    assert nn.OH_NNModel_AddTensorToModel(model, d) == R.OH_NN_SUCCESS
    index = len(model.tensors) - 1
    if data is not None:
        arr = np.asarray(data, dtype)
        assert nn.OH_NNModel_SetTensorData(model, index, arr, arr.nbytes) == R.OH_NN_SUCCESS
    if q is not None:
        assert nn.OH_NNModel_SetTensorQuantParams(model, index, q) == R.OH_NN_SUCCESS
    return index


def run(model: Any, device: int, feeds: Sequence[np.ndarray]) -> np.ndarray:
    c = nn.OH_NNCompilation_Construct(model)
    assert nn.OH_NNCompilation_SetDevice(c, device) == R.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_Build(c) == R.OH_NN_SUCCESS
    e = nn.OH_NNExecutor_Construct(c)
    ins = []
    for i, value in enumerate(feeds):
        t = nn.OH_NNTensor_Create(device, nn.OH_NNExecutor_CreateInputTensorDesc(e, i))
        nn.OH_NNTensor_GetDataBuffer(t)[...] = value
        ins.append(t)
    out = nn.OH_NNTensor_Create(device, nn.OH_NNExecutor_CreateOutputTensorDesc(e, 0))
    assert nn.OH_NNExecutor_RunSync(e, ins, len(ins), [out], 1) == R.OH_NN_SUCCESS
    return np.array(nn.OH_NNTensor_GetDataBuffer(out))


def requantize(real: np.ndarray, scale: Any, zero_point: Any, lo: int, hi: int) -> np.ndarray:
    """What a quantized output holds: real / scale rounded half to even, + zero point,
    saturated."""
    return np.clip(np.rint(real / scale) + zero_point, lo, hi)


def add_model(qa: Any, qb: Any, qout: Any, dtype: Any = np.int8, shape: Any = (4,)) -> Any:
    model = nn.OH_NNModel_Construct()
    a, b = tensor(model, dtype, shape, qa), tensor(model, dtype, shape, qb)
    out = tensor(model, dtype, shape, qout)
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [], [a, b], [out]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [a, b], [out]) == 0
    return model


@pytest.mark.parametrize("device", DEVICES)
def test_an_int8_add_adds_real_values(device: int) -> None:
    # 0.5-scaled inputs, a 1.0-scaled output: the sums of the ints halved, not wrapped.
    model = add_model(quant([0.5]), quant([0.5]), quant([1.0]))
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    a = np.array([10, 30, 100, 120], np.int8)
    b = np.array([10, 20, 100, 120], np.int8)
    got = run(model, device, [a, b])
    assert got.dtype == np.int8
    assert got.tolist() == [10, 25, 100, 120]  # main gave the wrapped int8 sums [20, 50, -56, -16]


@pytest.mark.parametrize("device", DEVICES)
def test_zero_points_and_uint8(device: int) -> None:
    model = add_model(quant([0.25], [10]), quant([0.5], [-4]), quant([0.75], [3]))
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    a = np.array([-128, 0, 50, 127], np.int8)
    b = np.array([-100, 7, 60, 127], np.int8)
    real = (a.astype(float) - 10) * 0.25 + (b.astype(float) + 4) * 0.5
    want = requantize(real, 0.75, 3, -128, 127)
    assert run(model, device, [a, b]).tolist() == want.tolist()

    model = add_model(quant([0.1], [128]), quant([0.2], [100]), quant([0.3], [0]), np.uint8)
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    a = np.array([0, 128, 200, 255], np.uint8)
    b = np.array([0, 100, 0, 255], np.uint8)
    real = (a.astype(float) - 128) * 0.1 + (b.astype(float) - 100) * 0.2
    want = requantize(real, 0.3, 0, 0, 255)  # negative sums saturate at 0
    np.testing.assert_allclose(run(model, device, [a, b]), want, atol=1)  # float32 ties


@pytest.mark.parametrize("device", DEVICES)
def test_per_channel_weights(device: int) -> None:
    # x (float) * w, w int8 [3, 2] with one scale and zero point per row (axis 0).
    scales, zps = [0.5, 1.0, 2.0], [0, 1, -1]
    w = np.array([[2, 4], [3, -5], [7, 9]], np.int8)
    model = nn.OH_NNModel_Construct()
    x = tensor(model, np.float32, [3, 2])
    wi = tensor(model, np.int8, [3, 2], quant(scales, zps), data=w)
    out = tensor(model, np.float32, [3, 2])
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_MUL, [], [x, wi], [out]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [x], [out]) == 0
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    xv = np.array([[1.0, 2.0], [3.0, 4.0], [0.5, -1.0]], np.float32)
    real_w = (w - np.array(zps)[:, None]) * np.array(scales)[:, None]
    np.testing.assert_allclose(run(model, device, [xv]), xv * real_w, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_an_int8_convolution_with_per_channel_weights(device: int) -> None:
    # NHWC int8 x (scale 0.05, zero point 3), OHWI int8 w with a scale per output channel,
    # an int32 bias at x's scale times w's, an int8 result at scale 0.1: TFLite's int8 conv.
    x_scale, w_scales, zp = 0.05, [0.01, 0.02, 0.03], 3
    w = np.array([[[[3, -5]]], [[[7, 2]]], [[[-8, 4]]]], np.int8)
    bias = np.array([100, -50, 20], np.int32)
    model = nn.OH_NNModel_Construct()
    x = tensor(model, np.int8, [1, 4, 4, 2], quant([x_scale], [zp]))
    wi = tensor(model, np.int8, [3, 1, 1, 2], quant(w_scales), data=w)
    bi = tensor(model, np.int32, [3], quant([x_scale * s for s in w_scales]), data=bias)
    params = []
    for tag, value in (
        (nn.OH_NN_CONV2D_STRIDES, [1, 1]),
        (nn.OH_NN_CONV2D_PAD, [0, 0, 0, 0]),
        (nn.OH_NN_CONV2D_DILATION, [1, 1]),
        (nn.OH_NN_CONV2D_GROUP, [1]),
    ):
        params.append(tensor(model, np.int64, [len(value)], data=value))
        assert nn.OH_NNModel_SetTensorType(model, params[-1], tag) == R.OH_NN_SUCCESS
    out = tensor(model, np.int8, [1, 4, 4, 3], quant([0.1]))
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_CONV2D, params, [x, wi, bi], [out]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [x], [out]) == 0
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    xv = (np.arange(32).reshape(1, 4, 4, 2) * 7 % 50 - 25).astype(np.int8)
    real_w = w[:, 0, 0, :].astype(float) * np.array(w_scales)[:, None]
    real = (xv.astype(float) - zp) * x_scale @ real_w.T + bias * x_scale * np.array(w_scales)
    want = requantize(real, 0.1, 0, -128, 127)
    got = run(model, device, [xv]).astype(int)
    # float32 engines may round a value within 1e-6 of .5 the other way: 1 step, rarely
    assert np.abs(got - want).max() <= 1 and np.count_nonzero(got != want) <= 2


@pytest.mark.parametrize("device", DEVICES)
def test_fewer_bits_saturate_at_their_range(device: int) -> None:
    model = add_model(quant([1.0]), quant([1.0]), quant([1.0], bits=4))
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    a = np.array([3, 5, -6, -1], np.int8)
    b = np.array([3, 5, -6, 0], np.int8)
    assert run(model, device, [a, b]).tolist() == [6, 7, -8, -1]  # int4: -8..7


def test_what_cannot_be_expressed_is_refused() -> None:
    model = nn.OH_NNModel_Construct()
    # A zero point outside int8, a bit width wider than the type, per-channel counts that
    # are not the first dimension: the parameters themselves are wrong.
    for q in (quant([0.5], [300]), quant([0.5], bits=16), quant([0.5, 1.0, 2.0])):
        index = tensor(model, np.int8, [4])
        assert nn.OH_NNModel_SetTensorQuantParams(model, index, q) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNModel_SetTensorQuantParams(model, index, quant([0.0])) == (
        R.OH_NN_INVALID_PARAMETER
    )
    # A quantized int32 result: ONNX quantizes to 8 and 16 bits only.
    model = add_model(quant([0.5]), quant([0.5]), quant([1.0]), np.int32)
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_OPERATION_FORBIDDEN


def test_quant_params_on_a_float_tensor_change_nothing() -> None:
    model = add_model(quant([0.5]), None, None, np.float32)
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    a, b = np.array([1, 2, 3, 4], np.float32), np.array([1, 1, 1, 1], np.float32)
    assert run(model, nn.device_id("reference"), [a, b]).tolist() == [2, 3, 4, 5]


def test_onnxruntime_runs_the_add_as_an_int8_kernel(tmp_path: Any) -> None:
    import onnx
    import onnxruntime as ort

    model = add_model(quant([0.5]), quant([0.5]), quant([1.0]))
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.model.proto.SerializeToString(), options, ["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert ops == ["QLinearAdd"]  # the QDQ pair fused: int8 in, int8 out
