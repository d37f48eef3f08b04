"""Cores: usable host CPUs, CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES, exclusive reservation.

Ownership across processes is tested with real processes (``sys.executable -c``) that report
on stdout; the test waits for their lines and for their exit, never for time to pass. Every
test has its own ``CROSSRT_RUNTIME_DIR``, so tests never see each other's locks or a user's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import itertools
import json
import logging
import os
import queue
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt import InvalidArgumentError, InvalidOptionError, OutOfResourcesError, StatusCode
from crossrt import host as hostinfo
from crossrt.config import settings
from crossrt.model import GraphBuilder
from crossrt.runtime.cores import reservation as cores
from crossrt.tools import ls as ls_tool

AFFINITY = sorted(os.sched_getaffinity(0))
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


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("CROSSRT_VISIBLE_CORES", raising=False)
    monkeypatch.delenv("CROSSRT_NUM_CORES", raising=False)
    return folder


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


# -- CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES syntax ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3", (3,)), ("3-6", (3, 4, 5, 6)), ("3,4,5", (3, 4, 5)), ("3-4,5", (3, 4, 5)), (" 2 ", (2,))],
    ids=["single", "range", "list", "range-and-core", "spaces"],
)
def test_visible_cores_syntax(text, expected):
    assert settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores == expected


@pytest.mark.parametrize("text", ["1,3", "0-1,3-4", "5,7"])
def test_non_contiguous_visible_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores
    message = info.value.message
    assert "contiguous range" in message and "is missing" in message
    first, last = text.replace("-", ",").split(",")[0], text.replace("-", ",").split(",")[-1]
    assert f"{first}-{last}" in message  # how to write it instead
    assert info.value.code is StatusCode.INVALID_OPTION


@pytest.mark.parametrize("text", ["a", "3-", "-1", "5-3", "3,,4", "1.5", "0x3", "3,3", "123456"])
def test_bad_visible_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores
    assert "CROSSRT_VISIBLE_CORES" in info.value.message


@pytest.mark.parametrize(("text", "expected"), [("2", 2), ("0", 0), (" 4 ", 4), ("", None)])
def test_num_cores_syntax(text, expected):
    assert settings({"CROSSRT_NUM_CORES": text}).num_cores == expected


@pytest.mark.parametrize("text", ["-1", "two", "1.5", "²", "1e3"])
def test_bad_num_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_NUM_CORES": text}).num_cores
    assert "CROSSRT_NUM_CORES" in info.value.message and "whole number" in info.value.message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"visible_cores": "1,3"},
        {"visible_cores": [0, 2]},
        {"visible_cores": []},
        {"visible_cores": -1},
        {"visible_cores": True},
        {"visible_cores": 1.0},
        {"visible_cores": "x"},
        {"num_cores": -1},
        {"num_cores": "2"},
        {"num_cores": True},
    ],
    ids=repr,
)
def test_bad_arguments_are_rejected_before_anything_is_reserved(kwargs, runtime_dir):
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.Runtime(**kwargs)
    assert info.value.code is StatusCode.INVALID
    assert next(iter(kwargs)) in info.value.message
    assert not runtime_dir.exists()


def test_non_contiguous_argument_says_how_to_write_it():
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.Runtime(visible_cores=[1, 3])
    assert "contiguous" in info.value.message and "1-3" in info.value.message


def test_runtime_dir_defaults(monkeypatch):
    named = settings({"CROSSRT_RUNTIME_DIR": "/srv/locks", "XDG_RUNTIME_DIR": "/run/user/7"})
    assert (named.runtime_dir, named.runtime_dir_is_default) == ("/srv/locks", False)
    xdg = settings({"XDG_RUNTIME_DIR": "/run/user/7"})
    assert (xdg.runtime_dir, xdg.runtime_dir_is_default) == ("/run/user/7/crossrt", True)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert settings({}).runtime_dir == "/run/crossrt"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert Path(settings({}).runtime_dir).name == "crossrt-1000"


# -- usable host CPUs: affinity and cgroups --------------------------------------------------


def test_cgroup_v2_cpuset_and_nested_quota(tmp_path):
    pod = tmp_path / "kube" / "pod"
    pod.mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "kube" / "cpu.max").write_text("400000 100000\n")
    (pod / "cpu.max").write_text("150000 100000\n")
    (pod / "cpuset.cpus.effective").write_text(f"{LAST}\n")
    cpuset, quota = hostinfo.cgroup_cpu_limits(tmp_path, "0::/kube/pod\n")
    assert cpuset == {LAST} and quota == 1.5
    host = hostinfo.host_cpus(tmp_path, "0::/kube/pod\n")
    assert host == hostinfo.HostCpus((LAST,), 1)


@pytest.mark.skipif(len(AFFINITY) < 2, reason="needs two CPUs in the affinity mask")
def test_cgroup_quota_bounds_the_usable_count(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    host = hostinfo.host_cpus(tmp_path, "0::/\n")
    assert host.cpus == tuple(AFFINITY) and host.limit == 1  # half a CPU rounds up to one


def test_cgroup_v1_quota_and_cpuset(tmp_path):
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    cpuset = tmp_path / "cpuset" / "docker" / "abc"
    cpu.mkdir(parents=True)
    cpuset.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("250000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpuset / "cpuset.effective_cpus").write_text("0-3,8\n")
    text = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n"
    assert hostinfo.cgroup_cpu_limits(tmp_path, text) == (frozenset({0, 1, 2, 3, 8}), 2.5)
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert hostinfo.cgroup_cpu_limits(tmp_path, text)[1] is None


def test_no_cgroup_limits(tmp_path):
    assert hostinfo.cgroup_cpu_limits(tmp_path, "0::/\n") == (None, None)
    assert hostinfo.host_cpus(tmp_path, "") == hostinfo.HostCpus(tuple(AFFINITY), len(AFFINITY))


def test_cpu_lists():
    assert hostinfo.parse_cpu_set("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert hostinfo.format_cpus([8, 0, 1, 2, 3, 10]) == "0-3,8,10"
    assert hostinfo.format_cpus([]) == "none"


# -- the default: shared, no locks -----------------------------------------------------------


def test_default_runtime_shares_every_usable_core(runtime_dir):
    host = hostinfo.host_cpus()
    with crossrt.Runtime() as rt:
        assert not rt.exclusive
        assert rt.cores == host.cpus[: host.limit]
    assert not runtime_dir.exists()  # nothing locked, nothing written


def test_default_processes_do_not_collide_with_each_other_or_owners(spawn):
    shared = HOST.cpus[: HOST.limit]
    first, second = spawn(), spawn()
    assert first.expect("ready") == second.expect("ready") == [str(c) for c in shared]
    owner = spawn(**owner_of(LAST))
    owner.expect("ready")
    with crossrt.Runtime() as rt:
        assert rt.cores == shared and not rt.exclusive


# -- exclusive ownership across processes ----------------------------------------------------


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


def test_a_pid_in_a_lock_file_without_the_lock_never_blocks(runtime_dir):
    runtime_dir.mkdir(mode=0o700)
    alive = {"pid": os.getppid(), "name": "x", "cmdline": "x", "started": None}
    (runtime_dir / f"cpu{LAST}.lock").write_text(json.dumps(alive))
    assert cores.core_owners() == {}
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


@no_quota
def test_more_cores_than_usable():
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(num_cores=len(CPUS) + 1)
    err = info.value
    assert err.code is StatusCode.LOAD_NOT_ENOUGH_NC and int(err.code) == 9
    assert f"asked for {len(CPUS) + 1} cores" in err.message
    assert err.details["requested"] == len(CPUS) + 1 and err.details["usable"] == CPUS
    outside = max(CPUS) + 1
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(visible_cores=outside)
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert f"host CPU {outside} is not usable by this process" in info.value.message


# -- precedence --------------------------------------------------------------------------------


def test_environment_reserves(monkeypatch, spawn):
    monkeypatch.setenv("CROSSRT_NUM_CORES", "1")
    with crossrt.Runtime() as rt:
        assert rt.exclusive and rt.cores == (CPUS[0],)
        assert spawn(**owner_of(CPUS[0])).expect("error")[0] == "1005"


def test_visible_cores_win_over_num_cores_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", str(LAST))
    monkeypatch.setenv("CROSSRT_NUM_CORES", str(len(CPUS)))
    with caplog.at_level(logging.WARNING, logger="crossrt"), crossrt.Runtime() as rt:
        assert rt.cores == (LAST,)
    assert "CROSSRT_VISIBLE_CORES and CROSSRT_NUM_CORES are both set" in caplog.text
    assert "take precedence" in caplog.text
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="crossrt"),
        crossrt.Runtime(visible_cores=LAST, num_cores=len(CPUS)) as rt,
    ):
        assert rt.cores == (LAST,)
    assert "visible_cores and num_cores are both set" in caplog.text


@needs_two
def test_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", str(LAST))
    with crossrt.Runtime(num_cores=1) as rt:
        assert rt.cores == (CPUS[0],)
    monkeypatch.delenv("CROSSRT_VISIBLE_CORES")
    monkeypatch.setenv("CROSSRT_NUM_CORES", "0")
    with crossrt.Runtime(visible_cores=[CPUS[0]]) as rt:
        assert rt.cores == (CPUS[0],)


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


def test_threads_reserve_at_once_and_share(runtime_dir):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runtimes = list(pool.map(lambda _: crossrt.Runtime(num_cores=1), range(16)))
    assert {rt.cores for rt in runtimes} == {(CPUS[0],)}
    for rt in runtimes:
        rt.close()
    assert cores.core_owners() == {}


def test_an_unclosed_runtime_gives_its_cores_back_when_collected():
    rt = crossrt.Runtime(visible_cores=LAST)
    assert LAST in cores.core_owners()
    del rt
    gc.collect()
    assert cores.core_owners() == {}


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


# -- core indices of a load --------------------------------------------------------------------


def test_load_core_indices_start_at_zero_within_the_reservation():
    b = GraphBuilder("add")
    x = b.input("x", "float32", [2])
    b.output(b.op("Add", [x, b.constant(np.ones(2, np.float32))], outputs=["y"]))
    exe = crossrt.compile(b.finish())
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.load(exe).cores == (0,)
        loaded = rt.load(exe, cores=[0])
        np.testing.assert_array_equal(loaded.run({"x": np.zeros(2, np.float32)})["y"], [1, 1])
        with pytest.raises(InvalidArgumentError) as bad:
            rt.load(exe, cores=[1])
        assert f"host CPUs {LAST}" in bad.value.message and "from 0 to 0" in bad.value.message
        with pytest.raises(OutOfResourcesError) as many:
            rt.load(exe, cores=2)
        assert many.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
        assert many.value.details == {"requested": 2, "available": 1}


# -- the runtime directory -------------------------------------------------------------------


def test_runtime_dir_is_created_private(tmp_path, monkeypatch):
    folder = tmp_path / "a" / "b"
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(folder))
    old = os.umask(0o022)
    try:
        with crossrt.Runtime(num_cores=1):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            written = json.loads((folder / f"cpu{CPUS[0]}.lock").read_text())
    finally:
        os.umask(old)
    assert written["pid"] == os.getpid() and written["host_cpu"] == CPUS[0]


def test_default_runtime_dir_under_xdg_and_unsafe_one_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CROSSRT_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    with crossrt.Runtime(num_cores=1):
        assert stat.S_IMODE((tmp_path / "xdg" / "crossrt").stat().st_mode) == 0o700
    (tmp_path / "xdg" / "crossrt").chmod(0o777)
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(num_cores=1)
    assert "writable by others" in info.value.message
    assert "CROSSRT_RUNTIME_DIR" in info.value.message


# -- crossrt ls ------------------------------------------------------------------------------


def _ls_json(capsys) -> dict[str, Any]:
    assert ls_tool.main(["--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


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
