"""``crossrt profile MODEL``: where a model's time goes, as a user runs it (``--pid`` is
tested against a running process in tests/system/test_observe.py and against the daemon in
tests/server/test_observe_daemon.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from crossrt.tools import profile
from small_models import relu


@pytest.fixture
def model(tmp_path: Path) -> Path:
    source = tmp_path / "relu.onnx"
    onnx.save(relu().proto, source)
    return source


def test_profile_writes_a_trace_and_prints_the_phases(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.json"
    assert profile.main([str(model), "--seconds", "0.3", "--clients", "2", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    assert first.startswith("'relu': ") and "requests in" in first and "0 failed" in first
    for phase in profile.PHASES:
        assert f"  {phase} " in printed
    assert f"trace: {out}" in printed
    trace = json.loads(out.read_text())
    (summary,) = trace["otherData"]["summary"]
    assert summary["requests"] > 0 and summary["infer_us"]["p50"] > 0
    starts = [e for e in trace["traceEvents"] if e["ph"] == "b" and e["name"] == "relu"]
    assert len(starts) == min(summary["requests"], 20_000)


def test_json_prints_the_summary(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    assert profile.main([str(model), "--seconds", "0.1", "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["trace"] == str(out)
    assert printed["models"][0]["model"] == "relu"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seconds", "0"], "give seconds above 0"),
        (["--clients", "0"], "at least 1 client"),
        (["--shape", "nope=2x3"], "has no input 'nope'"),
        (["-o", "/nonexistent/folder/t.json"], "is not a folder this user can write"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    model: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert profile.main([str(model), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crossrt profile: error [") and message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give MODEL or --pid PID"),
        (["m.onnx", "--pid", "1"], "give MODEL or --pid PID"),
        (["--pid", "1", "--shape", "x=1"], "describe a MODEL to load"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        profile.main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_process_that_is_not_there_is_a_clear_error(
    runtime_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert profile.main(["--pid", "999999999", "-o", str(tmp_path / "t.json")]) == 1
    err = capsys.readouterr().err
    assert "NOT_FOUND" in err and "no crossrt process 999999999 answers" in err


def test_the_command_runs_as_a_process(model: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crossrt", "profile", str(model), "--seconds", "0.1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "trace: profile.json" in done.stdout and (tmp_path / "profile.json").exists()
