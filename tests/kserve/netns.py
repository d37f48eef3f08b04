"""A process in a network namespace of its own, as a pod has one, and ports to reach it.

The container's command line binds 0.0.0.0:8080, 8081 and 8082, the ports KServe names. Run
as is on a shared host they would collide with whatever else listens there; in a namespace of
its own (``unshare(CLONE_NEWNET)``, loopback brought up) the process binds them as in its pod.
:class:`Forward` reaches such a port from the test: a loopback port here whose connections are
made from a thread that has entered the process's namespace (``setns`` moves the calling
thread only, and a socket stays in the namespace it was made in).

Needs root (CAP_SYS_ADMIN), as the tests of this project run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import sys
import threading
import time

CLONE_NEWNET = 0x40000000

LAUNCH = """
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) != 0:
    sys.exit("unshare(CLONE_NEWNET): " + os.strerror(ctypes.get_errno()))
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
os.execv(sys.argv[1], sys.argv[1:])
"""
"""Run as ``python -c LAUNCH COMMAND...``: the command in a new network namespace with its
loopback up (``execv``: the same process, so its pid names the namespace)."""


def isolated(command: list[str]) -> list[str]:
    """``command`` (its first item a path) run in a network namespace of its own."""
    return [sys.executable, "-c", LAUNCH, *command]


def available() -> str | None:
    """Why a network namespace cannot be made here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "a network namespace needs root (the project's tests run as root)"
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "setns"):
        return "this libc has no setns"
    return None


def namespace_of(pid: int, seconds: float = 30.0) -> str:
    """``/proc/PID/ns/net`` once process ``pid`` (started with :func:`isolated`) has left
    this process's network namespace.

    Raises:
        AssertionError: it has not within ``seconds`` (or it has ended).
    """
    ours = os.readlink("/proc/self/ns/net")
    path = f"/proc/{pid}/ns/net"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.readlink(path) != ours:
                return path
        except FileNotFoundError:
            break  # it has ended
    raise AssertionError(f"process {pid} did not enter a network namespace of its own")


class Forward:
    """127.0.0.1:``port`` here, carried to 127.0.0.1:``target`` in process ``pid``'s
    network namespace."""

    def __init__(self, pid: int, target: int) -> None:
        self.target = target
        self._namespace = os.open(namespace_of(pid), os.O_RDONLY)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._libc = ctypes.CDLL(None, use_errno=True)
        threading.Thread(target=self._accept, name="forward", daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        os.close(self._namespace)

    def _accept(self) -> None:
        while True:
            try:
                outer, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._carry, args=(outer,), daemon=True).start()

    def _carry(self, outer: socket.socket) -> None:
        # This thread enters the process's namespace for good: it ends with the connection.
        if self._libc.setns(self._namespace, CLONE_NEWNET) != 0:
            outer.close()
            return
        try:
            inner = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            outer.close()  # refused: the client sees its connection closed, as a refusal
            return
        inner.settimeout(None)
        back = threading.Thread(target=_pump, args=(inner, outer), daemon=True)
        back.start()
        _pump(outer, inner)
        back.join()
        inner.close()
        outer.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``sink``'s sending side."""
    with contextlib.suppress(OSError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
