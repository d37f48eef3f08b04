"""What bounds the HTTP/REST endpoint's connections (:mod:`.rest`): a cap on those served at
once, a deadline on each request's reads, and the refusals with HTTP's own statuses.

3,000 half-open requests made 2,621 daemon threads, and a client sending a byte every few
seconds held its thread for ever: :class:`BoundedServer` serves at most ``connections`` at
once (one more is answered 503 and closed in the accepting thread, without a thread of its
own), and :class:`DeadlineReader` gives a request's reads one deadline, not a timeout each.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("crossrt.serve")


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
        super().__init__(address, handler)

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


SLACK = 0.5
"""Seconds a read may block past its deadline: the socket's timeout is set again only when
it would allow more (each setting is a system call, on every read otherwise)."""


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each given what is left of a deadline (the socket's own timeout is
    per read: a client sending a byte every few seconds held a thread for ever)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client took too long to send its request")
            allowed = self._sock.gettimeout()
            if allowed is None or allowed > left + SLACK:
                self._sock.settimeout(left)
            try:
                return self._sock.recv_into(buffer)
            except TimeoutError:
                if self.deadline - time.monotonic() <= 0:
                    raise
                self._sock.settimeout(self.deadline - time.monotonic())  # it was set shorter
