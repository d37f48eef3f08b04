"""crossrt.compat.nnrt: descriptors, tensors (shared memory, fds), models, compilations
(cache rules, offline models, options), executors (sync, async, timeout, callbacks), devices,
and every OH_NN_ReturnCode the layer returns, with its meaning. No exception crosses the API."""

from __future__ import annotations

import inspect
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crossrt.compat import nnrt as nn
from crossrt.errors import StatusCode

pytestmark = pytest.mark.usefixtures("runtime_dir")
R = nn.OH_NN_ReturnCode
REF = nn.device_id("reference")


def desc(dtype: int = nn.OH_NN_FLOAT32, shape: list[int] | None = None, name: str = "") -> Any:
    d = nn.OH_NNTensorDesc_Create()
    assert nn.OH_NNTensorDesc_SetDataType(d, dtype) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_SetShape(d, shape or [2, 3]) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_SetName(d, name) == R.OH_NN_SUCCESS
    return d


def add_model(shape: list[int] | None = None, dim: int = 3) -> Any:
    """x + y, finished; ``shape`` may hold -1."""
    shape = shape or [2, dim]
    model = nn.OH_NNModel_Construct()
    for name in ("x", "y", "out"):
        assert nn.OH_NNModel_AddTensorToModel(model, desc(shape=shape, name=name)) == 0
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [], [0, 1], [2]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 1], [2]) == 0
    assert nn.OH_NNModel_Finish(model) == 0
    return model


def built(model: Any = None, device: int = REF) -> Any:
    c = nn.OH_NNCompilation_Construct(model or add_model())
    assert nn.OH_NNCompilation_SetDevice(c, device) == 0
    assert nn.OH_NNCompilation_Build(c) == 0
    return c


def tensors(e: Any, values: list[np.ndarray]) -> tuple[list[Any], list[Any]]:
    ins = []
    for i, v in enumerate(values):
        t = nn.OH_NNTensor_Create(REF, nn.OH_NNExecutor_CreateInputTensorDesc(e, i))
        nn.OH_NNTensor_GetDataBuffer(t)[...] = v
        ins.append(t)
    out = nn.OH_NNTensor_Create(REF, nn.OH_NNExecutor_CreateOutputTensorDesc(e, 0))
    return ins, [out]


# -- return codes ------------------------------------------------------------------------------


def test_return_codes_are_numbered_as_nnrt_numbers_them() -> None:
    assert [(c.name, c.value) for c in R] == [
        ("OH_NN_SUCCESS", 0),
        ("OH_NN_FAILED", 1),
        ("OH_NN_INVALID_PARAMETER", 2),
        ("OH_NN_MEMORY_ERROR", 3),
        ("OH_NN_OPERATION_FORBIDDEN", 4),
        ("OH_NN_NULL_PTR", 5),
        ("OH_NN_INVALID_FILE", 6),
        ("OH_NN_UNAVALIDABLE_DEVICE", 7),
        ("OH_NN_INVALID_PATH", 8),
        ("OH_NN_TIMEOUT", 9),
        ("OH_NN_UNSUPPORTED", 10),
        ("OH_NN_CONNECTION_EXCEPTION", 11),
        ("OH_NN_SAVE_CACHE_EXCEPTION", 12),
        ("OH_NN_DYNAMIC_SHAPE", 13),
        ("OH_NN_UNAVAILABLE_DEVICE", 14),
    ]
    assert nn.OH_NN_TIMEOUT == 9 and nn.OH_NN_FLOAT32 == 11 and nn.OH_NN_FORMAT_ND == 3
    assert len(nn.OH_NN_OperationType) == 108 and nn.OH_NN_OPS_GATHER_ND == 108
    assert len(nn.OH_NN_TensorType) == 163 and nn.OH_NN_REDUCE_L2_COEFF == 162


def test_status_mapping_both_ways() -> None:
    for code in R:
        back = nn.TO_NN.get(nn.crossrt_status(code))
        # Each code maps to a crossrt code that maps back to a code of the same meaning.
        assert back is not None
        if code not in (R.OH_NN_NULL_PTR, R.OH_NN_DYNAMIC_SHAPE, R.OH_NN_SAVE_CACHE_EXCEPTION):
            assert back in (code, R.OH_NN_UNAVAILABLE_DEVICE, R.OH_NN_UNAVALIDABLE_DEVICE)
    assert nn.TO_NN[StatusCode.TIMEOUT] is R.OH_NN_TIMEOUT
    assert nn.TO_NN[StatusCode.UNSUPPORTED_OPERATOR] is R.OH_NN_UNSUPPORTED
    assert nn.crossrt_status(8) is StatusCode.NOT_FOUND


