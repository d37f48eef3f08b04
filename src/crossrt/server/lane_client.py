"""The direct lane's client end (the daemon's, and the wire format: :mod:`.lane`): a pool of
connections to one daemon, each carrying one request at a time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import CancelledError

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..drivers.base import CancelToken
from ..errors import ClosedError, CrossrtError, DeadlineExceededError, OutOfResourcesError
from .lane import CODES, GREETING_SECONDS, HEADER, MAGIC, REGISTER, FrameError, Frames, send
from .status import error_from

MAX_IDLE = 16
"""Idle connections a client keeps (each holds a thread of the daemon's)."""
_REFUSALS = {
    c.value[0] for c in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED)
}
"""The greeting's answers that refuse a connection (any other: not a lane daemon)."""


def _send(sock: socket.socket, kind: int, body: bytes, fd: int | None) -> None:
    """One frame, with the descriptor ``fd`` when there is one."""
    if fd is None:
        send(sock, kind, body)
    else:
        socket.send_fds(sock, [HEADER.pack(len(body), kind) + body], [fd])


class _HangUp:
    """Shuts one call's connection when its token is cancelled, until :meth:`done` (after
    which the connection may carry another caller's request: it must not be shut then)."""

    __slots__ = ("_connection", "_lock", "_over", "_shut")

    def __init__(self, connection: _Connection, cancel: CancelToken) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._shut = self._over = False
        cancel.on_cancel(self._cancel)

    def _cancel(self) -> None:
        with self._lock:
            if self._over:
                return
            self._shut = True
        with contextlib.suppress(OSError):
            self._connection.sock.shutdown(socket.SHUT_RDWR)

    def done(self) -> bool:
        """End the watch; whether the connection was shut (the call was cancelled)."""
        with self._lock:
            self._over = True
            return self._shut


class LaneUnavailable(Exception):
    """The daemon does not speak the lane (an older daemon): use gRPC."""


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = Frames(sock)


