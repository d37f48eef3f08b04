"""``crossrt compile`` and ``crossrt cache``: in process, and once as real subprocesses whose
``.crm`` file ``crossrt run`` executes."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import crossrt
from crossrt.compiler.cache import CompileCache
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.model import GraphBuilder
from crossrt.tools import cache as cache_tool
from crossrt.tools import cli
from crossrt.tools import compile as compile_tool
from crossrt.tools.common import human_bytes

X = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) * 0.7


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    for scale in (1, 2):
        b = GraphBuilder(f"scaled{scale}")
        x = b.input("x", "float32", [2, 3])
        y = b.op("Mul", [x, b.constant(np.full((2, 3), scale, np.float32))])
        b.output(b.op("Sigmoid", [y], outputs=["y"]))
        b.finish().save(d / f"scaled{scale}.onnx")

    b = GraphBuilder("mixed")  # ORT has no int16 Max: needs a fallback
    x = b.input("x", "float32", [2, 3])
    as_int = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.INT16)
    back = b.op("Cast", [b.op("Max", [as_int, as_int], name="int16_max")], to=TensorProto.FLOAT)
    b.output(b.op("Add", [back, x], outputs=["y"]))
    b.finish().save(d / "mixed.onnx")
    np.save(d / "x.npy", X)
    return {p.name: p for p in d.iterdir()}


def _expected(scale: int) -> np.ndarray:
    out: np.ndarray = 1 / (1 + np.exp(-X * scale))
    return out


def _run_crm(path: Path) -> np.ndarray:
    with crossrt.Runtime() as rt:
        out: np.ndarray = rt.load(crossrt.load_executable(path)).run({"x": X})["y"]
        return out


def _one_error_line(err: str, command: str, code: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"crossrt {command}: error [{code}")
    assert "Traceback" not in err
    return lines[0]


# -- compile ----------------------------------------------------------------------------------


def test_compile_writes_a_crm_that_runs(capsys, models, tmp_path):
    out = tmp_path / "s.crm"
    assert compile_tool.main([str(models["scaled1.onnx"]), "-d", "cpu", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"compiled 'scaled1' for cpu:0 -> {out}" in captured.out
    assert f"onnxruntime {ort.__version__}" in captured.out
    assert "nodes:   1" in captured.out and "cache:   off" in captured.out
    assert "onnxruntime_0: onnxruntime on cpu, 2 operators; optimization all; cpu " in captured.out
    assert f"({out.stat().st_size} bytes)" in captured.out
    onnx_size = human_bytes(models["scaled1.onnx"].stat().st_size)
    crm_size = human_bytes(out.stat().st_size)
    assert f"  size:    scaled1.onnx {onnx_size} -> s.crm {crm_size} (" in captured.out
    assert captured.err == ""  # no progress line for a compile under a second
    np.testing.assert_allclose(_run_crm(out), _expected(1), rtol=1e-5)


def test_compile_counts_a_model_s_external_data_in_its_size(capsys, tmp_path):
    b = GraphBuilder("external")
    x = b.input("x", "float32", [256, 256])
    b.output(b.op("Add", [x, b.constant(np.ones((256, 256), np.float32))], outputs=["y"]))
    proto = b.finish().proto
    onnx.save(proto, tmp_path / "external.onnx", save_as_external_data=True, size_threshold=0)
    weights = sum(p.stat().st_size for p in tmp_path.iterdir() if p.suffix != ".onnx")
    assert weights >= 256 * 256 * 4  # the weights are in a file beside the model
    whole = (tmp_path / "external.onnx").stat().st_size + weights
    assert compile_tool.model_bytes(tmp_path / "external.onnx") == whole
    assert compile_tool.main([str(tmp_path / "external.onnx"), "-o", str(tmp_path / "e.crm")]) == 0
    assert f"external.onnx {human_bytes(whole)} -> e.crm " in capsys.readouterr().out


def test_compile_portable_records_the_option_and_an_unspecific_artifact(capsys, models, tmp_path):
    out = tmp_path / "p.crm"
    assert compile_tool.main([str(models["scaled1.onnx"]), "--portable", "-o", str(out)]) == 0
    exe = crossrt.load_executable(out)
    assert exe.options.portable
    unpacked = ort_artifact.unpack(exe.nodes[0].artifact)
    assert (unpacked.level, unpacked.features) == ("extended", ())
    np.testing.assert_allclose(_run_crm(out), _expected(1), rtol=1e-5)


def test_compile_default_output_is_named_after_the_model(capsys, models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert compile_tool.main([str(models["scaled2.onnx"])]) == 0
    np.testing.assert_allclose(_run_crm(tmp_path / "scaled2.crm"), _expected(2), rtol=1e-5)


def test_compile_through_the_cache_reports_miss_then_hit(capsys, models, tmp_path):
    args = [str(models["scaled1.onnx"]), "-o", str(tmp_path / "a.crm")]
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert compile_tool.main([*args, *cache]) == 0
    assert "cache:   miss (stored)" in capsys.readouterr().out
    assert compile_tool.main([*args, *cache]) == 0
    assert "cache:   hit" in capsys.readouterr().out
    assert compile_tool.main([*args, *cache, "--perf", "low"]) == 0  # options are in the key
    assert "cache:   miss" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("*.crm"))) == 2
    np.testing.assert_allclose(_run_crm(tmp_path / "a.crm"), _expected(1), rtol=1e-5)

    # A newer version in the cache is refused in one line; a newer request rebuilds.
    assert compile_tool.main([*args, *cache, "--cache-version", "3"]) == 0
    capsys.readouterr()
    assert compile_tool.main([*args, *cache, "--cache-version", "1"]) == 1
    line = _one_error_line(capsys.readouterr().err, "compile", "INVALID (2)")
    assert "holds version 3" in line and "version 1 was asked for" in line


def test_compile_with_fallback_places_nodes_on_two_drivers(capsys, models, tmp_path):
    out = tmp_path / "mixed.crm"
    assert compile_tool.main([str(models["mixed.onnx"]), "-o", str(out)]) == 1
    line = _one_error_line(capsys.readouterr().err, "compile", "UNSUPPORTED_OPERATOR")
    assert "int16_max (Max)" in line
    assert compile_tool.main([str(models["mixed.onnx"]), "-o", str(out), "--fallback", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "nodes:   3" in text and "reference" in text and "onnxruntime" in text
    exe = crossrt.load_executable(out)
    assert [n.driver for n in exe.nodes] == ["onnxruntime", "reference", "onnxruntime"]
    with crossrt.Runtime() as rt:
        got = rt.load(exe).run({"x": X})["y"]
    relu = np.maximum(X, 0).astype(np.int16).astype(np.float32)
    np.testing.assert_array_equal(got, relu + X)


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (["missing.onnx"], "NOT_FOUND", "does not exist"),
        (["{scaled1}", "--perf", "turbo"], "INVALID_OPTION", "performance_mode"),
        (["{scaled1}", "--priority", "urgent"], "INVALID_OPTION", "priority"),
        (["{scaled1}", "-d", "tpu"], "DEVICE_UNAVAILABLE", "no device 'tpu'"),
        (["{scaled1}", "--driver", "reference", "--fp16"], "INVALID_OPTION", "fp16"),
    ],
)
def test_compile_errors_are_one_line(capsys, models, tmp_path, argv, code, fragment):
    argv = [a.format(scaled1=models["scaled1.onnx"]) for a in argv]
    assert compile_tool.main([*argv, "-o", str(tmp_path / "x.crm")]) == 1
    captured = capsys.readouterr()
    assert fragment in _one_error_line(captured.err, "compile", code)
    assert captured.out == ""
    assert not (tmp_path / "x.crm").exists()


def test_compile_output_that_cannot_be_written(capsys, models, tmp_path):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "x.crm"
    assert compile_tool.main([str(models["scaled1.onnx"]), "-o", str(out)]) == 1
    assert "x.crm" in _one_error_line(capsys.readouterr().err, "compile", "")


class _Terminal(io.StringIO):
    """A stream that says it is a terminal and reports its first write."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = threading.Event()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.drawn.set()
        return super().write(text)


