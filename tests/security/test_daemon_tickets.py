"""Tickets with real users (useradd): a connection to the daemon's main socket, known by the
kernel (``SO_PEERCRED``), gets a ticket for the direct socket, which gRPC owns and where a
client's address says nothing. Another user cannot use a ticket whose connection closed; a
call without a ticket, or with a wrong one, is refused there whatever the caller names its
socket; a ticket acts as its own user (owners, and a token cannot change who it is); the relay
still knows tritonclient's user."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from as_user import AsUser, Lines, User, needs_root, once
from test_daemon_identity import _pump  # a byte pump between two sockets
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

import crossrt
from crossrt.errors import CrossrtError
from crossrt.server.proto import runtime_pb2 as v1
from crossrt.server.proto import runtime_pb2_grpc as v1_grpc
from crossrt.server.tickets import KEY, direct_path, request_ticket
from server.serving import Daemon, make_repository, start_daemon, start_shared_daemon
from small_models import add_one

pytestmark = needs_root


@pytest.fixture(scope="module")
def token(people: list[User]) -> str:
    return f"user-{os.urandom(16).hex()}"


@pytest.fixture(scope="module")
def daemon(folder: Path, people: list[User], token: str) -> Iterator[Daemon]:
    """A daemon on a Unix socket others may use (0666); people[0] has a user token."""
    d = start_shared_daemon(folder / "tickets", people[0].name, token)
    yield d
    assert d.stop() == 0, "".join(d.log)


def call(target: str, method: str, request: Any, ticket: str | None = None) -> str:
    """One call of KServe's (or crossrt.v1's, ``v1.Method``) on ``target``: "OK" or its
    status code's name."""
    metadata = () if ticket is None else ((KEY, ticket),)
    with grpc.insecure_channel(target) as channel:
        if method.startswith("v1."):
            stub: Any = v1_grpc.RuntimeStub(channel)  # type: ignore[no-untyped-call]
        else:
            stub = pbg.GRPCInferenceServiceStub(channel)
        try:
            getattr(stub, method.removeprefix("v1."))(request, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


# -- a ticket of a closed connection ---------------------------------------------------


def hold_a_ticket(lines: Lines, path: str) -> None:
    """As A: get a ticket, check it works, hand it over; close its connection when told."""
    ticket = request_ticket(path, None, f"unix:{path}")
    assert ticket is not None
    works = call(f"unix:{ticket.direct}", "ServerLive", pb.ServerLiveRequest(), ticket.value)
    lines.send({"ticket": ticket.value, "direct": ticket.direct, "works": works})
    assert lines.recv() == "close"
    ticket.sock.shutdown(socket.SHUT_WR)
    ticket.sock.settimeout(30)
    # The daemon's end of file comes once it has dropped the ticket.
    lines.send({"dropped": ticket.sock.recv(1) == b""})
    lines.recv()  # held until the test ends it


def use_until_refused(direct: str, ticket: str, seconds: float = 30.0) -> list[str]:
    """As B: the statuses of ServerLive with A's ticket, until refused or ``seconds``."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (not seen or seen[-1] == "OK"):
        seen.append(call(f"unix:{direct}", "ServerLive", pb.ServerLiveRequest(), ticket))
    return seen[-1:]


def test_b_cannot_use_a_ticket_after_its_connection_closed(
    daemon: Daemon, people: list[User]
) -> None:
    with AsUser(people[0], hold_a_ticket, daemon.socket) as a:
        held = a.recv()
        assert held.get("works") == "OK", held
        assert held["direct"] == direct_path(daemon.socket)
        a.send("close")
        assert a.recv() == {"dropped": True}
        refused = once(people[1], call, f"unix:{held['direct']}", "ServerLive",
                       pb.ServerLiveRequest(), held["ticket"])  # fmt: skip
    assert refused == "UNAUTHENTICATED"


def test_b_cannot_use_a_ticket_after_a_died(daemon: Daemon, people: list[User]) -> None:
    with AsUser(people[0], hold_a_ticket, daemon.socket) as a:
        held = a.recv()
        assert held.get("works") == "OK", held
    # A was killed (SIGKILL) and reaped: the kernel closed its connection.
    assert once(people[1], use_until_refused, held["direct"], held["ticket"]) == ["UNAUTHENTICATED"]


# -- no ticket, a wrong ticket, whatever the socket is named -------------------------------


def named_caller(direct: str, name: str) -> str:
    """A local socket for gRPC whose connections reach ``direct`` from a socket bound to
    ``name`` (a path, or an abstract name starting with NUL): the peer gRPC reports."""
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "fw.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)

    def forward() -> None:
        serial = 0
        while True:
            client, _ = listener.accept()
            serial += 1
            upstream = socket.socket(socket.AF_UNIX)
            abstract = name.startswith("\0")
            upstream.bind(
                f"{name}-{serial}" if abstract else os.path.join(folder, f"{name}{serial}")
            )
            upstream.connect(direct)
            for x, y in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(x, y), daemon=True).start()

    threading.Thread(target=forward, daemon=True).start()
    return f"unix:{path}"


def refusals(direct: str, abstract: str) -> dict[str, str]:
    """As B, on the direct socket: operator calls without a ticket, from an unnamed socket,
    one bound to a path (gRPC reports ``unix:<path>``, which the daemon takes for its own
    user on its inner socket) and one bound to an abstract name; with wrong tickets."""
    unload = pb.RepositoryModelUnloadRequest(model_name="tiny")
    out = {"plain": call(f"unix:{direct}", "RepositoryModelUnload", unload)}
    out["path"] = call(named_caller(direct, "me"), "RepositoryModelUnload", unload)
    out["abstract"] = call(named_caller(direct, abstract), "RepositoryModelUnload", unload)
    out["wrong"] = call(
        f"unix:{direct}", "ServerLive", pb.ServerLiveRequest(), os.urandom(32).hex()
    )
    out["garbage"] = call(f"unix:{direct}", "ServerLive", pb.ServerLiveRequest(), "not-a-ticket")
    client = tc.InferenceServerClient(f"unix://{direct}")
    try:
        client.get_server_metadata()
        out["tritonclient"] = "OK"
    except InferenceServerException as exc:
        out["tritonclient"] = f"{exc.status()} {exc.message()}"
    return out


def test_no_ticket_or_a_wrong_one_is_refused_on_the_direct_socket(
    daemon: Daemon, people: list[User]
) -> None:
    abstract = f"\0crossrt-peer-{os.urandom(16).hex()}"
    got = once(people[1], refusals, direct_path(daemon.socket), abstract)
    for kind in ("plain", "path", "abstract", "wrong", "garbage"):
        assert got[kind] == "UNAUTHENTICATED", (kind, got)
    assert got["tritonclient"].startswith("StatusCode.UNAUTHENTICATED"), got
    assert f"unix:{daemon.socket}" in got["tritonclient"]  # where to go instead
    # tiny is still served: no refused call reached the repository
    assert daemon.client().is_model_ready("tiny")


# -- a ticket acts as its user ------------------------------------------------------------


def own_a_model(lines: Lines, url: str, data: bytes) -> None:
    """As A, through the direct socket: load a model (A's), then unload it when told."""
    from crossrt.server.client import connect

    with connect(url, lane=False) as rt:
        rt.load(data, name="owned-by-a")
        lines.send({"direct": rt._ticket is not None})
        assert lines.recv() == "unload"
        rt.call("v1.Unload", v1.ModelRequest(name="owned-by-a"))
        lines.send("unloaded")
        lines.recv()


def unload_as(url: str, token: str | None) -> list[Any]:
    """As B, through the direct socket (with a token, when given): unload A's model."""
    from crossrt.server.client import connect

    with connect(url, lane=False, token=token) as rt:
        try:
            rt.call("v1.Unload", v1.ModelRequest(name="owned-by-a"))
        except CrossrtError as exc:
            return [rt._ticket is not None, type(exc).__name__]
    return [rt._ticket is not None, "OK"]


def test_a_ticket_acts_as_its_user(daemon: Daemon, people: list[User], token: str) -> None:
    data = crossrt.compile(add_one(3), "cpu").to_bytes()
    with AsUser(people[0], own_a_model, daemon.url, data) as a:
        assert a.recv() == {"direct": True}
        assert once(people[1], unload_as, daemon.url, None) == [True, "OperationForbiddenError"]
        # A's token over B's ticket: the kernel's user stays B (a token adds only a role)
        assert once(people[1], unload_as, daemon.url, token) == [True, "OperationForbiddenError"]
        a.send("unload")
        assert a.recv() == "unloaded"


# -- the relay still knows tritonclient's user ----------------------------------------------


def tritonclient_on_the_socket(url: str) -> dict[str, str]:
    """As B, tritonclient on the main socket: its own segment registers (a proven user),
    the repository is refused as B's (not as an anonymous caller's)."""
    client = tc.InferenceServerClient(url)
    key = f"/crossrt-b-{os.getpid()}"
    region = shm.create_shared_memory_region("mine", key, 128)
    shm.set_shared_memory_region(region, [np.ones((4, 8), np.float32)])
    out = {}
    try:
        client.register_system_shared_memory("mine", key, 128)
        x = tc.InferInput("x", [4, 8], "FP32")
        x.set_shared_memory("mine", 128)
        out["shm"] = str(client.infer("tiny", [x]).as_numpy("y").shape)
        client.unregister_system_shared_memory("mine")
    finally:
        shm.destroy_shared_memory_region(region)
    try:
        client.unload_model("tiny")
        out["unload"] = "OK"
    except InferenceServerException as exc:
        out["unload"] = str(exc.status())
    return out


def test_the_relay_still_knows_tritonclients_user(daemon: Daemon, people: list[User]) -> None:
    # tritonclient's segments are multiprocessing's, whose resource tracker is a new
    # interpreter: one B cannot start (it lives under /root). B's child inherits root's.
    resource_tracker.ensure_running()
    got = once(people[1], tritonclient_on_the_socket, daemon.url)
    assert got == {"shm": "(4, 8)", "unload": "StatusCode.PERMISSION_DENIED"}, got


# -- bounded like connections -------------------------------------------------------------


def tickets_until_refused(path: str) -> list[str]:
    """As B: tickets, each holding its connection, until one is refused (at most 5)."""
    held, seen = [], []
    for _ in range(5):
        try:
            ticket = request_ticket(path, None, f"unix:{path}")
        except CrossrtError as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
            break
        seen.append("ticket" if ticket is not None else "none")
        held.append(ticket)
    return seen


def test_tickets_per_user_are_bounded_like_connections(folder: Path, people: list[User]) -> None:
    tmp_path = folder / "bounded"
    tmp_path.mkdir()
    tmp_path.chmod(0o711)
    config = tmp_path / "serve.toml"
    config.write_text('socket_mode = "0666"\n')
    args = ["-c", str(config), "--user-connections", "2"]
    d = start_daemon(tmp_path, make_repository(tmp_path / "models"), args)
    try:
        seen = once(people[1], tickets_until_refused, d.socket)
    finally:
        assert d.stop() == 0, "".join(d.log)
    assert seen[:2] == ["ticket", "ticket"], seen
    assert seen[2].startswith("OutOfResourcesError") and "user_connections" in seen[2], seen
