"""ONNX Runtime's documented Python examples, each run twice: with ``import onnxruntime`` and
with ``import crossrt.onnxruntime`` (the one line a program changes), giving the same results,
bit for bit, and the same exceptions by ORT's class names.

Each function follows one page of ORT's documentation step by step (named in its docstring),
written against a module ``rt`` so that the module is the only difference; it returns what the
page prints. The pages' own models come from the onnxruntime wheel (``onnxruntime.datasets``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from onnxruntime.datasets import get_example

import crossrt.onnxruntime as crossrt_ort
from crossrt.onnxruntime.capi import onnxruntime_pybind11_state as crossrt_state

pytestmark = pytest.mark.usefixtures("runtime_dir")
Example = Callable[[ModuleType, ModuleType, Path], list[Any]]
STATES = {ort: ort_state, crossrt_ort: crossrt_state}


def load_and_predict(rt: ModuleType, state: ModuleType, tmp: Path) -> list[Any]:
    """ "Load and predict with ONNX Runtime and a very simple model" (plot_load_and_predict):
    sigmoid.onnx, its input's and output's name, shape and type, then a run."""
    sess = rt.InferenceSession(get_example("sigmoid.onnx"))
    printed: list[Any] = []
    for arg in (sess.get_inputs()[0], sess.get_outputs()[0]):
        printed += [arg.name, arg.shape, arg.type]
    x = np.random.default_rng(0).random((3, 4, 5)).astype(np.float32)
    printed.append(sess.run([sess.get_outputs()[0].name], {sess.get_inputs()[0].name: x}))
    return printed


def common_errors(rt: ModuleType, state: ModuleType, tmp: Path) -> list[Any]:
    """ "Common errors with onnxruntime" (plot_common_errors): logreg_iris.onnx with
    ``providers=rt.get_available_providers()``, run with a wrong dtype, a misspelled output
    and input name, ``None`` for every output, and inputs of other shapes and ranks."""
    sess = rt.InferenceSession(
        get_example("logreg_iris.onnx"), providers=rt.get_available_providers()
    )
    input_name = sess.get_inputs()[0].name
    output_name = sess.get_outputs()[0].name
    printed: list[Any] = []

    def attempt(names: Any, feed: dict[str, Any]) -> None:
        try:
            printed.append(sess.run(names, feed))
        except (RuntimeError, state.InvalidArgument, ValueError) as e:
            printed.append(_failure(e))

    good = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
    attempt([output_name], {input_name: good.astype(np.float64)})
    attempt(["misspelled"], {input_name: good})
    attempt(None, {input_name: good})
    attempt([output_name], {"misspelled": good})
    for x in (
        np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32),
        np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32),
        np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
        np.array([[[1.0, 2.0], [3.0, 4.0]]], dtype=np.float32),
        np.array([[[1.0, 2.0]], [[3.0, 4.0]]], dtype=np.float32),
    ):
        attempt([output_name], {input_name: x})
        attempt(None, {input_name: x})
    return printed


def metadata(rt: ModuleType, state: ModuleType, tmp: Path) -> list[Any]:
    """ "Metadata" (plot_metadata): logreg_iris.onnx's ``get_modelmeta()``, field by field."""
    sess = rt.InferenceSession(
        get_example("logreg_iris.onnx"), providers=rt.get_available_providers()
    )
    meta = sess.get_modelmeta()
    fields = ("custom_metadata_map", "description", "domain", "graph_name", "producer_name")
    return [getattr(meta, f) for f in (*fields, "version", "graph_description")]


def api_summary(rt: ModuleType, state: ModuleType, tmp: Path) -> list[Any]:
    """The API summary's CPU snippets (onnxruntime.ai/docs/api/python/api_summary): an
    OrtValue from NumPy and what it says of itself, fed to ``run``; then IOBinding with a CPU
    input and an output ORT allocates, inputs and outputs bound by address, an output
    allocated and read with ``get_outputs()``, and OrtValues bound directly."""
    model = _add_model(tmp)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    printed: list[Any] = []
    ortvalue = rt.OrtValue.ortvalue_from_numpy(x)
    printed += [ortvalue.device_name(), ortvalue.shape(), ortvalue.data_type()]
    printed += [ortvalue.is_tensor(), np.array_equal(ortvalue.numpy(), x)]
    session = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    printed.append(session.run(["output"], {"input": ortvalue}))

    io_binding = session.io_binding()
    io_binding.bind_cpu_input("input", x)
    io_binding.bind_output("output")
    session.run_with_iobinding(io_binding)
    printed.append(io_binding.copy_outputs_to_cpu()[0])

    x_ortvalue = rt.OrtValue.ortvalue_from_numpy(x, "cpu", 0)
    y_ortvalue = rt.OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32, "cpu", 0)
    io_binding = session.io_binding()
    io_binding.bind_input(
        name="input",
        device_type=x_ortvalue.device_name(),
        device_id=0,
        element_type=np.float32,
        shape=x_ortvalue.shape(),
        buffer_ptr=x_ortvalue.data_ptr(),
    )
    io_binding.bind_output(
        name="output",
        device_type=y_ortvalue.device_name(),
        device_id=0,
        element_type=np.float32,
        shape=y_ortvalue.shape(),
        buffer_ptr=y_ortvalue.data_ptr(),
    )
    session.run_with_iobinding(io_binding)
    printed.append(y_ortvalue.numpy().copy())

    io_binding = session.io_binding()
    io_binding.bind_input(
        name="input",
        device_type=x_ortvalue.device_name(),
        device_id=0,
        element_type=np.float32,
        shape=x_ortvalue.shape(),
        buffer_ptr=x_ortvalue.data_ptr(),
    )
    io_binding.bind_output("output", "cpu")
    session.run_with_iobinding(io_binding)
    ort_output = io_binding.get_outputs()[0]
    printed += [ort_output.numpy(), ort_output.shape(), ort_output.data_type()]

    y_ortvalue = rt.OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32, "cpu", 0)
    io_binding = session.io_binding()
    io_binding.bind_ortvalue_input("input", x_ortvalue)
    io_binding.bind_ortvalue_output("output", y_ortvalue)
    session.run_with_iobinding(io_binding)
    printed.append(y_ortvalue.numpy().copy())
    return printed


