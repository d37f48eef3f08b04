"""Private sockets: any gRPC client (tritonclient, perf_analyzer) on a socket gRPC owns, with
no relay, still known by the kernel.

The daemon's main Unix socket relays every gRPC connection (:mod:`.relay`) so that it knows
who connected (``SO_PEERCRED``): two more hops per call. crossrt's own client skips them with
a ticket (:mod:`.tickets`), a secret sent with every call; a client that cannot send one
(perf_analyzer sends no metadata over gRPC), or should not show it (a command line is
readable by every user), gets a *private socket* instead: a connection to the main socket
opens with :data:`MAGIC`, and the daemon, which knows that connection's uid, gid and pid,
starts a gRPC server of its own on a new socket beside the main one, which only that uid
may open (mode 0600 and a POSIX ACL entry for the uid, or the file given to the uid where
ACLs are missing and the daemon is root), and answers its path. Every call on it is that
connection's caller, ``private:<n>``: the kernel checks who may connect, at ``connect()``,
so nothing travels with the calls. The socket lives while the connection that asked for
it stays open: when the client closes it or dies, the daemon removes the file, refuses new
calls on the connections made before (UNAUTHENTICATED, :data:`ENDED`, which says what to
do) and stops the server :data:`GRACE_S` later (calls under way finish). Root and the
daemon's own user may open any file, and so act as that caller there, as they can anyway;
a user who opens their socket to others (``chmod``, ``setfacl``) lends them their identity,
as handing over a ticket would.

Wire format (the lane's frames, :mod:`.lane`): :data:`MAGIC`, then a frame with status 0
holding the authorization value (``Bearer <token>``, empty without a token); the answer is
a frame with status 0 holding the socket's path (UTF-8), or a status (UNAUTHENTICATED,
RESOURCE_EXHAUSTED, FAILED_PRECONDITION) and a message, then the end. After the path,
neither side sends anything. Each private socket holds one connection of the main socket,
counted in ``max_connections`` and the user's ``user_connections``, and one gRPC server
(a thread); the calls run on the daemon's request threads, through its gate (token, drain).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from ..errors import ClosedError
from .gate import Gate, refusing
from .lane import CODES, GREETING_SECONDS, Activity, FrameError, greet, greeted, hold, send
from .peers import Peer
from .status import ServiceError, error_from

MAGIC = b"CRTPRIV1"
"""What a client asking for a private socket sends first."""
GRACE_S = 5.0
"""How long a private socket's server lives on once its holder left: calls under way
finish, new ones on connections made before are told why they are refused."""
ENDED = (
    "the connection that held this private socket closed (its holder exited or was killed), "
    "so the socket is gone: hold another, with crossrt socket -- COMMAND or "
    "crossrt.private_socket(), or use the daemon's main socket"
)
GIVE_BACK_S = 2.0
"""How long :meth:`PrivateSocket.close` waits for the daemon to have removed the socket."""
_SUFFIX = ".private-"
_ACL = "system.posix_acl_access"
_ACL_ENTRY = struct.Struct("<HHI")
_ANYONE = 0xFFFFFFFF
_ENDED = (grpc.StatusCode.UNAUTHENTICATED, ENDED)


def _acl(uid: int) -> bytes:
    """A POSIX access ACL (the kernel's xattr form, version 2): the file's owner and ``uid``
    may read and write it (``connect()`` needs write), no one else."""
    entries = [(0x01, 6, _ANYONE), (0x02, 6, uid), (0x04, 0, _ANYONE), (0x10, 6, _ANYONE)]
    entries.append((0x20, 0, _ANYONE))  # user_obj, user:uid, group_obj, mask, other
    return struct.pack("<I", 2) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)


def only_for(path: str, uid: int) -> None:
    """Make ``path`` (mode 0600, the daemon's) one that only ``uid`` (and the daemon's user,
    and root) may open.

    Raises:
        OSError: neither an ACL nor a change of owner can be had here.
    """
    if uid == os.geteuid():
        return
    try:
        os.setxattr(path, _ACL, _acl(uid))
    except OSError as exc:
        if os.geteuid() != 0:
            raise OSError(
                f"cannot make a socket only uid {uid} may open in {os.path.dirname(path)}: "
                f"the file system refuses POSIX ACLs ({exc.strerror}) and the daemon is not "
                "root; use the main socket (through the relay), or serve its socket on a "
                "file system with ACLs (tmpfs, ext4)"
            ) from None
        os.chown(path, uid, -1)


def remove_stale(main: str) -> None:
    """Remove the private sockets a daemon on ``main`` left when it died (its own bind of
    ``main`` has shown that no daemon serves there)."""
    folder, name = os.path.split(main)
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder or "."):
            if entry.startswith(name + _SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, entry))


class HeldContext:
    """A call's servicer context on a private socket, carrying its holder: wherever the
    daemon asks who calls, the context itself says (:func:`holder_of`). Its :meth:`peer` is
    the holder's name (``private:<n>``), under which the gate counts the calls under way,
    which the relay's idle timeout asks about."""

    __slots__ = ("_context", "holder")

    def __init__(self, context: Any, holder: Peer) -> None:
        self._context = context
        self.holder = holder

    def peer(self) -> str:
        return self.holder.address

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def holder_of(context: Any) -> Peer | None:
    """The holder of the private socket a call came in on; ``None`` for any other call."""
    return context.holder if isinstance(context, HeldContext) else None


class HolderGate(grpc.ServerInterceptor):  # type: ignore[misc]
    """A private socket's interceptor: the daemon's :class:`.gate.Gate`, every call's
    servicer context a :class:`HeldContext` of ``holder``; each call notes ``activity``
    when it starts."""

    def __init__(self, holder: Peer, activity: Activity, gate: Gate) -> None:
        self._holder = holder
        self._activity = activity
        self._gate = gate
        self.ended = False
        """Its holder left: every new call is refused (UNAUTHENTICATED, :data:`ENDED`)."""

    def _hold(self, context: Any) -> HeldContext:
        return HeldContext(context, self._holder)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        if self.ended:
            handler = continuation(details)
            return None if handler is None else refusing(handler, _ENDED)
        self._activity.last = time.monotonic()
        # The gate holds the context of the kinds it wraps itself (all the daemon serves).
        handler = self._gate.intercept_service(continuation, details, self._hold)
        if handler is None or handler.unary_unary is not None or handler.stream_stream is not None:
            return handler
        # Any other kind (or a refusal, which reads nothing): held here, never passed bare.
        streams = handler.unary_stream is not None
        behavior = handler.unary_stream if streams else handler.stream_unary
        make = (
            grpc.unary_stream_rpc_method_handler
            if streams
            else grpc.stream_unary_rpc_method_handler
        )

        def call(request: Any, context: Any) -> Any:
            return behavior(request, self._hold(context))

        return make(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class PrivateSockets:
    """The daemon's side: :meth:`serve` the connections that ask for a private socket.

    Args:
        gate: the daemon's gate (the greeting's token is checked by it; so is every call).
        make_server: a gRPC server with the daemon's services, options and request threads,
            and the interceptor given, not yet listening.
    """

    def __init__(self, gate: Gate, make_server: Callable[[Any], grpc.Server]) -> None:
        self._gate = gate
        self._make_server = make_server
        self._lock = threading.Lock()
        self._open: dict[str, grpc.Server] = {}

    def __len__(self) -> int:
        return len(self._open)

    def serve(self, sock: socket.socket, peer: Peer, activity: Activity, main: str) -> None:
        """The daemon's end of a connection asking for a private socket beside ``main``
        (the relay calls it in the connection's thread, ``peer`` being what the kernel said
        at accept): check the token, open the socket, hold it until the connection ends."""
        if not greeted(sock, MAGIC, self._gate):
            return
        try:
            path, server, gate = self._open_for(peer, activity, main)
        except ServiceError as exc:
            with contextlib.suppress(OSError):
                send(sock, exc.status.value[0], exc.message.encode())
            return
        try:
            hold(sock, path.encode())
        finally:
            gate.ended = True  # before the file goes: a client seeing it gone sees this
            with contextlib.suppress(OSError):
                os.unlink(path)  # no new connection
            with self._lock:
                self._open.pop(path, None)
            stop = threading.Timer(GRACE_S, server.stop, (GRACE_S,))
            stop.daemon = True  # a daemon that exits drained its calls first
            stop.start()

    def _open_for(
        self, peer: Peer, activity: Activity, main: str
    ) -> tuple[str, grpc.Server, HolderGate]:
        """A started gRPC server on a new socket beside ``main`` that only ``peer``'s uid
        may open: bound in a folder only the daemon may enter, made the uid's, then moved
        beside ``main``, so no one else can connect in between."""
        assert peer.uid is not None
        try:
            staging = tempfile.mkdtemp(prefix=".crossrt-private-", dir=os.path.dirname(main))
        except OSError as exc:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"cannot make a private socket beside {main} ({exc.strerror}); use it instead",
            ) from None
        staged = os.path.join(staging, "grpc.sock")
        gate = HolderGate(peer, activity, self._gate)
        server = self._make_server(gate)
        try:
            try:
                bound = server.add_insecure_port(f"unix:{staged}")
            except RuntimeError:
                bound = 0
            if not bound:
                raise OSError(f"gRPC could not bind a socket in {staging}")
            os.chmod(staged, 0o600)
            only_for(staged, peer.uid)
            path = f"{main}{_SUFFIX}{secrets.token_hex(8)}"
            os.rename(staged, path)
        except OSError as exc:
            server.stop(None)
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)
            with contextlib.suppress(OSError):
                os.rmdir(staging)
        try:
            server.start()
        except Exception as exc:  # its threads (a process limit): no socket left behind
            server.stop(None)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, f"cannot start a private socket's server: {exc}"
            ) from None
        with self._lock:
            self._open[path] = server
        return path, server, gate


