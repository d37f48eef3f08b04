"""Device 0 is the same device in every seed layer: the machine's default device
(``CROSSRT_DEFAULT_DEVICE``, ``cpu`` when unset), so a ``.crm`` compiled with the defaults
loads on device 0 of each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat import bmruntime as bm
from crossrt.compat import neuron as nrt
from crossrt.compat import nnrt as nn
from crossrt.model import GraphBuilder


def _model() -> crossrt.Model:
    b = GraphBuilder("double")
    x = b.input("x", "float32", [2, 4])
    b.output(b.op("Add", [x, x], outputs=["y"]))
    return b.finish()


def _device_0_of_each_layer() -> tuple[str, str, str]:
    _, handle = bm.bm_dev_request(0)
    bm_device = handle.device.id
    bm.bm_dev_free(handle)
    _, nn_name = nn.OH_NNDevice_GetName(0)
    _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, 8, "t")
    nrt_device = tensor.device
    nrt.nrt_tensor_free(tensor)
    return bm_device, nn_name, nrt_device


def test_device_0_is_the_default_device(neuron: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROSSRT_DEFAULT_DEVICE", raising=False)
    # main: sim:0 for BMRuntime, onnxruntime/cpu:0 for NNRt
    assert _device_0_of_each_layer() == ("cpu:0", "onnxruntime/cpu:0", "cpu:0")
    monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", "sim:0")
    # main: sim:0, but onnxruntime/cpu:0 for NNRt and the tensors on sim:0
    assert _device_0_of_each_layer() == ("sim:0", "sim/sim:0", "sim:0")


def test_a_crm_compiled_with_the_defaults_loads_on_bm_device_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CROSSRT_DEFAULT_DEVICE", raising=False)
    path = tmp_path / "double.crm"
    crossrt.compile(_model()).save(path)  # the CLI's default: cpu
    _, handle = bm.bm_dev_request(0)
    p_bmrt = bm.bmrt_create(handle)
    assert bm.bmrt_load_bmodel(p_bmrt, path)  # main: False (BM_ERR_PARAM: cpu on sim:0)
    inputs, outputs = [bm.bm_tensor_t()], [bm.bm_tensor_t()]
    bm.bmrt_tensor(inputs[0], p_bmrt, bm.BM_FLOAT32, bm.bm_shape_t.of([2, 4]))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert bm.bm_memcpy_s2d(handle, inputs[0].device_mem, x) == bm.BM_SUCCESS
    assert bm.bmrt_launch_tensor(p_bmrt, "double", inputs, 1, outputs, 1)
    assert bm.bm_thread_sync(handle) == bm.BM_SUCCESS
    y = np.empty((2, 4), np.float32)
    assert bm.bm_memcpy_d2s(handle, y, outputs[0].device_mem) == bm.BM_SUCCESS
    np.testing.assert_array_equal(y, 2 * x)
    bm.bmrt_destroy(p_bmrt)
    bm.bm_dev_free(handle)
