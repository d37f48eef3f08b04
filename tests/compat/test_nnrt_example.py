"""NNRt's development flow (build -> compile -> execute, seeds 000/001 and the NNRt guide),
ported step by step for a small convolutional network built op by op: Conv2D with bias and
fused ReLU, MaxPool, FullConnection. Its outputs must match bit for bit those of the same
model through crossrt's own API (GraphBuilder + compile + Runtime.load + run)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt.compat import nnrt as nn

pytestmark = pytest.mark.usefixtures("runtime_dir")

rng = np.random.default_rng(2024)
INPUT = rng.standard_normal((1, 6, 6, 2)).astype(np.float32)  # NHWC
WEIGHT = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)  # [outC, kH, kW, inC]
BIAS = rng.standard_normal(4).astype(np.float32)
FC_WEIGHT = rng.standard_normal((5, 36)).astype(np.float32)  # [out, in]
FC_BIAS = rng.standard_normal(5).astype(np.float32)


def create_desc(shape: list[int], dtype: int, fmt: int) -> Any:
    """``CreateTensorDesc``: a descriptor with a shape, a data type and a format."""
    desc = nn.OH_NNTensorDesc_Create()
    assert desc is not None
    assert nn.OH_NNTensorDesc_SetShape(desc, shape, len(shape)) == nn.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_SetDataType(desc, dtype) == nn.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_SetFormat(desc, fmt) == nn.OH_NN_SUCCESS
    return desc


def add_tensor(
    model: Any, shape: list[int], dtype: int, tensor_type: int, data: Any = None
) -> None:
    """Add one tensor (the guide repeats these four calls per tensor)."""
    index = len(model.tensors)
    desc = create_desc(
        shape, dtype, nn.OH_NN_FORMAT_NHWC if len(shape) == 4 else nn.OH_NN_FORMAT_NONE
    )
    assert nn.OH_NNModel_AddTensorToModel(model, desc) == nn.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_Destroy(desc) == nn.OH_NN_SUCCESS
    assert nn.OH_NNModel_SetTensorType(model, index, tensor_type) == nn.OH_NN_SUCCESS
    if data is not None:
        buf = np.ascontiguousarray(data)
        assert nn.OH_NNModel_SetTensorData(model, index, buf, buf.nbytes) == nn.OH_NN_SUCCESS


def build_model() -> Any:
    """``BuildModel``: Conv2D(+bias, ReLU) -> MaxPool -> FullConnection."""
    model = nn.OH_NNModel_Construct()
    assert model is not None
    f32, i64, i8 = nn.OH_NN_FLOAT32, nn.OH_NN_INT64, nn.OH_NN_INT8
    add_tensor(model, [1, 6, 6, 2], f32, nn.OH_NN_TENSOR)  # 0 input
    add_tensor(model, [4, 3, 3, 2], f32, nn.OH_NN_TENSOR, WEIGHT)  # 1 conv weight
    add_tensor(model, [4], f32, nn.OH_NN_TENSOR, BIAS)  # 2 conv bias
    add_tensor(model, [2], i64, nn.OH_NN_CONV2D_STRIDES, np.array([1, 1], np.int64))  # 3
    add_tensor(model, [4], i64, nn.OH_NN_CONV2D_PAD, np.array([1, 1, 1, 1], np.int64))  # 4
    add_tensor(model, [2], i64, nn.OH_NN_CONV2D_DILATION, np.array([1, 1], np.int64))  # 5
    add_tensor(model, [1], i64, nn.OH_NN_CONV2D_GROUP, np.array([1], np.int64))  # 6
    add_tensor(
        model, [1], i8, nn.OH_NN_CONV2D_ACTIVATION_TYPE, np.array([nn.OH_NN_FUSED_RELU], np.int8)
    )  # 7
    add_tensor(model, [1, 6, 6, 4], f32, nn.OH_NN_TENSOR)  # 8 conv output
    add_tensor(model, [2], i64, nn.OH_NN_MAX_POOL_KERNEL_SIZE, np.array([2, 2], np.int64))  # 9
    add_tensor(model, [2], i64, nn.OH_NN_MAX_POOL_STRIDE, np.array([2, 2], np.int64))  # 10
    add_tensor(model, [1], i8, nn.OH_NN_MAX_POOL_PAD_MODE, np.array([1], np.int8))  # 11 valid
    add_tensor(model, [1, 3, 3, 4], f32, nn.OH_NN_TENSOR)  # 12 pool output
    add_tensor(model, [5, 36], f32, nn.OH_NN_TENSOR, FC_WEIGHT)  # 13 fc weight
    add_tensor(model, [5], f32, nn.OH_NN_TENSOR, FC_BIAS)  # 14 fc bias
    add_tensor(model, [1], nn.OH_NN_BOOL, nn.OH_NN_FULL_CONNECTION_HAS_BIAS, np.array([True]))  # 15
    add_tensor(model, [1, 5], f32, nn.OH_NN_TENSOR)  # 16 output

    ops = [
        (nn.OH_NN_OPS_CONV2D, [3, 4, 5, 6, 7], [0, 1, 2], [8]),
        (nn.OH_NN_OPS_MAX_POOL, [9, 10, 11], [8], [12]),
        (nn.OH_NN_OPS_FULL_CONNECTION, [15], [12, 13, 14], [16]),
    ]
    for op, params, inputs, outputs in ops:
        ret = nn.OH_NNModel_AddOperation(
            model,
            op,
            nn.OH_NN_UInt32Array(params, len(params)),
            nn.OH_NN_UInt32Array(inputs, len(inputs)),
            nn.OH_NN_UInt32Array(outputs, len(outputs)),
        )
        assert ret == nn.OH_NN_SUCCESS
    ret = nn.OH_NNModel_SpecifyInputsAndOutputs(
        model, nn.OH_NN_UInt32Array([0], 1), nn.OH_NN_UInt32Array([16], 1)
    )
    assert ret == nn.OH_NN_SUCCESS
    assert nn.OH_NNModel_Finish(model) == nn.OH_NN_SUCCESS
    return model


def get_available_device(name: str) -> int:
    """``GetAvailableDevices``: the IDs, then the one whose name is ``name``."""
    ret, ids = nn.OH_NNDevice_GetAllDevicesID()
    assert ret == nn.OH_NN_SUCCESS and ids
    for device_id in ids:
        ret, device_name = nn.OH_NNDevice_GetName(device_id)
        assert ret == nn.OH_NN_SUCCESS
        ret, device_type = nn.OH_NNDevice_GetType(device_id)
        assert ret == nn.OH_NN_SUCCESS
        if device_name == name:
            assert device_type == nn.OH_NN_CPU
            return device_id
    raise AssertionError(f"no device {name}")


def create_compilation(model: Any, device_id: int, cache_dir: str) -> Any:
    """``CreateCompilation``: the model's supported ops, the device, the cache, Build."""
    ret, supported = nn.OH_NNModel_GetAvailableOperations(model, device_id)
    assert ret == nn.OH_NN_SUCCESS and supported == [True, True, True]
    compilation = nn.OH_NNCompilation_Construct(model)
    assert compilation is not None
    assert nn.OH_NNCompilation_SetDevice(compilation, device_id) == nn.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_SetCache(compilation, cache_dir, 1) == nn.OH_NN_SUCCESS
    ret = nn.OH_NNCompilation_SetPerformanceMode(compilation, nn.OH_NN_PERFORMANCE_NONE)
    assert ret == nn.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_SetPriority(compilation, nn.OH_NN_PRIORITY_NONE) == nn.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_Build(compilation) == nn.OH_NN_SUCCESS
    return compilation


