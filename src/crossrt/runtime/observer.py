"""How ``crossrt top``, ``crossrt monitor`` and ``crossrt profile --pid`` see the models of
other processes: each process that loads a model answers on a Unix socket of its own.

The first model a process loads starts one daemon thread listening on
``<runtime dir>/observe/<pid>.sock`` (the runtime directory is the user's, mode 0700, or
shared: :func:`observe_directory`; the socket is 0600: only the same user, and root,
connect). Nothing is measured or sent until someone asks: a connection sends one JSON line
and gets one JSON line back.

- ``{"op": "snapshot"}``: the process (pid, tag, command, CPU seconds, its compile caches'
  counters) and each loaded model with its request statistics (``docs/statistics.md``),
  cores and memory;
- ``{"op": "profile", "seconds": S, "models": [names]}``: a :class:`~.profiler.Profile` of
  S seconds (at most :data:`MAX_PROFILE_SECONDS`), returned as a Chrome trace.

An error comes back as ``{"error": {"code": NAME, "message": ...}}``. ``CROSSRT_OBSERVE=0``
turns the socket off; ``CROSSRT_PROCESS_TAG`` names the process (default: its command). The
daemon (``crossrt serve``) is a process like any other: its models appear the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import resource
import socket
import stat
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compiler.cache import cache_stats
from ..config import settings
from ..errors import (
    CrossrtError,
    InvalidArgumentError,
    ModelNotFoundError,
    StatusCode,
    error_class,
)
from .cores.reservation import runtime_directory
from .profiler import Profile

if TYPE_CHECKING:
    from .loaded import LoadedModel

log = logging.getLogger("crossrt")

MAX_REQUEST_BYTES = 64 << 10
"""The longest request line a process reads."""

MAX_PROFILE_SECONDS = 600.0
"""The longest profile one request may ask for."""

MAX_CONNECTIONS = 4
"""Requests a process answers at once (a profile holds its connection for its seconds)."""

DRAWN_REQUESTS = 5_000
"""Requests per model drawn in a trace asked for over the socket (the summary counts all)."""


def observe_directory() -> Path:
    """``observe/`` in the runtime directory, created when missing: 0700 in a user's own
    runtime directory; in one shared with a group or with everyone (``CROSSRT_RUNTIME_DIR``
    of mode 0750 or 1777, say), writable by them too and sticky, as ``/tmp`` is, so each
    user's processes can put their sockets in it and remove only their own. (Made 0700 by
    the first user, it hid every other user's processes from ``crossrt top``.)"""
    config = settings()
    folder = runtime_directory(Path(config.runtime_dir), config.runtime_dir_is_default)
    path = folder / "observe"
    mode = observe_mode(os.stat(folder).st_mode)
    try:
        path.mkdir(mode=0o700)
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)  # made before the runtime directory was shared
    return path


def observe_mode(runtime_mode: int) -> int:
    """The mode of ``observe/`` in a runtime directory of mode ``runtime_mode``: the users
    who may enter the runtime directory may add their sockets."""
    mode = 0o700
    if runtime_mode & 0o010:
        mode |= 0o070
    if runtime_mode & 0o001:
        mode |= 0o007
    return mode | 0o1000 if mode != 0o700 else mode


# -- the process's side ------------------------------------------------------------------------


