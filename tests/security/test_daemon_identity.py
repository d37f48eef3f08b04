"""Who a client of ``crossrt serve`` is: the kernel says it over the Unix socket
(``SO_PEERCRED``), a credential the operator issued says it over TCP, and nothing else does.
A real daemon, real users (useradd), real sockets: the TIME_WAIT / AF_INET6 spoof that made any
local user root over loopback TCP, per-user tokens, and ``Bearer `` on every transport."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import contextlib

import grpc
import numpy as np
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from as_user import User, needs_root, once
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

import crossrt
from crossrt.errors import CrossrtError, InvalidOptionError
from crossrt.server.lane import HEADER, MAGIC, Frames
from crossrt.server.proto import runtime_pb2 as v1
from server.serving import Daemon, free_port, make_repository, start_daemon
from small_models import add_one

pytestmark = needs_root
TOKEN = "s3cret-shared-token"


def status_of(call: Any) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    return "OK"


@pytest.fixture(scope="module")
def tokens(people: list[User], folder: Path) -> dict[str, str]:
    return {
        "user": f"user-{os.urandom(16).hex()}",
        "operator": f"op-{os.urandom(16).hex()}",
    }


@pytest.fixture(scope="module")
def daemon(folder: Path, people: list[User], tokens: dict[str, str]) -> Iterator[Daemon]:
    """A daemon on a Unix socket others may use (0666), loopback TCP and HTTP, with a tokens
    file: people[0] has a user token, and an operator token."""
    base = folder / "main"
    base.mkdir()
    base.chmod(0o711)
    file = base / "tokens.toml"
    file.write_text(
        f'[[tokens]]\ntoken = "{tokens["user"]}"\nuser = "{people[0].name}"\n'
        f'[[tokens]]\ntoken = "{tokens["operator"]}"\nuser = "ops"\nrole = "operator"\n'
    )
    file.chmod(0o600)
    config = base / "serve.toml"
    config.write_text(f'socket_mode = "0666"\nmodel_control = "explicit"\ntokens = "{file}"\n')
    tcp, http = free_port(), free_port()
    args = ["-c", str(config), "-g", f"127.0.0.1:{tcp}", "--http", f"127.0.0.1:{http}"]
    args += ["--model-control", "explicit"]
    d = start_daemon(base, make_repository(base / "models"), args)
    d.tcp = f"127.0.0.1:{tcp}"
    d.http = f"http://127.0.0.1:{http}/v2"  # type: ignore[attr-defined]
    tc.InferenceServerClient(d.url).load_model("tiny")
    yield d
    assert d.stop() == 0, "".join(d.log)


@pytest.fixture
def root_segment() -> Iterator[tuple[str, Any]]:
    """Root's 0600 shared-memory segment with known bytes."""
    key = f"/crossrt-secret-{os.getpid()}"
    region = shm.create_shared_memory_region("secret", key, 128)
    shm.set_shared_memory_region(region, [np.full((4, 8), 7, np.float32)])
    os.chmod(f"/dev/shm{key}", 0o600)
    yield key, region
    shm.destroy_shared_memory_region(region)


# -- the spoof ----------------------------------------------------------------------------


def _spoofed(port: int) -> socket.socket:
    """A connection to 127.0.0.1:``port`` from a local port whose row in /proc/net/tcp is a
    TIME_WAIT one (uid 0), made from an AF_INET6 socket (listed only in /proc/net/tcp6)."""
    helper = socket.create_server(("127.0.0.1", 0))
    first = socket.socket()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    first.bind(("127.0.0.1", 0))
    local = first.getsockname()[1]
    first.connect(helper.getsockname())
    accepted, _ = helper.accept()
    first.close()  # the active close: 127.0.0.1:local goes to TIME_WAIT
    accepted.recv(1)
    accepted.close()
    helper.close()
    again = socket.socket(socket.AF_INET6)
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    again.bind(("::ffff:127.0.0.1", local))
    again.connect(("::ffff:127.0.0.1", port))
    return again