def test_errors_become_their_codes() -> None:
    from crossrt.errors import ClosedError, DeviceUnavailableError, InvalidContainerError

    status_of = nn.status.status_of
    unavailable = DeviceUnavailableError("driver x is not installed", StatusCode.DRIVER_UNAVAILABLE)
    assert status_of(unavailable) is R.OH_NN_UNAVAILABLE_DEVICE
    assert status_of(ClosedError("closed")) is R.OH_NN_CONNECTION_EXCEPTION
    assert status_of(InvalidContainerError("damaged")) is R.OH_NN_INVALID_FILE
    assert status_of(MemoryError()) is R.OH_NN_MEMORY_ERROR
    assert status_of(ValueError()) is R.OH_NN_INVALID_PARAMETER
    assert status_of(RuntimeError()) is R.OH_NN_FAILED


def test_failed_when_the_engine_fails(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.OH_NNModel_Construct()
    nn.OH_NNModel_AddTensorToModel(model, desc(shape=[3]))
    nn.OH_NNModel_AddTensorToModel(model, desc(nn.OH_NN_INT32, [1]))
    nn.OH_NNModel_AddTensorToModel(model, desc(nn.OH_NN_INT32, [1]))
    nn.OH_NNModel_AddTensorToModel(model, desc(shape=[1]))
    nn.OH_NNModel_SetTensorData(model, 2, np.array([0], np.int32))
    nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_GATHER, [], [0, 1, 2], [3])
    nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 1], [3])
    nn.OH_NNModel_Finish(model)
    e = nn.OH_NNExecutor_Construct(built(model))
    ins, outs = tensors(e, [np.zeros(3, np.float32), np.array([99], np.int32)])
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == R.OH_NN_FAILED  # index 99 of 3
    assert "OH_NN_FAILED" in caplog.text


def test_no_exception_crosses_the_api_for_garbage() -> None:
    junk: list[Any] = [None, 1, "x", object(), -1, b"\0" * 8]
    called = 0
    for name in dir(nn):
        fn = getattr(nn, name)
        if not name.startswith("OH_NN") or not callable(fn) or isinstance(fn, type):
            continue
        arity = len(inspect.signature(fn).parameters)
        for value in junk:
            fn(*[value] * arity)  # returns a code, a (code, None) pair or None; never raises
            called += 1
    assert called > 60 * len(junk)


# -- descriptors and tensors ---------------------------------------------------------------------


def test_tensor_desc_rules() -> None:
    d = nn.OH_NNTensorDesc_Create()
    assert nn.OH_NNTensorDesc_GetFormat(d) == (R.OH_NN_SUCCESS, nn.OH_NN_FORMAT_NONE)
    assert nn.OH_NNTensorDesc_GetShape(d) == (R.OH_NN_INVALID_PARAMETER, None)
    assert nn.OH_NNTensorDesc_SetShape(d, [2, 3], 0) == R.OH_NN_INVALID_PARAMETER  # length 0
    assert nn.OH_NNTensorDesc_SetShape(d, [2, 0]) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNTensorDesc_SetShape(d, [2, 3, 4], 2) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_GetShape(d) == (R.OH_NN_SUCCESS, [2, 3])
    assert nn.OH_NNTensorDesc_GetByteSize(d) == (R.OH_NN_INVALID_PARAMETER, None)  # UNKNOWN type
    assert nn.OH_NNTensorDesc_SetDataType(d, 99) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNTensorDesc_SetDataType(d, nn.OH_NN_FLOAT16) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_GetElementCount(d) == (R.OH_NN_SUCCESS, 6)
    assert nn.OH_NNTensorDesc_GetByteSize(d) == (R.OH_NN_SUCCESS, 12)
    assert nn.OH_NNTensorDesc_SetFormat(d, nn.OH_NN_FORMAT_NHWC) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_SetFormat(d, 7) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNTensorDesc_SetName(d, None) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNTensorDesc_SetName(d, "in") == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_GetName(d) == (R.OH_NN_SUCCESS, "in")
    assert nn.OH_NNTensorDesc_SetShape(d, [-1, 3]) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_GetElementCount(d) == (R.OH_NN_DYNAMIC_SHAPE, 0)
    assert nn.OH_NNTensorDesc_GetByteSize(d) == (R.OH_NN_DYNAMIC_SHAPE, 0)
    assert nn.OH_NNTensorDesc_Destroy(d) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensorDesc_Destroy(d) == R.OH_NN_INVALID_PARAMETER  # already freed
    assert nn.OH_NNTensorDesc_GetName(d) == (R.OH_NN_INVALID_PARAMETER, None)