# -- the client's end ---------------------------------------------------------------------


class PrivateSocket:
    """A private socket held by this process (:func:`private_socket`): :attr:`url` is what
    a gRPC client connects to (``unix:<path>``), valid while this object is open."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self._sock = sock
        self.path = path
        self.url = f"unix:{path}"

    def fileno(self) -> int:
        """The connection that holds the socket (readable when the daemon dropped it)."""
        return self._sock.fileno()

    def close(self, seconds: float = GIVE_BACK_S) -> None:
        """Give the socket back, and wait up to ``seconds`` for the daemon to have removed
        it (it closes its end then)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
            self._sock.settimeout(seconds)
            self._sock.recv(1)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> PrivateSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def private_socket(
    path: str | None = None, token: str | None = None, seconds: float = GREETING_SECONDS
) -> PrivateSocket:
    """A gRPC socket of this process's own on the daemon whose main socket is ``path``
    (default the daemon's default socket), held until the result is closed (a context
    manager): any gRPC client calls it with no relay, as this process's user::

        with crossrt.private_socket() as held:
            client = tritonclient.grpc.InferenceServerClient(held.url)

    Raises:
        ClosedError: no daemon there, or one that makes no private sockets.
        CrossrtError: the daemon refused (a wrong token, too many connections open, no way
            to make a socket only this user may open).
    """
    if path is None:
        from .settings import default_endpoint

        path = default_endpoint().address
    path = path.removeprefix("unix:")
    endpoint = f"unix:{path}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(seconds)
        sock.connect(path)
        status, answer = greet(sock, MAGIC, token)
        sock.settimeout(None)
    except (OSError, EOFError, FrameError) as exc:
        sock.close()
        raise ClosedError(
            f"no private socket from a daemon at {endpoint} ({exc}): is `crossrt serve` "
            "running there, and new enough to make them? Clients can use the main socket"
        ) from None
    if status:
        sock.close()
        code = CODES.get(status, grpc.StatusCode.UNKNOWN)
        raise error_from(code, answer.decode(errors="replace"), endpoint)
    return PrivateSocket(sock, answer.decode())
