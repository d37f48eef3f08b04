"""The ``crossrt`` command: ``ls`` and ``run``, in process and once as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import crossrt
from crossrt.drivers import registry
from crossrt.model import GraphBuilder
from crossrt.tools import cli
from crossrt.tools import ls as ls_tool
from crossrt.tools import run as run_tool

CORES = len(os.sched_getaffinity(0))
X = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) * 0.7
N = np.arange(12, dtype=np.int64).reshape(4, 3)


def _crossrt_executable() -> str:
    found = shutil.which("crossrt", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"no crossrt console script next to {sys.executable}")
    return found


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A two-input model (x: float32 [2,3], n: int64 [?,3]) and input files of every kind."""
    d = tmp_path_factory.mktemp("cli")
    b = GraphBuilder("two")
    x = b.input("x", "float32", [2, 3])
    n = b.input("n", "int64", [None, 3])
    b.output(b.op("Sigmoid", [x], outputs=["probs:0"]))
    b.output(b.op("Mul", [n, b.constant(np.int64(3))], outputs=["tripled"]))
    b.finish().save(d / "two.onnx")

    b = GraphBuilder("custom", opsets={"com.example": 1})
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Foo", [x], domain="com.example", name="my_foo"), "float32", [2, 3])
    b.finish().save(d / "custom.onnx")

    data = (d / "two.onnx").read_bytes()
    (d / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (d / "random.onnx").write_bytes(np.random.default_rng(0).bytes(2048))
    np.save(d / "x.npy", X)
    np.save(d / "x64.npy", X.astype(np.float64))
    np.save(d / "n.npy", N)
    X.tofile(d / "x.bin")
    X.ravel()[:5].tofile(d / "short.bin")
    return {p.name: p for p in d.iterdir()}


def _raw_ort(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _one_error_line(capsys, code_name: str, number: int) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("crossrt run: error ")
    assert f"{code_name} ({number})" in line
    assert "Traceback" not in err
    return line


# -- top level --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["help"]])
def test_top_level_help(capsys, argv):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: crossrt COMMAND")
    assert "  ls " in out and "  run " in out


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2  # as argparse exits for a missing argument
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: crossrt COMMAND")
    assert "error: a command is required" in captured.err


def test_version(capsys):
    import crossrt

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"crossrt {crossrt.__version__}"


def test_unknown_command(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "usage: crossrt" in err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_subcommand_help_exits_0(capsys, command):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: crossrt {command}" in capsys.readouterr().out


# -- ls ---------------------------------------------------------------------------------------


def _cpu_drivers() -> set[str]:
    """The available drivers serving cpu:0 (openvino too where it is installed)."""
    return {
        s.name
        for s in crossrt.drivers.driver_statuses()
        if s.driver is not None and any(d.id == "cpu:0" for d in s.driver.devices())
    }


def test_ls_table(capsys):
    assert ls_tool.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DRIVERS")
    # Sections are parted by an empty line, not an escaped newline ("\x0aDEVICES").
    assert "\n\nDEVICES\n" in out and "\n\nCORES of cpu:0" in out and "\\x" not in out
    assert "\n\nPROCESSES with models loaded" in out
    for name in ("onnxruntime", "reference"):
        line = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert "PASS" in line
    device_lines = [line for line in out.splitlines() if line.strip().startswith("cpu:0")]
    assert len(device_lines) == len(_cpu_drivers()) >= 2
    assert all(f" {CORES} " in line for line in device_lines)


def test_ls_json(capsys):
    assert cli.main(["ls", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    drivers = {d["name"]: d for d in doc["drivers"]}
    for name in ("onnxruntime", "reference"):
        assert drivers[name]["status"] == "PASS"
        assert drivers[name]["reason"] == ""
        assert drivers[name]["version"]
    assert drivers["onnxruntime"]["version"] == ort.__version__
    cpus = [d for d in doc["devices"] if d["id"] == "cpu:0"]
    assert {d["driver"] for d in cpus} == _cpu_drivers() >= {"onnxruntime", "reference"}
    for d in cpus:
        assert d["cores"] == CORES
        assert d["memory_bytes"] > 0
        assert d["kind"] == "cpu"


def test_ls_shows_a_disabled_driver_as_fail(capsys, monkeypatch):
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setenv("CROSSRT_DISABLE_DRIVERS", "reference")
    monkeypatch.delenv("CROSSRT_SIM", raising=False)
    assert ls_tool.main(["--all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    reference = next(d for d in doc["drivers"] if d["name"] == "reference")
    assert reference["status"] == "FAIL"
    assert "CROSSRT_DISABLE_DRIVERS" in reference["reason"]
    assert {d["driver"] for d in doc["devices"]} == (_cpu_drivers() | {"sim"}) - {"reference"}
    assert ls_tool.main([]) == 0
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if line.split()[:1] == ["reference"])
    assert "FAIL" in line and "CROSSRT_DISABLE_DRIVERS" in line


def test_ls_rejects_unknown_flags(capsys):
    with pytest.raises(SystemExit) as info:
        ls_tool.main(["--bogus"])
    assert info.value.code == 2


# -- run: success -----------------------------------------------------------------------------


def test_run_writes_each_output_equal_to_raw_ort(capsys, files, tmp_path):
    out_dir = tmp_path / "out"
    code = run_tool.main(
        [
            str(files["two.onnx"]),
            "--input",
            f"x={files['x.npy']}",
            "-i",
            f"n={files['n.npy']}",
            "--output-dir",
            str(out_dir),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""
    expected = _raw_ort(files["two.onnx"], {"x": X, "n": N})
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == ["probs_0.npy", "tripled.npy"]  # ':' is not kept in file names
    np.testing.assert_array_equal(np.load(out_dir / "probs_0.npy"), expected["probs:0"])
    np.testing.assert_array_equal(np.load(out_dir / "tripled.npy"), expected["tripled"])
    assert np.load(out_dir / "tripled.npy").dtype == np.int64
    assert "probs:0: float32 [2, 3]" in captured.out
    assert "ran 'two' on cpu:0 (onnxruntime)" in captured.out


def test_run_on_the_reference_driver(capsys, files, tmp_path):
    args = [str(files["two.onnx"]), "-i", f"x={files['x.npy']}", "-i", f"n={files['n.npy']}"]
    assert run_tool.main([*args, "--driver", "reference", "-o", str(tmp_path)]) == 0
    assert "(reference)" in capsys.readouterr().out
    expected = _raw_ort(files["two.onnx"], {"x": X, "n": N})
    np.testing.assert_allclose(np.load(tmp_path / "probs_0.npy"), expected["probs:0"], atol=1e-6)


def test_run_reads_a_raw_bin_for_a_static_input(capsys, files, tmp_path):
    args = [str(files["two.onnx"]), "-i", f"x={files['x.bin']}", "-i", f"n={files['n.npy']}"]
    code = run_tool.main([*args, "-o", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    expected = _raw_ort(files["two.onnx"], {"x": X, "n": N})
    np.testing.assert_array_equal(np.load(tmp_path / "probs_0.npy"), expected["probs:0"])


def test_missing_input_is_zero_filled_with_a_warning(capsys, files, tmp_path):
    code = run_tool.main([str(files["two.onnx"]), "-i", f"x={files['x.npy']}", "-o", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0
    warnings = captured.err.splitlines()
    assert len(warnings) == 1
    assert "warning" in warnings[0] and "'n'" in warnings[0] and "zeros" in warnings[0]
    assert "int64 [1, 3]" in warnings[0] and "dynamic" in warnings[0]
    expected = _raw_ort(files["two.onnx"], {"x": X, "n": np.zeros((1, 3), np.int64)})
    np.testing.assert_array_equal(np.load(tmp_path / "tripled.npy"), expected["tripled"])
    np.testing.assert_array_equal(np.load(tmp_path / "probs_0.npy"), expected["probs:0"])


def test_no_inputs_at_all_runs_on_zeros(capsys, files, tmp_path):
    assert run_tool.main([str(files["two.onnx"]), "-o", str(tmp_path)]) == 0
    assert len(capsys.readouterr().err.splitlines()) == 2  # one warning per input
    np.testing.assert_array_equal(np.load(tmp_path / "probs_0.npy"), np.full((2, 3), 0.5))


# -- run: errors (one line on stderr, the code name and number, exit 1) -----------------------


@pytest.mark.parametrize(
    ("case", "code_name", "number", "mentions"),
    [
        ("missing-model", "NOT_FOUND", 2007, "does-not-exist.onnx"),
        ("truncated-model", "INVALID_MODEL", 2003, "truncated.onnx"),
        ("corrupt-model", "INVALID_MODEL", 2003, "random.onnx"),
        ("unsupported-op", "UNSUPPORTED_OPERATOR", 2001, "my_foo"),
        ("wrong-dtype", "EXEC_BAD_INPUT", 1002, "float64"),
        ("unknown-input", "EXEC_BAD_INPUT", 1002, "xx"),
        ("bad-syntax", "INVALID", 2, "NAME=FILE"),
        ("empty-name", "INVALID", 2, "NAME=FILE"),
        ("missing-input-file", "INVALID", 2, "nothere.npy"),
        ("short-bin", "EXEC_BAD_INPUT", 1002, "20 bytes"),
        ("bin-for-dynamic-input", "EXEC_BAD_INPUT", 1002, "static shape"),
        ("not-npy", "EXEC_BAD_INPUT", 1002, "not a readable .npy"),
        ("unknown-device", "DEVICE_UNAVAILABLE", 2004, "tpu"),
        ("unknown-driver", "DEVICE_UNAVAILABLE", 2004, "tensorrt"),
    ],
)
def test_run_errors_are_one_line(capsys, files, tmp_path, case, code_name, number, mentions):
    two, npy_n = str(files["two.onnx"]), f"n={files['n.npy']}"
    bad_npy = tmp_path / "bad.npy"
    bad_npy.write_bytes(b"not numpy at all")
    argv = {
        "missing-model": [str(tmp_path / "does-not-exist.onnx")],
        "truncated-model": [str(files["truncated.onnx"])],
        "corrupt-model": [str(files["random.onnx"])],
        "unsupported-op": [str(files["custom.onnx"]), "-i", f"x={files['x.npy']}"],
        "wrong-dtype": [two, "-i", f"x={files['x64.npy']}", "-i", npy_n],
        "unknown-input": [two, "-i", f"xx={files['x.npy']}"],
        "bad-syntax": [two, "-i", str(files["x.npy"])],
        "empty-name": [two, "-i", f"={files['x.npy']}"],
        "missing-input-file": [two, "-i", f"x={tmp_path / 'nothere.npy'}"],
        "short-bin": [two, "-i", f"x={files['short.bin']}", "-i", npy_n],
        "bin-for-dynamic-input": [two, "-i", f"n={files['x.bin']}"],
        "not-npy": [two, "-i", f"x={bad_npy}", "-i", npy_n],
        "unknown-device": [two, "--device", "tpu"],
        "unknown-driver": [two, "--driver", "tensorrt"],
    }[case]
    out_dir = tmp_path / "out"
    assert cli.main(["run", *argv, "-o", str(out_dir)]) == 1
    line = _one_error_line(capsys, code_name, number)
    assert mentions in line
    assert not out_dir.exists()  # nothing written on failure


def test_unwritable_output_dir_is_one_line(capsys, files, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = [str(files["two.onnx"]), "-i", f"x={files['x.npy']}", "-i", f"n={files['n.npy']}"]
    try:
        code = run_tool.main([*args, "-o", str(blocker)])
    except OSError:
        code = None
    assert code == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "a-file" in err


def test_outputs_whose_file_names_clash_are_all_kept(capsys, tmp_path):
    b = GraphBuilder("clash")
    x = b.input("x", "float32", [2])
    b.output(b.op("Relu", [x], outputs=["a:0"]))
    b.output(b.op("Neg", [x], outputs=["a_0"]))
    b.finish().save(tmp_path / "clash.onnx")
    out_dir = tmp_path / "out"
    assert run_tool.main([str(tmp_path / "clash.onnx"), "-o", str(out_dir)]) == 0
    assert len(list(out_dir.glob("*.npy"))) == 2


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run"])
    assert info.value.code == 2
    assert "model" in capsys.readouterr().err


# -- the real console script, once ------------------------------------------------------------


def test_console_script_ls_and_run(files, tmp_path):
    exe = _crossrt_executable()
    env = {**os.environ, "CROSSRT_DISABLE_DRIVERS": ""}
    listing = subprocess.run(
        [exe, "ls", "--json"], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert listing.returncode == 0, listing.stderr
    doc = json.loads(listing.stdout)
    assert {d["name"]: d["status"] for d in doc["drivers"]}["onnxruntime"] == "PASS"
    assert any(d["id"] == "cpu:0" and d["cores"] == CORES for d in doc["devices"])

    out_dir = tmp_path / "out"
    ran = subprocess.run(
        [exe, "run", str(files["two.onnx"]), "-i", f"x={files['x.npy']}", "-o", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "warning: input 'n' not given" in ran.stderr
    expected = _raw_ort(files["two.onnx"], {"x": X, "n": np.zeros((1, 3), np.int64)})
    np.testing.assert_array_equal(np.load(out_dir / "probs_0.npy"), expected["probs:0"])

    failed = subprocess.run(
        [exe, "run", str(files["random.onnx"])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "INVALID_MODEL (2003)" in failed.stderr

    bare = subprocess.run([exe], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.startswith("usage: crossrt COMMAND") and "command is required" in bare.stderr