def test_tensors_are_shared_memory_with_an_fd() -> None:
    d = desc(shape=[2, 3])
    t = nn.OH_NNTensor_Create(REF, d)
    ret, fd = nn.OH_NNTensor_GetFd(t)
    assert ret == R.OH_NN_SUCCESS and fd is not None and fd >= 0
    assert nn.OH_NNTensor_GetSize(t) == (R.OH_NN_SUCCESS, 24)
    assert nn.OH_NNTensor_GetOffset(t) == (R.OH_NN_SUCCESS, 0)
    nn.OH_NNTensor_GetDataBuffer(t)[...] = np.arange(6).reshape(2, 3)
    # The same memory through the fd: what one writes, the other reads.
    view = nn.OH_NNTensor_CreateWithFd(REF, d, fd, 24, 0)
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(view), np.arange(6).reshape(2, 3))
    # [offset, size): the second row only.
    row = nn.OH_NNTensor_CreateWithFd(REF, desc(shape=[3]), fd, 24, 12)
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(row), [3, 4, 5])
    assert nn.OH_NNTensor_GetOffset(row) == (R.OH_NN_SUCCESS, 12)
    assert nn.OH_NNTensor_GetSize(row) == (R.OH_NN_SUCCESS, 24)
    nn.OH_NNTensor_GetDataBuffer(row)[0] = 30
    assert nn.OH_NNTensor_GetDataBuffer(t)[1, 0] == 30
    assert nn.OH_NNTensor_Destroy(row) == R.OH_NN_SUCCESS  # leaves the memory alone
    assert nn.OH_NNTensor_GetDataBuffer(t)[1, 0] == 30
    assert nn.OH_NNTensor_CreateWithFd(REF, d, fd, 24, 24) is None  # size <= offset
    assert nn.OH_NNTensor_CreateWithFd(REF, d, fd, 20, 0) is None  # smaller than the desc
    assert nn.OH_NNTensor_GetTensorDesc(t).shape == [2, 3]
    assert nn.OH_NNTensor_Destroy(t) == R.OH_NN_SUCCESS
    assert nn.OH_NNTensor_Destroy(t) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNTensor_GetDataBuffer(t) is None


def test_tensor_sizes_and_dynamic_shapes(caplog: pytest.LogCaptureFixture) -> None:
    dyn = desc(shape=[-1, 3])
    assert nn.OH_NNTensor_Create(REF, dyn) is None  # a dynamic shape needs a size
    t = nn.OH_NNTensor_CreateWithSize(REF, dyn, 100)
    assert nn.OH_NNTensor_GetSize(t) == (R.OH_NN_SUCCESS, 100)
    assert nn.OH_NNTensor_CreateWithSize(REF, desc(shape=[2, 3]), 23) is None  # < 24 bytes
    assert nn.OH_NNTensor_Create(12345, desc()) is None  # no such device
    assert nn.OH_NNTensor_CreateWithSize(REF, desc(shape=[4]), 1 << 50) is None
    assert "OH_NN_MEMORY_ERROR" in caplog.text  # memory the host cannot give


def test_quant_params() -> None:
    q = nn.OH_NNQuantParam_Create()
    assert nn.OH_NNQuantParam_SetScales(q, [0.5], 1) == R.OH_NN_SUCCESS
    assert nn.OH_NNQuantParam_SetZeroPoints(q, [3], 1) == R.OH_NN_SUCCESS
    assert nn.OH_NNQuantParam_SetNumBits(q, [8], 1) == R.OH_NN_SUCCESS
    assert nn.OH_NNQuantParam_SetScales(q, [0.5], 2) == R.OH_NN_INVALID_PARAMETER
    model = nn.OH_NNModel_Construct()
    nn.OH_NNModel_AddTensorToModel(model, desc(shape=[4]))
    nn.OH_NNModel_AddTensorToModel(model, desc(nn.OH_NN_INT8, [4]))
    assert nn.OH_NNModel_SetTensorQuantParams(model, 1, q) == R.OH_NN_SUCCESS
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_QUANT_DTYPE_CAST, [], [0], [1]) == 0
    nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0], [1])
    assert nn.OH_NNModel_Finish(model) == 0
    e = nn.OH_NNExecutor_Construct(built(model))
    x = np.array([0.0, 1.0, -1.0, 2.2], np.float32)
    ins, _ = tensors(e, [x])
    out = nn.OH_NNTensor_Create(REF, nn.OH_NNExecutor_CreateOutputTensorDesc(e, 0))
    assert nn.OH_NNExecutor_RunSync(e, ins, 1, [out], 1) == 0
    want = np.clip(np.round(x / 0.5) + 3, -128, 127).astype(np.int8)
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(out), want)
    assert nn.OH_NNQuantParam_Destroy(q) == R.OH_NN_SUCCESS
    assert nn.OH_NNQuantParam_Destroy(q) == R.OH_NN_INVALID_PARAMETER


# -- models ------------------------------------------------------------------------------------


