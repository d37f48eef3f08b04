"""Tickets: crossrt's own gRPC client on a socket gRPC owns, with no relay, still known by
the kernel.

The daemon's Unix socket learns who connected from the kernel (``SO_PEERCRED``) and relays
each gRPC connection to gRPC's own socket (:mod:`.relay`): two more hops per call. A client
that can take one step first skips them. It opens a connection to the main socket with the
greeting :data:`MAGIC` (the relay recognises it, as it does the lane's), and the daemon,
which knows that connection's uid, gid and pid, answers a *ticket*: 32 random bytes, bound
to those credentials and valid while that connection stays open. The client then calls gRPC
on a second socket of the daemon's (the *direct socket*, beside the main one, same mode and
owner), which gRPC owns itself, presenting the ticket on every call: as the metadata
``crossrt-ticket``, or at the head of its ``user-agent`` (:data:`AGENT`), which crossrt's
client uses because gRPC sends a channel's user agent with every call anyway, where any
per-call metadata cost about 9 µs a call (client and daemon, a tiny ModelInfer, loaded
2-core host). When the client closes the connection or dies, the kernel closes it, the daemon
sees the end of file and drops the ticket: a ticket of a closed connection is refused.

Wire format (the lane's frames, :mod:`.lane`): the client sends :data:`MAGIC` and a frame
with status 0 whose body is its authorization value (``Bearer <token>``, empty without a
token); the daemon answers a frame with status 0 whose body is the ticket
(:data:`TICKET_BYTES` bytes) followed by the direct socket's path (UTF-8), or a frame with
UNAUTHENTICATED (a wrong token) or RESOURCE_EXHAUSTED (as many connections open as the
daemon allows, or the user's share) and a message, then closes. After the ticket, neither
side sends anything: a byte from the client ends the connection (and the ticket).

gRPC's server tells a servicer only ``context.peer()``, which is ``unix:`` for every unnamed
Unix client, and a client may name its socket what it likes (a path, or an abstract name,
in a network namespace of its own even one the relay's table holds). So nothing is believed
of a direct-socket caller's address: its gRPC server has a gate of its own
(:class:`TicketGate`) that refuses every call without a live ticket (UNAUTHENTICATED, before
its request is read), and wherever the daemon asks who calls, a call that carries a ticket is
that ticket's holder (:meth:`Tickets.bearer`, then :func:`.peers.identify`), named
``ticket:<n>`` after its connection; a call carrying a ticket that has ended since is
refused, never taken for its address. The ticket is looked up again only then: an inference
call that asks nothing of its caller pays for one lookup at the gate. A ticket is looked up in
a dict keyed by its text, never compared byte by byte with a guess: CPython hashes the key
with SipHash under a random key of its own and compares bytes only with an entry whose
64-bit hash matches, so a wrong guess's time says nothing of any ticket's bytes (a SHA-256
digest as the key, as the tokens file's, cost 7.5 µs a call in the daemon, a third of the
ticket's whole cost; no safer). Tickets are never logged. Each ticket holds one connection
of the main socket open, counted in ``max_connections`` and in the user's
``user_connections``: a user holds at most that many tickets at once. tritonclient and
perf_analyzer, which know no greeting, use the relay, or a private socket of their own
(:mod:`.private_sockets`, ``crossrt socket -- COMMAND``), which needs no secret.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from .gate import Gate, refusing
from .lane import CODES, GREETING_SECONDS, Activity, FrameError, greet, greeted, hold
from .peers import Peer
from .status import ServiceError, error_from

log = logging.getLogger("crossrt.serve")

MAGIC = b"CRTTICK1"
"""What a client asking for a ticket sends first (the lane's is ``CRTLANE1``)."""
KEY = "crossrt-ticket"
"""The metadata key a ticket travels under (its value: the ticket in hex)."""
AGENT = "crossrt-ticket/"
"""A user agent that starts with this and the ticket in hex carries that ticket (gRPC
appends its own: ``crossrt-ticket/<hex> grpc-python/...``)."""
TICKET_BYTES = 32
LOOK_S = 0.05
"""How often a client looks whether the daemon dropped its ticket (:meth:`Ticket.alive`)."""
REFUSED = (
    "this socket serves crossrt clients with a ticket (metadata 'crossrt-ticket'), which a "
    "connection to the daemon's main socket ({main}) gets: crossrt.connect() does it; "
    "tritonclient, perf_analyzer and other gRPC clients use the main socket, or a private "
    "socket of their own: crossrt socket -- COMMAND"
)
ENDED = (
    "the ticket sent is not one of a connection open now (its connection closed, or the "
    "daemon restarted); get another from the main socket, as crossrt.connect() does"
)


def direct_path(main: str) -> str:
    """The direct socket of the main socket at ``main``: beside it, in the same folder."""
    return f"{main}.direct"


class Tickets:
    """The tickets of the connections open now (the daemon's side)."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        self._by_value: dict[str, tuple[Peer, Activity]] = {}
        """The ticket in hex -> its connection's peer and activity."""

    def __len__(self) -> int:
        return len(self._by_value)

    def bearer(self, metadata: Any) -> Peer | None:
        """The holder of the ticket a call carries (its connection's peer, ``ticket:<n>``);
        ``None`` for a call that carries none.

        Raises:
            ServiceError: UNAUTHENTICATED, the call carries a ticket that is not live (its
                connection closed since the call was let in): never taken for the call's
                address, which a direct-socket client chooses.
        """
        value = ticket_of(metadata)
        if value is None:
            return None
        held = self.held(value)
        if held is None:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, ENDED)
        return held[0]

    def held(self, value: str | bytes | None) -> tuple[Peer, Activity] | None:
        """The peer and connection activity of a live ticket (metadata value, hex), else
        ``None``."""
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        return self._by_value.get(value) if value else None

    def serve(self, sock: socket.socket, peer: Peer, activity: Activity, direct: str) -> None:
        """The daemon's end of a ticket connection (the relay calls it in the connection's
        thread, ``peer`` being what the kernel said at accept): check the greeting's token,
        issue the ticket, then hold it until the connection ends."""
        if not greeted(sock, MAGIC, self._gate):
            return
        ticket = secrets.token_bytes(TICKET_BYTES)
        value = ticket.hex()  # as it comes
        with self._lock:
            self._by_value[value] = (peer, activity)
        try:
            hold(sock, ticket + direct.encode())
        finally:
            with self._lock:
                self._by_value.pop(value, None)


