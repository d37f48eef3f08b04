"""The direct lane: KServe ModelInfer messages over the daemon's Unix socket, without HTTP/2.

A gRPC call through grpcio's Python layer costs about 600 µs on the project's VM, where a
round trip between two processes costs 80 µs: too much for a small model, whose run takes a
few µs. A crossrt client on the same host (``crossrt.connect`` on a ``unix:`` endpoint) sends
the very same ``ModelInferRequest`` messages, length-prefixed, on a plain connection to the
daemon's socket; the relay (:mod:`.relay`) sees the lane's greeting instead of HTTP/2's
preface and hands the connection to :class:`LaneServer`. The request is served by the same
code as gRPC's ModelInfer (:meth:`kserve.InferenceService.infer`): the same checks, errors,
statistics, shared-memory regions and drain, and, as on gRPC, a client that hangs up has its
request dropped or stopped (:class:`HangUps`). Everything else (metadata, the repository,
regions, crossrt.v1) stays on gRPC, and gRPC clients (tritonclient, perf_analyzer) are
untouched. This module holds the wire format and the daemon's end; the client's is
:mod:`.lane_client`.

Wire format, integers little-endian. A *frame* is a header ``<IB`` (the body's length, a
gRPC status code: 0 for OK) and the body.

- client, once: :data:`MAGIC`, then a frame with status 0 whose body is the authorization
  value, ``Bearer <token>`` (empty when it sends no token: the kernel says who it is, and a
  token adds only what an operator token grants);
- daemon, once: a frame with status 0 and the body :data:`MAGIC`, or a frame with
  UNAUTHENTICATED (a wrong token) or RESOURCE_EXHAUSTED (as many connections open as the
  daemon allows) and a message, then it closes;
- then, one request at a time: the client sends a frame with status 0 and a serialized
  ``ModelInferRequest``; the daemon answers a frame with status 0 and a serialized
  ``ModelInferResponse``, or with the error's gRPC status code and its message (UTF-8), the
  same two gRPC gives. A client wanting requests in parallel opens more connections.
- or the client registers a shared-memory region by descriptor: a frame with status
  :data:`REGISTER` whose body is a serialized ``SystemSharedMemoryRegisterRequest`` (name and
  byte_size; key and offset unused), sent with one descriptor (``SCM_RIGHTS``): a memfd
  sealed against shrinking, which the daemon maps (``regions.Regions.register_sealed``). The
  answer: status 0 and an empty body, or the error. Requests then name the region as any
  other; gRPC's SystemSharedMemoryUnregister and Status serve it too.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ..drivers.base import CancelToken
from ..runtime.cores.pinning import own_thread
from .gate import Gate
from .peers import Peer
from .status import ServiceError, status_of

log = logging.getLogger("crossrt.serve")

REGISTER = 1
"""A client frame's status that makes it a region registration (0: a ModelInferRequest)."""
_FDS = socket.CMSG_SPACE(4 * array.array("i").itemsize)  # descriptors one frame may bring
MAGIC = b"CRTLANE1"
"""What a lane client sends first; HTTP/2's preface starts ``PRI * HT``."""
HEADER = struct.Struct("<IB")
MAX_BODY = 2**31 - 1
"""Protobuf's own limit on a message."""
_BUFFER = 1 << 16
_FIRST_BIG = 1 << 20
"""A body larger than the buffer starts at most this large and doubles as its bytes arrive:
a length that lies costs only what was really sent."""
GREETING_LIMIT = 1 << 12
"""The most a token frame may hold: nothing larger is read before the token is checked."""


class FrameError(Exception):
    """The other end broke the protocol or the connection (not an answer to a request)."""