def test_model_construction_rules() -> None:
    model = nn.OH_NNModel_Construct()
    for name in ("x", "y", "act", "out"):
        dt = nn.OH_NN_INT8 if name == "act" else nn.OH_NN_FLOAT32
        assert nn.OH_NNModel_AddTensorToModel(model, desc(dt, [1] if name == "act" else [2])) == 0
    assert nn.OH_NNModel_SetTensorData(model, 9, np.zeros(1, np.int8)) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNModel_SetTensorData(model, 2, np.zeros(4, np.int8)) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNModel_SetTensorType(model, 2, 9999) == R.OH_NN_INVALID_PARAMETER
    # A parameter tensor needs its type and its data before AddOperation.
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [2], [0, 1], [3]) == 2
    assert nn.OH_NNModel_SetTensorType(model, 2, nn.OH_NN_ADD_ACTIVATIONTYPE) == 0
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [2], [0, 1], [3]) == 2
    assert nn.OH_NNModel_SetTensorData(model, 2, np.array([1], np.int8), 1) == 0
    # Another op's parameter, wrong counts, unknown ops: INVALID_PARAMETER; LSTM: UNSUPPORTED.
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_SUB, [2], [0, 1], [3]) == 2
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, [2], [0], [3]) == 2
    assert nn.OH_NNModel_AddOperation(model, 999, [], [0, 1], [3]) == 2
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_LSTM, [], [0], [3]) == R.OH_NN_UNSUPPORTED
    ops = nn.OH_NN_UInt32Array([2], 1), nn.OH_NN_UInt32Array([0, 1], 2), nn.OH_NN_UInt32Array([3])
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, *ops) == 0
    assert nn.OH_NNModel_GetAvailableOperations(model, REF) == (R.OH_NN_OPERATION_FORBIDDEN, None)
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_INVALID_PARAMETER  # no inputs/outputs named
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 2], [3]) == 2  # 2 is a parameter
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0, 1], [3]) == 0
    assert nn.OH_NNModel_SetTensorData(model, 0, np.zeros(2, np.float32)) == 2  # an input
    assert nn.OH_NNModel_Finish(model) == 0
    forbidden = R.OH_NN_OPERATION_FORBIDDEN
    assert nn.OH_NNModel_AddTensorToModel(model, desc()) == forbidden
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_ADD, *ops) == forbidden
    assert nn.OH_NNModel_Finish(model) == forbidden
    assert nn.OH_NNModel_GetAvailableOperations(model, REF) == (R.OH_NN_SUCCESS, [True])
    assert nn.OH_NNModel_Destroy(model) is None
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_INVALID_PARAMETER


def test_unsupported_parameter_value_at_finish() -> None:
    model = nn.OH_NNModel_Construct()
    nn.OH_NNModel_AddTensorToModel(model, desc(shape=[2]))
    nn.OH_NNModel_AddTensorToModel(model, desc(nn.OH_NN_INT32, [1, 2]))
    nn.OH_NNModel_AddTensorToModel(model, desc(nn.OH_NN_INT32, [1]))
    nn.OH_NNModel_AddTensorToModel(model, desc(shape=[4]))
    nn.OH_NNModel_SetTensorData(model, 1, np.array([[1, 1]], np.int32))
    nn.OH_NNModel_SetTensorType(model, 2, nn.OH_NN_PAD_PADDING_MODE)
    nn.OH_NNModel_SetTensorData(model, 2, np.array([2], np.int32))  # SYMMETRIC: translated
    nn.OH_NNModel_SetTensorData(model, 1, np.array([[3, 0]], np.int32))  # but wider than x
    assert nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_PAD, [2], [0, 1], [3]) == 0
    nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0], [3])
    assert nn.OH_NNModel_Finish(model) == R.OH_NN_INVALID_PARAMETER


# -- compilations ------------------------------------------------------------------------------


def test_compilation_needs_a_finished_model_and_forbids_edits_after_build() -> None:
    open_model = nn.OH_NNModel_Construct()
    assert nn.OH_NNCompilation_Construct(open_model) is None
    c = nn.OH_NNCompilation_Construct(add_model())
    assert nn.OH_NNExecutor_Construct(c) is None  # not built
    assert nn.OH_NNCompilation_ExportCacheToBuffer(c, bytearray(10), 10) == (4, None)
    assert nn.OH_NNCompilation_SetDevice(c, 10**6) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNCompilation_SetDevice(c, REF) == 0
    assert nn.OH_NNCompilation_Build(c) == 0
    forbidden = R.OH_NN_OPERATION_FORBIDDEN
    assert nn.OH_NNCompilation_Build(c) == forbidden
    assert nn.OH_NNCompilation_SetDevice(c, REF) == forbidden
    assert nn.OH_NNCompilation_SetPerformanceMode(c, 0) == forbidden
    assert nn.OH_NNCompilation_SetPriority(c, 0) == forbidden
    assert nn.OH_NNCompilation_EnableFloat16(c, False) == forbidden
    assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", b"m", 1) == forbidden
    assert nn.OH_NNCompilation_Destroy(c) is None