def run(executor: Any, device_id: int) -> np.ndarray:
    """``Run``: tensors from the executor's descs, input data, RunSync, output data."""
    ret, n_in = nn.OH_NNExecutor_GetInputCount(executor)
    assert ret == nn.OH_NN_SUCCESS
    ret, n_out = nn.OH_NNExecutor_GetOutputCount(executor)
    assert ret == nn.OH_NN_SUCCESS
    inputs, outputs = [], []
    for i in range(n_in):
        desc = nn.OH_NNExecutor_CreateInputTensorDesc(executor, i)
        inputs.append(nn.OH_NNTensor_Create(device_id, desc))
        assert nn.OH_NNTensorDesc_Destroy(desc) == nn.OH_NN_SUCCESS
    for i in range(n_out):
        desc = nn.OH_NNExecutor_CreateOutputTensorDesc(executor, i)
        outputs.append(nn.OH_NNTensor_Create(device_id, desc))
        assert nn.OH_NNTensorDesc_Destroy(desc) == nn.OH_NN_SUCCESS
    # SetInputData: memcpy into the tensor's shared memory.
    memoryview(nn.OH_NNTensor_GetDataBuffer(inputs[0])).cast("B")[:] = INPUT.tobytes()
    ret = nn.OH_NNExecutor_RunSync(executor, inputs, n_in, outputs, n_out)
    assert ret == nn.OH_NN_SUCCESS
    ret, shape = nn.OH_NNExecutor_GetOutputShape(executor, 0)
    assert ret == nn.OH_NN_SUCCESS and shape == [1, 5]
    result = np.array(nn.OH_NNTensor_GetDataBuffer(outputs[0]))
    for tensor in inputs + outputs:
        assert nn.OH_NNTensor_Destroy(tensor) == nn.OH_NN_SUCCESS
    return result