class Frames:
    """Frames read from one connection, through a buffer that holds small ones whole: a
    small request or answer takes one ``recv``. With ``descriptors`` (the daemon's end),
    descriptors sent with the bytes are kept in :attr:`fds`; without, the kernel drops them."""

    def __init__(self, sock: socket.socket, descriptors: bool = False) -> None:
        self._sock = sock
        self._receive = self._receive_fds if descriptors else sock.recv_into
        self._buffer = bytearray(_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0
        self.fds: list[int] = []
        """Descriptors that came with the bytes read (``SCM_RIGHTS``), for the reader to
        take or close (:meth:`close_fds`)."""

    def close_fds(self) -> None:
        """Close the descriptors received and not taken."""
        fds, self.fds = self.fds, []
        _close_all(fds)

    def read(self, limit: int = MAX_BODY) -> tuple[int, bytes | bytearray]:
        """The next frame's (status, body).

        Raises:
            EOFError: the connection ended between frames.
            FrameError: it ended inside one, or a body is over ``limit`` bytes.
            OSError: from ``recv`` (a timeout is ``TimeoutError``).
        """
        while self._end - self._start < HEADER.size:
            self._fill(between=self._start == self._end)
        length, status = HEADER.unpack_from(self._buffer, self._start)
        if length > limit:
            raise FrameError(
                f"a frame of {length} bytes, over the {limit}-byte limit (the daemon's "
                "max_message_bytes); send large tensors through shared memory"
            )
        begin = self._start + HEADER.size
        if begin + length <= len(self._buffer):
            while self._end < begin + length:
                self._fill(between=False)
            body = bytes(self._view[begin : begin + length])
            self._start = begin + length
            return status, body
        return status, self._read_big(begin, length)

    def _fill(self, between: bool) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buffer):  # a header split at the buffer's end
            kept = self._end - self._start
            self._buffer[:kept] = self._buffer[self._start : self._end]
            self._start, self._end = 0, kept
        got = self._receive(self._view[self._end :])
        if not got:
            if between:
                raise EOFError
            raise FrameError("the connection ended inside a frame")
        self._end += got

    def _receive_fds(self, into: memoryview) -> int:
        """``recv_into``, keeping the descriptors that come with the bytes."""
        got, ancillary, _, _ = self._sock.recvmsg_into([into], _FDS)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        return got

    def _read_big(self, begin: int, length: int) -> bytearray:
        body = bytearray(min(length, _FIRST_BIG))
        have = self._end - begin
        body[:have] = self._view[begin : self._end]
        self._start = self._end = 0
        while have < length:
            if have == len(body):
                body.extend(bytes(min(len(body), length - len(body))))
            with memoryview(body) as view:
                got = self._receive(view[have:])
            if not got:
                raise FrameError("the connection ended inside a frame")
            have += got
        return body


def send(sock: socket.socket, status: int, body: bytes) -> None:
    """One frame."""
    if len(body) < _BUFFER:
        sock.sendall(HEADER.pack(len(body), status) + body)
    else:  # no copy of a large body to prepend the header
        sock.sendall(HEADER.pack(len(body), status))
        sock.sendall(body)


# -- a held connection's greeting (tickets, private sockets) ------------------------------

GREETING_SECONDS = 10.0
"""How long either side waits for the other's greeting or answer."""
CODES = {c.value[0]: c for c in grpc.StatusCode}
"""A frame's status: gRPC's code of that number."""


def greet(sock: socket.socket, magic: bytes, token: str | None) -> tuple[int, bytes]:
    """The client's side: send ``magic`` and a frame with the authorization value (``Bearer
    <token>``, empty without one), and read the daemon's answer: its status and body.

    Raises:
        OSError, EOFError, FrameError: no answer of the daemon's (an older one relays the
            greeting to gRPC, which closes the connection).
    """
    body = f"Bearer {token}".encode() if token else b""
    sock.sendall(magic + HEADER.pack(len(body), 0) + body)
    status, answer = Frames(sock).read(GREETING_LIMIT)
    return status, bytes(answer)


def greeted(sock: socket.socket, magic: bytes, gate: Gate) -> bool:
    """The daemon's side of :func:`greet`, on a connection the relay hands over: read the
    greeting (``magic``, which the relay peeked, then the frame) and check its token with
    ``gate`` (which grants roles per call, later). Refused, the reason is sent. Whether the
    connection goes on; it blocks from then on."""
    try:
        sock.settimeout(GREETING_SECONDS)
        sock.recv(len(magic))  # peeked by the relay
        _, token = Frames(sock).read(GREETING_LIMIT)
        try:
            gate.grant(bytes(token))
        except ServiceError as exc:
            send(sock, exc.status.value[0], exc.message.encode())
            return False
        sock.settimeout(None)
        return True
    except (OSError, EOFError, FrameError):
        return False


def hold(sock: socket.socket, answer: bytes) -> None:
    """Send the greeting's ``answer`` (status 0), then hold the connection until it ends:
    the client sends nothing more, so this returns at its end of file or the daemon's cut."""
    with contextlib.suppress(OSError):
        send(sock, 0, answer)
        sock.recv(1)


# -- the daemon's side (the client's: lane_client.py) -------------------------------------


