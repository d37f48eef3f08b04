"""The oracle of ``crossrt verify`` and ``crossrt compile --device auto`` holds on models the
reference driver cannot evaluate: over its memory bound (it keeps every intermediate value),
or with an operator it lacks (ZipMap). ONNX Runtime at fp32 answers instead, and the output
says so and why; never a message that blames the user's inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from classifier_model import classifier
from onnx import TensorProto, helper, numpy_helper

from crossrt.choice import oracle
from crossrt.tools import compile as compile_tool
from crossrt.tools import verify

VALUES, SIZE = 24, 2**18  # 24 float32 values of 1 MiB: onnx.reference holds them all


def _wide() -> onnx.ModelProto:
    """x [1] expanded to SIZE elements, then VALUES elementwise steps and a max: ONNX Runtime
    reuses two buffers, onnx.reference keeps VALUES of them."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["v0"])]
    for i in range(VALUES):
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [f"v{i}", "c"], [f"v{i + 1}"]))
    nodes.append(helper.make_node("ReduceMax", [f"v{VALUES}"], ["y"], keepdims=1))
    weights = [
        numpy_helper.from_array(np.array([SIZE], np.int64), "shape"),
        numpy_helper.from_array(np.array([1.5], np.float32), "c"),
    ]
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def wide_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CROSSRT_REFERENCE_MEMORY", "8M")  # under the model's ~25 MiB
    path = tmp_path / "wide.onnx"
    onnx.save(_wide(), path)
    return path


def test_the_footprint_counts_every_value_the_reference_keeps() -> None:
    import crossrt

    need = oracle.reference_footprint(crossrt.load_model(_wide()), {"x": np.ones(1, np.float32)})
    assert need is not None and VALUES * SIZE * 4 <= need < (VALUES + 3) * SIZE * 4


