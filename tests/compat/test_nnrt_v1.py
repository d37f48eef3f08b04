"""NNRt's API-9 path (OH_NNModel_AddTensor, OH_NNExecutor_SetInput/SetOutput/Run and the
OH_NN_Memory functions), ported from the API-9 development guide's sample: an Add with a fused
activation parameter, built with AddTensor, run by binding IO per index. Its answer must be
raw onnxruntime's for the same ONNX graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from crossrt.compat import nnrt as nn

pytestmark = pytest.mark.usefixtures("runtime_dir")
R = nn.OH_NN_ReturnCode
REF = nn.device_id("reference")
DIMS = [1, 2, 2, 3]
rng = np.random.default_rng(9)
X = rng.standard_normal(DIMS).astype(np.float32)
Y = rng.standard_normal(DIMS).astype(np.float32)


def build_model() -> Any:
    """``BuildModel`` of the API-9 guide: Add(x, y) with ADD_ACTIVATIONTYPE = RELU."""
    model = nn.OH_NNModel_Construct()
    data = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 4, DIMS, None, nn.OH_NN_TENSOR)
    assert nn.OH_NNModel_AddTensor(model, data) == R.OH_NN_SUCCESS  # 0: x
    assert nn.OH_NNModel_AddTensor(model, data) == R.OH_NN_SUCCESS  # 1: y
    activation = nn.OH_NN_Tensor(nn.OH_NN_INT8, 0, [], None, nn.OH_NN_ADD_ACTIVATIONTYPE)
    assert nn.OH_NNModel_AddTensor(model, activation) == R.OH_NN_SUCCESS  # 2
    fused = np.array([nn.OH_NN_FUSED_RELU], np.int8)
    assert nn.OH_NNModel_SetTensorData(model, 2, fused, fused.nbytes) == R.OH_NN_SUCCESS
    assert nn.OH_NNModel_AddTensor(model, data) == R.OH_NN_SUCCESS  # 3: output
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [2], [0, 1], [3]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 1], [3]) == 0
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    return model


def executor(model: Any) -> Any:
    c = nn.OH_NNCompilation_Construct(model)
    assert nn.OH_NNCompilation_SetDevice(c, REF) == 0
    assert nn.OH_NNCompilation_Build(c) == 0
    e = nn.OH_NNExecutor_Construct(c)
    nn.OH_NNCompilation_Destroy(c)
    assert e is not None
    return e


def raw_ort(model: Any) -> np.ndarray:
    session = ort.InferenceSession(model.model.proto.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    return np.asarray(session.run(None, dict(zip(names, (X, Y), strict=True)))[0])


def test_api9_app_set_input_run_set_output_gives_raw_onnxruntime() -> None:
    model = build_model()
    e = executor(model)
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 4, DIMS, None, nn.OH_NN_TENSOR)
    assert nn.OH_NNExecutor_SetInput(e, 0, t, X, X.nbytes) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_SetInput(e, 1, t, Y.tobytes(), Y.nbytes) == R.OH_NN_SUCCESS
    out = bytearray(X.nbytes)
    assert nn.OH_NNExecutor_SetOutput(e, 0, out, len(out)) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_Run(e) == R.OH_NN_SUCCESS
    got = np.frombuffer(out, np.float32).reshape(DIMS)
    np.testing.assert_array_equal(got, raw_ort(model))
    np.testing.assert_array_equal(got, np.maximum(X + Y, 0))
    assert nn.OH_NNExecutor_GetOutputShape(e, 0) == (R.OH_NN_SUCCESS, DIMS)
    # Bindings persist: new data, same output buffer.
    assert nn.OH_NNExecutor_SetInput(e, 1, t, -Y, Y.nbytes) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_Run(e) == R.OH_NN_SUCCESS
    np.testing.assert_array_equal(
        np.frombuffer(out, np.float32).reshape(DIMS), np.maximum(X - Y, 0)
    )
    nn.OH_NNExecutor_Destroy(e)


def test_api9_memory_path() -> None:
    e = executor(build_model())
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 4, DIMS, None, nn.OH_NN_TENSOR)
    mems = [nn.OH_NNExecutor_AllocateInputMemory(e, i, X.nbytes) for i in (0, 1)]
    out = nn.OH_NNExecutor_AllocateOutputMemory(e, 0, X.nbytes)
    assert all(m is not None for m in mems) and out is not None and out.length == X.nbytes
    for i, m in enumerate(mems):
        assert nn.OH_NNExecutor_SetInputWithMemory(e, i, t, m) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_SetOutputWithMemory(e, 0, out) == R.OH_NN_SUCCESS
    mems[0].data[:] = X.reshape(-1).view(np.uint8)  # filled after binding: read at Run
    mems[1].data[:] = Y.reshape(-1).view(np.uint8)
    assert nn.OH_NNExecutor_Run(e) == R.OH_NN_SUCCESS
    np.testing.assert_array_equal(out.data.view(np.float32).reshape(DIMS), np.maximum(X + Y, 0))
    nn.OH_NNExecutor_DestroyInputMemory(e, 0, mems[0])
    assert nn.OH_NNExecutor_Run(e) == R.OH_NN_INVALID_PARAMETER  # input 0 no longer bound
    nn.OH_NNExecutor_DestroyInputMemory(e, 1, mems[1])
    nn.OH_NNExecutor_DestroyOutputMemory(e, 0, out)
    nn.OH_NNExecutor_Destroy(e)


def test_api9_bad_arguments_are_the_seeds_statuses() -> None:
    e = executor(build_model())
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 4, DIMS, None, nn.OH_NN_TENSOR)
    bad = R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNExecutor_Run(e) == bad  # nothing bound
    assert nn.OH_NNExecutor_SetInput(e, 2, t, X, X.nbytes) == bad  # no input 2
    assert nn.OH_NNExecutor_SetInput(e, 0, t, X, X.nbytes - 4) == bad  # wrong length
    assert nn.OH_NNExecutor_SetInput(e, 0, t, None, X.nbytes) == bad
    i32 = nn.OH_NN_Tensor(nn.OH_NN_INT32, 4, DIMS, None, nn.OH_NN_TENSOR)
    assert nn.OH_NNExecutor_SetInput(e, 0, i32, X, X.nbytes) == bad  # wrong type
    other = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 4, [1, 3, 2, 2], None, nn.OH_NN_TENSOR)
    assert nn.OH_NNExecutor_SetInput(e, 0, other, X, X.nbytes) == bad  # wrong dims
    assert nn.OH_NNExecutor_SetOutput(e, 0, bytes(X.nbytes), X.nbytes) == bad  # read-only
    assert nn.OH_NNExecutor_AllocateInputMemory(e, 5, 8) is None
    assert nn.OH_NNExecutor_AllocateOutputMemory(e, 0, 0) is None
    small = bytearray(8)
    assert nn.OH_NNExecutor_SetInput(e, 0, t, X, X.nbytes) == 0
    assert nn.OH_NNExecutor_SetInput(e, 1, t, Y, Y.nbytes) == 0
    assert nn.OH_NNExecutor_SetOutput(e, 0, small, len(small)) == 0
    assert nn.OH_NNExecutor_Run(e) == bad  # the result does not fit
    mem = nn.OH_NNExecutor_AllocateInputMemory(e, 0, X.nbytes)
    assert nn.OH_NNExecutor_SetInputWithMemory(e, 1, t, mem) == bad  # another index's memory
    assert nn.OH_NNExecutor_SetOutputWithMemory(e, 0, mem) == bad  # an input's memory
    nn.OH_NNExecutor_DestroyInputMemory(e, 0, mem)
    assert nn.OH_NNExecutor_SetInputWithMemory(e, 0, t, mem) == bad  # freed
    model = nn.OH_NNModel_Construct()
    assert nn.OH_NNModel_AddTensor(model, "x") == bad
    assert nn.OH_NNModel_AddTensor(model, nn.OH_NN_Tensor(nn.OH_NN_UNKNOWN, 0, [])) == bad
    assert nn.OH_NNModel_AddTensor(model, nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 3, [1])) == bad
    assert (
        nn.OH_NNModel_AddTensor(model, nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 1, [1], None, 999)) == bad
    )
    q = nn.OH_NN_QuantParam(1, [8], [0.5], [3])
    assert nn.OH_NNModel_AddTensor(model, nn.OH_NN_Tensor(nn.OH_NN_INT8, 1, [4], q)) == 0
    assert model.tensors[0].quant.scales == [0.5] and model.tensors[0].quant.zero_points == [3]
    assert (
        nn.OH_NNModel_AddTensor(
            model, nn.OH_NN_Tensor(nn.OH_NN_INT8, 1, [4], nn.OH_NN_QuantParam(2, [8], [0.5], [3]))
        )
        == bad
    )
    nn.OH_NNExecutor_Destroy(e)


def test_api9_dynamic_input_takes_the_dims_set_input_gives() -> None:
    model = nn.OH_NNModel_Construct()
    dynamic = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 2, [-1, 3])
    for _ in range(3):
        assert nn.OH_NNModel_AddTensor(model, dynamic) == R.OH_NN_SUCCESS
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_MUL, [], [0, 1], [2]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 1], [2]) == 0
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_SUCCESS
    e = executor(model)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 2, [5, 3])
    assert nn.OH_NNExecutor_SetInput(e, 0, t, x, x.nbytes) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_SetInput(e, 1, t, x, x.nbytes) == R.OH_NN_SUCCESS
    out = np.zeros(64, np.float32)  # larger than the result: its first 15 floats are written
    assert nn.OH_NNExecutor_SetOutput(e, 0, out, out.nbytes) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_Run(e) == R.OH_NN_SUCCESS
    assert nn.OH_NNExecutor_GetOutputShape(e, 0) == (R.OH_NN_SUCCESS, [5, 3])
    np.testing.assert_array_equal(out[:15].reshape(5, 3), x * x)
    wrong_rank = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, 1, [15])
    assert nn.OH_NNExecutor_SetInput(e, 0, wrong_rank, x, x.nbytes) == R.OH_NN_INVALID_PARAMETER
    nn.OH_NNExecutor_Destroy(e)