class LaneServer:
    """Serves the lane connections the relay hands over, each in the relay's thread for it.

    Args:
        infer: serves one request for a peer (:meth:`kserve.InferenceService.infer`).
        gate: the daemon's token and drain.
        register: registers a memfd passed by a peer as a region (name, descriptor, byte
            size, peer: :meth:`regions.Regions.register_sealed`, which owns the descriptor).
        max_bytes: the largest frame taken (``max_message_bytes``); a larger one is refused
            from its header, unread, and its connection closed.
    """

    def __init__(
        self,
        infer: Callable[
            [pb.ModelInferRequest, Callable[[], Peer], float | None, CancelToken | None],
            pb.ModelInferResponse,
        ],
        gate: Gate,
        register: Callable[[str, int, int, Peer], None] | None = None,
        max_bytes: int = MAX_BODY,
    ) -> None:
        self._infer = infer
        self._gate = gate
        self._register = register
        self._max_bytes = max_bytes
        self._hang_ups = HangUps()

    def close(self) -> None:
        """Stop watching for hang-ups (the daemon stops; its connections are cut)."""
        self._hang_ups.close()

    def serve(self, sock: socket.socket, peer: Peer, activity: Activity | None = None) -> None:
        """Greet, then answer requests until the client leaves or the daemon stops;
        ``activity`` (the relay's idle timeout reads it) is kept up to date."""
        own_thread()  # its runs on the cores of the instance each takes (cores/pinning.py)
        frames = Frames(sock, descriptors=True)
        watch = self._hang_ups.watch(sock)
        seen = activity or Activity()
        try:
            sock.recv(len(MAGIC))  # peeked by the relay
            _, token = frames.read(GREETING_LIMIT)
            try:
                peer = peer.granted(self._gate.grant(bytes(token)))
            except ServiceError as exc:
                send(sock, exc.status.value[0], exc.message.encode())
                return
            send(sock, 0, MAGIC)
            while True:
                seen.busy = False
                kind, body = frames.read(self._max_bytes)
                seen.busy = True
                if kind == REGISTER:
                    fds, frames.fds = frames.fds, []
                    send(sock, *self._registration(body, fds, peer))
                else:
                    if frames.fds:
                        frames.close_fds()  # a request brings none
                    self._respond(sock, body, peer, watch)
                seen.last = time.monotonic()
        except EOFError:
            pass  # the client closed between requests
        except FrameError as exc:
            log.warning("lane connection of pid %d dropped: %s", peer.pid, exc)
            with contextlib.suppress(OSError):
                send(sock, grpc.StatusCode.INVALID_ARGUMENT.value[0], str(exc).encode())
        except OSError:
            pass  # the client died, or the daemon cut the connection at stop
        finally:
            self._hang_ups.forget(watch)
            frames.close_fds()

    def _registration(
        self, body: bytes | bytearray, fds: list[int], peer: Peer
    ) -> tuple[int, bytes]:
        """Register the memfd that came with a :data:`REGISTER` frame; the answer."""
        try:
            if self._register is None:
                raise ServiceError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    "this daemon registers no descriptors; register a /dev/shm segment by name",
                )
            if len(fds) != 1:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a registration frame carries one descriptor (SCM_RIGHTS), not {len(fds)}",
                )
            try:
                request = pb.SystemSharedMemoryRegisterRequest.FromString(body)
            except DecodeError as exc:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a registration frame holds a SystemSharedMemoryRegisterRequest ({exc})",
                ) from None
            self._register(request.name, fds.pop(), request.byte_size, peer)  # it owns it
            return 0, b""
        except Exception as exc:
            return _failure(exc, "a lane registration")
        finally:
            _close_all(fds)

    def _respond(
        self, sock: socket.socket, body: bytes | bytearray, peer: Peer, watch: Watch
    ) -> None:
        """Answer one request. The drain counts it until its answer is sent, not only
        computed: the daemon cuts the lane's connections once the drain ends."""
        try:
            self._gate.enter()
        except ServiceError as exc:
            send(sock, exc.status.value[0], exc.message.encode())
            return
        try:
            send(sock, *self._answer(body, peer, watch))
        finally:
            watch.token = None
            self._gate.leave()

    def _answer(self, body: bytes | bytearray, peer: Peer, watch: Watch) -> tuple[int, bytes]:
        try:
            try:
                request = pb.ModelInferRequest.FromString(body)
            except DecodeError as exc:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a lane frame of {len(body)} bytes is not a ModelInferRequest ({exc}); "
                    "send one serialized KServe ModelInferRequest per frame",
                ) from None
            name = request.model_name
            # Made stoppable unless this connection's last request to the model took under
            # QUICK_S: making it so costs 5-10 µs a request in the daemon (about 7% of a
            # small model's round trip), more than a client gone away can waste on it.
            gone = None if name in watch.quick else watch.start()
            began = time.perf_counter()
            response = self._infer(request, lambda: peer, None, gone)
            if time.perf_counter() - began < QUICK_S:
                watch.quick.add(name)
            else:
                watch.quick.discard(name)
            return 0, response.SerializeToString()
        except Exception as exc:
            return _failure(exc, "a lane request")


class Activity:
    """When a connection last carried a request or an answer, and whether one is under way
    (:attr:`busy`): what the relay's idle timeout looks at (:mod:`.relay`), and whether it
    has begun closing the connection (:attr:`closing`)."""

    __slots__ = ("busy", "closing", "last")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.busy = False
        self.closing = False


QUICK_S = 0.001
"""A lane request to a model whose last request on the same connection took less than this
is not watched for its client hanging up (:class:`HangUps`)."""


