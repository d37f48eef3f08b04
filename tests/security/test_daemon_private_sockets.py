"""Private sockets with real users (useradd): a connection to the daemon's main socket, known
by the kernel (``SO_PEERCRED``), gets a gRPC socket of its own that only its user may open;
every call there is that user (never the operator, whom gRPC's ``unix:`` peer would name),
another user cannot connect to it, and it ends with the connection that asked for it."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import tritonclient.grpc as tc
from as_user import AsUser, Lines, User, needs_root, once
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

from crossrt.errors import CrossrtError
from crossrt.server.private_sockets import private_socket
from server.serving import Daemon, make_repository, start_daemon, start_shared_daemon

pytestmark = needs_root


@pytest.fixture(scope="module")
def token(people: list[User]) -> str:
    return f"user-{os.urandom(16).hex()}"


@pytest.fixture(scope="module")
def daemon(folder: Path, people: list[User], token: str) -> Iterator[Daemon]:
    """A daemon on a Unix socket others may use (0666); people[0] has a user token."""
    d = start_shared_daemon(folder / "private", people[0].name, token)
    yield d
    assert d.stop() == 0, "".join(d.log)


def call(target: str, method: str, request: Any, token: str | None = None) -> str:
    """One KServe call on ``target``: "OK", or its status code's name and message."""
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(target) as channel:
        try:
            getattr(pbg.GRPCInferenceServiceStub(channel), method)(
                request, metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name} {exc.details()}"
    return "OK"


UNLOAD = pb.RepositoryModelUnloadRequest(model_name="tiny")


def hold(lines: Lines, main: str, token: str | None) -> None:
    """As A: hold a private socket; say its path and what A's own calls get there."""
    with private_socket(main, token) as held:
        live = call(held.url, "ServerLive", pb.ServerLiveRequest())
        unload = call(held.url, "RepositoryModelUnload", UNLOAD, token)
        client = tc.InferenceServerClient(held.url)
        lines.send({"path": held.path, "live": live, "unload": unload,
                    "ready": client.is_model_ready("tiny")})  # fmt: skip
        lines.recv()  # held until the test ends it


def named_in_acl(path: str) -> list[int]:
    """The users a file's POSIX access ACL names (its ACL_USER entries)."""
    acl = os.getxattr(path, "system.posix_acl_access")
    entries = struct.iter_unpack("<HHI", acl[4:])
    return [who for tag, _, who in entries if tag == 0x02]


def open_as_another(path: str) -> dict[str, str]:
    """As B: connect to A's private socket, by hand and with tritonclient."""
    out = {}
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
        out["connect"] = "connected"
    except OSError as exc:
        out["connect"] = type(exc).__name__
    finally:
        probe.close()
    try:
        tc.InferenceServerClient(f"unix:{path}").get_server_metadata()
        out["tritonclient"] = "OK"
    except InferenceServerException as exc:
        out["tritonclient"] = str(exc.status())
    return out


def test_only_its_user_opens_a_private_socket(daemon: Daemon, people: list[User]) -> None:
    with AsUser(people[0], hold, daemon.socket, None) as a:
        held = a.recv()
        assert held.get("live") == "OK" and held["ready"] is True, held
        got = once(people[1], open_as_another, held["path"])
        assert got == {"connect": "PermissionError", "tritonclient": "StatusCode.UNAVAILABLE"}
        assert Path(held["path"]).parent == Path(daemon.socket).parent
        assert os.stat(held["path"]).st_mode & 0o007 == 0  # no one else, but
        assert named_in_acl(held["path"]) == [people[0].uid]  # A, by an ACL entry


def test_a_private_sockets_calls_are_its_user(
    daemon: Daemon, people: list[User], token: str
) -> None:
    # gRPC names an unnamed Unix caller 'unix:', which the daemon takes for its own user on
    # its inner socket: on a private socket that would make A the operator.
    with AsUser(people[0], hold, daemon.socket, None) as a:
        held = a.recv()
    assert held["unload"].startswith("PERMISSION_DENIED"), held
    assert f"uid {people[0].uid} is not" in held["unload"], held
    # B with A's token: the kernel's user stays B (a token adds only a role)
    with AsUser(people[1], hold, daemon.socket, token) as b:
        held = b.recv()
    assert held["unload"].startswith("PERMISSION_DENIED"), held
    assert f"uid {people[1].uid} is not" in held["unload"], held
    assert daemon.client().is_model_ready("tiny")


def test_a_private_socket_ends_with_its_holder(daemon: Daemon, people: list[User]) -> None:
    with AsUser(people[0], hold, daemon.socket, None) as a:
        held = a.recv()
        assert held.get("live") == "OK", held
        # root may open any file: a connection made while A holds the socket (as A)
        channel = grpc.insecure_channel(f"unix:{held['path']}")
        stub = pbg.GRPCInferenceServiceStub(channel)
        stub.ServerLive(pb.ServerLiveRequest(), timeout=30)
    # A was killed (SIGKILL) and reaped: the kernel closed its connection, the daemon saw
    # the end of file and removes the socket.
    deadline = time.monotonic() + 30
    while os.path.exists(held["path"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(held["path"])  # no new connection
    with channel, pytest.raises(grpc.RpcError) as refused:
        stub.ServerLive(pb.ServerLiveRequest(), timeout=30)  # the connection made before
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "crossrt socket -- COMMAND" in str(refused.value.details())


def sockets_until_refused(main: str) -> list[str]:
    """As B: private sockets, each held, until one is refused (at most 5)."""
    held, seen = [], []
    for _ in range(5):
        try:
            held.append(private_socket(main))
        except CrossrtError as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
            break
        seen.append("socket")
    return seen


def test_private_sockets_per_user_are_bounded_like_connections(
    folder: Path, people: list[User]
) -> None:
    base = folder / "private-bounded"
    base.mkdir()
    base.chmod(0o711)
    config = base / "serve.toml"
    config.write_text('socket_mode = "0666"\n')
    args = ["-c", str(config), "--user-connections", "2"]
    d = start_daemon(base, make_repository(base / "models"), args)
    try:
        seen = once(people[1], sockets_until_refused, d.socket)
    finally:
        assert d.stop() == 0, "".join(d.log)
    assert seen[:2] == ["socket", "socket"], seen
    assert seen[2].startswith("OutOfResourcesError") and "user_connections" in seen[2], seen


def listen_for(lines: Lines, folder: str, uid: int | None) -> None:
    """As A (not root, as a daemon run by a user is): a listening socket, mode 0600, made
    one ``uid`` may open (``only_for``), or not (``None``)."""
    from crossrt.server.private_sockets import only_for

    path = os.path.join(folder, f"s-{uid}")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    os.chmod(path, 0o600)
    if uid is not None:
        only_for(path, uid)
    lines.send(path)
    lines.recv()


def connect_to(path: str) -> str:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
    except OSError as exc:
        return type(exc).__name__
    finally:
        probe.close()
    return "connected"


def test_a_daemon_that_is_not_root_lets_one_user_in_by_an_acl(
    folder: Path, people: list[User]
) -> None:
    a, b = people
    mine = folder / "not-root"
    mine.mkdir()
    os.chown(mine, a.uid, a.gid)
    mine.chmod(0o711)
    for uid, expected in ((b.uid, "connected"), (None, "PermissionError")):
        with AsUser(a, listen_for, str(mine), uid) as daemon_user:
            path = daemon_user.recv()
            assert isinstance(path, str), path
            assert once(b, connect_to, path) == expected, uid