def test_progress_spins_on_a_terminal_and_clears_its_line():
    stream = _Terminal()
    with compile_tool.Progress("compiling big.onnx", stream, quiet_s=0):
        assert stream.drawn.wait(timeout=30)
    text = stream.getvalue()
    assert "compiling big.onnx ... " in text and text.startswith("\r")
    assert text.endswith("\r") and text.rstrip("\r").split("\r")[-1].strip() == ""


def test_progress_writes_one_line_elsewhere_and_nothing_for_quick_steps():
    stream = io.StringIO()
    with compile_tool.Progress("compiling big.onnx", stream, quiet_s=0):
        pass
    assert stream.getvalue().startswith("crossrt: compiling big.onnx: done in ")
    assert stream.getvalue().count("\n") == 1
    quick = io.StringIO()
    with compile_tool.Progress("compiling small.onnx", quick):
        pass
    assert quick.getvalue() == ""


def _crossrt_executable() -> str:
    found = shutil.which("crossrt", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"no crossrt console script next to {sys.executable}")
    return found


def test_compile_then_run_as_subprocesses(models, tmp_path):
    exe = _crossrt_executable()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSRT_")}
    crm = tmp_path / "s2.crm"
    done = subprocess.run(
        [exe, "compile", str(models["scaled2.onnx"]), "-d", "cpu", "-o", str(crm)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "compiled 'scaled2'" in done.stdout
    assert f"scaled2.onnx {human_bytes(models['scaled2.onnx'].stat().st_size)} -> s2.crm " in (
        done.stdout
    )
    ran = subprocess.run(
        [exe, "run", str(crm), "-i", f"x={models['x.npy']}", "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), _expected(2), rtol=1e-5)


# -- cache ------------------------------------------------------------------------------------


@pytest.fixture
def filled(models, tmp_path) -> Path:
    """A cache with scaled1 (used last) and scaled2."""
    cache_dir = tmp_path / "cache"
    for name in ("scaled2", "scaled1"):
        crossrt.compile(models[f"{name}.onnx"], "cpu", cache_dir=cache_dir)
    return cache_dir


def test_cache_ls_table_and_json(capsys, filled):
    assert cli.main(["cache", "ls", "--cache-dir", str(filled)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["key", "model", "driver", "device", "size", "version", "last", "used"]
    assert [line.split()[1] for line in out[1:3]] == ["scaled2", "scaled1"]  # LRU first
    assert all("onnxruntime" in line and "just now" in line for line in out[1:3])
    assert out[3].startswith("2 entries, ")

    assert cache_tool.main(["ls", "--cache-dir", str(filled), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["model"] for e in doc["entries"]] == ["scaled2", "scaled1"]
    assert doc["total_bytes"] == sum(e["size"] for e in doc["entries"])
    for e in doc["entries"]:
        assert Path(e["path"]).stat().st_size == e["size"]
        assert e["version"] == 0 and e["driver"] == "onnxruntime" and len(e["key"]) == 64


def test_cache_ls_uses_the_environment_and_says_when_empty(capsys, tmp_path, monkeypatch):
    CompileCache(tmp_path / "empty")
    monkeypatch.setenv("CROSSRT_CACHE_DIR", str(tmp_path / "empty"))
    assert cache_tool.main(["ls"]) == 0
    assert capsys.readouterr().out.startswith("no entries in ")


def test_cache_verify_reports_and_fixes_corrupt_entries(capsys, filled):
    assert cache_tool.main(["verify", "--cache-dir", str(filled)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 ok, 0 corrupt"
    victim = sorted(filled.glob("*.crm"))[0]
    data = bytearray(victim.read_bytes())
    data[-30] ^= 0x55
    victim.write_bytes(bytes(data))

    assert cache_tool.main(["verify", "--cache-dir", str(filled)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT  {victim.stem[:12]}" in out and "SHA-256" in out
    assert out.splitlines()[-1] == "1 ok, 1 corrupt"
    assert victim.exists()
    assert cache_tool.main(["verify", "--cache-dir", str(filled), "--fix"]) == 1
    assert f"REMOVED  {victim.stem[:12]}" in capsys.readouterr().out
    assert not victim.exists()
    assert cache_tool.main(["verify", "--cache-dir", str(filled)]) == 0


def test_cache_prune_by_size_key_and_all(capsys, filled):
    sizes = {p.stem: p.stat().st_size for p in filled.glob("*.crm")}
    assert cache_tool.main(["prune", "--cache-dir", str(filled), "--max-size", "1G"]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    keep = max(sizes.values())
    assert cache_tool.main(["prune", "--cache-dir", str(filled), "--max-size", str(keep)]) == 0
    out = capsys.readouterr().out
    assert "scaled2" in out and "1 left" in out  # the least recently used went first
    (left,) = CompileCache(filled).entries()
    assert left.model == "scaled1"

    assert cache_tool.main(["prune", "--cache-dir", str(filled), "--key", left.key[:10]]) == 0
    assert "0 left" in capsys.readouterr().out
    crossrt.compile(_scaled_model(), "cpu", cache_dir=filled)
    assert cache_tool.main(["prune", "--cache-dir", str(filled), "--all"]) == 0
    assert list(filled.glob("*.crm")) == [] and list(filled.glob("*.json")) == []


def _scaled_model() -> crossrt.Model:
    b = GraphBuilder("scaled9")
    x = b.input("x", "float32", [2, 3])
    b.output(b.op("Sigmoid", [x], outputs=["y"]))
    return b.finish()


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (["ls"], "INVALID (2)", "give --cache-dir"),
        (["ls", "--cache-dir", "{missing}"], "NOT_FOUND", "does not exist"),
        (["prune", "--cache-dir", "{plain}", "--all"], "NOT_FOUND", "is not a crossrt cache"),
        (["prune", "--cache-dir", "{cache}"], "INVALID (2)", "--max-size"),
        (["prune", "--cache-dir", "{cache}", "--max-size", "lots"], "INVALID_OPTION", "lots"),
        (["prune", "--cache-dir", "{cache}", "--key", "zz"], "NOT_FOUND", "match key 'zz'"),
    ],
)
def test_cache_errors_are_one_line(capsys, tmp_path, monkeypatch, argv, code, fragment):
    monkeypatch.delenv("CROSSRT_CACHE_DIR", raising=False)
    monkeypatch.delenv("CROSSRT_CACHE_MAX_SIZE", raising=False)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "keep.json").write_text("{}")
    CompileCache(tmp_path / "cache")
    where = {"missing": tmp_path / "nope", "plain": tmp_path / "plain", "cache": tmp_path / "cache"}
    argv = [a.format(**where) for a in argv]
    assert cache_tool.main(argv) == 1
    line = _one_error_line(capsys.readouterr().err, f"cache {argv[0]}", code)
    assert fragment in line
    assert (tmp_path / "plain" / "keep.json").exists()  # never touches what is not a cache