def test_unsupported_options_are_unavalidable_device() -> None:
    c = nn.OH_NNCompilation_Construct(add_model())
    nn.OH_NNCompilation_SetDevice(c, REF)
    no_device = R.OH_NN_UNAVALIDABLE_DEVICE
    assert nn.OH_NNCompilation_SetPerformanceMode(c, nn.OH_NN_PERFORMANCE_HIGH) == no_device
    assert nn.OH_NNCompilation_SetPerformanceMode(c, 9) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNCompilation_SetPriority(c, nn.OH_NN_PRIORITY_HIGH) == no_device
    assert nn.OH_NNCompilation_EnableFloat16(c, False) == R.OH_NN_SUCCESS
    # Recorded all the same: Build refuses it too while the device lacks float16.
    assert nn.OH_NNCompilation_EnableFloat16(c, True) == no_device
    assert nn.OH_NNCompilation_Build(c) == no_device
    assert nn.OH_NNCompilation_EnableFloat16(c, False) == R.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_Build(c) == R.OH_NN_SUCCESS


def test_extension_configs() -> None:
    c = nn.OH_NNCompilation_Construct(add_model())
    nn.OH_NNCompilation_SetDevice(c, REF)
    assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", b"net", 3) == 0
    assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", b"net", 3) == 2
    assert nn.OH_NNCompilation_AddExtensionConfig(c, "", b"x", 1) == 2
    assert nn.OH_NNCompilation_Build(c) == 0  # NNRt's own keys stay in this layer
    other = nn.OH_NNCompilation_Construct(add_model())
    nn.OH_NNCompilation_SetDevice(other, REF)
    assert nn.OH_NNCompilation_AddExtensionConfig(other, "vendor.key", b"1", 1) == 0
    assert nn.OH_NNCompilation_Build(other) == R.OH_NN_INVALID_PARAMETER  # the driver refuses


def test_cache_rules(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    c = nn.OH_NNCompilation_Construct(add_model())
    assert nn.OH_NNCompilation_SetCache(c, str(missing), 1) == R.OH_NN_INVALID_PATH
    assert nn.OH_NNCompilation_SetCache(c, str(tmp_path), 2**32 - 1) == R.OH_NN_INVALID_PARAMETER

    def build(version: int, dim: int = 3) -> Any:
        c = nn.OH_NNCompilation_Construct(add_model(dim=dim))
        nn.OH_NNCompilation_SetDevice(c, REF)
        assert nn.OH_NNCompilation_SetCache(c, str(tmp_path), version) == 0
        return c, nn.OH_NNCompilation_Build(c)

    assert build(2)[1] == 0  # empty: compiled and saved at version 2
    assert len(list(tmp_path.glob("*.crm"))) == 1
    assert build(2)[1] == 0  # same version: loaded
    assert build(1)[1] == R.OH_NN_INVALID_PARAMETER  # the cache is newer
    assert build(3)[1] == 0  # the cache is older: recompiled and replaced
    assert len(list(tmp_path.glob("*.crm"))) == 1
    # A damaged cache file: INVALID_FILE.
    crm = next(tmp_path.glob("*.crm"))
    data = bytearray(crm.read_bytes())
    data[-8:] = b"garbage!"
    crm.write_bytes(bytes(data))
    assert build(3)[1] == R.OH_NN_INVALID_FILE
    # A directory removed after SetCache: INVALID_PATH at Build.
    other = tmp_path / "gone"
    other.mkdir()
    c = nn.OH_NNCompilation_Construct(add_model())
    assert nn.OH_NNCompilation_SetCache(c, str(other), 1) == 0
    other.rmdir()
    assert nn.OH_NNCompilation_Build(c) == R.OH_NN_INVALID_PATH


def test_construct_for_cache(tmp_path: Path) -> None:
    empty = nn.OH_NNCompilation_ConstructForCache()
    assert nn.OH_NNCompilation_Build(empty) == R.OH_NN_INVALID_PARAMETER  # nothing to restore
    restore = nn.OH_NNCompilation_ConstructForCache()
    assert nn.OH_NNCompilation_SetCache(restore, str(tmp_path), 1) == 0
    assert nn.OH_NNCompilation_Build(restore) == R.OH_NN_INVALID_FILE  # the cache is empty


def test_export_import_and_offline_models(tmp_path: Path) -> None:
    c = built()
    ret, size = nn.OH_NNCompilation_ExportCacheToBuffer(c, bytearray(16), 16)
    assert ret == R.OH_NN_INVALID_PARAMETER  # too small
    buf = bytearray(1 << 20)
    ret, size = nn.OH_NNCompilation_ExportCacheToBuffer(c, buf, len(buf))
    assert ret == 0 and size and size > 0
    blob = bytes(buf[:size])
    restored = nn.OH_NNCompilation_ConstructForCache()
    assert nn.OH_NNCompilation_ImportCacheFromBuffer(restored, blob, size) == 0
    assert nn.OH_NNCompilation_Build(restored) == 0
    (tmp_path / "model.crm").write_bytes(blob)
    from_file = nn.OH_NNCompilation_ConstructWithOfflineModelFile(str(tmp_path / "model.crm"))
    assert nn.OH_NNCompilation_Build(from_file) == 0
    from_buffer = nn.OH_NNCompilation_ConstructWithOfflineModelBuffer(blob, size)
    assert nn.OH_NNCompilation_Build(from_buffer) == 0
    x, y = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    for comp in (restored, from_file, from_buffer):
        e = nn.OH_NNExecutor_Construct(comp)
        ins, outs = tensors(e, [x, y])
        assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == 0
        assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(outs[0]), x + y)
        nn.OH_NNExecutor_Destroy(e)
    assert nn.OH_NNCompilation_ConstructWithOfflineModelFile(str(tmp_path / "no.crm")) is None
    bad = nn.OH_NNCompilation_ConstructWithOfflineModelBuffer(b"not a crm at all", 16)
    assert nn.OH_NNCompilation_Build(bad) == R.OH_NN_INVALID_FILE
    damaged = nn.OH_NNCompilation_ConstructForCache()
    nn.OH_NNCompilation_ImportCacheFromBuffer(damaged, blob[:-10] + b"0123456789", size)
    assert nn.OH_NNCompilation_Build(damaged) == R.OH_NN_INVALID_FILE