class LaneClient:
    """A client's lane to one daemon: a pool of connections, one per caller at a time.

    When the daemon refuses one more connection (as many open as its ``max_connections``),
    a caller waits for one of this client's own connections to be free instead, within the
    timeout: the daemon's limit then bounds the client's concurrency, not its success.

    Args:
        path: the daemon's Unix socket.
        token: a token of the daemon's (its shared ``--token``, or one of its tokens file),
            sent as ``Bearer <token>``.
        timeout: seconds a request may take.
        endpoint: the endpoint as the user named it, for messages.
    """

    def __init__(self, path: str, token: str | None, timeout: float | None, endpoint: str) -> None:
        self._path = path
        self._token = f"Bearer {token}".encode() if token else b""
        self._timeout = timeout
        self._endpoint = endpoint
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._busy = 0  # connections handed out (and callers opening one)
        self._waiting = 0  # callers waiting for one of those
        self._closed = False

    def infer(
        self,
        request: pb.ModelInferRequest,
        seconds: float | None = None,
        cancel: CancelToken | None = None,
    ) -> pb.ModelInferResponse:
        """Serve ``request`` on the daemon.

        Args:
            seconds: wait this long for the answer (a deadline's), rather than the
                client's timeout.
            cancel: when it is cancelled, the connection is shut: the call raises
                ``CancelledError`` at once, and the daemon, seeing the hang-up, drops or
                stops the request (:class:`.lane.HangUps`).

        Raises:
            LaneUnavailable: the daemon does not speak the lane.
            CrossrtError: the daemon's answer was an error, or it is gone (CLOSED), or the
                answer took longer than the timeout (TIMEOUT).
            CancelledError: ``cancel`` was cancelled.
        """
        answer = self._call(0, request.SerializeToString(), None, seconds, cancel)
        return pb.ModelInferResponse.FromString(answer)

    def register(self, name: str, fd: int, byte_size: int) -> None:
        """Register the memfd ``fd`` (sealed against shrinking) as the region ``name`` of
        ``byte_size`` bytes, passing the descriptor itself (the daemon maps it).

        Raises:
            LaneUnavailable: the daemon does not speak the lane.
            CrossrtError: the daemon refused it, or is gone (CLOSED).
        """
        message = pb.SystemSharedMemoryRegisterRequest(name=name, byte_size=byte_size)
        self._call(REGISTER, message.SerializeToString(), fd)

    def _call(
        self,
        kind: int,
        body: bytes,
        fd: int | None = None,
        seconds: float | None = None,
        cancel: CancelToken | None = None,
    ) -> bytes | bytearray:
        """Send one frame (with descriptor ``fd``) and read the answer's body, within
        ``seconds`` when given (else the client's timeout); ``cancel`` shuts the connection.

        Raises:
            CrossrtError: the answer was an error, or the daemon is gone (CLOSED), or the
                answer took longer than the timeout (TIMEOUT).
            CancelledError: ``cancel`` was cancelled.
        """
        connection, reused = self._take()
        hang_up = None
        try:
            try:
                _send(connection.sock, kind, body, fd)
            except OSError:
                if not reused:
                    raise
                # An idle connection the daemon closed (it stopped or restarted): the
                # frame never left, so a new connection may carry it.
                with contextlib.suppress(OSError):
                    connection.sock.close()
                connection = self._open()
                _send(connection.sock, kind, body, fd)
            # The connection that carries it, at last (a reused one may have been replaced).
            if seconds is not None:
                connection.sock.settimeout(seconds)
            if cancel is not None:
                hang_up = _HangUp(connection, cancel)
            status, answer = connection.frames.read()
        except TimeoutError:
            self._drop(connection)
            if seconds is not None:
                raise DeadlineExceededError(
                    f"no answer from the daemon at {self._endpoint} by the call's deadline"
                ) from None
            raise DeadlineExceededError(
                f"no answer from the daemon at {self._endpoint} within {self._timeout} s; "
                "give connect() a longer timeout"
            ) from None
        except (OSError, EOFError, FrameError) as exc:
            self._drop(connection)
            if hang_up is not None and hang_up.done():
                raise CancelledError from None
            raise self._gone(exc) from None
        except BaseException:
            self._drop(connection)  # an interrupted read leaves the stream mid-frame
            raise
        if hang_up is not None and hang_up.done():  # it came as the answer did
            self._drop(connection)
            raise CancelledError
        if seconds is not None:
            connection.sock.settimeout(self._timeout)
        self._give_back(connection)
        if status:
            raise error_from(CODES.get(status, grpc.StatusCode.UNKNOWN), answer.decode(),
                             self._endpoint)  # fmt: skip
        return answer

    def prepare(self) -> None:
        """Open one connection now (checking the daemon speaks the lane).

        Raises:
            LaneUnavailable: it does not.
        """
        self._give_back(self._take()[0])

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._returned.notify_all()
        for connection in idle:
            connection.sock.close()

    def _take(self) -> tuple[_Connection, bool]:
        """A connection for one call: an idle one, a new one, or (the daemon refusing more)
        the next of this client's own to be given back. Whether it was open before."""
        with self._lock:
            if self._closed:
                raise ClosedError("this client is closed; connect() again")
            self._busy += 1
            if self._idle:
                return self._idle.pop(), True
        try:
            return self._open(), False
        except OutOfResourcesError as exc:
            return self._wait_for_own(exc), True
        except BaseException:
            self._finish(None)
            raise

    def _wait_for_own(self, refused: OutOfResourcesError) -> _Connection:
        """The next connection of this client's given back, the daemon having refused one
        more; ``refused`` again when none of them is in use (none will come back)."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        with self._lock:
            self._waiting += 1
            try:
                while not self._idle:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (
                        self._closed
                        or self._busy <= self._waiting
                        or (left is not None and left <= 0)
                    ):
                        self._busy -= 1
                        self._returned.notify_all()
                        if self._closed:
                            raise ClosedError("this client is closed; connect() again")
                        raise refused
                    self._returned.wait(left)
                return self._idle.pop()
            finally:
                self._waiting -= 1

    def _finish(self, connection: _Connection | None, keep: bool = False) -> None:
        """A call is done with ``connection``: back to the pool (``keep``), else closed."""
        with self._lock:
            self._busy -= 1
            # Past MAX_IDLE only for a caller waiting: after a burst, the daemon keeps no
            # thread for connections nobody needs.
            keep = keep and not self._closed and (len(self._idle) < MAX_IDLE or self._waiting > 0)
            if keep and connection is not None:
                self._idle.append(connection)
            if self._waiting:  # they look again: at the idle, or at how many are busy
                self._returned.notify_all()
        if not keep and connection is not None:
            with contextlib.suppress(OSError):
                connection.sock.close()

    def _give_back(self, connection: _Connection) -> None:
        self._finish(connection, keep=True)

    def _drop(self, connection: _Connection) -> None:
        self._finish(connection)

    def _open(self) -> _Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._timeout)
        try:
            sock.connect(self._path)
        except OSError as exc:
            sock.close()
            raise self._gone(exc) from None
        connection = _Connection(sock)
        sock.settimeout(GREETING_SECONDS)  # a daemon that does not know the lane may not answer
        try:
            sock.sendall(MAGIC + HEADER.pack(len(self._token), 0) + self._token)
            status, answer = connection.frames.read()
        except (OSError, EOFError, FrameError):
            sock.close()
            raise LaneUnavailable from None
        sock.settimeout(self._timeout)
        if status in _REFUSALS:  # the daemon speaks the lane, and refused this connection
            sock.close()
            raise error_from(CODES[status], bytes(answer).decode(errors="replace"),
                             self._endpoint)  # fmt: skip
        if status or answer != MAGIC:
            sock.close()
            raise LaneUnavailable
        return connection

    def _gone(self, exc: BaseException) -> CrossrtError:
        why = str(exc) or type(exc).__name__
        return ClosedError(
            f"the daemon at {self._endpoint} is not answering ({why}); start it, or retry"
        )
