"""``crossrt verify MODEL --compare DIR``: a model checked against bmrt_test-style reference
data files (raw tensors one after another), an ONNX model on each driver or a .crm as it was
compiled. The round trip with BMRuntime's BMRT_SAVE_IO_TENSORS is in
tests/compat/test_bmruntime_compare.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import crossrt
from crossrt.tools import verify

W = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
X = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)


def _model() -> onnx.ModelProto:
    """y = x @ W and k = argmax(y): a float and an integer output, a dynamic batch."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"]),
            helper.make_node("ArgMax", ["y"], ["k"], axis=1),
        ],
        "mm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 32]),
            helper.make_tensor_value_info("k", onnx.TensorProto.INT64, ["n", 1]),
        ],
        [numpy_helper.from_array(W, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    onnx.save(_model(), tmp_path / "mm.onnx")
    crossrt.compile(tmp_path / "mm.onnx", shapes={"x": [3, 64]}).save(tmp_path / "mm.crm")
    ref = tmp_path / "ref"
    ref.mkdir()
    y = X @ W
    (ref / "input_ref_data.dat").write_bytes(X.tobytes())
    (ref / "output_ref_data.dat").write_bytes(y.tobytes() + y.argmax(1).astype(np.int64).tobytes())
    return {"onnx": tmp_path / "mm.onnx", "crm": tmp_path / "mm.crm", "ref": ref}


def _report(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_every_driver_passes_against_the_reference_data(files, capsys):
    argv = [str(files["onnx"]), "--compare", str(files["ref"]), "--shape", "x=3x64", "--json"]
    assert verify.main(argv) == 0
    report = _report(capsys)
    assert report["oracle"] == f"reference data in {files['ref']}"
    assert report["inputs"] == {"x": [3, 64]}
    rows = {r["target"]: r for r in report["targets"]}
    assert rows["onnxruntime"]["result"] == "PASS"
    assert {r["result"] for r in rows.values()} <= {"PASS", "SKIP"}


def test_a_crm_runs_as_compiled_against_the_data(files, capsys):
    assert verify.main([str(files["crm"]), "--compare", str(files["ref"]), "--json"]) == 0
    (row,) = _report(capsys)["targets"]
    assert row["target"] == "crm" and row["result"] == "PASS"


def test_wrong_reference_outputs_fail(files, capsys):
    y = X @ W
    k = y.argmax(1).astype(np.int64)
    out = files["ref"] / "output_ref_data.dat"
    out.write_bytes((y * 1.1).tobytes() + k.tobytes())  # floats off by 10 %
    assert verify.main([str(files["crm"]), "--compare", str(files["ref"]), "--json"]) == 1
    (row,) = _report(capsys)["targets"]
    assert row["result"] == "FAIL" and "> tolerance 0.01" in row["reason"]
    out.write_bytes(y.tobytes() + (k + 1).tobytes())  # floats right, integers one off
    assert verify.main([str(files["crm"]), "--compare", str(files["ref"]), "--json"]) == 1
    (row,) = _report(capsys)["targets"]
    assert row["reason"] == "integer outputs differ: k"
    out.write_bytes(y.tobytes())  # the integer output missing
    assert verify.main([str(files["crm"]), "--compare", str(files["ref"]), "--json"]) == 1
    (row,) = _report(capsys)["targets"]
    assert "holds 384 bytes" in row["reason"] and "take 408" in row["reason"]


def test_inputs_that_do_not_fit_the_data_say_which_flag_to_give(files, capsys):
    assert verify.main([str(files["onnx"]), "--compare", str(files["ref"])]) == 1
    assert "give its shape in the reference data as --shape x=DxD" in capsys.readouterr().err
    argv = [str(files["onnx"]), "--compare", str(files["ref"]), "--shape", "x=2x64"]
    assert verify.main(argv) == 1
    assert "holds 768 bytes" in capsys.readouterr().err
    empty = files["ref"].parent / "empty"
    empty.mkdir()
    assert verify.main([str(files["crm"]), "--compare", str(empty)]) == 1
    assert "holds none of input_ref_data.dat" in capsys.readouterr().err