def _offline(device: int) -> tuple[bytes, int]:
    """add_model compiled for ``device``, exported as an offline model's bytes."""
    c = built(device=device)
    buf = bytearray(1 << 20)
    ret, size = nn.OH_NNCompilation_ExportCacheToBuffer(c, buf, len(buf))
    assert ret == 0
    return bytes(buf[:size]), size


def test_an_offline_model_takes_the_settings_it_can_and_refuses_the_rest() -> None:
    """Issue 27.4: SetDevice and the performance mode were silently ignored for an offline
    model. Now the mode takes effect (it is read at load: ORT's thread count), and a device
    the compiled model is not for is refused. (No CPU driver honours priorities: SetPriority
    refuses them at once, OH_NN_UNAVALIDABLE_DEVICE.)"""
    ort = nn.device_id("onnxruntime")
    blob, size = _offline(ort)
    other = nn.OH_NNCompilation_ConstructWithOfflineModelBuffer(blob, size)
    assert nn.OH_NNCompilation_SetDevice(other, REF) == 0
    assert nn.OH_NNCompilation_Build(other) == R.OH_NN_INVALID_PARAMETER  # was SUCCESS
    same = nn.OH_NNCompilation_ConstructWithOfflineModelBuffer(blob, size)
    assert nn.OH_NNCompilation_SetDevice(same, ort) == 0
    assert nn.OH_NNCompilation_SetPerformanceMode(same, nn.OH_NN_PERFORMANCE_LOW) == 0
    assert nn.OH_NNCompilation_Build(same) == 0
    assert same.exe.options.performance_mode.name == "LOW"  # what the runtime loads with
    e = nn.OH_NNExecutor_Construct(same)
    x, y = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    ins, outs = tensors(e, [x, y])
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == 0
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(outs[0]), x + y)
    nn.OH_NNExecutor_Destroy(e)


def test_float16_on_an_offline_model_compiled_at_float32_is_refused() -> None:
    import crossrt

    able = [
        (s.name, d.id)
        for s in crossrt.drivers.driver_statuses()
        if s.driver is not None
        for d in s.driver.devices()
        if d.capabilities.fp16
    ]
    if not able:
        pytest.skip("no device here computes in float16")
    device = nn.device_id(*able[0])
    blob, size = _offline(device)
    half = nn.OH_NNCompilation_ConstructWithOfflineModelBuffer(blob, size)
    assert nn.OH_NNCompilation_SetDevice(half, device) == 0
    assert nn.OH_NNCompilation_EnableFloat16(half, True) == 0
    assert nn.OH_NNCompilation_Build(half) == R.OH_NN_OPERATION_FORBIDDEN  # was SUCCESS


# -- executors ---------------------------------------------------------------------------------


