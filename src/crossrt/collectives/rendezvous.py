"""Where the ranks of a group meet, and how each learns that a peer exited.

Rank 0 listens at the root address (``host:port``, Neuron's ``NEURON_RT_ROOT_COMM_ID``); every
other rank connects and says ``HELLO rank size``. Rank 0 answers each, in turn, with its join
order and the MPI port to connect to (``mpi.join``). The TCP connections stay open for the
communicator's life: the kernel closes them when a process exits, however it exits, so
:class:`Watch` sees a dead peer at once. Rank 0 forwards ``dead RANK`` to the others, so every
rank learns of any death. ``bye`` before a close tells the peers it was no death.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time

from ..errors import DeadlineExceededError, InvalidArgumentError
from .errors import CollectiveError

_LINE_MAX = 4096


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` (an IPv6 host in brackets)."""
    host, sep, port = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(
            f"root address {address!r}: give host:port, e.g. 127.0.0.1:29500 (rank 0 "
            "listens there; NEURON_RT_ROOT_COMM_ID has the same form)"
        )
    return host, int(port)


def _read_line(sock: socket.socket, deadline: float, what: str) -> str:
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceededError(f"{what}: no answer before the timeout")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1)  # one line, nothing after it: MPI's exchange follows
        except TimeoutError:
            continue
        if not chunk:
            raise CollectiveError(f"{what}: the peer closed the connection")
        data += chunk
        if len(data) > _LINE_MAX:
            raise CollectiveError(f"{what}: the peer sent a line over {_LINE_MAX} bytes")
    sock.settimeout(None)
    return data.decode(errors="replace").strip()


def listen(host: str, port: int) -> socket.socket:
    """Rank 0's listening socket at the root address."""
    try:
        return socket.create_server((host, port))
    except OSError as exc:
        raise CollectiveError(
            f"rank 0 cannot listen at {host}:{port} ({exc.strerror}); give a free port of "
            "this host as the root address"
        ) from None


def accept_ranks(
    server: socket.socket, size: int, deadline: float
) -> list[tuple[int, socket.socket]]:
    """Rank 0: the connections of ranks 1..size-1 to ``server`` (closed after), each with
    its rank, in arrival order."""
    peers: dict[int, socket.socket] = {}
    host, port = server.getsockname()[:2]
    with server:
        while len(peers) < size - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(1, size)) - set(peers))
                for sock in peers.values():
                    sock.close()
                raise DeadlineExceededError(
                    f"rank 0 waited at {host}:{port} for ranks {missing}, which did not "
                    "connect in the timeout; start every rank with the same root address"
                )
            server.settimeout(remaining)
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            try:
                words = _read_line(sock, deadline, "a joining rank").split()
                rank, their_size = int(words[1]), int(words[2])
                if words[0] != "HELLO":
                    raise ValueError(words[0])
            except (ValueError, IndexError, CollectiveError):
                sock.close()  # not one of ours (a port scan): keep waiting
                continue
            problem = (
                f"the group has {size} ranks, this one says {their_size}"
                if their_size != size
                else f"rank {rank} is not in 1..{size - 1}"
                if not 0 < rank < size
                else f"rank {rank} joined already"
                if rank in peers
                else ""
            )
            if problem:
                with contextlib.suppress(OSError):
                    sock.sendall(f"ERR {problem}\n".encode())
                sock.close()
                continue
            peers[rank] = sock
    return list(peers.items())


def connect_root(
    host: str, port: int, rank: int, size: int, deadline: float
) -> tuple[socket.socket, int, str]:
    """Rank ``rank`` > 0: ``(connection, join order, MPI port name)`` from rank 0."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise DeadlineExceededError(
                    f"rank {rank} could not reach rank 0 at {host}:{port} in the timeout "
                    f"({exc.strerror or exc}); start rank 0 with the same root address"
                ) from None
            time.sleep(0.05)  # rank 0 is not listening yet
    sock.sendall(f"HELLO {rank} {size}\n".encode())
    answer = _read_line(sock, deadline, f"rank {rank} joining at {host}:{port}")
    if answer.startswith("ERR "):
        sock.close()
        raise InvalidArgumentError(f"rank 0 refused rank {rank}: {answer[4:]}")
    order, _, port_name = answer.partition(" ")
    return sock, int(order), port_name


class Watch:
    """A thread watching the connections to the peers; :attr:`failure` says which exited."""

    def __init__(self, rank: int, peers: dict[int, socket.socket]) -> None:
        self.rank = rank
        self.failure: str | None = None
        self._peers = dict(peers)
        self._left: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="crossrt collectives watch")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        by_fd = {sock.fileno(): (rank, sock) for rank, sock in self._peers.items()}
        while by_fd:
            ready, _, _ = select.select([self._wake_r, *by_fd], [], [])
            if self._wake_r in ready:
                return
            for fd in ready:
                rank, sock = by_fd[fd]
                try:
                    data = sock.recv(_LINE_MAX)
                except OSError:
                    data = b""
                for line in data.decode(errors="replace").splitlines():
                    self._heard(rank, line.strip())
                if not data:
                    del by_fd[fd]
                    if rank not in self._left:
                        self._died(rank)

    def _heard(self, rank: int, line: str) -> None:
        if line == "bye":
            self._left.add(rank)
        elif line.startswith("dead ") and self.failure is None:
            self.failure = f"rank {line[5:]} exited"

    def _died(self, rank: int) -> None:
        if self.failure is None:
            self.failure = f"rank {rank} exited" + (" (the root)" if rank == 0 else "")
        if self.rank == 0:  # tell the others: they only watch rank 0
            for other, sock in self._peers.items():
                if other != rank:
                    with contextlib.suppress(OSError):
                        sock.sendall(f"dead {rank}\n".encode())

    def close(self) -> None:
        """Say ``bye`` to the peers and stop watching."""
        for sock in self._peers.values():
            with contextlib.suppress(OSError):
                sock.sendall(b"bye\n")
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for sock in self._peers.values():
            sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
