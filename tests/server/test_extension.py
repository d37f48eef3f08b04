"""The crossrt.v1 service through ``connect()``: devices, models sent as bytes (owned by the
sending process), core groups, infer_post / infer_wait with a cookie, cancellation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from serving import Daemon, start_daemon

import crossrt
from concurrency_models import tiny
from crossrt.server.client import connect

W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64


def test_devices_and_core_owners(daemon: Daemon) -> None:
    with connect(daemon.url) as remote:
        devices = remote.devices()
        assert any(d["id"] == "cpu:0" for d in devices)
        assert isinstance(remote.core_owners(), dict)


def test_models_sent_as_files_and_bytes(daemon: Daemon) -> None:
    x = np.ones((4, 8), np.float32)
    with connect(daemon.url) as remote:
        sent = remote.load(daemon.repository / "tiny.crm", name="sent-crm")
        np.testing.assert_allclose(sent.run(x)["y"], x @ W + 1, rtol=1e-6)
        onnx_bytes = tiny().to_bytes()  # compiled on the daemon
        compiled_there = remote.load(onnx_bytes, name="sent-onnx")
        np.testing.assert_allclose(compiled_there.run(x)["y"], x @ W + 1, rtol=1e-6)
        with pytest.raises(crossrt.CrossrtError, match="served already"):
            remote.load(daemon.repository / "tiny.crm", name="sent-crm")
        sent.unload()
        compiled_there.unload()
        names = {
            m.name for m in tc.InferenceServerClient(daemon.url).get_model_repository_index().models
        }
        assert not names & {"sent-crm", "sent-onnx"}


def test_models_of_a_dead_client_are_unloaded(daemon: Daemon) -> None:
    # A new interpreter, not a fork: a child forked from this process (gRPC's and ONNX
    # Runtime's threads running) could hang inside gRPC before it ever loaded.
    child = (
        "import os, sys, crossrt\n"
        "data = open(sys.argv[2], 'rb').read()\n"
        "crossrt.connect(sys.argv[1]).load(data, name='orphan')\n"
        "print('loaded', flush=True)\n"
        "os._exit(0)  # dies without unloading\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, daemon.url, str(daemon.repository / "tiny.crm")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "loaded", done.stderr
    client = tc.InferenceServerClient(daemon.url)
    assert "orphan" not in {m.name for m in client.get_model_repository_index().models}


def test_a_script_run_again_at_once_gets_its_model_name_back(daemon: Daemon) -> None:
    """A client script that loads a model under a name and ends, run twice in a row: the
    second run gets the name at once, not ALREADY_EXISTS until the daemon's sweep."""
    child = (
        "import sys, crossrt\n"
        "rt = crossrt.connect(sys.argv[1])\n"
        "model = rt.load(open(sys.argv[2], 'rb').read(), name='again')\n"
        "print(model.run({'x': __import__('numpy').ones((4, 8), 'float32')})['y'].shape)\n"
    )
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", child, daemon.url, str(daemon.repository / "tiny.crm")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stdout.strip()) == (0, "(4, 8)"), done.stderr


def test_core_group_start_and_stop(daemon: Daemon, tmp_path: Path) -> None:
    """On a daemon of its own with nothing loaded: the shared one's models hold every core."""
    x = np.ones((4, 8), np.float32)
    (tmp_path / "empty").mkdir()
    bare = start_daemon(tmp_path, tmp_path / "empty", ["--model-control", "explicit"])
    try:
        remote = connect(bare.url)
        group = remote.create_core_group(indices=[0])
        assert group.indices == (0,)
        model = remote.load(daemon.repository / "tiny.crm", name="grouped", group=group)
        with pytest.raises(crossrt.CrossrtError) as info:
            model.run(x)  # loaded stopped
        assert info.value.code == crossrt.StatusCode.OPERATION_FORBIDDEN
        model.start()
        np.testing.assert_allclose(model.run(x)["y"], x @ W + 1, rtol=1e-6)
        model.stop()
        model.unload()
        group.destroy()
        remote.close()
    finally:
        assert bare.stop() == 0


def test_post_wait_and_cancel(daemon: Daemon) -> None:
    x = np.full((4, 8), 3, np.float32)
    with connect(daemon.url) as remote:
        model = remote.load("tiny")
        cookies = [model.post(x) for _ in range(3)]
        for cookie in cookies:
            outputs = model.wait(cookie, timeout=30)
            assert outputs is not None
            np.testing.assert_allclose(outputs["y"], x @ W + 1, rtol=1e-6)
        with pytest.raises(crossrt.CrossrtError, match="waited for already"):
            model.wait(cookies[0])
        late = model.post(x)
        model.cancel(late)  # cancelled if still queued, else it ran: either way one answer
        try:
            assert model.wait(late, timeout=30) is not None
        except crossrt.CrossrtError as exc:
            assert "cancelled" in str(exc)


def test_posted_requests_of_a_dead_process_are_dropped() -> None:
    from concurrent.futures import Future

    from tritonclient.grpc import service_pb2 as pb

    from crossrt.server.extension import Posted, RuntimeService
    from crossrt.server.peers import Peer

    pid = os.fork()
    if pid == 0:  # pragma: no cover - a process that is gone at once
        os._exit(0)
    os.waitpid(pid, 0)
    service = RuntimeService(None, None, None, None)  # type: ignore[arg-type]
    queued: Future[object] = Future()
    mine: Future[object] = Future()
    me = Peer("unix-abstract:me", True, 0, 0, os.getpid())
    service._posted[1] = Posted(
        queued, pb.ModelInferRequest(), [], "1", Peer("gone", True, 0, 0, pid)
    )
    service._posted[2] = Posted(mine, pb.ModelInferRequest(), [], "1", me)
    assert service.release_orphans() == 1
    assert queued.cancelled() and not mine.cancelled()
    assert list(service._posted) == [2]
