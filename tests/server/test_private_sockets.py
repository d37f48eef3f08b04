"""Private sockets (``server/private_sockets.py``): any gRPC client on a socket gRPC owns, which
only the user of the connection that asked for it may open; ``crossrt socket -- COMMAND``;
a real daemon. The security side, with real users, is
tests/security/test_daemon_private_sockets.py."""

from __future__ import annotations

import os
import queue
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
import tritonclient.grpc as tc
from serving import EXPLICIT, Daemon, make_repository, start_daemon

import crossrt
from concurrency_models import slow_rows
from crossrt.errors import ClosedError
from crossrt.server.gate import Gate
from crossrt.server.lane import Activity
from crossrt.server.peers import socket_peer
from crossrt.server.private_sockets import (
    HeldContext,
    HolderGate,
    PrivateSocket,
    PrivateSockets,
    holder_of,
    remove_stale,
)
from crossrt.tools import cli

PERF_ANALYZER = Path(
    os.environ.get(
        "CROSSRT_PERF_ANALYZER",
        Path(__file__).resolve().parents[2] / "benchmarks" / ".perf_analyzer" / "perf_analyzer",
    )
)
# Run by `crossrt socket`: says what it was given, calls the daemon with tritonclient.
CHILD = """
import os, sys, numpy as np, tritonclient.grpc as tc
url = os.environ["CROSSRT_PRIVATE_URL"]
assert sys.argv[1] == url and sys.argv[2] == os.environ["CROSSRT_PRIVATE_SOCKET"], sys.argv
x = tc.InferInput("x", [4, 8], "FP32")
x.set_data_from_numpy(np.ones((4, 8), np.float32))
tc.InferenceServerClient(url).infer("tiny", [x])
print(url, flush=True)
sys.exit(3)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("private")
    d = start_daemon(folder, make_repository(folder / "models"), EXPLICIT)
    yield d
    assert d.stop() == 0, "".join(d.log)


def tiny_input() -> tc.InferInput:
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    return x


def test_tritonclient_infers_on_a_private_socket_unary_and_streaming(served: Daemon) -> None:
    with crossrt.private_socket(served.socket) as held:
        assert held.url == f"unix:{held.path}" and os.path.exists(held.path)
        client = tc.InferenceServerClient(held.url)
        expected = served.client().infer("tiny", [tiny_input()]).as_numpy("y")
        np.testing.assert_array_equal(client.infer("tiny", [tiny_input()]).as_numpy("y"), expected)
        answers: queue.Queue[object] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer("tiny", [tiny_input()])
        got = answers.get(timeout=30)
        client.stop_stream()
        assert isinstance(got, tc.InferResult), got
        np.testing.assert_array_equal(got.as_numpy("y"), expected)


class Context:
    def peer(self) -> str:
        return "unix:"  # what gRPC says of an unnamed Unix client

    def time_remaining(self) -> float:
        return 1.5


def test_a_held_context_names_its_holder_and_passes_the_rest_on() -> None:
    holder = socket_peer("private:7", 1000, 1000, 42)
    held = HeldContext(Context(), holder)
    assert holder_of(held) is holder and held.peer() == "private:7"
    assert held.time_remaining() == 1.5
    assert holder_of(Context()) is None


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream", "stream_unary", "stream_stream"])
def test_every_kind_of_call_on_a_private_socket_is_its_holder(kind: str) -> None:
    """The gate holds the contexts of the kinds it wraps; the others are held by the private
    socket's own gate: none reaches a servicer bare (it would be the daemon's user)."""
    seen: list[object] = []

    def behavior(request: object, context: object) -> object:
        seen.append(holder_of(context))
        return iter([request]) if kind.endswith("stream") else request

    handler = getattr(grpc, f"{kind}_rpc_method_handler")(behavior)
    holder = socket_peer("private:7", 1000, 1000, 42)
    details = SimpleNamespace(method="/inference.GRPCInferenceService/X", invocation_metadata=())
    gated = HolderGate(holder, Activity(), Gate()).intercept_service(lambda d: handler, details)
    answer = getattr(gated, kind)(b"x", Context())
    list(answer) if kind.endswith("stream") else answer
    assert seen == [holder]


def test_no_daemon_is_a_closed_error_that_says_so(tmp_path: Path) -> None:
    with pytest.raises(ClosedError, match="is `crossrt serve` running there"):
        crossrt.private_socket(str(tmp_path / "none.sock"))


def test_crossrt_socket_runs_a_command_with_its_url(
    served: Daemon, capfd: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "socket",
            "--daemon",
            served.socket,
            "--",
            sys.executable,
            "-c",
            CHILD,
            "{url}",
            "{socket}",
        ]
    )
    out = capfd.readouterr().out.strip()
    assert code == 3, out  # the command's status
    assert out.startswith(f"unix:{served.socket}.private-")
    assert not os.path.exists(out.removeprefix("unix:"))  # given back (the daemon removes it)


def test_crossrt_socket_without_a_command_or_a_daemon(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["socket", "--daemon", str(tmp_path / "none.sock")])
    assert exited.value.code == 2 and "a COMMAND to run is required" in capfd.readouterr().err
    assert cli.main(["socket", "--daemon", str(tmp_path / "none.sock"), "--", "true"]) == 1
    assert "crossrt socket: error [CLOSED" in capfd.readouterr().err


def test_perf_analyzer_over_grpc_through_crossrt_socket(served: Daemon) -> None:
    if not os.access(PERF_ANALYZER, os.X_OK):
        pytest.skip(f"perf_analyzer is not at {PERF_ANALYZER}: `make perf-analyzer` fetches it")
    command = [sys.executable, "-m", "crossrt", "socket", "--daemon", served.socket, "--"]
    command += [str(PERF_ANALYZER), "-m", "tiny", "-i", "grpc", "-u", "{url}"]
    command += ["--measurement-mode", "count_windows", "--measurement-request-count", "20"]
    command += ["--max-trials", "10", "--stability-percentage", "1000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Throughput:" in out, out  # {url}, unreplaced, would not be a URL it can reach


def test_the_sockets_a_dead_daemon_left_are_removed(tmp_path: Path) -> None:
    main = tmp_path / "d.sock"
    left = [tmp_path / "d.sock.private-0123", tmp_path / "d.sock.private-4567"]
    kept = [tmp_path / "d.sock.direct", tmp_path / "other.sock.private-89ab"]
    for path in left + kept:
        path.touch()
    remove_stale(str(main))
    assert [p.exists() for p in left + kept] == [False, False, True, True]


IDLE_S = 1


@pytest.fixture(scope="module")
def idling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose idle timeout is short, with a model whose calls outlast it."""
    folder = tmp_path_factory.mktemp("private-idle")
    repository = folder / "models"
    repository.mkdir()
    crossrt.compile(slow_rows(chain=50, size=1024), "cpu").save(repository / "slow.crm")
    d = start_daemon(folder, repository, [*EXPLICIT, "--idle-timeout", str(IDLE_S)])
    yield d
    assert d.stop() == 0, "".join(d.log)


