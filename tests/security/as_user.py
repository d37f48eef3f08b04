"""Real users for the daemon's security tests: accounts made with ``useradd`` (removed after),
and code run as one of them in a forked child that talks to the test in JSON lines.

A fork, not a new interpreter: the interpreter lives under /root, which another user may not
enter. A child that stops answering is killed; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="creating users (useradd) and acting as them needs root",
)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@contextlib.contextmanager
def users(count: int) -> Iterator[list[User]]:
    """``count`` new local users (no home, no login), removed afterwards."""
    made: list[User] = []
    try:
        for _ in range(count):
            name = f"crt{secrets.token_hex(4)}"
            subprocess.run(
                ["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            made.append(User(name, entry.pw_uid, entry.pw_gid))
        yield made
    finally:
        for user in made:
            subprocess.run(["userdel", user.name], capture_output=True)


class Lines:
    """JSON documents, one a line, over a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, doc: Any) -> None:
        self.sock.sendall(json.dumps(doc).encode() + b"\n")

    def recv(self, seconds: float = 60.0) -> Any:
        self.sock.settimeout(seconds)
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the child ended without answering")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


class AsUser:
    """``body(lines, *args)`` run as ``user`` in a forked child; :attr:`lines` talks to it.
    Whatever it raises comes back as ``{"error": repr}``."""

    def __init__(self, user: User, body: Callable[..., None], *args: Any) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ours.close()
            lines = Lines(theirs)
            try:
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                body(lines, *args)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    lines.send({"error": repr(exc)})
            os._exit(0)
        theirs.close()
        self.pid = pid
        self.lines = Lines(ours)

    def recv(self, seconds: float = 60.0) -> Any:
        return self.lines.recv(seconds)

    def send(self, doc: Any) -> None:
        self.lines.send(doc)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.lines.sock.close()

    def __enter__(self) -> AsUser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def once(user: User, body: Callable[..., Any], *args: Any, seconds: float = 60.0) -> Any:
    """``body(*args)``'s JSON result, run as ``user``."""

    def run(lines: Lines, *args: Any) -> None:
        lines.send({"result": body(*args)})

    # A child forked from a process whose gRPC and engine threads are running can hang in its
    # first gRPC call (a lock held by a thread that fork did not copy): seen once in six full
    # runs of make test. A child that does not answer in time is killed and started again,
    # once; what it answers is checked as before.
    for attempt in (1, 2):
        with AsUser(user, run, *args) as child:
            try:
                answer = child.recv(seconds)
                break
            except TimeoutError:
                if attempt == 2:
                    raise
    if "error" in answer:
        raise AssertionError(f"the child as {user.name} failed: {answer['error']}")
    return answer["result"]