def test_executor_io_descs_and_run_sync() -> None:
    e = nn.OH_NNExecutor_Construct(built())
    assert nn.OH_NNExecutor_GetInputCount(e) == (0, 2)
    assert nn.OH_NNExecutor_GetOutputCount(e) == (0, 1)
    d = nn.OH_NNExecutor_CreateInputTensorDesc(e, 1)
    assert nn.OH_NNTensorDesc_GetName(d) == (0, "y")
    assert nn.OH_NNTensorDesc_GetShape(d) == (0, [2, 3])
    assert nn.OH_NNTensorDesc_GetDataType(d) == (0, nn.OH_NN_FLOAT32)
    assert nn.OH_NNExecutor_CreateInputTensorDesc(e, 2) is None
    assert nn.OH_NNExecutor_GetInputDimRange(e, 0) == (0, ([2, 3], [2, 3]))
    assert nn.OH_NNExecutor_GetOutputShape(e, 0) == (0, [2, 3])
    assert nn.OH_NNExecutor_GetOutputShape(e, 5) == (2, None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ins, outs = tensors(e, [x, x])
    assert nn.OH_NNExecutor_RunSync(e, ins, 1, outs, 1) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == 0
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(outs[0]), 2 * x)
    nn.OH_NNExecutor_Destroy(e)
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == R.OH_NN_INVALID_PARAMETER


def test_dynamic_shapes() -> None:
    e = nn.OH_NNExecutor_Construct(built(add_model([-1, 3])))
    ret, (mins, maxs) = nn.OH_NNExecutor_GetInputDimRange(e, 0)
    assert ret == 0 and mins == [1, 3] and maxs == [nn.executor.DIM_MAX, 3]
    d = nn.OH_NNExecutor_CreateInputTensorDesc(e, 0)
    assert nn.OH_NNTensorDesc_GetShape(d) == (0, [-1, 3])
    assert nn.OH_NNExecutor_GetOutputShape(e, 0) == (R.OH_NN_OPERATION_FORBIDDEN, None)
    nn.OH_NNTensorDesc_SetShape(d, [4, 3])
    ins = [nn.OH_NNTensor_Create(REF, d) for _ in range(2)]
    for t in ins:
        nn.OH_NNTensor_GetDataBuffer(t)[...] = 1.5
    out = nn.OH_NNTensor_CreateWithSize(REF, nn.OH_NNExecutor_CreateOutputTensorDesc(e, 0), 96)
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, [out], 1) == 0
    assert nn.OH_NNExecutor_GetOutputShape(e, 0) == (0, [4, 3])
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(out), np.full((4, 3), 3.0))


def test_run_async_calls_on_run_done() -> None:
    e = nn.OH_NNExecutor_Construct(built())
    x = np.ones((2, 3), np.float32)
    ins, outs = tensors(e, [x, x])
    done = threading.Event()
    calls: list[tuple[Any, ...]] = []

    def on_done(user_data: Any, code: Any, out: list[Any], count: int) -> None:
        calls.append((user_data, code, out, count))
        done.set()

    assert nn.OH_NNExecutor_SetOnRunDone(e, "not callable") == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNExecutor_SetOnRunDone(e, on_done) == 0
    assert nn.OH_NNExecutor_RunAsync(e, ins, 2, outs, 1, -1, None) == R.OH_NN_INVALID_PARAMETER
    assert nn.OH_NNExecutor_RunAsync(e, ins, 2, outs, 1, 5000, "me") == 0
    assert done.wait(10)
    assert calls == [("me", R.OH_NN_SUCCESS, outs, 1)]
    assert np.array_equal(nn.OH_NNTensor_GetDataBuffer(outs[0]), 2 * x)


def _slow_model(n: int = 700) -> Any:
    """x @ x @ x ... on an [n, n] input: a run that takes a while on the reference driver."""
    model = nn.OH_NNModel_Construct()
    for _ in range(6):
        nn.OH_NNModel_AddTensorToModel(model, desc(shape=[n, n]))
    for k in range(5):
        nn.OH_NNModel_AddOperation(model, nn.OH_NN_OPS_MATMUL, [], [k, 0] if k else [0, 0], [k + 1])
    nn.OH_NNModel_SpecifyInputsAndOutputs(model, [0], [5])
    assert nn.OH_NNModel_Finish(model) == 0
    return model


def test_run_async_timeout_gives_no_outputs() -> None:
    e = nn.OH_NNExecutor_Construct(built(_slow_model()))
    x = np.eye(700, dtype=np.float32)
    ins, first = tensors(e, [x])
    _, late = tensors(e, [x])
    nn.OH_NNTensor_GetDataBuffer(late[0])[...] = -7.0
    codes: list[Any] = []
    finished = threading.Event()

    def on_done(user_data: Any, code: Any, out: list[Any], count: int) -> None:
        codes.append((user_data, code, count))
        if len(codes) == 2:
            finished.set()

    nn.OH_NNExecutor_SetOnRunDone(e, on_done)
    assert nn.OH_NNExecutor_RunAsync(e, ins, 1, first, 1, 0, "first") == 0
    assert nn.OH_NNExecutor_RunAsync(e, ins, 1, late, 1, 1, "late") == 0  # 1 ms: too short
    assert finished.wait(30)
    assert ("late", R.OH_NN_TIMEOUT, 0) in codes and ("first", R.OH_NN_SUCCESS, 1) in codes
    assert (nn.OH_NNTensor_GetDataBuffer(late[0]) == -7.0).all()  # untouched


