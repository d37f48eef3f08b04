"""``crossrt socket -- COMMAND ARGS...``: run a command with a gRPC socket of its own on the
daemon (:mod:`crossrt.server.private_sockets`), so that tritonclient, perf_analyzer or any
gRPC client calls it with no relay, as this user.

The socket is held while COMMAND runs: its URL (``unix:<path>``) is in COMMAND's
environment as ``CROSSRT_PRIVATE_URL`` (the path as ``CROSSRT_PRIVATE_SOCKET``), and
``{url}`` / ``{socket}`` in its arguments are replaced by them::

    crossrt socket -- perf_analyzer -m tiny -i grpc -u {url}

The path is no secret (only this user may open the socket), so it may sit on a command
line. Exit status: COMMAND's (128 + the signal that ended it), or 2 when no socket could be
had.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from ..errors import CrossrtError
from .common import fail

ENV_URL = "CROSSRT_PRIVATE_URL"
ENV_SOCKET = "CROSSRT_PRIVATE_SOCKET"
TOKEN_ENV = "CROSSRT_SERVE_TOKEN"


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt socket",
        description="Run COMMAND with a gRPC socket of its own on the daemon: tritonclient, "
        "perf_analyzer or any gRPC client calls it without the relay, as this user. Its URL "
        f"is in ${ENV_URL} (its path in ${ENV_SOCKET}); {{url}} and {{socket}} in ARGS are "
        "replaced by them. The daemon's token, if it wants one, is read from "
        f"${TOKEN_ENV}.",
        epilog="example: crossrt socket -- perf_analyzer -m tiny -i grpc -u {url}",
    )
    p.add_argument(
        "--daemon",
        metavar="PATH",
        help="the daemon's main Unix socket (default: the default socket, as crossrt serve "
        "makes it)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt socket``."""
    p = parser()
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("a COMMAND to run is required (after --)")
    from ..server.private_sockets import private_socket

    try:
        held = private_socket(args.daemon, os.environ.get(TOKEN_ENV) or None)
    except CrossrtError as exc:
        return fail("socket", exc)
    with held:
        env = dict(os.environ, **{ENV_URL: held.url, ENV_SOCKET: held.path})
        command = [a.replace("{url}", held.url).replace("{socket}", held.path) for a in command]
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            print(f"crossrt socket: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        ended = threading.Event()
        threading.Thread(target=_watch, args=(held.fileno(), ended), daemon=True).start()
        # Ctrl-C reaches COMMAND from the terminal; a SIGTERM sent to us is passed on.
        signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        code = child.wait()
        ended.set()
    return 128 - code if code < 0 else code


def _watch(fd: int, ended: threading.Event) -> None:
    """Say so when the daemon drops the socket while COMMAND runs (it stopped, or the socket
    carried no call for its idle timeout): COMMAND's calls fail from then on."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLRDHUP)
    if poller.poll() and not ended.is_set():
        print(
            "crossrt socket: the daemon closed this private socket (it stopped, or no call "
            "came for its idle_timeout); calls on it fail from now on: run the command again",
            file=sys.stderr,
        )
