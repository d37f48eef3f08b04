"""``crossrt run`` on outputs that are not tensors, and ``--fallback``: in process and once as
a real subprocess.

The model is what skl2onnx makes of a default scikit-learn classifier, built by hand
(``classifier_model.py``): ``output_probability`` is a sequence of maps (int64 -> float).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from classifier_model import classifier
from onnx import TensorProto, helper

import crossrt
from crossrt.tools import cli
from crossrt.tools import run as run_tool

X = np.array([[0.5, -1.0], [2.0, 1.0], [-3.0, 0.25]], np.float32)


def _words() -> onnx.ModelProto:
    """A string tensor in and out."""
    words = helper.make_tensor_value_info("words", TensorProto.STRING, [2])
    same = helper.make_tensor_value_info("same", TensorProto.STRING, [2])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["words"], ["same"])], "w", [words], [same]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("run-outputs")
    onnx.save(classifier(), d / "classifier.onnx")
    onnx.save(_words(), d / "words.onnx")
    np.save(d / "x.npy", X)
    np.save(d / "words.npy", np.array(["un", "deux"]))
    crossrt.compile(d / "classifier.onnx").save(d / "classifier.crm")
    return {p.name: p for p in d.iterdir()}


def _expected() -> list[dict[str, float]]:
    """ORT's own answer, keys as strings as JSON writes them."""
    session = ort.InferenceSession(
        classifier().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rows = session.run(["output_probability"], {"X": X})[0]
    return [{str(k): v for k, v in row.items()} for row in rows]


def _no_leftovers(out_dir: Path) -> None:
    hidden = [p.name for p in out_dir.iterdir() if p.name.startswith(".")]
    assert hidden == [], f"temporary files left behind: {hidden}"


def test_a_sequence_of_maps_is_written_as_json(capsys, files, tmp_path):
    out_dir = tmp_path / "out"
    argv = ["run", str(files["classifier.onnx"]), "-i", f"X={files['x.npy']}", "-o", str(out_dir)]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert sorted(p.name for p in out_dir.iterdir()) == ["label.npy", "output_probability.json"]
    rows = json.loads((out_dir / "output_probability.json").read_text())
    assert len(rows) == len(X)
    for got, want in zip(rows, _expected(), strict=True):
        assert got.keys() == want.keys() == {"0", "1"}
        assert got == pytest.approx(want)
    labels = np.load(out_dir / "label.npy")
    assert labels.tolist() == [int(max(r, key=r.get)) for r in rows]
    assert "output_probability: sequence of 3 maps -> " in captured.out
    assert "label: int64 [3] -> " in captured.out
    _no_leftovers(out_dir)


def test_a_string_tensor_is_written_as_npy_without_pickle(capsys, files, tmp_path):
    argv = [str(files["words.onnx"]), "-i", f"words={files['words.npy']}", "-o", str(tmp_path)]
    assert run_tool.main(argv) == 0
    assert "same: string [2] -> " in capsys.readouterr().out
    assert np.load(tmp_path / "same.npy", allow_pickle=False).tolist() == ["un", "deux"]


def test_a_failed_write_leaves_no_partial_file(capsys, files, tmp_path):
    out_dir = tmp_path / "out"
    (out_dir / "output_probability.json").mkdir(parents=True)  # the rename onto it fails
    argv = [str(files["classifier.onnx"]), "-i", f"X={files['x.npy']}", "-o", str(out_dir)]
    assert run_tool.main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "crossrt run: error [INVALID (2)]" in err and "-o DIR" in err
    _no_leftovers(out_dir)
    written = {p.name for p in out_dir.iterdir()}
    assert written <= {"label.npy", "output_probability.json"}
    if "label.npy" in written:  # written whole before the failure, never half
        assert np.load(out_dir / "label.npy").shape == (len(X),)


def test_fallback_places_what_the_driver_cannot_run(capsys, files, tmp_path):
    args = [str(files["classifier.onnx"]), "-i", f"X={files['x.npy']}", "--driver", "reference"]
    assert run_tool.main([*args, "-o", str(tmp_path / "strict")]) == 1
    err = capsys.readouterr().err
    assert "UNSUPPORTED_OPERATOR (2001)" in err and "ZipMap" in err
    assert not (tmp_path / "strict").exists()

    out_dir = tmp_path / "fallback"
    assert run_tool.main([*args, "--fallback", "cpu", "-o", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "(reference, onnxruntime)" in out  # the placement: both drivers ran a part
    rows = json.loads((out_dir / "output_probability.json").read_text())
    for got, want in zip(rows, _expected(), strict=True):
        assert got == pytest.approx(want, abs=1e-6)


def test_fallback_on_a_compiled_crm_is_refused(capsys, files, tmp_path):
    argv = [str(files["classifier.crm"]), "--fallback", "cpu", "-o", str(tmp_path / "out")]
    assert run_tool.main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "INVALID (2)" in err and "compiled already" in err and "crossrt compile" in err
    assert not (tmp_path / "out").exists()


def test_console_script_writes_json_for_a_sequence_of_maps(files, tmp_path):
    exe = shutil.which("crossrt", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"no crossrt console script next to {sys.executable}")
    out_dir = tmp_path / "out"
    ran = subprocess.run(
        [
            exe,
            "run",
            str(files["classifier.onnx"]),
            "-i",
            f"X={files['x.npy']}",
            "-o",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CROSSRT_DISABLE_DRIVERS": ""},
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    rows = json.loads((out_dir / "output_probability.json").read_text())
    assert [set(r) for r in rows] == [{"0", "1"}] * len(X)
    _no_leftovers(out_dir)