def test_connection_exception_and_service_died_when_the_runtime_goes() -> None:
    e = nn.OH_NNExecutor_Construct(built(_slow_model()))
    x = np.eye(700, dtype=np.float32)
    ins, outs = tensors(e, [x])
    died = threading.Event()
    nn.OH_NNExecutor_SetOnServiceDied(e, lambda user_data: died.set())
    assert nn.OH_NNExecutor_SetOnServiceDied(e, None) == R.OH_NN_INVALID_PARAMETER
    for _ in range(3):
        nn.OH_NNExecutor_RunAsync(e, ins, 1, outs, 1, 0, None)
    nn.runtime().close()
    assert died.wait(30)
    assert nn.OH_NNExecutor_RunSync(e, ins, 1, outs, 1) == R.OH_NN_CONNECTION_EXCEPTION


# -- devices -----------------------------------------------------------------------------------


def test_devices() -> None:
    ret, ids = nn.OH_NNDevice_GetAllDevicesID()
    assert ret == 0 and ids and ids[0] == 0
    names = [nn.OH_NNDevice_GetName(i)[1] for i in ids]
    assert "reference/cpu:0" in names and nn.OH_NNDevice_GetName(REF)[1] == "reference/cpu:0"
    assert nn.OH_NNDevice_GetType(REF) == (0, nn.OH_NN_CPU)
    sims = [i for i, n in zip(ids, names, strict=True) if n and n.startswith("sim/")]
    if sims:
        assert nn.OH_NNDevice_GetType(sims[0]) == (0, nn.OH_NN_ACCELERATOR)
    assert nn.OH_NNDevice_GetName(max(ids) + 1) == (R.OH_NN_INVALID_PARAMETER, None)
    assert nn.OH_NNDevice_GetType(-1) == (R.OH_NN_INVALID_PARAMETER, None)
    # Device 0 (the first) builds and runs too.
    e = nn.OH_NNExecutor_Construct(built(device=0))
    x = np.ones((2, 3), np.float32)
    ins, outs = tensors(e, [x, x])
    assert nn.OH_NNExecutor_RunSync(e, ins, 2, outs, 1) == 0
    assert os.environ.get("CROSSRT_RUNTIME_DIR")  # this test's own core locks


def test_enable_float16_is_precision_fp16() -> None:
    import crossrt
    from crossrt.compat.nnrt.compilation import compilation_of

    able = [
        (s.name, d.id)
        for s in crossrt.drivers.driver_statuses()
        if s.driver is not None
        for d in s.driver.devices()
        if d.capabilities.fp16
    ]
    if not able:  # no device here computes in float16
        c = nn.OH_NNCompilation_Construct(add_model())
        nn.OH_NNCompilation_SetDevice(c, REF)
        assert nn.OH_NNCompilation_EnableFloat16(c, True) == R.OH_NN_UNAVALIDABLE_DEVICE
        return
    c = nn.OH_NNCompilation_Construct(add_model())
    assert nn.OH_NNCompilation_SetDevice(c, nn.device_id(*able[0])) == R.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_EnableFloat16(c, True) == R.OH_NN_SUCCESS
    assert nn.OH_NNCompilation_Build(c) == R.OH_NN_SUCCESS
    exe = compilation_of(c).exe
    assert exe is not None and exe.options.precision == "fp16"


def test_nnrt_keys_with_no_effect_are_warned_of_once_by_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27.4: isProfiling, AIPP... were recorded and dropped without a word."""
    from crossrt.compat.nnrt import compilation

    caplog.set_level(logging.WARNING, logger="crossrt")  # another test may have raised it
    monkeypatch.setattr(compilation, "_warned", set())
    for _ in range(2):
        c = nn.OH_NNCompilation_Construct(add_model())
        assert nn.OH_NNCompilation_SetDevice(c, REF) == 0
        assert nn.OH_NNCompilation_AddExtensionConfig(c, "isProfiling", b"1", 1) == 0
        assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", b"net", 3) == 0
        assert nn.OH_NNCompilation_Build(c) == 0
    warned = [r.getMessage() for r in caplog.records if "no effect here" in r.getMessage()]
    assert len(warned) == 1 and "isProfiling" in warned[0]  # once; ModelName takes effect
