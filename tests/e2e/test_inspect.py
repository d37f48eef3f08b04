"""``crossrt inspect`` of a .crm container and of an ONNX model: in process, and once as a real
subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from classifier_model import classifier
from onnx import TensorProto

import crossrt
from crossrt.drivers import get_driver
from crossrt.model import GraphBuilder
from crossrt.tools import cli
from crossrt.tools import inspect as inspect_tool

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits" / "digits.onnx"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One network (digits.crm), two networks (two.crm), and a corrupt copy."""
    d = tmp_path_factory.mktemp("inspect")
    fast = crossrt.compile(DIGITS, driver="onnxruntime")
    fast.save(d / "digits.crm")
    crossrt.compiler.save_executables(
        {"fast": fast, "exact": crossrt.compile(DIGITS, driver="reference")}, d / "two.crm"
    )
    data = bytearray((d / "digits.crm").read_bytes())
    data[-10] ^= 0x01
    (d / "corrupt.crm").write_bytes(bytes(data))
    return {p.name: p for p in d.iterdir()}


def test_table_output(capsys, files):
    assert inspect_tool.main([str(files["digits.crm"])]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"CONTAINER {files['digits.crm']}"
    size = files["digits.crm"].stat().st_size
    assert f"({size} bytes)" in out
    assert f"producer        crossrt {crossrt.__version__}" in out
    assert "format version  3" in out
    assert "sections        1," in out and "SHA-256 verified" in out
    assert "NETWORK digits_mlp" in out
    assert "input                    float32 [?,64]" in out
    assert f"driver onnxruntime {ort.__version__} (installed)" in out
    features = " ".join(get_driver("onnxruntime").devices()[0].features)
    assert "       optimization: all" in out and f"       cpu: {features}" in out
    header = next(line for line in lines if line.split()[:2] == ["NODE", "EXECUTOR"])
    assert header.split() == [
        "NODE", "EXECUTOR", "DEVICE", "NAME", "TENSOR", "SIZE", "TYPE", "FORMAT", "SHAPE", "DTYPE",
    ]  # fmt: skip
    rows = [line.split() for line in lines[lines.index(header) + 1 :] if line.strip()]
    assert rows == [
        ["0", "onnxruntime", "cpu", "onnxruntime_0", "input", "?", "IN", "ND", "[?,64]", "float32"],
        ["0", "onnxruntime", "cpu", "onnxruntime_0", "label", "?", "OUT", "ND", "[?]", "int64"],
        ["0", "onnxruntime", "cpu", "onnxruntime_0", "probabilities", "?", "OUT", "ND", "[?,10]",
         "float32"],
    ]  # fmt: skip


def test_json_is_parseable_and_holds_the_header(capsys, files):
    assert cli.main(["inspect", str(files["two.crm"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["size"] == files["two.crm"].stat().st_size
    assert doc["format_version"] == 3
    assert doc["hashes"] == {"header": "verified", "sections": "verified"}
    assert [n["name"] for n in doc["header"]["networks"]] == ["fast", "exact"]
    assert doc["header"]["networks"][1]["nodes"][0]["driver"] == "reference"


def test_one_network_of_several(capsys, files):
    assert inspect_tool.main([str(files["two.crm"]), "--network", "exact", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in doc["header"]["networks"]] == ["exact"]
    assert inspect_tool.main([str(files["two.crm"]), "-n", "exact"]) == 0
    out = capsys.readouterr().out
    assert "NETWORK exact" in out and "NETWORK fast" not in out
    assert "networks        2: fast, exact" in out


def test_hash_status_follows_the_setting(capsys, monkeypatch, files):
    monkeypatch.setenv("CROSSRT_VALIDATE_HASH", "0")
    assert inspect_tool.main([str(files["corrupt.crm"])]) == 0
    assert "SHA-256 not checked (CROSSRT_VALIDATE_HASH=0)" in capsys.readouterr().out
    assert inspect_tool.main([str(files["corrupt.crm"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hashes"]["sections"] == "not checked"


def _one_error_line(err: str, code: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("crossrt inspect: error ")
    assert code in lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("name", "args", "code", "fragment"),
    [
        ("corrupt.crm", [], "INVALID (2)", "section 0 (node 'onnxruntime_0'"),
        ("missing.crm", [], "NOT_FOUND (2007)", "no container at"),
        ("two.crm", ["--network", "nope"], "INVALID (2)", "has no network 'nope'"),
    ],
)
def test_errors_are_one_line(capsys, files, name, args, code, fragment):
    path = files.get(name, files["digits.crm"].parent / name)
    assert inspect_tool.main([str(path), *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in _one_error_line(captured.err, code)


def test_help(capsys):
    with pytest.raises(SystemExit) as info:
        inspect_tool.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: crossrt inspect" in out and "--network" in out and "--json" in out


def test_listed_in_top_level_help(capsys):
    assert cli.main(["--help"]) == 0
    assert "  inspect " in capsys.readouterr().out


def _crossrt(*args: str) -> subprocess.CompletedProcess[str]:
    """``crossrt ARGS`` as a real subprocess, the way a user types it."""
    script = shutil.which("crossrt", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "crossrt"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_real_subprocess(files):
    ok = _crossrt("inspect", str(files["two.crm"]), "--json")
    assert ok.returncode == 0, ok.stderr
    assert [n["name"] for n in json.loads(ok.stdout)["header"]["networks"]] == ["fast", "exact"]
    bad = _crossrt("inspect", str(files["corrupt.crm"]))
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert "fails its SHA-256 check" in _one_error_line(bad.stderr, "INVALID (2)")


# -- an ONNX model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A classifier whose probabilities are a sequence of maps, and a model split between
    drivers: ORT nodes, an int16 Max only the reference driver runs, and an operator of an
    unknown domain that no driver runs."""
    d = tmp_path_factory.mktemp("inspect-onnx")
    onnx.save(classifier(), d / "classifier.onnx")
    b = GraphBuilder("mixed", opsets={"com.example": 1})
    x = b.input("x", "float32", ["batch", 3])
    as_int = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.INT16)
    back = b.op("Cast", [b.op("Max", [as_int, as_int], name="int16_max")], to=TensorProto.FLOAT)
    y = b.op("Add", [back, x])
    b.output(b.op("Foo", [y], domain="com.example", name="my_foo"), "float32", ["batch", 3])
    b.finish().save(d / "mixed.onnx")
    (d / "random.onnx").write_bytes(bytes(range(256)) * 4)
    return {p.name: p for p in d.iterdir()}


def test_an_onnx_model_is_described_not_refused(capsys, models):
    path = models["classifier.onnx"]
    assert inspect_tool.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"MODEL {path}\n")
    assert "  IR version      8" in out
    assert "  opsets          ai.onnx 17, ai.onnx.ml 1" in out
    assert "    X                        float32 [N,2]" in out
    assert "    label                    int64 [N]" in out
    assert "    output_probability       seq(map(int64, float32))" in out
    assert "ai.onnx.ml.LinearClassifier      x1" in out and "ai.onnx.ml.ZipMap" in out
    assert "  PLACEMENT on cpu:0" in out
    assert "onnxruntime      runs 2 of 2 nodes" in out
    assert "strict           onnxruntime runs every node" in out


def test_placement_groups_and_why_no_driver_runs_a_node(capsys, models):
    assert inspect_tool.main([str(models["mixed.onnx"])]) == 0
    out = capsys.readouterr().out
    assert "    x                        float32 [batch,3]" in out
    assert "onnxruntime      runs 4 of 6 nodes" in out
    assert "reference        runs 5 of 6 nodes" in out
    assert "strict           fails: onnxruntime cannot run 2 nodes" in out
    assert "int16_max (Max): onnxruntime: ONNX Runtime has no CPU kernel for Max" in out
    groups = out[out.index("    groups") :].splitlines()[1:5]
    assert [g.split()[:3] for g in groups] == [
        ["0", "onnxruntime", "2"],
        ["1", "reference", "1"],
        ["2", "onnxruntime", "2"],
        ["3", "NO", "DRIVER"],
    ]
    unrun = out[out.index("  NOT RUN BY ANY DRIVER") :].splitlines()[1:]
    assert len(unrun) == 1
    assert unrun[0].strip().startswith("my_foo (com.example.Foo): onnxruntime: ")
    assert (
        "reference: the reference evaluator has no operators in domain 'com.example'" in (unrun[0])
    )


def test_an_onnx_model_as_json(capsys, models):
    argv = ["inspect", str(models["mixed.onnx"]), "--json", "--driver", "reference"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "onnx" and doc["name"] == "mixed"
    assert doc["opsets"] == {"ai.onnx": 21, "com.example": 1}
    assert doc["op_types"] == {"Add": 1, "Cast": 2, "Max": 1, "Relu": 1, "com.example.Foo": 1}
    assert doc["inputs"][0]["shape"] == ["batch", 3]
    place = doc["placement"]
    assert place["device"] == "cpu:0" and place["target"] == "reference"
    counts = {k: v for k, v in place["drivers"].items() if k != "openvino"}  # where installed
    assert counts == {"reference": 5, "onnxruntime": 4}
    assert place["strict"] is None
    assert [g["driver"] for g in place["groups"]] == ["reference", None]
    assert [u["name"] for u in place["unsupported"]] == ["my_foo"]
    assert set(place["unsupported"][0]["reasons"]) - {"openvino"} == {"reference", "onnxruntime"}


@pytest.mark.parametrize(
    ("name", "args", "code", "fragment"),
    [
        ("random.onnx", [], "INVALID_MODEL (2003)", "random.onnx"),
        ("mixed.onnx", ["--network", "x"], "INVALID (2)", "leave --network out"),
        ("mixed.onnx", ["--device", "tpu"], "DEVICE_UNAVAILABLE (2004)", "tpu"),
    ],
)
def test_onnx_model_errors_are_one_line(capsys, models, name, args, code, fragment):
    assert inspect_tool.main([str(models[name]), *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in _one_error_line(captured.err, code)


def test_device_and_driver_do_not_apply_to_a_container(capsys, files):
    assert inspect_tool.main([str(files["digits.crm"]), "--device", "cpu"]) == 1
    assert "apply to an ONNX model" in _one_error_line(capsys.readouterr().err, "INVALID (2)")


def test_real_subprocess_on_an_onnx_model(models):
    done = _crossrt("inspect", str(models["classifier.onnx"]), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [o["type"] for o in doc["outputs"]] == ["int64 [N]", "seq(map(int64, float32))"]
    assert doc["placement"]["strict"] == "onnxruntime"
