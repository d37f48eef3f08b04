"""Core ownership across processes: real Python children (``sys.executable -c``) reserve
cores and report on stdout; the test waits for their lines and for their exit, never for time
to pass. Every test has its own ``CROSSRT_RUNTIME_DIR`` (the ``runtime_dir`` fixture), so tests
never see each other's locks or a user's. The syntax of the settings, the usable CPUs and the
reservation within one process are tested in tests/unit/test_cores.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import crossrt
from crossrt import OutOfResourcesError, StatusCode
from crossrt import host as hostinfo
from crossrt.runtime.cores import reservation as cores
from crossrt.tools import ls as ls_tool

pytestmark = pytest.mark.usefixtures("runtime_dir")

HOST = hostinfo.host_cpus()
CPUS = list(HOST.cpus)
LAST = CPUS[-1]
PAIR = next(((a, b) for a, b in itertools.pairwise(CPUS) if b == a + 1), None)
needs_pair = pytest.mark.skipif(PAIR is None, reason="needs two adjacent usable CPUs")
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs")
no_quota = pytest.mark.skipif(
    HOST.limit < len(CPUS), reason="a cgroup CPU quota caps how many cores may be reserved"
)
TIMEOUT = 60  # seconds a child may take to start crossrt or to answer; never reached when well

OWNER = """
import json, sys
import crossrt
try:
    rt = crossrt.Runtime(**json.loads(sys.argv[1]))
except crossrt.CrossrtError as exc:
    print("error", int(exc.code), " ".join(exc.message.split()), flush=True)
    sys.exit(3)