class Watch:
    """One lane connection as :class:`HangUps` watches it.

    Attributes:
        token: cancelled when the client hangs up; set while a request is served.
        hung_up: the client hung up (seen by the watcher).
        quick: the models whose last request on this connection took under
            :data:`QUICK_S` (not watched).
    """

    __slots__ = ("fd", "hung_up", "quick", "token")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.token: CancelToken | None = None
        self.hung_up = False
        self.quick: set[str] = set()

    def start(self) -> CancelToken:
        """A token for the request about to be served, cancelled at once when the client
        already hung up."""
        # The watcher sets hung_up, then cancels the token it sees; this sets the token,
        # then reads hung_up: whichever runs second sees the other's write.
        self.token = token = CancelToken()
        if self.hung_up:
            token.cancel()
        return token

    def hang_up(self) -> None:
        """The client went away: cancel the request being served, if any."""
        self.hung_up = True
        token = self.token
        if token is not None:
            token.cancel()


class HangUps:
    """One thread that sees lane clients hang up while their request runs.

    A lane connection is served in one thread, which reads nothing while it runs a request:
    without this, a client that is killed or gives up would have its request run to the
    end for nobody. The connections are registered edge-triggered for ``EPOLLRDHUP`` (the
    other end closed or shut its writing half), so a client waiting for its answer costs
    nothing and a hang-up wakes the thread once; it cancels the request's token
    (:meth:`LoadedModel.run`'s ``cancel``: dropped if queued, stopped where the engine can
    if running, counted CANCELLED). Requests to a model that answered quickly on the same
    connection last time are not watched (:data:`QUICK_S`).
    """

    _EVENTS = select.EPOLLRDHUP | select.EPOLLET  # HUP and ERR are always reported

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake_reader, self._wake_writer = os.pipe()
        self._epoll.register(self._wake_reader, select.EPOLLIN)
        self._watched: dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, sock: socket.socket) -> Watch:
        """Watch ``sock`` until :meth:`forget` (before it is closed: its number may be
        reused)."""
        watch = Watch(sock.fileno())
        with self._lock:
            if self._closed:
                return watch  # never fires
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="crossrt-lane-hang-ups", daemon=True
                )
                self._thread.start()
            self._watched[watch.fd] = watch
            self._epoll.register(watch.fd, self._EVENTS)
        return watch

    def forget(self, watch: Watch) -> None:
        """Stop watching the connection of ``watch``."""
        with self._lock:
            if self._watched.get(watch.fd) is watch:
                del self._watched[watch.fd]
                with contextlib.suppress(OSError):
                    self._epoll.unregister(watch.fd)

    def close(self) -> None:
        """End the thread and release the epoll instance."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in self._watched:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
            self._watched.clear()
            thread = self._thread
        os.write(self._wake_writer, b"x")
        if thread is not None:
            thread.join()
        self._epoll.close()
        os.close(self._wake_reader)
        os.close(self._wake_writer)

    def _run(self) -> None:
        while True:
            for fd, _ in self._epoll.poll():
                if fd == self._wake_reader:
                    return
                with self._lock:
                    watch = self._watched.get(fd)
                if watch is not None:
                    watch.hang_up()


def _failure(exc: Exception, what: str) -> tuple[int, bytes]:
    """The answer frame's status and body for ``exc``: gRPC's code and message, as gRPC
    would send them (an unexpected error logged with its traceback)."""
    code, message = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", what)
    return code.value[0], message.encode()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def is_lane(sock: socket.socket, seconds: float = 10.0) -> bool:
    """Whether a new connection opens with :data:`MAGIC` (looked at without reading it);
    false as soon as its first bytes differ, or when it sends too few within ``seconds``."""
    return opening(sock, (MAGIC,), seconds) == MAGIC


def opening(sock: socket.socket, greetings: tuple[bytes, ...], seconds: float = 10.0) -> bytes:
    """Which of ``greetings`` (all as long as :data:`MAGIC`) a new connection opens with,
    looked at without reading it; ``b""`` as soon as its first bytes differ from all, or
    when it sends too few within ``seconds``."""
    deadline = time.monotonic() + seconds
    sock.settimeout(seconds)
    try:
        while True:
            seen = sock.recv(len(MAGIC), socket.MSG_PEEK)
            if seen in greetings:
                return seen
            if not seen or not any(g.startswith(seen) for g in greetings):
                return b""
            if _hung_up(sock) or time.monotonic() > deadline:
                return b""
            time.sleep(0.001)  # the rest of a greeting split by the kernel
    except OSError:
        return b""
    finally:
        sock.settimeout(None)


def _hung_up(sock: socket.socket) -> bool:
    """Whether the other end closed (or stopped sending): a peek sees the bytes it sent
    before, again and again."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return bool(poller.poll(0))
