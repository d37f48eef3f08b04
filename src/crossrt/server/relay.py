"""The daemon's Unix socket: connections accepted here, where the kernel says who connected
(``SO_PEERCRED``), and relayed to gRPC's own socket in a folder only the daemon's user may
enter; a connection that opens with the direct lane's greeting (:mod:`.lane`) is served
here instead.

Each connection holds a thread or two and up to seven file descriptors while it is open, so the
relay keeps at most ``limit`` open (``max_connections``): one more is refused at once (a lane
client is told why, RESOURCE_EXHAUSTED; a gRPC client sees the connection closed) and logged.
When the process runs out of file descriptors, accepting pauses and resumes as they free up:
the connection waits in the listen backlog instead of the listener giving up.

gRPC's Python server shows a Unix client only as ``unix:``. Each relayed connection comes
to gRPC from a socket bound to an abstract name of its own
(``crossrt-peer-<random>-<n>``), which gRPC reports as the call's peer, and
:attr:`UnixRelay.peers` maps that name to the credentials read at accept. The relay costs
about 45 µs per call (two extra socket hops).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

import grpc

from .lane import GREETING_LIMIT, MAGIC, FrameError, Frames, is_lane, send
from .peers import Peer

log = logging.getLogger("crossrt.serve")
_CHUNK = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
"""accept()'s errors that pass once the process frees what it holds."""
_PAUSE_S = 0.1
"""How long accepting pauses when the process is short of file descriptors or memory."""
_WARN_EVERY_S = 10.0
_REFUSE_S = 1.0
"""How long a refused connection may take to show whether it is a lane client."""
DEFAULT_LIMIT = 1024


class UnixRelay:
    """Listen on ``path`` (mode ``mode``) and relay every connection to ``inner``, but
    those of the direct lane, which go to ``lane`` (called in a thread of their own); at
    most ``limit`` connections at once.

    Raises:
        OSError: the socket cannot be created (the message of :func:`bind_unix`).
    """

    def __init__(
        self,
        path: str,
        inner: str,
        mode: int = 0o660,
        lane: Callable[[socket.socket, Peer], None] | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> None:
        self.path = path
        self._inner = inner
        self._lane = lane
        self._limit = limit
        self.connections = 0
        """Connections open now: being routed, served on the lane, or relayed."""
        self.refused = 0
        """Connections refused since the start because ``limit`` were open."""
        self._stopping = False
        self._warned: dict[str, float] = {}
        self._lanes: dict[int, socket.socket] = {}
        self._listener = bind_unix(path, mode)
        self._tag = secrets.token_hex(8)
        self._serial = 0
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        self._open: dict[str, tuple[socket.socket, socket.socket]] = {}
        self.peers: dict[str, Peer] = {}
        self._thread = threading.Thread(target=self._accept, name="crossrt-relay", daemon=True)

    def start(self) -> None:
        """Start accepting."""
        self._thread.start()

    def stop_accepting(self) -> None:
        """Accept no new connection and remove the socket file; open ones go on."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def close(self, seconds: float = 5.0) -> None:
        """Stop accepting, cut the lane's connections (their requests were drained), give
        the relayed connections ``seconds`` to pass on what gRPC wrote last (the answers of
        drained calls), then cut them."""
        self.stop_accepting()
        with self._lock:
            lanes = list(self._lanes.values())
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
            with self._lock:
                full = self.connections >= self._limit
                if full:
                    self.refused += 1
                else:
                    self.connections += 1
            # A thread per connection: telling a lane from gRPC waits for its first bytes.
            target = self._refuse if full else self._route
            try:
                threading.Thread(target=target, args=(client,), daemon=True).start()
            except RuntimeError as exc:  # no thread to be had
                client.close()
                self._warn("thread", f"dropped a connection: {exc}")
                if not full:
                    self._closed_one()

    def _closed_one(self) -> None:
        with self._lock:
            self.connections -= 1

    def _warn(self, kind: str, text: str) -> None:
        """Log ``text``, at most once per ``_WARN_EVERY_S`` for each ``kind``: a flood of
        connections must not flood the log."""
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            log.warning("%s on %s", text, self.path)

    def _refuse(self, client: socket.socket) -> None:
        """A connection over the limit: a lane client is told why, then it is closed."""
        why = (
            f"the daemon has {self._limit} connections open, its limit (max_connections); "
            "close idle clients, or start crossrt serve with a larger --max-connections"
        )
        self._warn("refused", f"refused a connection: {self._limit} are open (max_connections)")
        try:
            if self._lane is not None and is_lane(client, _REFUSE_S):
                client.settimeout(_REFUSE_S)
                client.recv(len(MAGIC))  # peeked by is_lane
                Frames(client).read(GREETING_LIMIT)  # the token, unread: never checked
                send(client, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], why.encode())
        except (OSError, EOFError, FrameError):
            pass  # it left, or sent no greeting: closed all the same
        finally:
            client.close()

    def _route(self, client: socket.socket) -> None:
        routed = False
        try:
            creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, gid = struct.unpack("3i", creds)
            with self._lock:
                self._serial += 1
                serial = self._serial
            if self._lane is not None and is_lane(client):
                routed = True  # _serve_lane counts it closed
                self._serve_lane(client, serial, Peer(f"lane:{serial}", True, uid, gid, pid))
            else:
                self._relay(client, serial, uid, gid, pid)
                routed = True  # _forget counts it closed
        except OSError as exc:
            self._warn("relay", f"could not relay a connection to {self._inner}: {exc}")
            client.close()
        finally:
            if not routed:
                self._closed_one()

    def _serve_lane(self, client: socket.socket, serial: int, peer: Peer) -> None:
        assert self._lane is not None
        with self._lock:
            self._lanes[serial] = client
        try:
            self._lane(client, peer)
        finally:
            with self._lock:
                self._lanes.pop(serial, None)
                self.connections -= 1
            client.close()

    def _relay(self, client: socket.socket, serial: int, uid: int, gid: int, pid: int) -> None:
        name = f"crossrt-peer-{self._tag}-{serial}"
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.bind("\0" + name)
            upstream.connect(self._inner)
        except OSError:
            upstream.close()
            raise
        with self._lock:
            self.peers[name] = Peer(f"unix-abstract:{name}", True, uid, gid, pid)
            self._open[name] = (client, upstream)
        done = threading.Barrier(2, action=lambda: self._forget(name))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b, done), daemon=True).start()

    def _forget(self, name: str) -> None:
        with self._lock:
            self.peers.pop(name, None)
            pair = self._open.pop(name, None)
            if pair is not None:
                self.connections -= 1
            self._closed.notify_all()
        for s in pair or ():
            s.close()


def _pump(src: socket.socket, dst: socket.socket, done: threading.Barrier) -> None:
    """Copy ``src`` to ``dst`` until EOF: through a pipe with ``splice`` (the kernel moves
    the pages; about 3x faster than recv/send through Python on 16 MB tensors)."""
    read, write = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write, _F_SETPIPE_SZ, _CHUNK)
        source, target = src.fileno(), dst.fileno()
        while n := os.splice(source, write, _CHUNK):
            while n:
                n -= os.splice(read, target, n)
    except OSError:
        pass
    finally:
        os.close(read)
        os.close(write)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    with contextlib.suppress(threading.BrokenBarrierError):
        done.wait()


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