print("ready", *rt.cores, flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        rt.close()
        print("closed", flush=True)
"""


class Child:
    """A Python child process whose stdout lines the test reads one at a time."""

    def __init__(self, code: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def expect(self, word: str) -> list[str]:
        """Wait for the next line; it must start with ``word``. Returns the rest, split."""
        line = self._lines.get(timeout=TIMEOUT)
        if line is None:
            self.proc.wait(timeout=TIMEOUT)
            assert self.proc.stderr is not None
            pytest.fail(f"child exited ({self.proc.returncode}): {self.proc.stderr.read()}")
        head, *rest = line.split()
        assert head == word, line
        return rest

    def next_line(self) -> tuple[str, str]:
        """The next line as ``(first word, the rest)``."""
        line = self._lines.get(timeout=TIMEOUT)
        assert line is not None, "the child exited"
        head, _, rest = line.partition(" ")
        return head, rest

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@pytest.fixture
def spawn() -> Iterator[Any]:
    children: list[Child] = []

    def start(code: str = OWNER, *args: str, **kwargs: Any) -> Child:
        child = Child(code, json.dumps(kwargs), *args)
        children.append(child)
        return child

    yield start
    for child in children:
        child.stop()


def owner_of(cpu: int, **kwargs: Any) -> dict[str, Any]:
    return {"visible_cores": str(cpu), **kwargs}


def busy_error(cpu: int) -> OutOfResourcesError:
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(visible_cores=cpu)
    assert info.value.code is StatusCode.EXEC_NC_BUSY
    return info.value


# -- the default: shared, no locks -------------------------------------------------------------


def test_default_processes_do_not_collide_with_each_other_or_owners(spawn):
    shared = HOST.cpus[: HOST.limit]
    first, second = spawn(), spawn()
    assert first.expect("ready") == second.expect("ready") == [str(c) for c in shared]
    owner = spawn(**owner_of(LAST))
    owner.expect("ready")
    with crossrt.Runtime() as rt:
        assert rt.cores == shared and not rt.exclusive


# -- exclusive ownership -----------------------------------------------------------------------


def test_second_process_fails_naming_the_owner(spawn):
    owner = spawn(**owner_of(LAST))
    assert owner.expect("ready") == [str(LAST)]
    err = busy_error(LAST)
    assert isinstance(err, MemoryError)
    assert f"core {LAST} is owned by process {owner.pid} (" in err.message
    assert "CROSSRT_VISIBLE_CORES" in err.message and "stop that process" in err.message
    assert err.details["owner"]["pid"] == owner.pid
    assert f"-c {OWNER.split()[0]}" in err.details["owner"]["cmdline"]
    # The same through the environment, from another real process.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CROSSRT_VISIBLE_CORES", str(LAST))
        code, *words = spawn().expect("error")
    assert int(code) == StatusCode.EXEC_NC_BUSY == 1005
    assert f"owned by process {owner.pid}" in " ".join(words)


def test_core_is_free_again_after_the_owner_closes(spawn, runtime_dir):
    owner = spawn(**owner_of(LAST))
    owner.expect("ready")
    busy_error(LAST)
    owner.send("close")
    owner.expect("closed")
    assert owner.proc.poll() is None  # released by close(), not by exiting
    assert (runtime_dir / f"cpu{LAST}.lock").read_text() == ""  # it no longer names itself
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.exclusive and rt.cores == (LAST,)
        assert cores.core_owners()[LAST].pid == os.getpid()


def test_core_can_be_taken_at_once_after_kill_9(spawn, runtime_dir):
    owner = spawn(**owner_of(LAST))
    owner.expect("ready")
    owner.proc.kill()
    assert owner.proc.wait(timeout=TIMEOUT) == -9
    stale = json.loads((runtime_dir / f"cpu{LAST}.lock").read_text())
    assert stale["pid"] == owner.pid  # the file still names the dead owner...
    assert LAST not in cores.core_owners()  # ...but the lock, not the file, decides
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.cores == (LAST,)


@needs_pair
def test_reservation_is_all_or_nothing(spawn):
    low, high = PAIR
    owner = spawn(**owner_of(high))
    owner.expect("ready")
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(visible_cores=f"{low}-{high}")
    assert info.value.code is StatusCode.EXEC_NC_BUSY and info.value.details["core"] == high
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(num_cores=len(CPUS))
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert f"core {high} is owned by process {owner.pid}" in info.value.message
    assert low not in cores.core_owners()  # the free core was let go both times
    assert spawn(**owner_of(low)).expect("ready") == [str(low)]


@needs_two
def test_num_cores_takes_free_cores_and_skips_owned_ones(spawn):
    owner = spawn(**owner_of(CPUS[0]))
    owner.expect("ready")
    with crossrt.Runtime(num_cores=1) as rt:
        assert rt.exclusive and rt.cores == (CPUS[1],)
    with crossrt.Runtime(num_cores=0) as rt:  # 0: every free core
        assert rt.cores == tuple(CPUS[1:])


@no_quota
def test_num_cores_fails_when_every_core_is_owned(spawn):
    owner = spawn(num_cores=0)
    assert owner.expect("ready") == [str(c) for c in CPUS]
    for kwargs in ({"num_cores": 1}, {"num_cores": 0}):
        with pytest.raises(OutOfResourcesError) as info:
            crossrt.Runtime(**kwargs)
        assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
        assert f"owned by process {owner.pid}" in info.value.message


# -- precedence --------------------------------------------------------------------------------


def test_environment_reserves(monkeypatch, spawn):
    monkeypatch.setenv("CROSSRT_NUM_CORES", "1")
    with crossrt.Runtime() as rt:
        assert rt.exclusive and rt.cores == (CPUS[0],)
        assert spawn(**owner_of(CPUS[0])).expect("error")[0] == "1005"


# -- within one process: shared, counted -------------------------------------------------------


def test_runtimes_of_one_process_share_its_cores(spawn):
    first = crossrt.Runtime(visible_cores=LAST)
    second = crossrt.Runtime(visible_cores=str(LAST))
    assert first.cores == second.cores == (LAST,)
    first.close()
    assert cores.core_owners()[LAST].pid == os.getpid()  # the second still holds it
    assert spawn(**owner_of(LAST)).expect("error")[0] == "1005"
    second.close()
    assert spawn(**owner_of(LAST)).expect("ready") == [str(LAST)]


FORKER = r"""
import json, os, sys
import crossrt
rt = crossrt.Runtime(**json.loads(sys.argv[1]))
child = os.fork()
if child == 0:
    os.write(1, f"child {os.getpid()}\n".encode())  # one write: two processes share the pipe
    sys.stdin.read()  # lives until the test closes the pipe, whatever becomes of the parent
    os._exit(0)
if sys.argv[2] == "close":
    rt.close()
os.write(1, f"parent {child}\n".encode())
sys.stdin.read()
"""


def test_closing_frees_the_cores_even_while_a_child_forked_just_before_lives(spawn):
    parent = spawn(FORKER, "close", **owner_of(LAST))
    while True:  # lines come in either order; try at once once the parent has closed
        head, child = parent.next_line()
        if head == "parent":
            break
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.cores == (LAST,)
    os.kill(int(child), 0)  # the forked child still lives


def test_a_forked_child_does_not_keep_the_cores_of_its_killed_parent(spawn):
    parent = spawn(FORKER, "keep", **owner_of(LAST))
    lines = dict(parent.next_line() for _ in range(2))
    busy_error(LAST)
    parent.proc.kill()
    parent.proc.wait(timeout=TIMEOUT)
    os.kill(int(lines["child"]), 0)  # the forked child lives on, with the lock file open...
    with crossrt.Runtime(visible_cores=LAST) as rt:  # ...yet the core is free
        assert rt.cores == (LAST,)


# -- crossrt ls --------------------------------------------------------------------------------


def _ls_json(capsys) -> dict[str, Any]:
    assert ls_tool.main(["--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_ls_escapes_control_characters_in_an_owners_command_line(capsys):
    # Any local user writes their own process's command line (an -X option Python ignores,
    # early enough to be shown): it reaches the terminal as text.
    mark = "\x1b[2J\x1b]0;owned\x07\u202e"
    owner = subprocess.Popen(
        [sys.executable, "-X", mark, "-c", OWNER, json.dumps(owner_of(LAST))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().startswith("ready")
        assert ls_tool.main([]) == 0
        text = capsys.readouterr().out
    finally:
        owner.kill()
        owner.wait(timeout=TIMEOUT)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    # the pid as a field of its own: as a substring it also matched an engine's version
    # ("1+openvino-2026.4.1-22982-...", with the owner's pid 22982)
    line = next(line for line in text.splitlines() if str(owner.pid) in line.split())
    assert "-X \\x1b[2J\\x1b]0;owned\\x07\\u202e -c" in line


def test_ls_shows_the_owner_of_each_core(spawn, capsys, runtime_dir):
    owner = spawn(**owner_of(LAST))
    owner.expect("ready")
    table = _ls_json(capsys)["cores"]
    assert table["device"] == "cpu:0" and table["runtime_dir"] == str(runtime_dir)
    rows = {row["host_cpu"]: row for row in table["host_cpus"]}
    assert set(rows) == set(CPUS) and all(row["usable"] for row in rows.values())
    assert rows[LAST]["owner"]["pid"] == owner.pid
    assert all(rows[c]["owner"] is None for c in CPUS if c != LAST)
    assert ls_tool.main([]) == 0
    text = capsys.readouterr().out
    line = next(
        line for line in text.splitlines() if line.split()[:2] == [str(LAST), str(owner.pid)]
    )
    assert "python" in line.lower()
    # From another process, as a user types it.
    listing = subprocess.run(
        [sys.executable, "-m", "crossrt", "ls", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    rows = {row["host_cpu"]: row for row in json.loads(listing.stdout)["cores"]["host_cpus"]}
    assert rows[LAST]["owner"]["pid"] == owner.pid
    owner.proc.kill()
    owner.proc.wait(timeout=TIMEOUT)
    rows = {row["host_cpu"]: row for row in _ls_json(capsys)["cores"]["host_cpus"]}
    assert rows[LAST]["owner"] is None
