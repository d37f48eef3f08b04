"""A daemon shared by people who do not trust each other, bounded (issue 24, points 3-6):
files that change under a served model, memory a request may cost, HTTP connections, and
what a client that has gone leaves behind. Each test runs a real ``crossrt serve`` and reads
the daemon's memory from ``/proc/PID/status``: memory is a correctness property here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import tritonclient.grpc as tc

import crossrt
from crossrt import GraphBuilder

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # serving.py: the daemon's
from serving import Daemon, free_port, start_daemon

N = 256


def summing() -> crossrt.Model:
    """y = x @ ones(256, 256): each y is sum(x); 256 KiB of weights that ONNX Runtime maps
    from the .crm file itself (over its 1 KiB threshold)."""
    b = GraphBuilder("summing")
    x = b.input("x", "float32", [1, N])
    b.output(b.op("MatMul", [x, b.constant(np.ones((N, N), np.float32), "W")], outputs=["y"]))
    return b.finish()


def doubled() -> crossrt.Model:
    """The same inputs and outputs, a much smaller file: y = 2 * sum(x) in every place."""
    b = GraphBuilder("summing")
    x = b.input("x", "float32", [1, N])
    total = b.op("ReduceSum", [x, b.constant(np.array([1], np.int64), "axes")])
    b.output(b.op("Mul", [total, b.constant(np.full((1, N), 2, np.float32), "two")], outputs=["y"]))
    return b.finish()


def vm_kib(pid: int, key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of process ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def until(check: Callable[[], bool], tries: int = 400) -> bool:
    """``check()`` until it holds; each try is a request to the daemon (no sleeping)."""
    return any(check() for _ in range(tries))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return tmp_path


def _stop(d: Daemon) -> None:
    assert d.stop() == 0, "".join(d.log)


@pytest.fixture
def served(folder: Path) -> Iterator[Daemon]:
    crossrt.compile(summing(), "cpu").save(folder / "models" / "summing.crm")
    d = start_daemon(folder, folder / "models", ["--http", f"127.0.0.1:{free_port()}"])
    yield d
    if d.proc.poll() is None:
        _stop(d)


def _ask(c: tc.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    given = tc.InferInput("x", [1, N], "FP32")
    given.set_data_from_numpy(x)
    out = c.infer("summing", [given]).as_numpy("y")
    assert out is not None
    return out


# -- 3. files that change under a served model --------------------------------------------------


def test_a_model_file_overwritten_truncated_or_deleted_never_reaches_the_daemon(
    served: Daemon, folder: Path
) -> None:
    x = np.arange(N, dtype=np.float32).reshape(1, N) / N
    served_file = folder / "models" / "summing.crm"
    smaller = folder / "doubled.crm"
    crossrt.compile(doubled(), "cpu").save(smaller)
    assert smaller.stat().st_size < served_file.stat().st_size / 4
    with served.client() as c:
        np.testing.assert_allclose(_ask(c, x), np.full((1, N), x.sum()), rtol=1e-5)
        shutil.copyfile(smaller, served_file)  # what cp does: truncate in place, then write
        for _ in range(20):
            np.testing.assert_allclose(_ask(c, x), np.full((1, N), x.sum()), rtol=1e-5)
        assert served.proc.poll() is None, "".join(served.log)
        served.proc.send_signal(signal.SIGHUP)  # the new version
        assert until(lambda: np.allclose(_ask(c, x), 2 * x.sum(), rtol=1e-5)), "".join(served.log)
        os.truncate(served_file, 0)
        served_file.unlink()
        np.testing.assert_allclose(_ask(c, x), np.full((1, N), 2 * x.sum()), rtol=1e-5)
    assert served.proc.poll() is None, "".join(served.log)


# -- 4. every request bounded before it is paid for -----------------------------------------------

TOKEN = "s3cret"
MiB = 2**20
LIMITS = {  # the daemon's settings in these tests (the defaults are larger: docs/daemon.md)
    "max_message_bytes": 64 * MiB,
    "max_json_bytes": 32 * MiB,
    "max_posted_bytes": 32 * MiB,
    "http_connections": 16,
    "http_timeout": 2.0,
}


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with a token, HTTP, and :data:`LIMITS`, serving ``adder`` (y = x + 1, [n])."""
    from small_models import add_one

    folder = tmp_path_factory.mktemp("bounded")
    (folder / "models").mkdir()
    crossrt.compile(add_one("n"), "cpu").save(folder / "models" / "adder.crm")
    crossrt.compile(summing(), "cpu").save(folder / "models" / "summing.crm")  # static shapes
    config = folder / "serve.toml"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in LIMITS.items()))
    port = free_port()
    args = ["--http", f"127.0.0.1:{port}", "--token", TOKEN, "-c", str(config)]
    d = start_daemon(folder, folder / "models", args)
    d.tcp = f"127.0.0.1:{port}"
    yield d
    _stop(d)