class TicketGate(grpc.ServerInterceptor):  # type: ignore[misc]
    """The direct socket's interceptor: a call without a live ticket is refused before its
    request is read; any other passes the daemon's :class:`.gate.Gate` (token, drain,
    errors), and is its ticket's holder wherever the daemon asks who calls
    (:meth:`Tickets.bearer`)."""

    def __init__(self, tickets: Tickets, gate: Gate, mains: Sequence[str]) -> None:
        self._tickets = tickets
        self._gate = gate
        self._refusal = (
            grpc.StatusCode.UNAUTHENTICATED,
            REFUSED.format(main=", ".join(f"unix:{m}" for m in mains)),
        )

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        value = ticket_of(details.invocation_metadata)
        held = self._tickets.held(value)
        if held is None:
            handler = continuation(details)
            if handler is None:
                return None
            refusal = self._refusal if value is None else (grpc.StatusCode.UNAUTHENTICATED, ENDED)
            return refusing(handler, refusal)
        held[1].last = time.monotonic()  # the ticket's connection is in use
        return self._gate.intercept_service(continuation, details)


def ticket_of(metadata: Any) -> str | None:
    """The ticket a call's metadata carries (``crossrt-ticket``, or at the head of its user
    agent), ``None`` when it carries none."""
    for key, found in metadata or ():
        if key == KEY:
            return found  # type: ignore[no-any-return]
        if key == "user-agent" and found.startswith(AGENT):
            return found[len(AGENT) : len(AGENT) + 2 * TICKET_BYTES]  # type: ignore[no-any-return]
    return None


def listen_direct(server: grpc.Server, main: str, mode: int) -> str | None:
    """Add the direct socket of the main socket ``main`` to ``server`` with ``mode``; its
    path, or ``None`` (logged) when it cannot be had: crossrt clients then use the relay."""
    path = direct_path(main)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            pass  # left by a daemon that died: gRPC replaces it
        else:
            # gRPC would unlink a live socket and take its place.
            log.warning("%s is served by another process: no direct socket", path)
            return None
        finally:
            probe.close()
    old = os.umask(0o777 ^ mode)  # no moment where the file is wider than mode
    try:
        port = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as exc:
        port, why = 0, str(exc)
    else:
        why = "gRPC could not bind it"
    finally:
        os.umask(old)
    if not port:
        log.warning("no direct socket at %s (%s): crossrt clients use the relay", path, why)
        return None
    os.chmod(path, mode)
    return path


# -- the client's end ---------------------------------------------------------------------


class Ticket:
    """A ticket held by this process: :attr:`value` for the metadata, :attr:`direct` the
    socket to call, valid while :attr:`sock` (the connection that got it) stays open."""

    def __init__(self, sock: socket.socket, value: str, direct: str) -> None:
        self.sock = sock
        self.value = value
        self.direct = direct
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN | select.POLLRDHUP)
        self._seen = time.monotonic()

    def alive(self) -> bool:
        """Whether the daemon still holds it, as far as this process knows: it closes the
        connection when it drops the ticket (idle, or stopping), and sends nothing on it
        otherwise. Looked at when :data:`LOOK_S` passed since the last look (a look is a
        system call): a ticket is dropped after a client's idle time, or at a restart,
        whose calls fail for longer than that anyway."""
        now = time.monotonic()
        if now - self._seen < LOOK_S:
            return True
        if self.sock.fileno() < 0 or self._poll.poll(0):
            return False
        self._seen = now
        return True

    def close(self) -> None:
        """Give the ticket back (the daemon drops it at the end of file)."""
        with contextlib.suppress(OSError):
            self.sock.close()


def request_ticket(
    path: str, token: str | None, endpoint: str, seconds: float = GREETING_SECONDS
) -> Ticket | None:
    """A ticket from the daemon at the main socket ``path``; ``None`` when it issues none (an
    older daemon, or no direct socket: use the main socket).

    Raises:
        OSError: no daemon there (the connection is refused).
        CrossrtError: the daemon refused (a wrong token, too many connections open).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(seconds)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    try:
        status, answer = greet(sock, MAGIC, token)
        sock.settimeout(None)
    except (OSError, EOFError, FrameError):
        sock.close()  # a daemon that knows no tickets (it relayed the greeting to gRPC)
        return None
    if status:
        sock.close()
        code = CODES.get(status, grpc.StatusCode.UNKNOWN)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED):
            raise error_from(code, answer.decode(errors="replace"), endpoint)
        return None
    if len(answer) <= TICKET_BYTES:
        sock.close()
        return None
    value, direct = answer[:TICKET_BYTES].hex(), answer[TICKET_BYTES:].decode()
    return Ticket(sock, value, direct)
