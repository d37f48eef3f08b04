"""Tickets (``server/tickets.py``): crossrt's gRPC client on the daemon's direct socket, which
gRPC owns, with a ticket a connection to the main socket got; a real daemon. The security
side, with real users, is tests/security/test_daemon_tickets.py."""

from __future__ import annotations

import os
import select
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
from serving import EXPLICIT, Daemon, make_repository, start_daemon
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from crossrt.server.client import connect
from crossrt.server.gate import Gate
from crossrt.server.lane import HEADER, Activity, Frames
from crossrt.server.peers import identify, socket_peer
from crossrt.server.status import ServiceError
from crossrt.server.tickets import (
    AGENT,
    KEY,
    MAGIC,
    TICKET_BYTES,
    Tickets,
    direct_path,
    request_ticket,
)

IDLE_S = 2


@pytest.fixture(scope="module")
def ticketed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose idle timeout is short (its ticket connections are dropped soon)."""
    folder = tmp_path_factory.mktemp("tickets")
    args = [*EXPLICIT, "--idle-timeout", str(IDLE_S)]
    d = start_daemon(folder, make_repository(folder / "models"), args)
    yield d
    assert d.stop() == 0, "".join(d.log)


def live(target: str, ticket: str | None) -> grpc.StatusCode:
    """ServerLive on ``target`` with ``ticket``: its status."""
    with grpc.insecure_channel(target) as channel:
        metadata = () if ticket is None else ((KEY, ticket),)
        try:
            pbg.GRPCInferenceServiceStub(channel).ServerLive(
                pb.ServerLiveRequest(), metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_the_direct_socket_is_beside_the_main_one_and_as_closed(ticketed: Daemon) -> None:
    main, direct = os.stat(ticketed.socket), os.stat(direct_path(ticketed.socket))
    assert stat.S_ISSOCK(direct.st_mode)
    assert (stat.S_IMODE(direct.st_mode), direct.st_uid, direct.st_gid) == (
        stat.S_IMODE(main.st_mode),
        main.st_uid,
        main.st_gid,
    )


def test_connect_calls_grpc_on_the_direct_socket(ticketed: Daemon) -> None:
    with connect(ticketed.url, lane=False) as rt:
        assert rt._ticket is not None
        assert rt._target == f"unix:{direct_path(ticketed.socket)}"
        model = rt.load("tiny")
        x = np.ones((4, 8), np.float32)
        assert model.run(x)["y"].shape == (4, 8)
        assert model.run_async(x).result(30)["y"].shape == (4, 8)


def test_a_ticket_lives_as_long_as_its_connection(ticketed: Daemon) -> None:
    target = f"unix:{direct_path(ticketed.socket)}"
    ticket = request_ticket(ticketed.socket, None, ticketed.url)
    assert ticket is not None and ticket.direct == direct_path(ticketed.socket)
    assert live(target, ticket.value) == grpc.StatusCode.OK
    # End the connection; the daemon's end of file comes after it dropped the ticket.
    ticket.sock.shutdown(socket.SHUT_WR)
    ticket.sock.settimeout(30)
    assert ticket.sock.recv(1) == b""
    ticket.close()
    assert live(target, ticket.value) == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("value", [None, "", "0" * 2 * TICKET_BYTES, "zz" * TICKET_BYTES, "abc"])
def test_no_ticket_or_a_wrong_one_is_refused(ticketed: Daemon, value: str | None) -> None:
    assert live(f"unix:{direct_path(ticketed.socket)}", value) == grpc.StatusCode.UNAUTHENTICATED


def test_the_refusal_says_where_to_go(ticketed: Daemon) -> None:
    target = f"unix:{direct_path(ticketed.socket)}"
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as info:
        pbg.GRPCInferenceServiceStub(channel).ServerMetadata(pb.ServerMetadataRequest(), timeout=30)
    assert f"unix:{ticketed.socket}" in info.value.details()
    assert "tritonclient" in info.value.details()


def test_a_big_ticketless_request_is_refused_unread(ticketed: Daemon) -> None:
    """The gate refuses from the metadata, before the message is received."""
    request = pb.ModelInferRequest(model_name="tiny", raw_input_contents=[bytes(64 << 20)])
    target = f"unix:{direct_path(ticketed.socket)}"
    options = [("grpc.max_send_message_length", -1)]
    with (
        grpc.insecure_channel(target, options=options) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        pbg.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_wrong_token_gets_no_ticket(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, make_repository(tmp_path / "models"), ["--token", "t" * 20])
    try:
        for body in (b"", b"Bearer wrong-token-0123456789"):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(30)
                sock.connect(d.socket)
                sock.sendall(MAGIC + HEADER.pack(len(body), 0) + body)
                status, answer = Frames(sock).read()
            assert status == grpc.StatusCode.UNAUTHENTICATED.value[0], answer
        with connect(d.url, token="t" * 20, lane=False) as rt:
            assert rt._ticket is not None
            assert rt.ready()
    finally:
        assert d.stop() == 0, "".join(d.log)


def test_a_ticket_dropped_when_idle_is_replaced(ticketed: Daemon) -> None:
    with connect(ticketed.url, lane=False) as rt:
        model = rt.load("tiny")
        first = rt._ticket
        assert first is not None
        # The daemon closes the idle ticket connection (idle_timeout); wait for that.
        readable, _, _ = select.select([first.sock], [], [], 30 * IDLE_S)
        assert readable and first.sock.recv(1) == b""
        assert live(f"unix:{first.direct}", first.value) == grpc.StatusCode.UNAUTHENTICATED
        assert model.run(np.ones((4, 8), np.float32))["y"].shape == (4, 8)  # a new ticket
        assert rt._ticket is not None and rt._ticket.value != first.value


def test_a_direct_path_someone_serves_is_left_alone(tmp_path: Path) -> None:
    """gRPC would unlink a live socket and take its place: the daemon serves no direct
    socket then, its relay knows no ticket greeting (as an older daemon), and connect()
    uses the main socket."""
    squatter = socket.socket(socket.AF_UNIX)
    squatter.bind(direct_path(str(tmp_path / "d.sock")))
    squatter.listen(1)
    try:
        d = start_daemon(tmp_path, make_repository(tmp_path / "models"), EXPLICIT)
        try:
            assert any("served by another process" in line for line in d.log), d.log
            assert request_ticket(d.socket, None, d.url) is None
            with connect(d.url, lane=False) as rt:
                assert rt._ticket is None and rt._target == rt.endpoint
                assert rt.load("tiny").run(np.ones((4, 8), np.float32))["y"].shape == (4, 8)
        finally:
            assert d.stop() == 0, "".join(d.log)
        assert os.path.exists(direct_path(d.socket))  # still the squatter's
    finally:
        squatter.close()


def test_a_call_with_a_ticket_is_its_holder_over_unix_only() -> None:
    """Tickets.bearer and peers.identify, on a ticket a real socket pair got."""
    tickets = Tickets(Gate())
    ours, theirs = socket.socketpair(socket.AF_UNIX)
    holder = socket_peer("ticket:7", 4321, 4321, 99)
    served = threading.Thread(
        target=tickets.serve, args=(ours, holder, Activity(), "/run/x.sock.direct")
    )
    served.start()
    theirs.sendall(MAGIC + HEADER.pack(0, 0))
    status, answer = Frames(theirs).read()
    assert status == 0 and answer[TICKET_BYTES:] == b"/run/x.sock.direct"
    value = bytes(answer[:TICKET_BYTES]).hex()
    agent = (("user-agent", f"{AGENT}{value} grpc-python/1.0"),)
    assert tickets.bearer(agent) == holder and tickets.bearer(((KEY, value),)) == holder
    assert tickets.bearer((("user-agent", "grpc-python/1.0"),)) is None
    # the holder, whatever the address a direct-socket client reports
    for address in ("unix:", "unix:/tmp/me", "unix-abstract:crossrt-peer-0"):
        assert identify(address, {}, None, tickets.bearer(agent)).uid == 4321
    assert identify("ipv4:127.0.0.1:5000", {}, None, holder).uid is None  # not over TCP
    theirs.close()
    served.join(30)
    assert not served.is_alive()
    with pytest.raises(ServiceError) as info:
        tickets.bearer(agent)  # ended: refused, not taken for the address
    assert info.value.status == grpc.StatusCode.UNAUTHENTICATED
    assert len(tickets) == 0
    ours.close()


def test_a_client_takes_a_new_ticket_when_the_daemon_restarts(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "models")
    d = start_daemon(tmp_path, repository, EXPLICIT)
    try:
        with connect(d.url, lane=False) as rt:
            model = rt.load("tiny")
            first = rt._ticket
            assert first is not None and model.run(np.ones((4, 8), np.float32))["y"].size
            assert d.stop() == 0, "".join(d.log)
            d = start_daemon(tmp_path, repository, EXPLICIT)  # the same sockets
            assert model.run(np.ones((4, 8), np.float32))["y"].shape == (4, 8)
            assert rt._ticket is not None and rt._ticket.value != first.value
    finally:
        assert d.stop() == 0, "".join(d.log)
