"""The runtime directory among several users (issue 24, point 6), with real users made by
useradd and removed after: another user's squatted ``/tmp/crossrt-<uid>`` does not stop a
user's crossrt, and in a runtime directory shared by several users the first one's
``observe/`` does not hide the others' processes from ``crossrt top``.

The other users' parts run in a fork of the test that drops to that user (the interpreter
lives under /root, which those users may not enter, so none can be started afresh); a
child that never answers is killed."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crossrt.config import settings
from crossrt.runtime import observer
from crossrt.runtime.cores.reservation import runtime_directory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="makes users with useradd: needs root",
)
WAIT = 30  # seconds: the bound on every wait; reached only when something is broken


@pytest.fixture
def users() -> Iterator[Callable[[str], int]]:
    """Make users (``useradd -m``) on demand; each is removed, with its home, after."""
    made: list[str] = []

    def make(name: str) -> int:
        name = f"{name}{os.getpid() % 10000}"
        subprocess.run(["useradd", "-m", "-s", "/bin/false", name], check=True)
        made.append(name)
        return pwd.getpwnam(name).pw_uid

    yield make
    for name in made:
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


def as_user(uid: int, env: dict[str, str], work: Callable[[], Any], hold: bool = False) -> Any:
    """Run ``work()`` in a fork that is user ``uid`` with environment ``env``; its JSON
    result. ``hold``: the child stays alive (returned as ``(result, pid, release)``) until
    ``release()``, which ends it."""
    results, result_writer = os.pipe()
    release_reader, release_writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(results)
            os.close(release_writer)
            entry = pwd.getpwuid(uid)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(uid)
            os.environ.clear()
            os.environ.update(env)
            try:
                result: Any = work()
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(result_writer, json.dumps(result).encode())
            os.close(result_writer)
            if hold:
                select.select([release_reader], [], [], WAIT)
        finally:
            os._exit(0)
    os.close(result_writer)
    os.close(release_reader)
    chunks = []
    with os.fdopen(results, "rb") as pipe:
        while select.select([pipe], [], [], WAIT)[0] and (chunk := pipe.read1(65536)):
            chunks.append(chunk)

    def release() -> None:
        os.close(release_writer)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    answer = json.loads(b"".join(chunks) or b'{"error": "no answer"}')
    if hold:
        return answer, pid, release
    release()
    return answer


def test_a_squatted_tmp_runtime_directory_does_not_stop_its_user(
    users: Callable[[str], int],
) -> None:
    """``/tmp/crossrt-<uid>`` made first by another user: ``crossrt serve`` refused to start
    (the folder is not its user's, so its core locks cannot be trusted). The user's crossrt
    now takes a folder in its own home, and the squatted one is left alone."""
    # imported here: the child, once another user, may not read the interpreter's library
    build = pytest.importorskip("crossrt.server.settings", reason="the serve extra").build
    victim, squatter = users("crtvictim"), users("crtsquat")
    squatted = Path(tempfile.gettempdir()) / f"crossrt-{victim}"
    squatted.mkdir(mode=0o777)
    try:
        os.chown(squatted, squatter, squatter)  # as `mkdir` by the squatter leaves it
        squatted.chmod(0o777)
        home = pwd.getpwuid(victim).pw_dir

        def start() -> dict[str, Any]:
            config = settings()
            folder = runtime_directory(Path(config.runtime_dir), config.runtime_dir_is_default)
            endpoint = build(None, {}).endpoints()[0]  # what `crossrt serve` listens on
            st = folder.stat()
            return {"folder": str(folder), "endpoint": endpoint.address,
                    "owner": st.st_uid, "mode": stat.S_IMODE(st.st_mode)}  # fmt: skip

        got = as_user(victim, {"HOME": home, "PATH": "/usr/bin:/bin"}, start)
        assert "error" not in got, got
        assert got["folder"] == f"{home}/.cache/crossrt/run"
        assert got["endpoint"] == f"{home}/.cache/crossrt/run/crossrt.sock"
        assert (got["owner"], got["mode"]) == (victim, 0o700)
        assert squatted.stat().st_uid == squatter  # left as it was
    finally:
        shutil.rmtree(squatted, ignore_errors=True)


def test_every_user_of_a_shared_runtime_directory_is_seen(
    users: Callable[[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime directory several users share (``CROSSRT_RUNTIME_DIR``, mode 1777 here):
    the first user's ``observe/`` was 0700, so a second user's process could not put its
    socket there and ``crossrt top`` (root's here) never saw it."""
    first, second = users("crtfirst"), users("crtsecond")
    shared = Path(tempfile.mkdtemp(prefix="crossrt-shared-"))
    shared.chmod(0o1777)
    env = {"CROSSRT_RUNTIME_DIR": str(shared), "PATH": "/usr/bin:/bin"}
    try:
        made = as_user(first, env, lambda: str(observer.observe_directory()))
        assert made == str(shared / "observe"), made
        mode = stat.S_IMODE((shared / "observe").stat().st_mode)
        assert mode == 0o1777  # writable by those who share the folder, sticky

        class Runtime:  # what watch() keeps a weak reference to; nothing is asked of it
            pass

        def publish() -> bool:
            runtime = Runtime()
            observer.watch(runtime)
            publish.runtime = runtime  # type: ignore[attr-defined]  # kept alive
            return (shared / "observe" / f"{os.getpid()}.sock").is_socket()

        published, pid, release = as_user(second, env, publish, hold=True)
        try:
            assert published is True, published
            monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(shared))
            assert pid in [p for p, _ in observer.endpoints()]
        finally:
            release()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_observe_mode_follows_who_shares_the_runtime_directory() -> None:
    assert observer.observe_mode(0o40700) == 0o700  # a user's own: as before
    assert observer.observe_mode(0o40750) == 0o1770  # a group's (the systemd unit's)
    assert observer.observe_mode(0o41777) == 0o1777