def crossrt_reference() -> np.ndarray:
    """The same network through crossrt's own API, node for node."""
    b = crossrt.GraphBuilder("conv_net")
    x = b.input("x", "float32", [1, 6, 6, 2])
    w = b.constant(np.ascontiguousarray(WEIGHT.transpose(0, 3, 1, 2)))
    y = b.op("Transpose", [x], perm=[0, 3, 1, 2])
    y = b.op(
        "Conv",
        [y, w, b.constant(BIAS)],
        group=1,
        strides=[1, 1],
        dilations=[1, 1],
        pads=[1, 1, 1, 1],
    )
    y = b.op("Relu", [b.op("Transpose", [y], perm=[0, 2, 3, 1])])
    y = b.op("Transpose", [y], perm=[0, 3, 1, 2])
    y = b.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=0, auto_pad="VALID")
    y = b.op("Transpose", [y], perm=[0, 2, 3, 1])
    y = b.op("Reshape", [y, b.constant(np.array([-1, 36], np.int64))])
    b.output(b.op("Gemm", [y, b.constant(FC_WEIGHT), b.constant(FC_BIAS)], transB=1))
    exe = crossrt.compile(b.finish(), "cpu:0", driver="reference")
    with crossrt.Runtime() as rt:
        return next(iter(rt.load(exe).run({"x": INPUT}).values()))


def test_conv_net_flow_matches_crossrt_bit_for_bit(tmp_path: Any) -> None:
    model = build_model()
    device_id = get_available_device("reference/cpu:0")
    compilation = create_compilation(model, device_id, str(tmp_path))
    nn.OH_NNModel_Destroy(model)  # allowed once the compilation is built
    executor = nn.OH_NNExecutor_Construct(compilation)
    assert executor is not None
    nn.OH_NNCompilation_Destroy(compilation)  # allowed once the executor exists
    got = run(executor, device_id)
    nn.OH_NNExecutor_Destroy(executor)

    want = crossrt_reference()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()  # bit for bit
    # And the numbers are the network's: NumPy, to float32 rounding.
    pad = np.pad(INPUT, [(0, 0), (1, 1), (1, 1), (0, 0)])
    conv = np.zeros((1, 6, 6, 4), np.float64)
    for i in range(6):
        for j in range(6):
            patch = pad[0, i : i + 3, j : j + 3, :]
            conv[0, i, j] = np.tensordot(WEIGHT, patch, axes=([1, 2, 3], [0, 1, 2])) + BIAS
    pooled = np.maximum(conv, 0).reshape(1, 3, 2, 3, 2, 4).max(axis=(2, 4))
    np.testing.assert_allclose(
        got, pooled.reshape(1, 36) @ FC_WEIGHT.T + FC_BIAS, rtol=1e-4, atol=1e-4
    )


def test_second_build_reads_the_cache(tmp_path: Any) -> None:
    device_id = get_available_device("reference/cpu:0")
    first = create_compilation(build_model(), device_id, str(tmp_path))
    assert list(tmp_path.glob("*.crm"))  # the compile was stored
    restored = nn.OH_NNCompilation_ConstructForCache()
    assert nn.OH_NNCompilation_SetDevice(restored, device_id) == nn.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_SetCache(restored, str(tmp_path), 1) == nn.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_Build(restored) == nn.OH_NN_SUCCESS
    a, b = nn.OH_NNExecutor_Construct(first), nn.OH_NNExecutor_Construct(restored)
    assert run(a, device_id).tobytes() == run(b, device_id).tobytes()
    nn.OH_NNExecutor_Destroy(a)
    nn.OH_NNExecutor_Destroy(b)