class Peak:
    """The daemon's peak RSS over a block, from ``VmHWM`` reset at its start (clear_refs 5)."""

    def __init__(self, d: Daemon) -> None:
        self.pid = d.proc.pid

    def __enter__(self) -> Peak:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self.before = vm_kib(self.pid, "VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.grew_mib = (vm_kib(self.pid, "VmHWM") - self.before) / 1024


def test_an_unauthenticated_grpc_request_is_refused_before_it_is_read(bounded: Daemon) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    request = pb.ModelInferRequest(model_name="adder")
    request.inputs.add(name="x", datatype="FP32", shape=[12 * MiB])
    request.raw_input_contents.append(bytes(48 * MiB))  # under the message limit
    with grpc.insecure_channel(bounded.url, [("grpc.max_send_message_length", -1)]) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        stub.ServerLive(pb.ServerLiveRequest(), metadata=[("authorization", f"Bearer {TOKEN}")])
        with Peak(bounded) as peak, pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=60)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert peak.grew_mib < 24, f"+{peak.grew_mib:.0f} MiB for a refused 48 MiB request"


def test_a_grpc_message_over_the_limit_is_refused_before_it_is_read(bounded: Daemon) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    request = pb.ModelInferRequest(model_name="adder")
    request.inputs.add(name="x", datatype="FP32", shape=[24 * MiB])
    request.raw_input_contents.append(bytes(96 * MiB))  # over max_message_bytes (64 MiB)
    metadata = [("authorization", f"Bearer {TOKEN}")]
    with grpc.insecure_channel(bounded.url, [("grpc.max_send_message_length", -1)]) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        stub.ServerLive(pb.ServerLiveRequest(), metadata=metadata)
        with Peak(bounded) as peak, pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=60, metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert peak.grew_mib < 24, f"+{peak.grew_mib:.0f} MiB for a refused 96 MiB request"


HEADER = "Inference-Header-Content-Length"


def _http(
    d: Daemon,
    body: bytes,
    path: str = "/v2/models/adder/infer",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    import http.client

    assert d.tcp is not None
    host, _, port = d.tcp.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body, {"Authorization": f"Bearer {TOKEN}", **(headers or {})})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_a_json_request_costs_a_few_times_its_body_at_most(bounded: Daemon) -> None:
    count = 4 * MiB  # 16 MiB of JSON: "0.5," each
    x = np.full(count, 0.5, np.float32)
    head = (
        f'{{"parameters": {{"binary_data_output": true}}, "inputs": [{{"name": "x", "shape": '
        f'[{count}], "datatype": "FP32", "parameters": {{"binary_data_size": {x.nbytes}}}}}]}}'
    ).encode()
    body = (
        f'{{"parameters": {{"binary_data_output": true}}, "inputs": [{{"name": "x", "shape": '
        f'[{count}], "datatype": "FP32", "data": [' + "0.5," * (count - 1) + "0.5]}]}"
    ).encode()
    with Peak(bounded) as binary:  # the same tensor as binary data: what it costs anyway
        status, answer = _http(bounded, head + x.tobytes(), headers={HEADER: str(len(head))})
    assert status == 200, answer[:500]
    with Peak(bounded) as peak:
        status, answer = _http(bounded, body)
    assert status == 200, answer[:500]
    y = np.frombuffer(answer[-4 * count :], np.float32)
    np.testing.assert_array_equal(y, np.full(count, 1.5, np.float32))
    # the text once more while it is parsed, then the tensor: 11x the body before
    extra = peak.grew_mib - binary.grew_mib
    assert extra < 2.5 * len(body) / MiB, (
        f"+{peak.grew_mib:.0f} MiB for 16 MiB of JSON, +{binary.grew_mib:.0f} MiB in binary"
    )
    # and answered in JSON too: its numbers written by orjson from the array (a list of them
    # all cost 8 times the tensor, 202 MiB for this one)
    with Peak(bounded) as both:
        status, answer = _http(bounded, body.replace(b'"binary_data_output": true', b'"x": 0'))
    assert status == 200, answer[:500]
    assert answer.endswith(b"1.5,1.5]}]}")
    assert both.grew_mib - binary.grew_mib < 5 * len(body) / MiB, (
        f"+{both.grew_mib:.0f} MiB for 16 MiB of JSON in and out, +{binary.grew_mib:.0f} in binary"
    )
    # nested (kept as text from 64 KiB: counted against the shape all the same), and a small
    # one (read whole by orjson)
    rows = np.arange(2**15, dtype=np.float32).reshape(256, 128) / 4
    doc = {"inputs": [{"name": "x", "shape": [2**15], "datatype": "FP32", "data": rows.tolist()}]}
    status, answer = _http(bounded, json.dumps(doc).encode())
    assert status == 200, answer[:500]
    np.testing.assert_array_equal(json.loads(answer)["outputs"][0]["data"], rows.ravel() + 1)
    doc["inputs"][0]["shape"] = [2**15 + 1]
    status, answer = _http(bounded, json.dumps(doc).encode())
    assert status == 400, answer[:500]
    assert b"hold 32768 values, its shape [32769] needs 32769" in answer
    small = (
        b'{"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]}]}'
    )
    status, answer = _http(bounded, small)
    assert status == 200, answer
    assert b"[2.0,3.0,4.0,5.5]" in answer


