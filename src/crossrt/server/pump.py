"""The relay's byte pumps, in a process of their own.

The Unix socket's relay (:mod:`.relay`) accepts a connection, reads who connected
(``SO_PEERCRED``) and connects a socket of its own to gRPC's inner socket; the bytes between
the two are copied here. In the daemon's process every copy waited for the GIL, which gRPC's
threads hold while they serve: at 4 clients gRPC over the Unix socket served 0.55-0.8x the
requests of gRPC over loopback TCP (p50 +400-500 µs). In a process of its own, with a GIL
of its own, the same copies cost next to nothing (measurements: docs/daemon.md, "The Unix
socket's relay").

The daemon keeps everything that decides: who connected, the limits, the idle timeout, the
drain. It hands both sockets of a relayed connection to the pump process (``SCM_RIGHTS``
over a socket pair) and keeps its own copies (to cut them); the pump process copies, notes
when bytes last went through in a shared board (one float per slot, ``CLOCK_MONOTONIC``,
which both processes read alike) and says when a connection ended. The pump process holds
nothing the daemon does not give it and trusts nothing it reads: it runs the standard
library only (``python -I`` of this file), and exits when the daemon's end of the socket
pair closes (the daemon exited or died).

Should the pump process die, the connections it copied are cut (their clients reconnect) and
the relay copies in the daemon's own threads from then on.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("crossrt.serve")
_CHUNK = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_HANDOFF = struct.Struct("qq")  # serial, slot
_ENDED = struct.Struct("q")  # serial
_SLOT = struct.Struct("d")  # when bytes last went through (time.monotonic())
_START_S = 10.0
"""How long the pump process may take to say it is ready."""


class Both:
    """Calls ``action`` once, when both directions of a connection have ended."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._left = 2
        self._lock = threading.Lock()
        self._action = action

    def one_ended(self) -> None:
        """One direction ended (or will never start)."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._action()


def pump(src: socket.socket, dst: socket.socket, both: Both, noted: Callable[[], None]) -> None:
    """Copy ``src`` to ``dst`` until EOF: through a pipe with ``splice`` (the kernel moves
    the pages; about 3x faster than recv/send through Python on 16 MB tensors), calling
    ``noted`` each time bytes went through; then shut ``dst`` for writing and tell
    ``both``."""
    read, write = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write, _F_SETPIPE_SZ, _CHUNK)
        source, target = src.fileno(), dst.fileno()
        while n := os.splice(source, write, _CHUNK):
            noted()
            while n:
                n -= os.splice(read, target, n)
    except OSError:
        pass
    finally:
        os.close(read)
        os.close(write)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    both.one_ended()


class Pumps:
    """The pump process, from the daemon's side: :meth:`relay` hands it a connection's two
    sockets; ``ended`` is called (from a thread of this class) with the serial of each
    connection it finished copying, and with every serial it held when it died.

    Raises:
        OSError: the process could not be started, or did not say it was ready.
    """

    def __init__(self, slots: int, ended: Callable[[int], None]) -> None:
        self._ended = ended
        self._slots = slots
        self._free = list(range(slots - 1, -1, -1))
        self._held: dict[int, int] = {}  # serial -> slot
        self._lock = threading.Lock()
        self.alive = True
        board_fd = os.memfd_create("crossrt-pump-board", os.MFD_CLOEXEC)
        try:
            os.ftruncate(board_fd, max(slots, 1) * _SLOT.size)
            self._board = mmap.mmap(board_fd, max(slots, 1) * _SLOT.size)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", __file__, str(theirs.fileno()), str(board_fd)],
                    pass_fds=(theirs.fileno(), board_fd),
                    stdin=subprocess.DEVNULL,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
        finally:
            os.close(board_fd)
        self._control = ours
        ours.settimeout(_START_S)
        try:
            ready = ours.recv(16)
        except OSError as exc:
            self.close()
            raise OSError(f"the relay's pump process did not start: {exc}") from None
        if ready != b"ready":
            self.close()
            raise OSError(f"the relay's pump process did not start (exit {self._proc.poll()})")
        ours.settimeout(None)
        self._send_lock = threading.Lock()
        threading.Thread(target=self._listen, name="crossrt-pumps", daemon=True).start()

    def relay(self, serial: int, client: socket.socket, upstream: socket.socket) -> int | None:
        """Have the pump process copy between ``client`` and ``upstream``; the slot of the
        board where it notes activity, or ``None`` when it cannot take the connection (it
        died, or holds ``slots`` already): the caller copies itself then."""
        with self._lock:
            if not self.alive or not self._free:
                return None
            slot = self._free.pop()
            self._held[serial] = slot
        self.note(slot)
        try:
            with self._send_lock:
                socket.send_fds(
                    self._control,
                    [_HANDOFF.pack(serial, slot)],
                    [client.fileno(), upstream.fileno()],
                )
        except OSError:
            with self._lock:
                self._held.pop(serial, None)
                self._free.append(slot)
            return None
        return slot

    def last(self, slot: int) -> float:
        """When bytes last went through the connection of ``slot``."""
        return float(_SLOT.unpack_from(self._board, slot * _SLOT.size)[0])

    def note(self, slot: int, when: float | None = None) -> None:
        """Set the activity of ``slot`` (now by default)."""
        _SLOT.pack_into(self._board, slot * _SLOT.size, time.monotonic() if when is None else when)

    def _listen(self) -> None:
        while True:
            try:
                message = self._control.recv(_ENDED.size)
            except OSError:
                message = b""
            if len(message) != _ENDED.size:
                break
            (serial,) = _ENDED.unpack(message)
            with self._lock:
                slot = self._held.pop(serial, None)
                if slot is not None:
                    self._free.append(slot)
            if slot is not None:
                self._ended(serial)
        with self._lock:
            was_alive, self.alive = self.alive, False
            orphans = list(self._held)
            self._held.clear()
        if was_alive:
            log.error(
                "the relay's pump process ended (exit %s); %d connections cut, the relay "
                "copies in the daemon from now on",
                self._proc.poll(),
                len(orphans),
            )
        for serial in orphans:
            self._ended(serial)

    def close(self) -> None:
        """End the pump process (the connections it copies end with it)."""
        with self._lock:
            self.alive = False
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        self._control.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def relay(pair: tuple[socket.socket, socket.socket], both: Both, noted: Callable[[], None]) -> None:
    """Copy both ways between the two sockets of ``pair``, a thread each; when no thread can
    be had, the connection is cut (``both`` is told all the same)."""
    for a, b in (pair, pair[::-1]):
        try:
            threading.Thread(target=pump, args=(a, b, both, noted), daemon=True).start()
        except RuntimeError:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the other direction (if any) ends
            both.one_ended()
            if a is pair[0]:
                both.one_ended()  # neither started
            return


def _serve(control_fd: int, board_fd: int) -> None:
    """The pump process: copy each connection handed over ``control_fd`` in two threads,
    until the daemon's end closes."""
    # The daemon's signals are the daemon's: Ctrl-C, SIGTERM or SIGHUP to its process group
    # must not end the copies of the answers it drains (it closes our socket pair when done).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    size = os.fstat(board_fd).st_size
    board = mmap.mmap(board_fd, size)
    os.close(board_fd)
    send_lock = threading.Lock()

    def ended(serial: int, pair: tuple[socket.socket, socket.socket]) -> None:
        for sock in pair:
            sock.close()
        with send_lock, contextlib.suppress(OSError):
            control.send(_ENDED.pack(serial))

    control.send(b"ready")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, _HANDOFF.size, 2)
        except OSError:
            break
        if len(message) != _HANDOFF.size or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if not message:
                break  # the daemon is gone
            continue
        serial, slot = _HANDOFF.unpack(message)
        offset = slot * _SLOT.size
        if not 0 <= offset <= size - _SLOT.size:
            for fd in fds:
                os.close(fd)
            continue
        pair = (socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]))

        def noted(offset: int = offset) -> None:
            _SLOT.pack_into(board, offset, time.monotonic())

        relay(pair, Both(functools.partial(ended, serial, pair)), noted)
    os._exit(0)  # the daemon is gone: every connection ends with this process


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
