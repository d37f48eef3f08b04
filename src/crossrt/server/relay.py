"""The daemon's Unix socket: connections accepted here, where the kernel says who connected
(``SO_PEERCRED``), and relayed to gRPC's own socket in a folder only the daemon's user may
enter; a connection that opens with the direct lane's greeting (:mod:`.lane`) is served
here instead, as are those that open with the ticket greeting (:mod:`.tickets`: crossrt's
own gRPC client then calls a socket gRPC owns directly) or ask for a private socket
(:mod:`.private_sockets`: any gRPC client does).

Each connection holds a thread (or, relayed, two in the pump process) and file descriptors
while it is open, so the relay keeps at most ``limit`` open (``max_connections``), and at
most ``user_limit`` of one user's (``user_connections``, default half; root and the daemon's
own user, the operator, have no share of their own): one more is refused at once (a lane
client is told why, RESOURCE_EXHAUSTED; a gRPC client sees the connection closed) and
logged. A connection that carries nothing for ``idle_seconds`` (``idle_timeout``), with no
call under way on it, is closed: gRPC clients and crossrt's lane client open another when
they next need one. When the process runs out of file descriptors, accepting pauses and
resumes as they free up: the connection waits in the listen backlog instead of the listener
giving up.

gRPC's Python server shows a Unix client only as ``unix:``. Each relayed connection comes
to gRPC from a socket bound to an abstract name of its own, 128 random bits
(``crossrt-peer-<32 hex digits>``), which gRPC reports as the call's peer, and
:attr:`UnixRelay.peers` maps that name to the credentials read at accept. Abstract names are
one namespace for the whole host and anyone may read them (``/proc/net/unix``): a name that
could be guessed could be bound first, and the connection would fail.

The bytes of a relayed connection are copied by the pump process (:mod:`.pump`), outside
this process's GIL: with 4 clients gRPC over the socket then serves as many requests as over
loopback TCP (0.72x when this process copied them); with one it still adds a few tens of µs
(two more hops). Should the pump process be missing, the relay copies in threads of its own.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

import grpc

from .lane import GREETING_LIMIT, MAGIC, Activity, FrameError, Frames, opening, send
from .peers import Peer, is_operator_uid, socket_peer
from .pump import Both, Pumps, relay

log = logging.getLogger("crossrt.serve")
_SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
"""accept()'s errors that pass once the process frees what it holds."""
_PAUSE_S = 0.1
"""How long accepting pauses when the process is short of file descriptors or memory."""
_WARN_EVERY_S = 10.0
_REFUSE_S = 1.0
"""How long a refused connection may take to show whether it is a lane client."""
DEFAULT_LIMIT = 1024
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
_SERIALS = itertools.count(1)
"""Connection numbers, one sequence for every relay: ``lane:<n>``, ``ticket:<n>`` and
``private:<n>`` name a connection across all of the daemon's sockets."""
Served = Callable[[socket.socket, Peer, Activity], None]
"""Serves a connection in its thread: the lane's, a ticket's, a private socket's."""


