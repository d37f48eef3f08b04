"""The direct lane (``crossrt.server.lane``): ModelInfer over the daemon's Unix socket without
HTTP/2. The same answers and errors as gRPC's ModelInfer, frames that break the protocol
answered and the connection dropped while the daemon goes on, and a client that falls back
to gRPC when the daemon does not speak the lane."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
from serving import Daemon, make_repository, start_daemon
from test_malformed import CASES, W, X, request
from tritonclient.grpc import service_pb2 as pb

import crossrt
from crossrt import dtypes
from crossrt.runtime.memory.shm import SharedMemorySegment
from crossrt.server.client import connect
from crossrt.server.gate import Gate
from crossrt.server.lane import HEADER, MAGIC, MAX_BODY, REGISTER, Frames, LaneServer, send
from crossrt.server.lane_client import LaneClient, LaneUnavailable
from crossrt.server.peers import Peer
from crossrt.server.tensors import bound_outputs


class Wire:
    """A lane connection driven frame by frame, as a client written elsewhere would."""

    def __init__(self, path: str, token: bytes = b"") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.frames = Frames(self.sock)
        self.sock.sendall(MAGIC + HEADER.pack(len(token), 0) + token)
        self.greeting = self.frames.read()

    def ask(self, message: pb.ModelInferRequest) -> tuple[int, bytes]:
        send(self.sock, 0, message.SerializeToString())
        status, body = self.frames.read()
        return status, bytes(body)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def wire(daemon: Daemon) -> Iterator[Wire]:
    w = Wire(daemon.socket)
    assert w.greeting == (0, MAGIC)
    yield w
    w.close()


def served(w: Wire) -> None:
    """A good request is answered on this connection."""
    status, body = w.ask(request())
    assert status == 0, body
    response = pb.ModelInferResponse.FromString(body)
    y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(4, 8)
    np.testing.assert_allclose(y, X @ W + 1, rtol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_request_gets_grpcs_status_and_the_lane_goes_on(wire: Wire, case: str) -> None:
    build, code, text = CASES[case]
    status, body = wire.ask(build())
    assert status == code.value[0], body
    assert text in body.decode()
    served(wire)


def test_a_body_that_is_no_request_is_invalid(wire: Wire) -> None:
    send(wire.sock, 0, b"\xff\xff\xff")
    status, body = wire.frames.read()
    assert status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert b"not a ModelInferRequest" in body
    served(wire)


@pytest.mark.parametrize("how", ["oversized frame", "cut inside a frame"])
def test_broken_framing_drops_the_connection_only(daemon: Daemon, how: str) -> None:
    w = Wire(daemon.socket)
    if how == "oversized frame":  # must not be allocated
        w.sock.sendall(HEADER.pack(MAX_BODY + 1, 0))
        said = b"over the"
    else:
        w.sock.sendall(HEADER.pack(1000, 0) + b"partial")
        w.sock.shutdown(socket.SHUT_WR)
        said = b"ended inside a frame"
    status, body = w.frames.read()  # answered, then closed
    assert status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert said in bytes(body)
    assert w.sock.recv(1) == b""
    w.close()
    fresh = Wire(daemon.socket)
    served(fresh)
    fresh.close()


def test_connect_runs_through_the_lane_with_the_grpc_answers(daemon: Daemon) -> None:
    x = np.random.default_rng(5).random((4, 8), dtype=np.float32)
    with connect(daemon.url) as fast, connect(daemon.url, lane=False) as plain:
        assert fast.lane and not plain.lane
        a, b = fast.load("tiny"), plain.load("tiny")
        np.testing.assert_array_equal(a.run(x)["y"], b.run(x)["y"])
        with pytest.raises(crossrt.InvalidArgumentError, match=r"expected shape \[4,8\]") as lane:
            a.run(np.zeros((2, 8), np.float32))
        with pytest.raises(crossrt.InvalidArgumentError) as grpc_error:
            b.run(np.zeros((2, 8), np.float32))
        assert str(lane.value) == str(grpc_error.value)
        assert lane.value.code == grpc_error.value.code
        strings = np.array(["a", "bc"], dtype=object)  # BYTES through the lane
        assert fast.load("text").run({"text": strings})["same"].tolist() == ["a", "bc"]


def test_shared_memory_through_the_lane(daemon: Daemon) -> None:
    x = np.random.default_rng(6).random((4, 8), dtype=np.float32)
    with connect(daemon.url, shm_threshold=1) as remote:
        assert remote.lane
        y = remote.load("tiny").run(x)["y"]
    np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)


def test_many_threads_share_one_client(daemon: Daemon) -> None:
    """8 threads x 200 requests on one client (a connection each at a time), every answer
    checked against its own input."""
    errors: list[BaseException] = []
    with connect(daemon.url) as remote:
        model = remote.load("tiny")

        def client(k: int) -> None:
            rng = np.random.default_rng(k)
            try:
                for _ in range(200):
                    x = rng.random((4, 8), dtype=np.float32)
                    np.testing.assert_allclose(model.run(x)["y"], x @ W + 1, rtol=1e-5)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors[0]


def test_a_daemon_without_the_lane_means_grpc(tmp_path: object) -> None:
    """A listener that drops the greeting (as an older daemon's gRPC would): the lane
    client says so, and it never hangs on it."""
    path = f"{tmp_path}/old.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def old_daemon() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.recv(64)
            conn.sendall(struct.pack(">I", 0x12) + b"\x04\x00" * 4)  # an HTTP/2-ish reply
            conn.close()

    thread = threading.Thread(target=old_daemon, daemon=True)
    thread.start()
    client = LaneClient(path, None, 5.0, f"unix:{path}")
    with pytest.raises(LaneUnavailable):
        client.prepare()
    with pytest.raises(LaneUnavailable):
        client.infer(request())
    thread.join(10)
    listener.close()


def test_token_on_the_lane(tmp_path: object) -> None:
    from serving import make_repository, start_daemon

    folder = Path(str(tmp_path))
    repository = make_repository(folder / "models")
    d = start_daemon(folder, repository, ["--token", "lane-token"])
    try:
        wrong = Wire(d.socket, b"nope")
        assert wrong.greeting[0] == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert b"authorization: Bearer" in bytes(wrong.greeting[1])
        wrong.close()
        with connect(d.url, token="lane-token") as remote:
            assert remote.lane
            assert remote.load("tiny").run(X)["y"].shape == (4, 8)
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "gRPC"])
def test_run_async_and_await_on_each_transport(daemon: Daemon, lane: bool) -> None:
    x = np.random.default_rng(7).random((4, 8), dtype=np.float32)
    with connect(daemon.url, lane=lane) as remote:
        assert remote.lane is lane
        model = remote.load("tiny")
        futures = [model.run_async(x) for _ in range(40)]  # more than the lane's threads
        for future in futures:
            np.testing.assert_allclose(future.result(30)["y"], x @ W + 1, rtol=1e-6)
        np.testing.assert_allclose(asyncio.run(model.infer(x))["y"], x @ W + 1, rtol=1e-6)
        bad = model.run_async(np.zeros((2, 8), np.float32))
        assert isinstance(bad.exception(30), crossrt.InvalidArgumentError)


def test_a_huge_greeting_is_refused_before_the_token_is_read(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(daemon.socket)
        sock.sendall(MAGIC + HEADER.pack(MAX_BODY, 0))  # a 2 GiB token, never sent
        status, body = Frames(sock).read()
        assert status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert b"over the 4096-byte limit" in bytes(body)
        assert sock.recv(1) == b""
    fresh = Wire(daemon.socket)
    served(fresh)
    fresh.close()


def test_a_large_tensor_inside_the_messages(daemon: Daemon) -> None:
    """4 MB each way in the frames (no shared memory): bodies larger than the read buffer,
    grown as their bytes arrive, on both ends."""
    x = np.random.default_rng(8).random(1 << 20, dtype=np.float32)
    with connect(daemon.url, shm_threshold=None) as remote:
        assert remote.lane
        np.testing.assert_array_equal(remote.load("adder").run(x)["y"], x + 1)


def _register(w: Wire, name: str, byte_size: int, fds: list[int]) -> tuple[int, str]:
    """A registration frame with these descriptors; the daemon's answer."""
    body = pb.SystemSharedMemoryRegisterRequest(name=name, byte_size=byte_size).SerializeToString()
    socket.send_fds(w.sock, [HEADER.pack(len(body), REGISTER) + body], fds)
    status, answer = w.frames.read()
    return status, bytes(answer).decode()


def _daemon_fds(daemon: Daemon) -> int:
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


def test_large_tensors_go_through_a_memfd_the_daemon_maps(daemon: Daemon) -> None:
    # Over the lane, connect() passes a sealed memfd itself: no /dev/shm name, and the daemon
    # reads the inputs where the client wrote them.
    x = np.random.default_rng(9).random(1 << 18, dtype=np.float32)

    def memfds() -> set[str]:
        # Regions are per user: this user's other clients (earlier tests on this daemon, whose
        # connections may still be closing) list theirs too.
        with daemon.client() as c:  # gRPC lists and serves the same regions
            regions = c.get_system_shared_memory_status(as_json=True).get("regions", {})
        return {name for name, r in regions.items() if r.get("key") == "memfd"}

    before = memfds()
    with connect(daemon.url, shm_threshold=1024) as remote:
        assert remote.lane
        adder = remote.load("adder")
        for _ in range(3):  # the segment is reused
            np.testing.assert_array_equal(adder.run(x)["y"], x + 1)
        mine = memfds() - before
        assert mine
    assert not mine & memfds()  # unregistered when the client closes


def test_only_a_sealed_memfd_is_mapped(daemon: Daemon, wire: Wire, tmp_path: Path) -> None:
    # Counted over this lane connection alone: gRPC connections of earlier tests may still be
    # closing (their descriptors come and go), so the count is taken once it is steady.
    before = _steady_fds(daemon)
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, 4096)
    plain = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    os.ftruncate(plain, 4096)
    sealed = SharedMemorySegment(4096, kind="memfd")
    read_only = os.memfd_create("read-only", os.MFD_ALLOW_SEALING)
    os.ftruncate(read_only, 4096)
    fcntl.fcntl(read_only, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    try:
        for fds, size, code, text in (
            ([unsealed], 4096, grpc.StatusCode.FAILED_PRECONDITION, "sealed against shrinking"),
            ([read_only], 4096, grpc.StatusCode.FAILED_PRECONDITION, "cannot map"),
            ([plain], 4096, grpc.StatusCode.FAILED_PRECONDITION, "not a memfd"),
            ([], 4096, grpc.StatusCode.INVALID_ARGUMENT, "one descriptor"),
            ([sealed.fd, sealed.fd], 4096, grpc.StatusCode.INVALID_ARGUMENT, "not 2"),
            ([sealed.fd], 8192, grpc.StatusCode.INVALID_ARGUMENT, "does not fit"),
            ([sealed.fd], 0, grpc.StatusCode.INVALID_ARGUMENT, "does not fit"),
        ):
            status, answer = _register(wire, "r", size, fds)
            assert status == code.value[0] and text in answer, (fds, answer)
        # Descriptors sent with requests are closed, not kept.
        message = request().SerializeToString()
        socket.send_fds(wire.sock, [HEADER.pack(len(message), 0) + message], [sealed.fd])
        assert wire.frames.read()[0] == 0
        served(wire)
        assert eventually_equal(lambda: _daemon_fds(daemon), before)  # none kept
        assert _register(wire, "sealed-ok", 4096, [sealed.fd]) == (0, "")
        # the region's and its mapping's (regions.py asks the first where the file's holes
        # are), held until unregistered
        assert _daemon_fds(daemon) == before + 2
        # Its size is sealed: the client cannot cut it short under the daemon's mapping.
        with pytest.raises(PermissionError):
            os.ftruncate(sealed.fd, 0)
        with daemon.client() as c:
            c.unregister_system_shared_memory("sealed-ok")
    finally:
        os.close(unsealed)
        os.close(plain)
        os.close(read_only)
        sealed.close()


def _steady_fds(daemon: Daemon, seconds: float = 10.0) -> int:
    """The daemon's descriptor count once it stays the same for 0.3 s."""
    deadline = time.monotonic() + seconds
    last = _daemon_fds(daemon)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _daemon_fds(daemon)
        if now == last:
            return now
        last = now
    return last


def eventually_equal(read: Callable[[], int], want: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while read() != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return read() == want


def _in_region(region: str, x_at: int, y_at: int) -> pb.ModelInferRequest:
    """tiny's x read from, and y written to, these offsets of ``region``."""
    r = pb.ModelInferRequest(model_name="tiny")
    x = r.inputs.add(name="x", datatype="FP32", shape=[4, 8])
    y = r.outputs.add(name="y")
    for params, at in ((x.parameters, x_at), (y.parameters, y_at)):
        params["shared_memory_region"].string_param = region
        params["shared_memory_offset"].int64_param = at
        params["shared_memory_byte_size"].int64_param = X.nbytes
    return r


@pytest.mark.parametrize("y_at", [0, 64, 128, 132])
def test_outputs_are_written_into_a_mapped_region(daemon: Daemon, wire: Wire, y_at: int) -> None:
    # The model writes y where the client asked for it, unless y's slice overlaps x's (the
    # model would read what it writes: then y is computed apart and copied in).
    segment = SharedMemorySegment(4096, kind="memfd")
    name = f"outputs-{y_at}"
    try:
        assert _register(wire, name, 4096, [segment.fd]) == (0, "")
        memory = segment.array()
        memory[: X.nbytes] = X.reshape(-1).view(np.uint8)
        status, body = wire.ask(_in_region(name, 0, y_at))
        assert status == 0, body
        y = memory[y_at : y_at + X.nbytes].view(np.float32).reshape(4, 8)
        np.testing.assert_allclose(y, X @ W + 1, rtol=1e-6)
    finally:
        with daemon.client() as c:
            c.unregister_system_shared_memory(name)
        segment.close()


def test_which_outputs_the_model_writes_into_the_mapping() -> None:
    # Static outputs in a mapped region, not over an input's slice; the rest copied after.
    specs = [
        crossrt.TensorSpec("y", dtypes.from_name("float32"), (4, 8)),
        crossrt.TensorSpec("dyn", dtypes.from_name("float32"), (None, 8)),
    ]
    memory = np.zeros(4096, np.uint8)

    def mapped(name: str, offset: int, size: int) -> np.ndarray | None:
        return memory[offset : offset + size] if name == "mapped" else None

    def bound(region: str, y_at: int) -> list[str]:
        request = _in_region(region, 0, y_at)
        chosen = [(specs[0], (region, y_at, X.nbytes)), (specs[1], (region, 2048, 1024))]
        return sorted(bound_outputs(request, chosen, mapped))

    assert bound("mapped", 128) == ["y"]
    assert bound("mapped", 0) == bound("mapped", 124) == []  # over x: [0, 128)
    assert bound("copied", 128) == []
    y = bound_outputs(_in_region("mapped", 0, 256), [(specs[0], ("mapped", 256, 128))], mapped)
    assert y["y"].shape == (4, 8) and np.shares_memory(y["y"], memory[256:384])


@pytest.mark.parametrize("lane", [True, False])
def test_shared_memory_survives_a_daemon_started_again(tmp_path: Path, lane: bool) -> None:
    # A new daemon knows none of the client's segments: the client registers new ones and
    # the call goes through, for run and run_async alike.
    repository = make_repository(tmp_path / "models")
    daemon = start_daemon(tmp_path, repository)
    x = np.random.default_rng(10).random(1 << 16, dtype=np.float32)  # 256 KiB: shared memory
    try:
        with connect(daemon.url, lane=lane) as remote:
            adder = remote.load("adder")
            np.testing.assert_array_equal(adder.run(x)["y"], x + 1)
            for call in ("run", "run_async"):
                assert daemon.stop() == 0
                daemon = start_daemon(tmp_path, repository)
                y = adder.run(x) if call == "run" else adder.run_async(x).result(timeout=60)
                np.testing.assert_array_equal(y["y"], x + 1)
                np.testing.assert_array_equal(adder.run(x)["y"], x + 1)  # registered anew
    finally:
        daemon.stop()


def test_the_drain_waits_for_an_answer_to_be_sent_not_only_computed() -> None:
    """The daemon cuts the lane's connections once its drain ends, so an answer still being
    written must hold the drain (test_sigterm_drains_then_stops lost one to this race)."""
    gate = Gate()
    big = pb.ModelInferResponse(raw_output_contents=[bytes(8 << 20)])  # > the socket buffer
    answering = threading.Event()  # the gate counts a call from before its answer is made

    def answer(*_: object) -> pb.ModelInferResponse:
        answering.set()
        return big

    server = LaneServer(answer, gate)
    client, daemon_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    serving = threading.Thread(
        target=server.serve, args=(daemon_end, Peer("test", local=True)), daemon=True
    )
    serving.start()
    try:
        client.settimeout(30)
        client.sendall(MAGIC + HEADER.pack(0, 0))
        frames = Frames(client)
        assert frames.read() == (0, MAGIC)
        send(client, 0, request().SerializeToString())
        assert answering.wait(30)
        # The answer is computed; its 8 MB wait for this client to read them.
        assert gate.drain(0.5) == 1
        status, body = frames.read()  # reading lets the send finish, and the drain with it
        assert status == 0 and len(body) == big.ByteSize()
        assert gate.drain(30) == 0
    finally:
        client.close()
        serving.join(30)
        daemon_end.close()
