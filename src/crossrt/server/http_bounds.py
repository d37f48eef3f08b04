"""What bounds the HTTP/REST endpoint's connections (:mod:`.rest`): a cap on those served at
once, a deadline on each request's reads, and the refusals with HTTP's own statuses.

3,000 half-open requests made 2,621 daemon threads, and a client sending a byte every few
seconds held its thread for ever: :class:`BoundedServer` serves at most ``connections`` at
once (one more is answered 503 and closed in the accepting thread, without a thread of its
own), and gives each connection a deadline for what it must send next (a request's headers,
then its body), not a timeout per read: one thread shuts the connections whose deadline has
passed. The sockets themselves keep no timeout: with one, Python polls before every read and
write, which cost HTTP requests about 20 µs each.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from ..runtime.cores.pinning import own_thread

log = logging.getLogger("crossrt.serve")

REAP_SECONDS = 0.25
"""How often connections past their deadline are looked for: a deadline holds within this."""


class Refused(Exception):
    """An HTTP status of HTTP's own (413, 408, 503): no gRPC code says it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``connections`` at once: one more is answered 503
    and closed in the accepting thread (3,000 half-open requests made 2,621 threads)."""

    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 let a burst of connections wait 1 s for SYNs

    def __init__(self, address: tuple[str, int], handler: Any, connections: int) -> None:
        self._slots = threading.BoundedSemaphore(connections)
        self._connections = connections
        self._warned = 0.0
        self._deadlines: dict[socket.socket, float] = {}
        self._watching = threading.Lock()  # a socket is shut only while still watched
        self._closing = threading.Event()
        super().__init__(address, handler)
        self._reaper = threading.Thread(target=self._reap, name="crossrt-http-reap", daemon=True)
        self._reaper.start()

    def watch(self, sock: socket.socket, seconds: float) -> float:
        """Shut ``sock`` unless it is watched again (or forgotten) within ``seconds``; the
        deadline (``inf``: none)."""
        deadline = time.monotonic() + seconds
        self._deadlines[sock] = deadline
        return deadline

    def forget(self, sock: socket.socket) -> None:
        """Stop watching ``sock`` (before it is closed: its number may be reused)."""
        with self._watching:
            self._deadlines.pop(sock, None)

    def _reap(self) -> None:
        while not self._closing.wait(REAP_SECONDS):
            now = time.monotonic()
            late = [s for s, deadline in list(self._deadlines.items()) if deadline < now]
            for sock in late:
                with self._watching:
                    if self._deadlines.get(sock, now) >= now:
                        continue  # forgotten, or watched again, meanwhile
                    del self._deadlines[sock]
                    with contextlib.suppress(OSError):  # its thread's read returns at once
                        sock.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread: its place is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        own_thread()  # its runs on the cores of the instance each takes (cores/pinning.py)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        now = time.monotonic()
        if now - self._warned > 10:
            self._warned = now
            log.warning(
                "HTTP: %d connections are served, the limit (http_connections); refusing more",
                self._connections,
            )
        body = json.dumps(
            {
                "error": f"the daemon serves {self._connections} HTTP connections at once, its "
                "limit (http_connections); close idle ones, retry later, or start crossrt "
                "serve with a larger --http-connections"
            }
        ).encode()
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        try:  # a few hundred bytes into an empty socket buffer: never blocks
            request.send(head + body, socket.MSG_DONTWAIT)
            # What the client sent is read, or closing would reset the connection (RST) and
            # lose the answer on its way.
            request.recv(64 * 1024, socket.MSG_DONTWAIT)
        except OSError:
            pass
        self.shutdown_request(request)