def _answer(s: socket.socket) -> bytes:
    """Everything the daemon says before it closes the connection."""
    s.settimeout(30)
    answer = b""
    while chunk := s.recv(4096):
        answer += chunk
    s.close()
    return answer


def test_a_json_body_over_the_limit_is_refused_unread(bounded: Daemon) -> None:
    head = (
        f"POST /v2/models/adder/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {40 * MiB}\r\n\r\n"
    ).encode()
    with Peak(bounded) as peak:
        answer = _answer(_open(bounded, head + b'{"inputs": [{"name": "x", "data": [1,'))
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"max_json_bytes" in answer
    assert peak.grew_mib < 16, f"+{peak.grew_mib:.0f} MiB for a refused 40 MiB body"


def test_a_sparse_region_costs_the_daemon_nothing(bounded: Daemon) -> None:
    key = f"/crossrt-sparse-{os.getpid()}"
    path = Path("/dev/shm") / key[1:]
    size = 256 * MiB
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)  # costs nothing: no page is written
        os.pwrite(fd, np.ones(1024, np.float32).tobytes(), 0)  # the first 4 KiB are
        c = tc.InferenceServerClient(bounded.url)
        headers = {"authorization": f"Bearer {TOKEN}"}
        c.register_system_shared_memory("sparse", key, size, headers=headers)
        c.register_system_shared_memory("small", key, 4096, headers=headers)
        os.ftruncate(fd, 2**30 + 1)
        with pytest.raises(Exception, match="max_region_bytes"):  # 1 GiB by default
            c.register_system_shared_memory("huge", key, 2**30 + 1, headers=headers)
        os.ftruncate(fd, size)
        try:
            x = tc.InferInput("x", [size // 4], "FP32")
            x.set_shared_memory("sparse", size)
            with Peak(bounded) as peak, pytest.raises(Exception) as refused:
                c.infer("adder", [x], headers=headers)
            assert "never written" in str(refused.value), refused.value
            assert peak.grew_mib < 16, f"+{peak.grew_mib:.0f} MiB for a sparse region"
            x.set_shared_memory("small", size)
            with pytest.raises(Exception, match="past its end"):
                c.infer("adder", [x], headers=headers)
            x = tc.InferInput("x", [1024], "FP32")  # the bytes written are served
            x.set_shared_memory("small", 4096)
            y = c.infer("adder", [x], headers=headers).as_numpy("y")
            np.testing.assert_array_equal(y, np.full(1024, 2, np.float32))
        finally:
            c.unregister_system_shared_memory(headers=headers)
            c.close()
    finally:
        os.close(fd)
        path.unlink()


POSTER = """
import os, sys
import numpy as np
from crossrt.errors import OutOfResourcesError
from crossrt.server.client import connect
rt = connect(sys.argv[1], token=sys.argv[2], shm_threshold=None, lane=False)
model = rt.load("adder")
x = np.ones(2**20, np.float32)  # 4 MiB
posted = 0
try:
    for _ in range(40):
        model.post(x)
        posted += 1
except OutOfResourcesError as exc:
    print(posted, exc, flush=True)
os._exit(0)  # dies without waiting for any
"""


def test_posted_requests_are_capped_per_client_and_freed_when_it_dies(bounded: Daemon) -> None:
    import subprocess

    from crossrt.server.client import connect

    def round_of_posts() -> str:
        return subprocess.run(
            [sys.executable, "-c", POSTER, bounded.url, TOKEN],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip

    def settled() -> int:
        """RSS once a living client's post is answered: the dead's posts are dropped then."""
        with connect(bounded.url, token=TOKEN, shm_threshold=None, lane=False) as rt:
            model = rt.load("adder")
            answer = model.wait(model.post(np.ones(4, np.float32)), timeout=60)
            assert answer is not None
            np.testing.assert_array_equal(answer["y"], np.full(4, 2, np.float32))
        return vm_kib(bounded.proc.pid, "VmRSS")

    said = round_of_posts()  # warm-up
    first = settled()
    for _ in range(3):
        said = round_of_posts()
    grew = (settled() - first) / 1024
    # 40 x 4 MiB asked for: refused past max_posted_bytes (32 MiB), with the reason
    assert grew < 48, f"RSS grew {grew:.0f} MiB over 3 rounds of posts by clients that died"
    posted = int(said.split()[0]) if said else 40
    assert 4 <= posted < 16, said
    assert "max_posted_bytes" in said


# -- 5. HTTP connections: a cap, timeouts, a body declared too large -------------------------------


def _threads(d: Daemon) -> int:
    return vm_kib(d.proc.pid, "Threads")


def _open(d: Daemon, data: bytes) -> socket.socket:
    assert d.tcp is not None
    host, _, port = d.tcp.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(data)
    return s


def test_half_open_http_requests_hold_bounded_threads_and_time_out(bounded: Daemon) -> None:
    before = _threads(bounded)
    partial = b"POST /v2/models/adder/infer HTTP/1.1\r\nHost: x\r\nContent-"
    held = [_open(bounded, partial) for _ in range(100)]
    try:
        # past the cap, a connection is answered 503 and closed at once; accepted in order,
        # so once the last one is, every one before it has its thread or its 503
        held[-1].settimeout(10)
        assert held[-1].recv(4096).startswith(b"HTTP/1.1 503")
        assert _threads(bounded) <= before + 16 + 2
        # and every one is closed by the daemon within its timeout, not held for ever
        for s in held:
            s.settimeout(10)
            while s.recv(4096):
                pass
    finally:
        for s in held:
            s.close()

    # a thread ends (and gives its place back) just after its connection is shut; until the
    # places are back, a new connection may still be the one past the cap, answered 503 and
    # closed as the request is sent (a broken pipe here): not yet
    def served_and_threads_gone() -> bool:
        try:
            status, _ = _http(bounded, b"{}", "/v2/repository/index")
        except (BrokenPipeError, ConnectionResetError):
            return False
        return status == 200 and _threads(bounded) <= before + 2

    assert until(served_and_threads_gone, tries=200), _threads(bounded)


def test_a_content_length_over_the_limit_is_413_before_anything_is_reserved(
    bounded: Daemon,
) -> None:
    def post(length: int, body: bytes) -> bytes:
        head = (
            f"POST /v2/models/adder/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
            f"\r\nConnection: close\r\nContent-Length: {length}\r\n\r\n"
        ).encode()
        return _answer(_open(bounded, head + body))

    # The same 30 connections with a small body first: the threads and the allocator's
    # arenas they bring (64 MiB of address space each with glibc, more arenas on more cores)
    # are then in place, so what the declared bodies add is theirs alone.
    small = b'{"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'
    for _ in range(30):
        assert post(len(small), small).startswith(b"HTTP/1.1 200"), "the baseline failed"
    size = vm_kib(bounded.proc.pid, "VmSize")
    with Peak(bounded) as peak:
        for _ in range(30):
            answer = post(2147483647, b"{")
            assert answer.startswith(b"HTTP/1.1 413"), answer
            assert b"max_message_bytes" in answer
    grew = (vm_kib(bounded.proc.pid, "VmSize") - size) / 1024
    assert grew < 2048, f"address space +{grew:.0f} MiB for 30 bodies declared 2 GiB: one kept"
    assert peak.grew_mib < 16


# -- 6. what a lane client that has gone leaves ---------------------------------------------------

LANE_CLIENT = """
import os, sys
import numpy as np
from crossrt.server.client import connect
rt = connect(sys.argv[1], token=sys.argv[2], shm_threshold=0)  # memfds passed on the lane
model = rt.load("adder")
for n in (1024, 4096):
    y = model.run({"x": np.full(n, float(n), np.float32)})["y"]
    assert (y == n + 1).all(), y
static = rt.load("summing")  # its output is written straight into the client's memfd
y = static.run({"x": np.ones((1, 256), np.float32)})["y"]
assert (y == 256).all(), y
print(os.getpid(), flush=True)
os._exit(0)  # dies holding its regions
"""


def _memfds_of(d: Daemon, pids: list[int]) -> list[str]:
    """The daemon's mappings of memfds that processes ``pids`` made (their names hold the
    PID: ``runtime/memory/shm.py``)."""
    maps = Path(f"/proc/{d.proc.pid}/maps").read_text().splitlines()
    return [m for m in maps if "memfd:" in m and any(f"-{pid}-" in m for pid in pids)]


def test_the_memfds_of_lane_clients_that_died_are_unmapped(bounded: Daemon) -> None:
    import subprocess

    # Not waited for: dead, but zombies until their parent reaps them (kill(pid, 0) still
    # finds them), as a harness that starts clients and forgets them leaves them.
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", LANE_CLIENT, bounded.url, TOKEN],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    pids = []
    for client in clients:
        assert client.stdout is not None
        pids.append(int(client.stdout.read()))  # it printed its PID and died
        os.waitid(os.P_PID, client.pid, os.WEXITED | os.WNOWAIT)  # a zombie now
    c = tc.InferenceServerClient(bounded.url)
    try:
        # Listing regions releases those of processes that have died. A connection's thread
        # may not have seen its client's hang-up yet on a loaded machine (it still holds the
        # last request's views): asked again for a few seconds, not forever.
        deadline = time.monotonic() + 15
        while True:
            c.get_system_shared_memory_status(headers={"authorization": f"Bearer {TOKEN}"})
            left = _memfds_of(bounded, pids)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        c.close()
    try:
        assert left == []
    finally:
        for client in clients:
            client.wait()


# -- the soak: every client at once, memory flat ---------------------------------------------------


def _grpc_client(d: Daemon, rounds: int, tag: str) -> None:
    """tritonclient over the Unix socket: tensors in the message, and through a /dev/shm
    segment of its own (read and written by the daemon with pread/pwrite)."""
    import tritonclient.utils.shared_memory as shm

    headers = {"authorization": f"Bearer {TOKEN}"}
    c = tc.InferenceServerClient(d.url)
    n = 2**18  # 1 MiB
    key = f"/crossrt-soak-{os.getpid()}-{tag}"
    handle = shm.create_shared_memory_region(f"soak-{tag}", key, 8 * n)
    c.register_system_shared_memory(f"soak-{tag}", key, 8 * n, headers=headers)
    try:
        for i in range(rounds):
            x = np.full(16, i, np.float32)
            given = tc.InferInput("x", [16], "FP32")
            given.set_data_from_numpy(x)
            y = c.infer("adder", [given], headers=headers).as_numpy("y")
            np.testing.assert_array_equal(y, x + 1)
            if i % 8 == 0:
                big = np.arange(n, dtype=np.float32) + i
                shm.set_shared_memory_region(handle, [big])
                given = tc.InferInput("x", [n], "FP32")
                given.set_shared_memory(f"soak-{tag}", 4 * n)
                out = tc.InferRequestedOutput("y")
                out.set_shared_memory(f"soak-{tag}", 4 * n, offset=4 * n)
                c.infer("adder", [given], outputs=[out], headers=headers)
                y = shm.get_contents_as_numpy(handle, np.float32, [n], offset=4 * n)
                np.testing.assert_array_equal(y, big + 1)
    finally:
        c.unregister_system_shared_memory(f"soak-{tag}", headers=headers)
        shm.destroy_shared_memory_region(handle)
        c.close()


def _lane_client(d: Daemon, rounds: int) -> None:
    """crossrt's own client on the direct lane: small tensors in the message, 1 MiB ones
    through a sealed memfd the daemon maps."""
    from crossrt.server.client import connect

    with connect(d.url, token=TOKEN, shm_threshold=2**16) as rt:
        adder, summing_ = rt.load("adder"), rt.load("summing")
        for i in range(rounds):
            x = np.full(16, i, np.float32)
            np.testing.assert_array_equal(adder.run({"x": x})["y"], x + 1)
            if i % 8 == 0:
                big = np.arange(2**18, dtype=np.float32) + i
                np.testing.assert_array_equal(adder.run({"x": big})["y"], big + 1)
                ones = np.ones((1, N), np.float32)
                np.testing.assert_array_equal(summing_.run({"x": ones})["y"], ones * N)


def _http_client(d: Daemon, rounds: int) -> None:
    """HTTP/REST: JSON, and 1 MiB tensors as binary data."""
    for i in range(rounds):
        doc = {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [i, 1, 2, 3]}]}
        status, answer = _http(d, json.dumps(doc).encode())
        assert status == 200, answer
        assert json.loads(answer)["outputs"][0]["data"] == [i + 1, 2, 3, 4]
        if i % 8 == 0:
            big = np.arange(2**18, dtype=np.float32) + i
            head = json.dumps(
                {
                    "parameters": {"binary_data_output": True},
                    "inputs": [
                        {
                            "name": "x",
                            "shape": [2**18],
                            "datatype": "FP32",
                            "parameters": {"binary_data_size": big.nbytes},
                        }
                    ],
                }
            ).encode()
            status, answer = _http(d, head + big.tobytes(), headers={HEADER: str(len(head))})
            assert status == 200, answer[:300]
            np.testing.assert_array_equal(np.frombuffer(answer[-big.nbytes :], np.float32), big + 1)


def test_soak_mixed_clients_every_answer_right_memory_flat(bounded: Daemon) -> None:
    """gRPC (message and /dev/shm), the lane (message and memfds) and HTTP (JSON and binary)
    at once, every answer checked; the daemon's RSS after the run within 64 MiB of its RSS
    after a warm-up of the same mix. The margin is what glibc's per-thread arenas may keep
    of the 1 MiB buffers (up to 16 arenas on 2 CPUs, a few MiB each, more of them in use the
    more requests overlap): +11 MiB on a quiet machine, +48 beside the rest of the suite.
    A leak of one 1 MiB buffer in 8 requests would be +450 MiB."""
    from concurrent.futures import ThreadPoolExecutor

    def mix(rounds: int) -> None:
        with ThreadPoolExecutor(5) as pool:
            done = [
                pool.submit(_grpc_client, bounded, rounds, "a"),
                pool.submit(_grpc_client, bounded, rounds, "b"),
                pool.submit(_lane_client, bounded, 2 * rounds),
                pool.submit(_lane_client, bounded, 2 * rounds),
                pool.submit(_http_client, bounded, rounds),
            ]
            for future in done:
                future.result(timeout=120)  # an answer that was wrong raises here

    mix(40)  # warm-up: pools, arenas, bindings, connections
    warm = vm_kib(bounded.proc.pid, "VmRSS")
    mix(400)
    grew = (vm_kib(bounded.proc.pid, "VmRSS") - warm) / 1024
    assert grew < 64, f"the daemon's RSS grew {grew:.0f} MiB after the warm-up"
    assert bounded.proc.poll() is None


def test_a_sparse_memfd_passed_on_the_lane_costs_the_daemon_nothing(bounded: Daemon) -> None:
    import fcntl

    from tritonclient.grpc import service_pb2 as pb

    from crossrt.errors import CrossrtError
    from crossrt.server.lane_client import LaneClient

    size = 256 * MiB
    fd = os.memfd_create("crossrt-sparse", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    lane = LaneClient(bounded.socket, TOKEN, 60.0, bounded.url)
    try:
        os.ftruncate(fd, size)  # nothing written: a hole
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        lane.register("sparse-memfd", fd, size)
        request = pb.ModelInferRequest(model_name="adder")
        x = request.inputs.add(name="x", datatype="FP32", shape=[size // 4])
        x.parameters["shared_memory_region"].string_param = "sparse-memfd"
        x.parameters["shared_memory_byte_size"].int64_param = size
        with Peak(bounded) as peak, pytest.raises(CrossrtError, match="never written"):
            lane.infer(request)
        assert peak.grew_mib < 16, f"+{peak.grew_mib:.0f} MiB for a sparse memfd"
    finally:
        lane.close()
        os.close(fd)