def dropped(held: PrivateSocket, seconds: float) -> bool:
    """Whether the daemon closes the connection holding ``held`` within ``seconds``."""
    poller = select.poll()
    poller.register(held.fileno(), select.POLLIN | select.POLLRDHUP)
    return bool(poller.poll(seconds * 1000))


def test_an_idle_private_socket_is_dropped_and_a_running_call_keeps_it(idling: Daemon) -> None:
    # A stream held open is a call under way for as long as it lasts, on any machine (a
    # slow inference outlasted the idle timeout only where the CPU was slow enough).
    with crossrt.private_socket(idling.socket) as held:
        client = tc.InferenceServerClient(held.url)
        answers: list[Any] = []
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        try:
            x = tc.InferInput("x", [1, 1024], "FP32")
            x.set_data_from_numpy(np.ones((1, 1024), np.float32))
            client.async_stream_infer("slow", [x])  # the stream is open on the daemon's side
            assert not dropped(held, 3 * IDLE_S), "dropped while a call ran on it"
        finally:
            client.stop_stream()
        assert answers and answers[0][1] is None, answers
        assert dropped(held, 30), "an idle private socket was kept"
        assert not os.path.exists(held.path)


def test_a_server_that_cannot_start_leaves_no_socket_behind() -> None:
    """A private socket's gRPC server that fails to start (its threads: a process limit)
    is refused as UNAVAILABLE, and neither its socket file nor its staging folder stays."""
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from crossrt.server.peers import Peer
    from crossrt.server.status import ServiceError

    def server(gate: Any) -> grpc.Server:
        made = grpc.server(ThreadPoolExecutor(1), interceptors=[gate])

        def start() -> None:
            raise RuntimeError("can't start new thread")

        made.start = start  # the one part of the server that fails
        return made

    folder = Path(tempfile.mkdtemp(prefix="crossrt-t-"))  # a socket path under 108 bytes
    sockets = PrivateSockets(Gate(), server)
    try:
        with pytest.raises(ServiceError) as refused:
            peer = Peer("unix:", True, uid=os.getuid())
            sockets._open_for(peer, Activity(), str(folder / "d.sock"))
        assert refused.value.status is grpc.StatusCode.UNAVAILABLE
        assert "can't start new thread" in refused.value.message
        assert list(folder.iterdir()) == [] and len(sockets) == 0
    finally:
        shutil.rmtree(folder)
