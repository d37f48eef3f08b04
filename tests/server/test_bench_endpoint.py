"""``crossrt bench --endpoint``: a daemon's model timed as its clients call it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")

from serving import Daemon

from crossrt.tools import bench


@pytest.mark.parametrize(
    ("flags", "transport"),
    [([], "lane"), (["--grpc"], "gRPC"), (["--shm"], "lane, shared memory")],
)
def test_bench_times_a_served_model(
    daemon: Daemon,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    transport: str,
) -> None:
    endpoint = f"unix:{daemon.socket}"
    out = tmp_path / "b.json"
    argv = ["tiny", "--endpoint", endpoint, "--seconds", "0.2", "-o", str(out), *flags]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"'tiny' at {endpoint} ({transport}), x [4, 8], 1 client(s)")
    report = json.loads(out.read_text())
    assert report["requests"] > 0 and report["transport"] == transport


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu"], "the daemon has loaded it"),
        (["--max-batch-size", "4", "--instances", "2"], "--instances, --max-batch-size choose"),
        (["--shape", "nope=1"], "has no input 'nope'"),
    ],
)
def test_bench_against_a_daemon_refuses_what_does_not_apply(
    daemon: Daemon, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert bench.main(["tiny", "--endpoint", f"unix:{daemon.socket}", *args]) == 1
    assert message in capsys.readouterr().err


def test_a_model_the_daemon_does_not_serve_is_not_found(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["nothing", "--endpoint", f"unix:{daemon.socket}"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_grpc_without_an_endpoint_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["m.onnx", "--grpc"]) == 1
    assert "--grpc and --shm apply with --endpoint only" in capsys.readouterr().err
