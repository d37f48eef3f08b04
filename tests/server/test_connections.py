"""How many connections the daemon's Unix socket keeps open (``max_connections``), and what
happens past that: a connection over the limit is refused with the reason, and a process out of
file descriptors pauses accepting instead of giving up on its socket."""

from __future__ import annotations

import contextlib
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
import tritonclient.grpc as tc
from serving import Daemon, free_port, make_repository, start_daemon
from test_lane import Wire, served
from test_malformed import W
from tritonclient.utils import InferenceServerException

import crossrt
from crossrt.server.client import connect
from crossrt.server.lane import HEADER, MAGIC, Frames
from crossrt.server.settings import build

LIMIT = 3
REFUSED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("limited")
    port = free_port()
    args = ["--max-connections", str(LIMIT), "--metrics", f"127.0.0.1:{port}"]
    d = start_daemon(folder, make_repository(folder / "models"), args)
    d.metrics = f"http://127.0.0.1:{port}/metrics"
    yield d
    assert d.stop() == 0, "".join(d.log)


def eventually(check: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def metric(d: Daemon, name: str) -> float:
    """A connection metric of the daemon's socket, scraped."""
    assert d.metrics is not None
    text = urllib.request.urlopen(d.metrics, timeout=10).read().decode()
    found = re.search(rf'^{name}{{socket="{re.escape(d.socket)}"}} (\S+)$', text, re.M)
    assert found, text
    return float(found.group(1))


def greeted(path: str) -> bool:
    w = Wire(path)
    try:
        return w.greeting == (0, MAGIC)
    finally:
        w.close()


def tiny_over_grpc(d: Daemon) -> np.ndarray:
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    with d.client() as c:
        answer = c.infer("tiny", [x]).as_numpy("y")
    assert answer is not None
    return answer


def test_a_connection_over_the_limit_is_refused_with_the_reason(limited: Daemon) -> None:
    assert eventually(lambda: metric(limited, "crossrt_connections") == 0)  # others' gone
    wires = [Wire(limited.socket) for _ in range(LIMIT)]
    try:
        assert all(w.greeting == (0, MAGIC) for w in wires)
        extra = Wire(limited.socket)
        status, body = extra.greeting
        extra.close()
        assert status == REFUSED
        assert f"{LIMIT} connections open" in body.decode()
        assert "--max-connections" in body.decode()
        # A client of the lane is told so, and does not fall back to gRPC (refused as well).
        with pytest.raises(crossrt.OutOfResourcesError, match="max_connections"):
            connect(f"unix:{limited.socket}")
        # A gRPC client sees its connection closed.
        with pytest.raises(InferenceServerException):
            tiny_over_grpc(limited)
        served(wires[0])  # those open are served all along
        assert any("refused a connection" in line for line in limited.log)
        assert metric(limited, "crossrt_connections") == LIMIT
        assert metric(limited, "crossrt_connections_refused_total") >= 3
    finally:
        for w in wires:
            w.close()
    # As soon as connections close, new ones are taken: the lane and gRPC alike. (A gRPC
    # channel closes its connection a moment after it is closed: waited for.)
    assert eventually(lambda: metric(limited, "crossrt_connections") == 0)
    assert greeted(limited.socket)
    assert tiny_over_grpc(limited).shape == (4, 8)
    assert eventually(lambda: metric(limited, "crossrt_connections") == 0)
    with connect(f"unix:{limited.socket}") as rt:
        assert rt.lane


def test_connections_that_end_any_way_free_their_place(limited: Daemon) -> None:
    # Closed before the greeting, mid-greeting, after a request, or after a gRPC call: each
    # gives its place back, so the limit never fills up with the dead.
    for _ in range(2 * LIMIT):
        assert eventually(lambda: metric(limited, "crossrt_connections") < LIMIT)
        socket.socket(socket.AF_UNIX).connect(limited.socket)  # closed at once (collected)
        s = socket.socket(socket.AF_UNIX)
        s.connect(limited.socket)
        s.sendall(MAGIC[:4])
        s.close()
        w = Wire(limited.socket)
        if w.greeting == (0, MAGIC):
            served(w)
        w.close()
        with contextlib.suppress(InferenceServerException):  # refused when others linger
            tiny_over_grpc(limited)
    started = time.monotonic()
    assert eventually(lambda: metric(limited, "crossrt_connections") == 0)
    print(f"all closed {time.monotonic() - started:.2f} s after the last")
    wires = [Wire(limited.socket) for _ in range(LIMIT)]
    try:
        assert all(w.greeting == (0, MAGIC) for w in wires)
    finally:
        for w in wires:
            w.close()


def test_max_connections_is_checked(tmp_path: Path) -> None:
    assert build(None, {"max_connections": 7}).max_connections == 7
    for bad in (0, -1, "many"):
        with pytest.raises(crossrt.InvalidOptionError, match="max_connections"):
            build(None, {"max_connections": bad})


def test_out_of_file_descriptors_pauses_accepting(tmp_path: Path) -> None:
    # With few descriptors, lane connections exhaust them: the next connection waits in the
    # listen backlog, and is greeted as soon as others close. The socket keeps accepting.
    d = start_daemon(tmp_path, make_repository(tmp_path / "models"), files=256)
    held: list[socket.socket] = []
    try:
        waiting = None
        for _ in range(256):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2.0)
            s.connect(d.socket)
            s.sendall(MAGIC + HEADER.pack(0, 0))
            try:
                assert Frames(s).read() == (0, MAGIC)
            except TimeoutError:
                waiting = s  # no descriptor left to accept it with
                break
            held.append(s)
        assert waiting is not None, "256 connections did not exhaust 256 descriptors"
        assert eventually(lambda: any("cannot accept a connection" in x for x in d.log))
        for s in held[:16]:
            s.close()
        waiting.settimeout(10.0)
        assert Frames(waiting).read() == (0, MAGIC)
        held.append(waiting)
        for s in held:
            s.close()
        held = []
        w = Wire(d.socket)
        served(w)
        w.close()
        assert tiny_over_grpc(d).shape == (4, 8)
    finally:
        for s in held:
            s.close()
        assert d.stop() == 0, "".join(d.log)


def test_a_client_at_the_limit_waits_for_its_own_connections(limited: Daemon) -> None:
    # 48 requests at once from one client, on a daemon that takes 3 connections (the
    # client's gRPC channel holds one): refused connections wait for the client's others.
    assert eventually(lambda: metric(limited, "crossrt_connections") == 0)
    refused = metric(limited, "crossrt_connections_refused_total")
    x = np.random.default_rng(3).random((4, 8), dtype=np.float32)
    with connect(f"unix:{limited.socket}") as remote:
        assert remote.lane
        tiny = remote.load("tiny")
        futures = [tiny.run_async(x) for _ in range(48)]
        for future in futures:
            np.testing.assert_allclose(future.result(timeout=60)["y"], x @ W + 1, rtol=1e-6)
    assert metric(limited, "crossrt_connections_refused_total") > refused  # it did wait