class _Endpoint:
    """The listening socket of this process and the runtimes it reports."""

    def __init__(self, path: Path) -> None:
        self.pid = os.getpid()
        self.path = path
        # Runtimes (not imported: runtime.py imports this module).
        self.runtimes: weakref.WeakSet[Any] = weakref.WeakSet()
        self.started = time.time()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a dead process that had this pid
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.socket.bind(str(path))
            os.chmod(path, 0o600)
            self.socket.listen(16)
        except BaseException:
            self.socket.close()
            raise
        atexit.register(self.close)
        threading.Thread(target=self._accept, name="crossrt-observe", daemon=True).start()

    def close(self) -> None:
        if os.getpid() == self.pid:
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            self.socket.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)  # out of descriptors: the connection waits in the backlog
                    continue
                return  # closed
            if not self._slots.acquire(blocking=False):
                busy = f"pid {self.pid} answers {MAX_CONNECTIONS} requests at once; ask later"
                conn.settimeout(0.5)  # an asker that never reads must not hold the accepting
                _reply(conn, _error(StatusCode.RESOURCE, busy))
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="crossrt-observe-request", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5.0)
            try:
                request = _read_request(conn)
                answer = self.answer(request)
            except CrossrtError as exc:
                answer = _error(exc.code, exc.message)
            except Exception as exc:  # a bug here must not end the thread silently
                log.exception("crossrt observe: request failed")
                answer = _error(StatusCode.FAILURE, f"{type(exc).__name__}: {exc}")
            _reply(conn, answer)
        finally:
            self._slots.release()

    def models(self) -> list[LoadedModel]:
        return [m for rt in list(self.runtimes) if not rt.closed for m in rt.models]

    def answer(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            raise InvalidArgumentError('send one JSON object with "op": "snapshot" or "profile"')
        op = request["op"]
        if op == "snapshot":
            return self.snapshot()
        if op == "profile":
            return self.profile(request)
        raise InvalidArgumentError(f"unknown op {op!r}: use snapshot or profile")

    def snapshot(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "pid": self.pid,
            "tag": process_tag(),
            "command": " ".join(sys.orig_argv)[:1000] or sys.executable,
            "version": _version(),
            "started": self.started,
            "time": time.time(),
            "cpu": {"user_s": usage.ru_utime, "system_s": usage.ru_stime},
            "cache": cache_stats().to_dict(),
            "models": [describe(m) for m in self.models()],
        }

    def profile(self, request: dict[str, Any]) -> dict[str, Any]:
        seconds = request.get("seconds", 5.0)
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= MAX_PROFILE_SECONDS
        ):
            raise InvalidArgumentError(
                f"seconds={seconds!r}: give a number of seconds above 0, at most "
                f"{MAX_PROFILE_SECONDS:g}"
            )
        names = request.get("models") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError('"models" is a list of model names')
        models = self.models()
        chosen = [m for m in models if not names or _known_as(m) & set(names)]
        if not chosen:
            loaded = sorted({m.served_as or m.name for m in models})
            what = f"no model named {', '.join(names)}" if names else "no model"
            raise ModelNotFoundError(
                f"pid {self.pid} has {what} loaded (loaded: {', '.join(loaded) or 'none'})",
            )
        profile = Profile(chosen, drawn_requests=DRAWN_REQUESTS).start()
        time.sleep(float(seconds))
        return profile.stop()


def describe(model: LoadedModel) -> dict[str, Any]:
    """One loaded model as a snapshot shows it."""
    memory = None
    with contextlib.suppress(CrossrtError):
        memory = dataclasses.asdict(model.memory.stats())
    batching = model.instances.batching
    return {
        "name": model.name,
        "load": model.memory.owner,  # one per load: a model loaded again is another
        "served_as": model.served_as,
        "device": model.device.id,
        "drivers": sorted({node.driver for node in model.executable.nodes}),
        "instances": len(model.instances),
        "cores": [list(c) for c in model.instances.cores],
        "devices": model.instances.devices,
        "running": model.running,
        "queue_depth": model.instances.queue_depth,
        "max_batch_size": batching.max_size if batching is not None else 0,
        "statistics": model.statistics().to_dict(),
        "memory": memory,
    }


def _known_as(model: LoadedModel) -> set[str]:
    """The names a request may give a model by: its own, and a daemon's NAME and
    NAME:VERSION for it."""
    names = {model.name}
    if model.served_as:
        names |= {model.served_as, model.served_as.rpartition(":")[0]}
    return names


def process_tag() -> str:
    """``CROSSRT_PROCESS_TAG``, else the program's name."""
    return settings().process_tag or Path(sys.argv[0] if sys.argv else "python").name


_endpoint: _Endpoint | None = None
_lock = threading.Lock()


def watch(runtime: Any) -> None:
    """Report ``runtime``'s models on this process's socket, started on first use; does
    nothing when ``CROSSRT_OBSERVE`` is off.

    Raises:
        InvalidOptionError: ``CROSSRT_OBSERVE`` or ``CROSSRT_PROCESS_TAG`` is malformed. A
            socket that cannot be made is only logged: observing is never a reason for a
            load to fail.
    """
    global _endpoint
    config = settings()
    if not config.observe:
        return
    _ = config.process_tag  # malformed: said now, to the loader, not later to an observer
    try:
        with _lock:
            if _endpoint is None or _endpoint.pid != os.getpid():  # a forked child: its own
                _endpoint = _Endpoint(observe_directory() / f"{os.getpid()}.sock")
            _endpoint.runtimes.add(runtime)
    except (OSError, CrossrtError) as exc:
        log.warning("crossrt: cannot open the observation socket (crossrt top/monitor will "
                    "not see this process): %s", exc)  # fmt: skip


