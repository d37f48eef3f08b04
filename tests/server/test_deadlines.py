"""Deadlines reach the daemon: a client's gRPC deadline, the request's ``timeout`` parameter
(tritonclient's, in microseconds) and ``connect(timeout=)`` on the lane. A request whose
deadline passes is not run, or is stopped where the engine can, and counted TIMEOUT; the
daemon serves on."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from serving import Daemon, start_daemon

import crossrt
from concurrency_models import endless, tiny
from crossrt.runtime import observer
from crossrt.server.client import connect

WAIT = 60


@pytest.fixture(scope="module")
def slow_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon serving ``tiny`` and ``heavy`` (:func:`endless`: a run that ends only when the
    daemon stops it; a chain of 2,000 MatMuls took 3 s to compile and 15 s to run here)."""
    folder = tmp_path_factory.mktemp("deadlines")
    repository = folder / "models"
    repository.mkdir()
    crossrt.compile(tiny(), "cpu").save(repository / "tiny.crm")
    crossrt.compile(endless(), "cpu").save(repository / "heavy.crm")
    daemon = start_daemon(folder, repository)
    yield daemon
    assert daemon.stop() == 0, "".join(daemon.log)


def _statistics(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, Any]:
    """The daemon's statistics of model ``name``, seen as ``crossrt top`` sees them."""
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(Path(daemon.socket).parent / "run"))
    (snapshot,) = [p for p in observer.processes() if p["pid"] == daemon.proc.pid]
    (model,) = [m for m in snapshot["models"] if m["served_as"] == f"{name}:1"]
    statistics: dict[str, Any] = model["statistics"]
    return statistics


def _failures(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, int]:
    """The daemon's failure counts of model ``name``, by code."""
    failures: dict[str, int] = _statistics(daemon, monkeypatch, name)["failures"]
    return failures


def _wait_for_in_flight(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, name: str, count: int
) -> None:
    """Until the daemon holds ``count`` requests of model ``name`` (running or queued): a
    bounded poll of what ``crossrt top`` sees, the daemon being another process."""
    deadline = time.monotonic() + WAIT
    while _statistics(daemon, monkeypatch, name)["in_flight"] < count:
        assert time.monotonic() < deadline, f"the daemon never held {count} {name} requests"
        time.sleep(0.01)


def _wait_for_timeout(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, name: str, before: int, code: str = "TIMEOUT"
) -> None:
    """Until the daemon counts one more failure ``code`` than ``before`` (the client gives
    up on its own clock, the daemon a moment later on its)."""
    deadline = time.monotonic() + WAIT
    while _failures(daemon, monkeypatch, name).get(code, 0) <= before:
        assert time.monotonic() < deadline, f"the daemon never counted the request {code}"
        time.sleep(0.05)


def test_an_expired_timeout_parameter_is_deadline_exceeded(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = slow_daemon.client()
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    with pytest.raises(tc.InferenceServerException) as raised:
        client.infer("tiny", [x], timeout=1)  # one microsecond: past before it can run
    assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "timed out" in raised.value.message()
    assert _failures(slow_daemon, monkeypatch, "tiny")["TIMEOUT"] >= 1
    assert client.infer("tiny", [x]).as_numpy("y").shape == (4, 8)  # serves on
    client.close()


def test_a_malformed_timeout_parameter_is_invalid_argument(slow_daemon: Daemon) -> None:
    client = slow_daemon.client()
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    with pytest.raises(tc.InferenceServerException) as raised:
        client.infer("tiny", [x], timeout=-5)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "timeout=-5" in raised.value.message()
    client.close()


@pytest.mark.parametrize("lane", [False, True], ids=["grpc", "lane"])
def test_a_client_timeout_stops_the_run_in_the_daemon(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch, lane: bool
) -> None:
    """``connect(timeout=)``: gRPC's deadline, or the lane's timeout parameter. The daemon
    stops the heavy run when it expires instead of running it to the end for nobody."""
    before = _failures(slow_daemon, monkeypatch, "heavy").get("TIMEOUT", 0)
    x = np.ones((64, 64), np.float32)
    # 0.5 s: the run never ends unless stopped, and the metadata call of load() under the
    # same deadline must not expire on a loaded machine (0.05 s did, with 12 processes on 2
    # cores).
    with connect(slow_daemon.url, timeout=0.5, lane=lane) as remote:
        model = remote.load("heavy")
        with pytest.raises(crossrt.CrossrtError) as raised:
            model.run({"x": x})
        assert raised.value.code is crossrt.StatusCode.TIMEOUT
    _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before)