def test_verify_checks_against_onnxruntime_over_the_memory_bound(
    wide_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify.main([str(wide_file), "--driver", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "against onnxruntime cpu:0 at fp32;" in out
    assert "not the reference driver: it would hold about 2" in out
    assert "over the bound 8 MiB" in out
    assert " PASS " in out
    assert verify.main([str(wide_file), "--driver", "onnxruntime", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["oracle"] == "onnxruntime cpu:0 at fp32"
    assert "CROSSRT_REFERENCE_MEMORY" in report["oracle_why"]


def test_auto_checks_against_onnxruntime_over_the_memory_bound(
    wide_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "wide.crm"
    argv = [str(wide_file), "-d", "auto", "--auto-seconds", "0.05", "-o", str(out)]
    assert compile_tool.main(argv) == 0
    printed = capsys.readouterr()
    assert "crossrt auto: checking against onnxruntime cpu:0 at fp32 (the reference" in printed.err
    assert "whose outputs match onnxruntime cpu:0 at fp32" in printed.out


def test_a_model_the_reference_lacks_an_operator_for_is_checked_against_onnxruntime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ZipMap classifier: its probabilities are a sequence of maps, compared per entry."""
    path = tmp_path / "classifier.onnx"
    onnx.save(classifier(), path)
    assert verify.main([str(path), "--shape", "X=3x2", "--driver", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "against onnxruntime cpu:0 at fp32" in out and "ZipMap" in out
    assert "give inputs" not in out  # the oracle failed, not the user's inputs
    assert " PASS " in out


def test_fallback_takes_the_repeated_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "classifier.onnx"
    onnx.save(classifier(), path)
    argv = [str(path), "--shape", "X=3x2", "--driver", "openvino", "--json"]
    assert verify.main([*argv, "--fallback", "cpu", "--fallback", "sim"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fallback"] == ["cpu", "sim"]
    assert report["targets"][0]["result"] == "PASS"


def test_sequences_and_maps_are_compared_entry_by_entry() -> None:
    want = {"p": [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}]}
    assert oracle.compare({"p": [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}]}, want) == (0.0, 1.0)
    assert oracle.compare({"p": [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.4}]}, want)[0] == (
        pytest.approx(0.1)
    )
    assert oracle.compare({"p": [{0: 0.25, 1: 0.75}]}, want)[0] == float("inf")  # length
    assert oracle.compare({"p": [{0: 0.25, 2: 0.75}, {0: 0.5, 1: 0.5}]}, want)[0] == float("inf")


def test_a_reference_past_its_time_is_stopped_and_onnxruntime_answers() -> None:
    """The reference runs in a child process that is killed at the time bound, wherever it
    is: within one node too (onnx.reference's tree ensembles are Python loops)."""
    import crossrt

    model = crossrt.load_model(_wide())
    x = {"x": np.ones(1, np.float32)}
    assert oracle.expected_outputs(model, x).name == "reference"
    stood_in = oracle.expected_outputs(model, x, seconds=0.01)
    assert stood_in.name == "onnxruntime cpu:0 at fp32"
    assert stood_in.why == "it ran past 0.01 s and was stopped"
    assert stood_in.outputs["y"] == pytest.approx(oracle.expected_outputs(model, x).outputs["y"])


def test_the_reference_child_runs_out_of_memory_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value whose size shape inference cannot know (ConstantOfShape of an input's values):
    the estimate passes, the child's address-space limit stops it, ONNX Runtime answers."""
    import crossrt

    nodes = [
        helper.make_node("ConstantOfShape", ["n"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "data_dependent",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = crossrt.load_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    n = {"n": np.array([64 * 2**20], np.int64)}  # 256 MiB of float32 zeros
    assert oracle.reference_footprint(model, n) is not None  # counted as far as known
    monkeypatch.setenv("CROSSRT_REFERENCE_MEMORY", "64M")
    got = oracle.expected_outputs(model, n)
    assert got.name == "onnxruntime cpu:0 at fp32" and "ran out of memory" in got.why
    assert float(got.outputs["y"]) == 0.0


def test_a_graph_of_large_attributes_is_not_given_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tree ensemble's trees are node attributes, which onnx.reference walks in Python (100 s
    for a 160 MB model): over the size bound (here made small), ONNX Runtime answers at once."""

    from benchmark_models import models

    model = models.build_trees(trees=20, depth=6)
    x = {"X": np.ones((2, 32), np.float32)}
    assert oracle.expected_outputs(model, x).name == "reference"
    monkeypatch.setattr(oracle, "GRAPH_BYTES", 2**14)
    got = oracle.expected_outputs(model, x)
    assert got.name == "onnxruntime cpu:0 at fp32" and "besides its weights" in got.why


def test_the_footprint_is_estimated_without_computing_the_values(tmp_path: Path) -> None:
    """Shape inference with data propagation computes elementwise values, whatever their size:
    on a chain of 64 MiB values it took 23 GB and the OOM killer ended `crossrt verify`. The
    estimate runs here in a process allowed 512 MiB more than it holds after its imports."""
    path = tmp_path / "chain.onnx"
    nodes = [helper.make_node("Expand", ["x", "shape"], ["v0"])]
    for i in range(8):
        nodes.append(helper.make_node("Add", [f"v{i}", "c"], [f"v{i + 1}"]))
    weights = [
        numpy_helper.from_array(np.array([16 * 2**20], np.int64), "shape"),
        numpy_helper.from_array(np.array([1.0], np.float32), "c"),
    ]
    spec = helper.make_tensor_value_info
    ends = [spec("x", TensorProto.FLOAT, [1])], [spec("v8", TensorProto.FLOAT, [16 * 2**20])]
    graph = helper.make_graph(nodes, "chain", *ends, weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = (
        "import resource, sys, numpy as np, crossrt\n"
        "from crossrt.choice import oracle\n"
        "model = crossrt.load_model(sys.argv[1])\n"
        "held = oracle._address_space()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (held + 2**29, held + 2**29))\n"
        "print(oracle.reference_footprint(model, {'x': np.ones(1, np.float32)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 9 * 16 * 2**20 * 4  # nine values of 64 MiB