def _pump(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def spoof_register(port: int, key: str) -> dict[str, str]:
    """As an unprivileged user: gRPC through a forwarder whose connections to the daemon come
    from spoofed ports; register root's segment and read it through a model."""
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "fw.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)

    def forward() -> None:
        while True:
            client, _ = listener.accept()
            upstream = _spoofed(port)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    threading.Thread(target=forward, daemon=True).start()
    c = tc.InferenceServerClient(f"unix://{path}")
    out = {"register": status_of(lambda: c.register_system_shared_memory("stolen", key, 128))}
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_shared_memory("stolen", 128)
    out["read"] = status_of(lambda: c.infer("tiny", [x]))
    return out


def test_a_spoofed_time_wait_row_gets_no_shared_memory(
    daemon: Daemon, people: list[User], root_segment: tuple[str, Any]
) -> None:
    key, _ = root_segment
    assert daemon.tcp is not None
    port = int(daemon.tcp.rpartition(":")[2])
    got = once(people[1], spoof_register, port, key)
    assert got["register"].split()[0] in (
        "StatusCode.UNAUTHENTICATED",
        "StatusCode.PERMISSION_DENIED",
    ), got
    assert "in the request" in got["register"]  # says what to do instead
    assert got["read"] != "OK"


def test_anonymous_tcp_sends_tensors_in_the_message(daemon: Daemon) -> None:
    assert daemon.tcp is not None
    client = tc.InferenceServerClient(daemon.tcp)
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    assert client.infer("tiny", [x]).as_numpy("y").shape == (4, 8)
    # root over TCP without a credential is no one in particular: no shared memory
    key = f"/crossrt-anon-{os.getpid()}"
    region = shm.create_shared_memory_region("anon", key, 128)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("anon", key, 128)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    finally:
        shm.destroy_shared_memory_region(region)


# -- per-user tokens ---------------------------------------------------------------------


def token_user_shm(tcp: str, token: str, root_key: str) -> dict[str, Any]:
    """As the token's user over loopback TCP: its own segment works, root's is refused."""
    headers = {"authorization": f"Bearer {token}"}
    c = tc.InferenceServerClient(tcp)
    out: dict[str, Any] = {}
    out["root"] = status_of(
        lambda: c.register_system_shared_memory("r", root_key, 128, headers=headers)
    )
    own_key = f"/crossrt-own-{os.getpid()}"
    own = shm.create_shared_memory_region("own", own_key, 128)
    shm.set_shared_memory_region(own, [np.ones((4, 8), np.float32)])
    try:
        out["own"] = status_of(
            lambda: c.register_system_shared_memory("own", own_key, 128, headers=headers)
        )
        x = tc.InferInput("x", [4, 8], "FP32")
        x.set_shared_memory("own", 128)
        out["y"] = c.infer("tiny", [x], headers=headers).as_numpy("y").tolist()
        c.unregister_system_shared_memory("own", headers=headers)
    finally:
        shm.destroy_shared_memory_region(own)
    return out


def test_a_user_token_is_that_user_over_tcp(
    daemon: Daemon, people: list[User], tokens: dict[str, str], root_segment: tuple[str, Any]
) -> None:
    key, _ = root_segment
    got = once(people[0], token_user_shm, daemon.tcp, tokens["user"], key)
    assert got["root"].startswith("StatusCode.PERMISSION_DENIED"), got
    assert got["own"] == "OK", got
    expected = np.ones((4, 8), np.float32) @ (np.arange(64, dtype=np.float32).reshape(8, 8) / 64)
    np.testing.assert_allclose(np.array(got["y"]), expected + 1, rtol=1e-6)
    # a token nobody was issued is refused, not taken for anonymous
    client = tc.InferenceServerClient(daemon.tcp)
    with pytest.raises(InferenceServerException) as info:
        client.get_server_metadata(headers={"authorization": "Bearer forged-token-0123456789"})
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"


def _http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_repository_control_needs_the_operator_over_http(
    daemon: Daemon, tokens: dict[str, str]
) -> None:
    base = daemon.http  # type: ignore[attr-defined]
    unload = f"{base}/repository/models/relu/unload"
    load = f"{base}/repository/models/relu/load"
    assert _http(unload, b"{}") == 401  # anonymous
    user = {"Authorization": f"Bearer {tokens['user']}"}
    assert _http(unload, b"{}", user) == 403
    assert _http(load, b"{}", user) == 403
    operator = {"Authorization": f"Bearer {tokens['operator']}"}
    assert _http(load, b"{}", operator) == 200
    assert _http(f"{base}/models/relu/ready") == 200
    assert _http(unload, b"{}", operator) == 200


def test_a_tokens_file_others_can_read_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    file.write_text('[[tokens]]\ntoken = "0123456789abcdef0123"\nuser = "root"\n')
    file.chmod(0o644)
    command = [sys.executable, "-m", "crossrt", "serve", "-x", "-g", f"unix:{tmp_path}/d.sock"]
    done = subprocess.run(
        [*command, "--tokens", str(file)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "0644" in done.stderr and "chmod 600" in done.stderr


# -- Bearer --------------------------------------------------------------------------------


def _greet(path: str, body: bytes) -> int:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(MAGIC + HEADER.pack(len(body), 0) + body)
        return Frames(sock).read()[0]


def test_bearer_is_required_everywhere(tmp_path: Path) -> None:
    http = free_port()
    d = start_daemon(
        tmp_path,
        make_repository(tmp_path / "models"),
        ["--token", TOKEN, "--http", f"127.0.0.1:{http}"],
    )
    try:
        base = f"http://127.0.0.1:{http}/v2"
        assert _http(f"{base}/models/tiny", headers={"Authorization": TOKEN}) == 401
        assert _http(f"{base}/models/tiny", headers={"Authorization": f"Bearer {TOKEN}"}) == 200
        client = d.client()
        with pytest.raises(InferenceServerException) as info:
            client.get_server_metadata(headers={"authorization": TOKEN})
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        unauthenticated = grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert _greet(d.socket, TOKEN.encode()) == unauthenticated
        assert _greet(d.socket, f"Bearer {TOKEN}".encode()) == 0
        from crossrt.server.client import connect

        with connect(d.url, token=TOKEN) as remote:  # the client sends Bearer on the lane
            assert remote.lane
            model = remote.load("tiny")
            assert model.run(np.ones((4, 8), np.float32))["y"].shape == (4, 8)
    finally:
        assert d.stop() == 0, "".join(d.log)


def test_the_settings_name_the_new_options() -> None:
    from crossrt.server.settings import build

    options = build(None, {"max_connections": 10})
    assert options.user_share == 5  # half, by default
    assert build(None, {"user_connections": 3}).user_share == 3
    assert options.idle_timeout == 300
    for bad in ({"user_connections": -1}, {"idle_timeout": -1}, {"idle_timeout": "soon"}):
        with pytest.raises(InvalidOptionError):
            build(None, bad)
    assert build(None, {"load_model": ("*",)}).load_model == ("*",)


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ('[[tokens]]\ntoken = "short"\nuser = "root"\n', "16 characters"),
        ('[[tokens]]\ntoken = "0123456789abcdef"\nuser = "root"\nrole = "admin"\n', "role"),
        ('[[tokens]]\ntoken = "0123456789abcdef"\n', "user"),
        ('[[tokens]]\ntoken = "0123456789abcdef"\nuser = "a"\n' * 2, "twice"),
        ("tokens = 3\n", "[[tokens]]"),
    ],
)
def test_a_malformed_tokens_file_is_refused(tmp_path: Path, text: str, wrong: str) -> None:
    from crossrt.server.tokens import load_tokens

    file = tmp_path / "tokens.toml"
    file.write_text(text)
    file.chmod(0o600)
    with pytest.raises(InvalidOptionError, match=re.escape(wrong)):
        load_tokens(str(file))


def test_a_token_maps_to_its_user_and_role(tmp_path: Path, people: list[User]) -> None:
    from crossrt.server.peers import identify
    from crossrt.server.tokens import Credentials, load_tokens

    file = tmp_path / "tokens.toml"
    file.write_text(
        f'[[tokens]]\ntoken = "{"a" * 20}"\nuser = "{people[0].name}"\n'
        f'[[tokens]]\ntoken = "{"b" * 20}"\nuser = "no-such-account"\nrole = "operator"\n'
    )
    file.chmod(0o600)
    credentials = Credentials(None, load_tokens(str(file)))
    user = identify("ipv4:127.0.0.1:5000", {}, credentials.grant(f"Bearer {'a' * 20}"))
    assert (user.uid, user.operator, user.local) == (people[0].uid, False, True)
    assert people[0].gid in user.groups()
    named = identify("ipv4:10.0.0.1:5000", {}, credentials.grant(f"Bearer {'b' * 20}"))
    assert (named.uid, named.operator, named.local, named.principal) == (
        None,
        True,
        False,
        "user no-such-account",
    )
    assert credentials.grant(None) is None  # no shared token: anonymous may come in
    file.chmod(0o640)
    with pytest.raises(InvalidOptionError, match="0640"):
        load_tokens(str(file))


def unload_over_the_socket(url: str, name: str) -> str:
    from crossrt.server.client import connect

    with connect(url) as rt:
        try:
            rt.call("v1.Unload", v1.ModelRequest(name=name))
        except CrossrtError as exc:
            return type(exc).__name__
    return "OK"


def test_a_token_user_and_the_same_user_on_the_socket_are_one_owner(
    daemon: Daemon, people: list[User], tokens: dict[str, str]
) -> None:
    from crossrt.server.client import connect

    assert daemon.tcp is not None
    data = crossrt.compile(add_one(3), "cpu").to_bytes()
    with connect(daemon.tcp, token=tokens["user"]) as rt:  # people[0], by its token
        rt.load(data, name="tokened")
    with connect(daemon.tcp) as anonymous:
        with pytest.raises(crossrt.errors.OperationForbiddenError):
            anonymous.load(data, name="nobodys")  # an anonymous client owns nothing
        with pytest.raises(crossrt.errors.OperationForbiddenError):
            anonymous.call(
                "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="tiny")
            )
    assert once(people[1], unload_over_the_socket, daemon.url, "tokened") == (
        "OperationForbiddenError"
    )
    assert once(people[0], unload_over_the_socket, daemon.url, "tokened") == "OK"