def inference_examples_api(rt: ModuleType, state: ModuleType, tmp: Path) -> list[Any]:
    """onnxruntime-inference-examples python/api/onnxruntime-python-api.py on the CPU: x + y
    with dynamic lengths, run on NumPy arrays, then with OrtValues bound by address and an
    output of the input's shape bound without memory (``get_outputs()``)."""
    model = _add_model(tmp, inputs=("x", "y"), output="z", dims=["array_length"])
    session = rt.InferenceSession(model, providers=rt.get_available_providers())
    printed: list[Any] = [
        session.run(["z"], {"x": np.float32([1, 2, 3]), "y": np.float32([4, 5, 6])})[0]
    ]
    x = y = np.float32([1.0, 2.0, 3.0, 4.0, 5.0])
    x_ortvalue = rt.OrtValue.ortvalue_from_numpy(x, "cpu", 0)
    y_ortvalue = rt.OrtValue.ortvalue_from_numpy(y, "cpu", 0)
    io_binding = session.io_binding()
    for name, value in (("x", x_ortvalue), ("y", y_ortvalue)):
        io_binding.bind_input(
            name=name,
            device_type=value.device_name(),
            device_id=0,
            element_type=x.dtype,
            shape=value.shape(),
            buffer_ptr=value.data_ptr(),
        )
    io_binding.bind_output(
        name="z", device_type="cpu", device_id=0, element_type=x.dtype, shape=x_ortvalue.shape()
    )
    session.run_with_iobinding(io_binding)
    printed.append(io_binding.get_outputs()[0].numpy())
    return printed


EXAMPLES: dict[str, Example] = {
    "load_and_predict": load_and_predict,
    "common_errors": common_errors,
    "metadata": metadata,
    "api_summary": api_summary,
    "inference_examples_api": inference_examples_api,
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_gives_what_onnxruntime_gives(name: str, tmp_path: Path) -> None:
    example = EXAMPLES[name]
    expected = example(ort, ort_state, tmp_path / "ort")
    got = example(crossrt_ort, crossrt_state, tmp_path / "crossrt")
    _same(got, expected)


def _failure(e: BaseException) -> tuple[str, ...]:
    """What a failure is, by ORT's class name: the names of its class and the classes above
    it (ORT raises a builtin ValueError for a missing input, crossrt an InvalidArgument that
    is a ValueError; both say which class is ORT's)."""
    return ("failed", *(c.__name__ for c in type(e).__mro__))


def _same(got: Any, expected: Any) -> None:
    if isinstance(expected, tuple) and expected[:1] == ("failed",):
        assert isinstance(got, tuple) and got[:1] == ("failed",), f"{got!r} for {expected!r}"
        assert expected[1] in got[1:], f"ORT raised {expected[1]}, crossrt {got[1]}"
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected), f"{got} != {expected}"
        return
    if isinstance(expected, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected, strict=True):
            _same(g, e)
        return
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for k in expected:
            _same(got[k], expected[k])
        return
    assert got == expected


def _add_model(
    folder: Path,
    inputs: tuple[str, ...] = ("input",),
    output: str = "output",
    dims: list[Any] | None = None,
) -> str:
    """``output = input + 1`` on float32 [3, 2] (or the sum of two inputs of ``dims``),
    saved in ``folder``: the API summary's "model.onnx"."""
    from onnx import TensorProto, helper, save

    shape = dims or [3, 2]
    if len(inputs) == 1:
        node = helper.make_node("Add", [inputs[0], "one"], [output])
        init = [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    else:
        node, init = helper.make_node("Add", list(inputs), [output]), []
    graph = helper.make_graph(
        [node],
        "model",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)],
        init,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    save(proto, str(path))
    return str(path)
