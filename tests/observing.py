"""A stand-in for a crossrt process that dies mid-answer, for the tests of the observation
socket (``runtime/observer.py``) and of the tools that read it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from crossrt.runtime import observer


@contextlib.contextmanager
def hanging_up(pid: int) -> Iterator[Path]:
    """A socket for ``pid`` in the observe directory that takes each question and closes the
    connection without answering, until the block ends."""
    path = observer.observe_directory() / f"{pid}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)

    def hang_up() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = server.accept()[0]
                conn.recv(100)
                conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        yield path
    finally:
        server.close()