def test_calls_without_a_deadline_leave_deadlines_working(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC says a call without a deadline has ~1e9 s remaining (infinity less now): taken
    for a deadline, it ended the watchdog thread (Condition.wait overflowed time_t) and no
    deadline or execution timeout was kept again in the daemon."""
    client = slow_daemon.client()
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    for _ in range(3):
        client.infer("tiny", [x])
    client.close()
    before = _failures(slow_daemon, monkeypatch, "heavy").get("TIMEOUT", 0)
    x = np.ones((64, 64), np.float32)
    with (
        connect(slow_daemon.url, timeout=0.5, lane=False) as remote,
        pytest.raises(crossrt.CrossrtError),
    ):
        remote.load("heavy").run({"x": x})
    _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before)
    assert "Traceback" not in "".join(slow_daemon.log)


def test_a_client_that_goes_away_has_its_run_stopped(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC client cancels its call (it hung up, Ctrl-C): the daemon stops the run where the
    engine can rather than finishing it for nobody, and counts it CANCELLED (Triton runs
    it to the end). Without a deadline, so only the hang-up can stop it."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    before = _failures(slow_daemon, monkeypatch, "heavy")
    request = pb.ModelInferRequest(model_name="heavy")
    request.inputs.add(name="x", datatype="FP32", shape=[64, 64])
    request.raw_input_contents.append(np.ones((64, 64), np.float32).tobytes())
    with grpc.insecure_channel(f"unix:{slow_daemon.socket}") as channel:
        call = pbg.GRPCInferenceServiceStub(channel).ModelInfer.future(request)
        _wait_for_in_flight(slow_daemon, monkeypatch, "heavy", 1)
        assert call.cancel()
    _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before.get("CANCELLED", 0), "CANCELLED")
    assert "Traceback" not in "".join(slow_daemon.log)


@pytest.mark.parametrize("when", ["running", "queued"])
def test_a_lane_client_that_hangs_up_has_its_request_stopped(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The lane's thread reads nothing while it serves a request, yet sees its client hang
    up (killed, or closing mid-request): the request is stopped where the engine can if it
    runs, dropped if it waits, and counted CANCELLED. No deadline is set, so only the
    hang-up can stop it; the daemon serves on."""
    from tritonclient.grpc import service_pb2 as pb

    from crossrt.server.lane import HEADER, MAGIC, Frames, send

    request = pb.ModelInferRequest(model_name="heavy")
    request.inputs.add(name="x", datatype="FP32", shape=[64, 64])
    request.raw_input_contents.append(np.ones((64, 64), np.float32).tobytes())
    before = _failures(slow_daemon, monkeypatch, "heavy").get("CANCELLED", 0)
    clients = []
    for _ in range(2 if when == "queued" else 1):  # heavy has one instance: one waits
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WAIT)
        sock.connect(slow_daemon.socket)
        sock.sendall(MAGIC + HEADER.pack(0, 0))
        assert Frames(sock).read() == (0, MAGIC)
        send(sock, 0, request.SerializeToString())
        clients.append(sock)
    _wait_for_in_flight(slow_daemon, monkeypatch, "heavy", len(clients))  # running (and queued)
    clients[-1].close()  # the last one hangs up
    _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before, "CANCELLED")
    if when == "queued":  # dropped at once, not when the instance it waited for frees up
        (running,) = clients[:-1]
        assert not select.select([running], [], [], 0)[0], "the running request ended first"
        running.close()  # now the running one hangs up too
        _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before + 1, "CANCELLED")
    with connect(slow_daemon.url) as remote:  # serves on
        assert remote.lane
        assert remote.load("tiny").run({"x": np.ones((4, 8), np.float32)})["y"].shape == (4, 8)
    assert "Traceback" not in "".join(slow_daemon.log)


@pytest.mark.parametrize("lane", [False, True], ids=["grpc", "lane"])
def test_a_remote_run_takes_a_deadline_and_a_cancel_token(
    slow_daemon: Daemon, monkeypatch: pytest.MonkeyPatch, lane: bool
) -> None:
    """``RemoteModel.run(deadline=, cancel=)``, as ``LoadedModel.run`` takes them: code
    written for an in-process model moves to the daemon unchanged. The daemon stops the run
    either way."""
    from concurrent.futures import CancelledError

    x = np.ones((64, 64), np.float32)
    with connect(slow_daemon.url, lane=lane) as remote:
        assert remote.lane == lane
        model = remote.load("heavy")
        before = _failures(slow_daemon, monkeypatch, "heavy")
        with pytest.raises(crossrt.DeadlineExceededError):
            model.run({"x": x}, deadline=time.monotonic() + 0.05)
        _wait_for_timeout(slow_daemon, monkeypatch, "heavy", before.get("TIMEOUT", 0))
        with pytest.raises(crossrt.DeadlineExceededError, match="before it was sent"):
            model.run({"x": x}, deadline=time.monotonic() - 1)
        token = crossrt.CancelToken()

        def cancel_once_held() -> None:  # the daemon holds it: not dropped before it came
            try:
                _wait_for_in_flight(slow_daemon, monkeypatch, "heavy", 1)
            finally:
                token.cancel()

        threading.Thread(target=cancel_once_held, daemon=True).start()
        with pytest.raises(CancelledError):
            model.run({"x": x}, cancel=token)
        _wait_for_timeout(
            slow_daemon, monkeypatch, "heavy", before.get("CANCELLED", 0), "CANCELLED"
        )
        with pytest.raises(crossrt.DeadlineExceededError):
            model.run_async({"x": x}, deadline=time.monotonic() + 0.05).result(WAIT)
        small = remote.load("tiny")  # the client serves on (on the lane: a new connection)
        y = small.run({"x": np.ones((4, 8), np.float32)}, deadline=time.monotonic() + WAIT)
        assert y["y"].shape == (4, 8)
        token = crossrt.CancelToken()
        assert small.run({"x": np.ones((4, 8), np.float32)}, cancel=token)["y"].shape == (4, 8)
        token.cancel()  # after the call: nothing to stop, and the next call is not hurt
        assert small.run({"x": np.ones((4, 8), np.float32)})["y"].shape == (4, 8)