# -- the observer's side ---------------------------------------------------------------------


def endpoints() -> list[tuple[int, Path]]:
    """``(pid, socket)`` of every process with a socket in the runtime directory, by pid."""
    found = []
    for path in observe_directory().glob("*.sock"):
        if path.stem.isdigit():
            found.append((int(path.stem), path))
    return sorted(found)


def ask(pid: int, request: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """Send ``request`` to process ``pid`` and return its answer.

    Raises:
        ModelNotFoundError: (NOT_FOUND) no crossrt process ``pid`` answers here (none has
            loaded a model, it ended, or it runs as another user or with another
            ``CROSSRT_RUNTIME_DIR``); or the process has no such model.
        DeadlineExceededError: it did not answer within ``timeout`` seconds.
        CrossrtError: with the code the process answered.
    """
    path = observe_directory() / f"{pid}.sock"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            if path.exists() and not _alive(pid):
                with contextlib.suppress(OSError):
                    path.unlink()  # the process died without removing it
            raise ModelNotFoundError(
                f"no crossrt process {pid} answers in {path.parent}: it has loaded no model, "
                "has ended, or uses another CROSSRT_RUNTIME_DIR; `crossrt top --once` lists "
                "the processes that answer",
                details={"pid": pid},
            ) from None
        try:
            conn.sendall(json.dumps(request).encode() + b"\n")
            data = _receive_line(conn, limit=1 << 31)
        except TimeoutError:
            raise CrossrtError(
                f"crossrt process {pid} did not answer within {timeout:g} s",
                StatusCode.TIMEOUT,
                details={"pid": pid},
            ) from None
        except OSError as exc:  # it hung up mid-question: it may have just ended
            raise CrossrtError(
                f"crossrt process {pid} dropped the connection ({exc.strerror or exc}); ask again",
                details={"pid": pid},
            ) from None
    finally:
        conn.close()
    try:
        answer = json.loads(data)
    except ValueError:
        what = "hung up without answering" if not data else "answered with something not JSON"
        raise CrossrtError(f"crossrt process {pid} {what}", details={"pid": pid}) from None
    if not isinstance(answer, dict):
        raise CrossrtError(f"crossrt process {pid} answered {answer!r}", details={"pid": pid})
    error = answer.get("error")
    if isinstance(error, dict):
        code = StatusCode.__members__.get(str(error.get("code")), StatusCode.FAILURE)
        raise error_class(code)(str(error.get("message")), code, details={"pid": pid})
    return answer


def processes(timeout: float = 2.0) -> list[dict[str, Any]]:
    """A snapshot of every crossrt process that answers, by pid; a process that answered
    with an error, hung up or took longer than ``timeout`` is ``{"pid": pid, "error":
    message}``: one process never spoils the listing. Sockets of processes that died are
    removed."""
    found = []
    for pid, _ in endpoints():
        try:
            found.append(ask(pid, {"op": "snapshot"}, timeout))
        except ModelNotFoundError:
            continue  # ended between the listing and the question
        except CrossrtError as exc:
            found.append({"pid": pid, "error": exc.message})
    return found


# -- the wire ------------------------------------------------------------------------------------


def _receive_line(conn: socket.socket, limit: int) -> bytes:
    """Bytes up to a newline or the end of the connection.

    Raises:
        InvalidArgumentError: more than ``limit`` bytes came.
    """
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise InvalidArgumentError(f"a request is one JSON line of at most {limit} bytes")
    return bytes(data)


def _read_request(conn: socket.socket) -> Any:
    try:
        return json.loads(_receive_line(conn, MAX_REQUEST_BYTES))
    except ValueError:
        raise InvalidArgumentError("a request is one line of JSON") from None


def _reply(conn: socket.socket, answer: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
    except OSError:
        pass  # the asker left
    finally:
        conn.close()


def _error(code: StatusCode, message: str) -> dict[str, Any]:
    return {"error": {"code": code.name, "status": int(code), "message": message}}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crossrt")
    except PackageNotFoundError:
        return "unknown"