class UnixRelay:
    """Listen on ``path`` (mode ``mode``) and relay every connection to ``inner``, but
    those of the direct lane, which go to ``lane`` (called in a thread of their own); at
    most ``limit`` connections at once, ``user_limit`` of one user's; those idle for
    ``idle_seconds`` (0: never) closed, unless ``busy`` (given the gRPC peer name) says a
    call is under way on them. Connections that open with another greeting of
    :attr:`served` are served by its function (tickets, private sockets).

    Raises:
        OSError: the socket cannot be created (the message of :func:`bind_unix`).
    """

    def __init__(
        self,
        path: str,
        inner: str,
        mode: int = 0o660,
        lane: Served | None = None,
        limit: int = DEFAULT_LIMIT,
        user_limit: int | None = None,
        idle_seconds: float = 0.0,
        busy: Callable[[str], bool] | None = None,
    ) -> None:
        self.path = path
        self._inner = inner
        self.served: dict[bytes, tuple[str, Served]] = {MAGIC: ("lane", lane)} if lane else {}
        """Greeting -> (what its connections' callers are named, what serves them in their
        thread); a connection that opens with none of them is relayed to gRPC."""
        self._limit = limit
        self._user_limit = user_limit or limit
        self._idle_seconds = idle_seconds
        self._busy = busy or (lambda name: False)
        self._by_user: dict[int, int] = {}
        """Connections open now, by user (the operator's not counted)."""
        self._activity: dict[int, tuple[Activity, tuple[socket.socket, ...], str]] = {}
        """serial -> (its activity, its sockets, the peer address its gRPC calls have: a
        relayed connection's, or the name of one served here, ``private:<n>`` that of its
        private socket's calls)."""
        self._idle_wake = threading.Event()
        self.connections = 0
        """Connections open now: being routed, served on the lane, or relayed."""
        self.refused = 0
        """Connections refused since the start because ``limit`` were open."""
        self._stopping = False
        self._warned: dict[str, float] = {}
        self._served: dict[int, socket.socket] = {}
        """The lane's and the tickets' connections, served in the daemon."""
        self._listener = bind_unix(path, mode)
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        self._open: dict[str, tuple[socket.socket, socket.socket]] = {}
        self.peers: dict[str, Peer] = {}
        self._pumps: Pumps | None = None
        self._pumped: dict[int, tuple[str, int]] = {}
        """serial -> (gRPC peer name, uid) of the connections the pump process copies."""
        self._thread = threading.Thread(target=self._accept, name="crossrt-relay", daemon=True)

    def start(self) -> None:
        """Start the pump process, accepting (and closing idle connections)."""
        try:
            self._pumps = Pumps(self._limit, self._pump_ended)
        except OSError as exc:
            log.warning("%s; the relay copies in the daemon's own threads (slower)", exc)
        self._thread.start()
        if self._idle_seconds:
            threading.Thread(target=self._close_idle, name="crossrt-idle", daemon=True).start()

    def _close_idle(self) -> None:
        """Every quarter of the idle timeout (at most 5 s): close the connections that carried
        nothing for longer than it, with no call under way.

        Gently first: the client's half is shut for reading only, so a request the client
        sent just then is still read and gets an answer frame (on the lane, CANCELLED for a
        model the hang-up watch covers: the shut looks like one), and one it sends after
        fails at once (EPIPE: crossrt's lane client and gRPC open another connection); the
        connection then ends as the client's end of file goes through. One still open at the
        next look (a client that reads nothing) is cut."""
        every = min(5.0, self._idle_seconds / 4)
        while not self._idle_wake.wait(every):
            limit = time.monotonic() - self._idle_seconds
            with self._lock:
                found = list(self._activity.values())
            for activity, sockets, name in found:
                if activity.last > limit or activity.busy:
                    continue
                if name and self._busy(name):
                    activity.last = time.monotonic()  # a call runs: idle from its end on
                    continue
                self._warn("idle", "closed connections idle for longer than idle_timeout")
                cut = activity.closing
                activity.closing = True
                for sock in sockets if cut else sockets[:1]:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR if cut else socket.SHUT_RD)

    def stop_accepting(self) -> None:
        """Accept no new connection and remove the socket file; open ones go on."""
        self._stopping = True
        self._idle_wake.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def close(self, seconds: float = 5.0) -> None:
        """Stop accepting, cut the lane's and the tickets' connections (the lane's requests
        were drained), give the relayed connections ``seconds`` to pass on what gRPC wrote
        last (the answers of drained calls), then cut them."""
        self.stop_accepting()
        with self._lock:
            lanes = list(self._served.values())
        for sock in lanes:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + seconds
        with self._lock:
            while self._open and (left := deadline - time.monotonic()) > 0:
                self._closed.wait(left)
            pairs = list(self._open.values())
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        if self._pumps is not None:
            self._pumps.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError as exc:
                if self._stopping:
                    return  # stop_accepting()
                if exc.errno in _SHORT_OF:
                    # The connection waits in the backlog until a descriptor is free.
                    self._warn(
                        "accept", f"cannot accept a connection for now ({exc.strerror}); retrying"
                    )
                    time.sleep(_PAUSE_S)
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client left before it was accepted
                log.error("stopped accepting on %s: %s", self.path, exc)
                return
            try:
                pid, uid, gid = _CREDENTIALS.unpack(
                    client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
                )
            except OSError:
                client.close()
                continue
            shared = not is_operator_uid(uid)
            with self._lock:
                held = self._by_user.get(uid, 0) if shared else 0
                why = None
                if self.connections >= self._limit:
                    why = (
                        f"the daemon has {self._limit} connections open, its limit "
                        "(max_connections); close idle clients, or start crossrt serve with a "
                        "larger --max-connections"
                    )
                elif held >= self._user_limit:
                    why = (
                        f"user {uid} has {held} connections open, one user's share "
                        "(user_connections); close idle ones, or ask the operator for a larger "
                        "--user-connections"
                    )
                if why is not None:
                    self.refused += 1
                else:
                    self.connections += 1
                    if shared:
                        self._by_user[uid] = held + 1
            # A thread per connection: telling a lane from gRPC waits for its first bytes.
            if why is not None:
                target, args = self._refuse, (client, why)
            else:
                target, args = self._route, (client, pid, uid, gid)  # type: ignore[assignment]
            try:
                threading.Thread(target=target, args=args, daemon=True).start()
            except RuntimeError as exc:  # no thread to be had
                client.close()
                self._warn("thread", f"dropped a connection: {exc}")
                if why is None:
                    self._closed_one(uid)

    def _closed_one(self, uid: int) -> None:
        with self._lock:
            self.connections -= 1
            held = self._by_user.pop(uid, 0) - 1
            if held > 0:
                self._by_user[uid] = held

    def _warn(self, kind: str, text: str) -> None:
        """Log ``text``, at most once per ``_WARN_EVERY_S`` for each ``kind``: a flood of
        connections must not flood the log."""
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            log.warning("%s on %s", text, self.path)

    def _refuse(self, client: socket.socket, why: str) -> None:
        """A connection over a limit: a lane client is told ``why``, then it is closed."""
        self._warn("refused", f"refused a connection: {why}")
        try:
            greetings = self._greetings()
            if greetings and opening(client, greetings, _REFUSE_S):
                client.settimeout(_REFUSE_S)
                client.recv(len(MAGIC))  # peeked by opening
                Frames(client).read(GREETING_LIMIT)  # the token, unread: never checked
                send(client, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], why.encode())
        except (OSError, EOFError, FrameError):
            pass  # it left, or sent no greeting: closed all the same
        finally:
            client.close()

    def _greetings(self) -> tuple[bytes, ...]:
        """The greetings of the connections served here, not relayed."""
        return tuple(self.served)

    def _route(self, client: socket.socket, pid: int, uid: int, gid: int) -> None:
        routed = False
        try:
            serial = next(_SERIALS)
            greetings = self._greetings()
            greeting = opening(client, greetings) if greetings else b""
            if greeting:
                routed = True  # _serve counts it closed
                kind, served = self.served[greeting]
                peer = socket_peer(f"{kind}:{serial}", uid, gid, pid)  # its calls' caller
                self._serve(client, serial, peer, served)
            else:
                self._relay(client, serial, uid, gid, pid)
                routed = True  # _forget counts it closed
        except OSError as exc:
            self._warn("relay", f"could not relay a connection to {self._inner}: {exc}")
            client.close()
        finally:
            if not routed:
                self._closed_one(uid)

    def _serve(self, client: socket.socket, serial: int, peer: Peer, served: Served) -> None:
        """Serve a connection with ``served``, in this thread (its activity kept by
        ``served``: a ticket's calls note theirs when they start)."""
        assert peer.uid is not None
        activity = Activity()
        with self._lock:
            self._served[serial] = client
            self._activity[serial] = (activity, (client,), peer.address)
        try:
            served(client, peer, activity)
        finally:
            with self._lock:
                self._served.pop(serial, None)
                self._activity.pop(serial, None)
            self._closed_one(peer.uid)
            client.close()

    def _relay(self, client: socket.socket, serial: int, uid: int, gid: int, pid: int) -> None:
        # 128 random bits: no one can bind the name first (see the module's docstring).
        name = f"crossrt-peer-{secrets.token_hex(16)}"
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.bind("\0" + name)
            upstream.connect(self._inner)
        except OSError:
            upstream.close()
            raise
        activity = Activity()
        sockets = (client, upstream)
        with self._lock:
            self.peers[name] = socket_peer(f"unix-abstract:{name}", uid, gid, pid)
            self._open[name] = sockets
            self._activity[serial] = (activity, sockets, f"unix-abstract:{name}")
            self._pumped[serial] = (name, uid)
        pumps = self._pumps
        slot = pumps.relay(serial, client, upstream) if pumps is not None else None
        if pumps is not None and slot is not None:
            # Copied in the pump process (:mod:`.pump`), its activity noted in the board.
            with self._lock:
                if serial in self._activity:  # not ended already
                    self._activity[serial] = (_Board(pumps, slot), sockets, f"unix-abstract:{name}")
            return
        with self._lock:
            self._pumped.pop(serial, None)

        def noted() -> None:
            activity.last = time.monotonic()

        relay(sockets, Both(lambda: self._forget(name, serial, uid)), noted)

    def _pump_ended(self, serial: int) -> None:
        """The pump process finished copying connection ``serial`` (or died)."""
        with self._lock:
            known = self._pumped.pop(serial, None)
        if known is not None:
            self._forget(known[0], serial, known[1])

    def _forget(self, name: str, serial: int, uid: int) -> None:
        with self._lock:
            self.peers.pop(name, None)
            self._activity.pop(serial, None)
            pair = self._open.pop(name, None)
            self._closed.notify_all()
        if pair is not None:
            self._closed_one(uid)
        for s in pair or ():
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # the pump process's copies end with ours
            s.close()


class _Board(Activity):
    """The activity of a connection the pump process copies: :attr:`last` is its slot of
    the pump process's board."""

    __slots__ = ("_pumps", "_slot")

    def __init__(self, pumps: Pumps, slot: int) -> None:
        self._pumps = pumps
        self._slot = slot
        super().__init__()

    @property
    def last(self) -> float:
        return self._pumps.last(self._slot)

    @last.setter
    def last(self, when: float) -> None:
        self._pumps.note(self._slot, when)


def bind_unix(path: str, mode: int) -> socket.socket:
    """A listening Unix socket at ``path`` with ``mode``; a stale socket file (no one
    listening) is replaced, a live one refused."""
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # left by a daemon that died
        else:
            raise OSError(f"another daemon is serving on {path}; stop it, or give -g another path")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 ^ mode)  # no moment where the file is wider than mode
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    listener.listen(128)
    return listener
