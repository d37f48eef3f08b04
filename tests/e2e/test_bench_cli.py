"""``crossrt bench``: a model timed on random inputs, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt.tools import bench
from small_models import relu


def _dynamic(path: Path) -> Path:
    """``y = Relu(x)`` on float32 [n, 4], and an int64 input of dynamic length."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["ids"], ["z"])],
        "dyn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["m"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("z", TensorProto.INT64, ["m"]),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_bench_prints_throughput_and_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "relu.onnx"
    onnx.save(relu().proto, source)
    out = tmp_path / "bench.json"
    argv = [str(source), "--seconds", "0.2", "--clients", "2", "-o", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "'relu' on cpu:0 (onnxruntime), x [2, 3], 2 client(s)" in printed
    assert "throughput" in printed and "p99" in printed
    report = json.loads(out.read_text())
    assert report["requests"] > 0 and report["clients"] == 2
    assert 0 < report["min_ms"] <= report["p50_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert report["inputs"] == {"x": [2, 3]}


def test_bench_json_prints_the_numbers_on_stdout_and_the_old_file_form_says_what_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` means JSON on stdout in every tool (bench's took a FILE before); a file is
    ``--output FILE``."""
    source = tmp_path / "relu.onnx"
    onnx.save(relu().proto, source)
    assert bench.main([str(source), "--seconds", "0.1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] > 0 and report["inputs"] == {"x": [2, 3]}
    with pytest.raises(SystemExit) as usage:
        bench.main([str(source), "--json", str(tmp_path / "b.json")])
    assert usage.value.code == 2
    assert f"write them to a file with --output {tmp_path / 'b.json'}" in capsys.readouterr().err


def test_dynamic_dimensions_are_one_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _dynamic(tmp_path / "dyn.onnx")
    assert bench.main([str(model), "--seconds", "0.1"]) == 0
    assert "x [1, 4], ids [1]" in capsys.readouterr().out
    crossrt.compile(str(model), "cpu").save(tmp_path / "dyn.crm")
    argv = [str(tmp_path / "dyn.crm"), "--shape", "x=8x4", "--shape", "ids=5", "--seconds", "0.1"]
    assert bench.main(argv) == 0
    assert "x [8, 4], ids [5]" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "nope=1x4"], "has no input 'nope'"),
        (["--shape", "x=1x5"], "does not fit input"),
        (["--shape", "x=axb"], "give NAME=DxD"),
        (["--seconds", "0"], "give seconds > 0"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    model = _dynamic(tmp_path / "dyn.onnx")
    assert bench.main([str(model), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crossrt bench: error [") and message in err


def test_the_command_is_listed_and_runs_as_a_process(tmp_path: Path) -> None:
    source = tmp_path / "relu.onnx"
    onnx.save(relu().proto, source)
    listed = subprocess.run(
        [sys.executable, "-m", "crossrt", "--help"], capture_output=True, text=True, check=True
    )
    assert "bench" in listed.stdout
    done = subprocess.run(
        [sys.executable, "-m", "crossrt", "bench", str(source), "--seconds", "0.1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "latency ms" in done.stdout


def test_bench_loads_with_instances_and_dynamic_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    source = tmp_path / "rows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    out = tmp_path / "bench.json"
    argv = [str(source), "--seconds", "0.2", "--clients", "3", "-o", str(out)]
    assert bench.main([*argv, "--max-batch-size", "4", "--batch-delay", "0.001"]) == 0
    assert "batches of" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["max_batch_size"] == 4 and report["mean_batch"] >= 1
    assert bench.main([*argv, "--instances", "2"]) == 0
    assert json.loads(out.read_text())["instances"] == 2
    assert bench.main([str(source), "--batch-delay", "1"]) == 1
    assert "without batching" in capsys.readouterr().err
