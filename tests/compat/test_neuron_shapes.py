"""A Neuron port of a model with a dynamic batch dimension: compiled with concrete shapes
(``crossrt.compile(shapes=)``, ``crossrt compile --shape``), its tensor info, ``crossrt
inspect`` and ``nrt_execute`` have concrete sizes and raw onnxruntime's answer; a model left
dynamic is refused at ``nrt_load`` with the way to fix it."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import crossrt
from crossrt.compat import neuron as nrt
from crossrt.errors import InvalidOptionError
from crossrt.model import GraphBuilder
from crossrt.tools import compile as compile_tool
from crossrt.tools import inspect as inspect_tool

W = np.arange(64, dtype=np.float32).reshape(16, 4) / 64 - 0.5


def batched() -> crossrt.Model:
    """y = relu(x @ W), x float32 [N, 16]: the batch dimension an exporter writes."""
    b = GraphBuilder("batched")
    x = b.input("x", "float32", ["N", 16])
    b.output(b.op("Relu", [b.op("MatMul", [x, b.constant(W)])], outputs=["y"]))
    return b.finish()


def _load(data: bytes) -> tuple[nrt.NRT_STATUS, Any]:
    result: tuple[nrt.NRT_STATUS, Any] = nrt.nrt_load(data, len(data), -1, -1)
    return result


def _execute(model: Any, x: np.ndarray) -> np.ndarray:
    _, info = nrt.nrt_get_model_tensor_info(model)
    _, inputs = nrt.nrt_allocate_tensor_set()
    _, outputs = nrt.nrt_allocate_tensor_set()
    for t in info.tensor_array:
        _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_DEVICE, 0, t.size, t.name)
        if t.usage == nrt.NRT_TENSOR_USAGE_INPUT:
            assert nrt.nrt_tensor_write(tensor, x, 0, t.size) == nrt.NRT_SUCCESS
            nrt.nrt_add_tensor_to_tensor_set(inputs, t.name, tensor)
        else:
            nrt.nrt_add_tensor_to_tensor_set(outputs, t.name, tensor)
    assert nrt.nrt_execute(model, inputs, outputs) == nrt.NRT_SUCCESS
    _, y = nrt.nrt_get_tensor_from_tensor_set(outputs, "y")
    buf = bytearray(nrt.nrt_tensor_get_size(y))
    assert nrt.nrt_tensor_read(y, buf, 0, len(buf)) == nrt.NRT_SUCCESS
    return np.frombuffer(buf, np.float32)


def _raw_ort(x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(batched().to_bytes(), providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(None, {"x": x})[0]
    return out


@pytest.mark.parametrize("how", ["shapes", "one stage"])
def test_concrete_shapes_give_concrete_tensors(neuron: None, how: str) -> None:
    if how == "shapes":
        exe = crossrt.compile(batched(), "cpu", shapes={"x": [2, 16]})
        assert [s.shape for s in exe.inputs] == [(2, 16)]
        assert [s.shape for s in exe.outputs] == [(2, 4)]
    else:  # a network of one stage is that stage, as a NEFF
        exe = crossrt.compile(batched(), "cpu", stages=[{"x": [2, 16]}])
    status, model = _load(exe.to_bytes())
    assert status == nrt.NRT_SUCCESS
    _, info = nrt.nrt_get_model_tensor_info(model)
    got = [(t.name, t.size, list(t.shape)) for t in info.tensor_array]
    assert got == [("x", 2 * 16 * 4, [2, 16]), ("y", 2 * 4 * 4, [2, 4])]  # main: 0 and [0, 16]
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(_execute(model, x).reshape(2, 4), _raw_ort(x))


def test_a_dynamic_model_is_refused_with_the_fix(neuron: None, caplog: Any) -> None:
    status, model = _load(crossrt.compile(batched(), "cpu").to_bytes())
    assert (status, model) == (nrt.NRT_INVALID, None)  # main: NRT_SUCCESS, then size 0
    assert "--shape x=" in caplog.text and "shapes=" in caplog.text
    two = crossrt.compile(batched(), "cpu", stages=[{"x": [1, 16]}, {"x": [2, 16]}])
    assert _load(two.to_bytes()) == (nrt.NRT_INVALID, None)


def test_shapes_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match="'z'"):
        crossrt.compile(batched(), "cpu", shapes={"z": [1, 16]})
    with pytest.raises(InvalidOptionError, match="dim 1"):
        crossrt.compile(batched(), "cpu", shapes={"x": [1, 8]})  # 16 is the model's
    with pytest.raises(InvalidOptionError, match="stages"):
        crossrt.compile(batched(), "cpu", shapes={"x": [1, 16]}, stages=[{"x": [1, 16]}])
    b = GraphBuilder("two")
    x, y = b.input("x", "float32", ["N", 2]), b.input("y", "float32", ["N", 2])
    b.output(b.op("Add", [x, y], outputs=["z"]))
    with pytest.raises(InvalidOptionError, match="'y'"):
        crossrt.compile(b.finish(), "cpu", shapes={"x": [1, 2]})  # y left dynamic


def test_the_cli_compiles_and_inspects_concrete_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "batched.onnx", tmp_path / "batched.crm"
    batched().save(source)
    assert compile_tool.main([str(source), "--shape", "x=1x16", "-o", str(out)]) == 0
    exe = crossrt.load_executable(out)
    assert [s.shape for s in exe.inputs] == [(1, 16)]
    capsys.readouterr()
    assert inspect_tool.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"x\s+float32 \[1,16\]", text) and re.search(r"y\s+float32 \[1,4\]", text)
    assert compile_tool.main([str(source), "--shape", "x=0x16", "-o", str(out)]) != 0


@pytest.fixture(autouse=True)
def _errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="crossrt.compat.neuron")
