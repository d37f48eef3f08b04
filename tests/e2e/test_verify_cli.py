"""``crossrt verify``: each engine's outputs against the reference driver's, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt.tools import verify
from small_models import relu


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def _graph(nodes: list[onnx.NodeProto], inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def relu_file(tmp_path: Path) -> Path:
    return _save(relu().proto, tmp_path / "relu.onnx")


def test_every_driver_of_the_device_passes_on_a_plain_model(
    relu_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify.main([str(relu_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("'relu' on cpu, inputs x [2, 3], against the reference driver")
    rows = {line.split()[0]: line.split()[1] for line in lines[2:]}
    cpu = {
        s.name
        for s in crossrt.drivers.driver_statuses()
        if s.driver is not None and s.name != "reference"
        and any(d.id.startswith("cpu") for d in s.driver.devices())
    }  # fmt: skip
    assert set(rows) == cpu and set(rows.values()) == {"PASS"}


def test_answers_that_differ_fail_with_exit_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random numbers: every engine draws its own, so no engine matches the reference."""
    model = _graph(
        [helper.make_node("RandomUniform", [], ["y"], shape=[64], seed=1.0)],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
    )
    path = _save(model, tmp_path / "random.onnx")
    assert verify.main([str(path), "--driver", "onnxruntime", "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)["targets"]
    assert row["result"] == "FAIL" and row["error"] > 1e-4
    assert row["reason"].startswith("error ") and "> tolerance 0.0001" in row["reason"]


def test_a_driver_that_cannot_run_the_model_is_skipped_unless_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ONNX Runtime has no int16 Max kernel; the reference driver has."""
    spec = helper.make_tensor_value_info("x", TensorProto.INT16, [4])
    model = _graph(
        [helper.make_node("Max", ["x", "x"], ["y"])],
        [spec],
        [helper.make_tensor_value_info("y", TensorProto.INT16, [4])],
    )
    path = _save(model, tmp_path / "max16.onnx")
    assert verify.main([str(path), "--json"]) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out)["targets"]}
    assert rows["onnxruntime"]["result"] == "SKIP" and "Max" in rows["onnxruntime"]["reason"]
    assert verify.main([str(path), "--driver", "onnxruntime"]) == 1
    assert " FAIL " in capsys.readouterr().out
    # Placed with fallback, the nodes ORT cannot run go to another driver, and the whole passes.
    assert verify.main([str(path), "--driver", "onnxruntime", "--fallback", "cpu", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["targets"]
    assert row["result"] == "PASS" and "reference" in row["placement"]


def test_inputs_from_files_and_the_tolerance_are_reported(
    relu_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.arange(6, dtype=np.float32).reshape(2, 3) - 3)
    argv = [str(relu_file), "--input", f"x={x}", "--driver", "onnxruntime", "--json"]
    assert verify.main([*argv, "--tolerance", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tolerance"] == 0.5 and report["inputs"] == {"x": [2, 3]}
    assert report["targets"][0]["error"] == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tolerance", "-1"], "give a number >= 0"),
        (["--shape", "nope=2x3"], "has no input 'nope'"),
        (["--input", "x=/nonexistent.npy"], "does not exist"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    relu_file: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert verify.main([str(relu_file), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crossrt verify: error [") and message in err


def test_a_compiled_container_is_refused_with_what_to_do(
    relu_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crossrt.compile(str(relu_file), "cpu").save(tmp_path / "relu.crm")
    assert verify.main([str(tmp_path / "relu.crm")]) == 1
    assert "verify the ONNX model it was compiled from" in capsys.readouterr().err


def test_an_unknown_precision_is_a_usage_error(
    relu_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        verify.main([str(relu_file), "--precision", "fp64"])
    assert exited.value.code == 2 and "invalid choice: 'fp64'" in capsys.readouterr().err
