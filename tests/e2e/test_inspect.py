"""``crossrt inspect``: in process, and once as a real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

import crossrt
from crossrt.drivers import get_driver
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
    crossrt.save_executables(
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


def test_real_subprocess(files):
    script = shutil.which("crossrt", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "crossrt"]
    ok = subprocess.run(
        [*command, "inspect", str(files["two.crm"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert [n["name"] for n in json.loads(ok.stdout)["header"]["networks"]] == ["fast", "exact"]
    bad = subprocess.run(
        [*command, "inspect", str(files["corrupt.crm"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert "fails its SHA-256 check" in _one_error_line(bad.stderr, "INVALID (2)")
