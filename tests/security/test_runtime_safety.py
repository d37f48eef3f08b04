"""Issue 13, the runtime's part: no thread left waiting, buffers checked before the engine,
allocation failures as errors, no leftovers (shared memory, core locks), host facts kept per
affinity mask, and terminals safe from names found in files."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
from concurrency_models import gate, tiny
from crossrt import GraphBuilder, StatusCode, host
from crossrt.host import host_cpus
from crossrt.runtime.cores import reservation
from crossrt.runtime.memory import shm

WAIT = 10  # seconds: the bound on every wait; reached only when something is broken
SRC = str(Path(crossrt.__file__).parents[1])


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a state other threads reach (no event marks it), failing after WAIT."""
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, f"never reached: {what}"
        time.sleep(0.002)


def _python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


# -- item 2: closing wakes every thread waiting in run() --------------------------------------


def _crowd(
    model: crossrt.LoadedModel, threads: int = 8
) -> tuple[dict[int, Any], list[threading.Thread], threading.Event]:
    """``threads`` callers of ``model.run`` on its one instance, held by a first run that
    goes on when the returned gate opens (a long run). Their outcomes go by caller number."""
    gated = gate(model)
    outcomes: dict[int, Any] = {}
    x = np.ones((4, 8), np.float32)

    def call(i: int) -> None:
        try:
            outcomes[i] = model.run({"x": x})
        except BaseException as exc:  # every outcome is checked below
            outcomes[i] = exc

    started = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(threads)]
    started[0].start()
    assert gated.started.wait(WAIT)  # the first holds the instance
    for t in started[1:]:
        t.start()
    scheduler = model._scheduler
    _until(
        lambda: len(scheduler.line.waiting) == threads - 1,
        "the other callers in line for the instance",
    )
    return outcomes, started, gated.gate


@pytest.mark.parametrize("how", ["unload", "close"])
def test_closing_wakes_every_thread_waiting_in_run(how: str) -> None:
    rt = crossrt.Runtime()
    model = rt.load(crossrt.compile(tiny()))
    assert len(model.instances) == 1
    outcomes, threads, long_run = _crowd(model)
    closer = threading.Thread(target=model.unload if how == "unload" else rt.close)
    closer.start()
    closer.join(WAIT)
    long_run.set()  # the run in progress ends
    for t in threads:
        t.join(WAIT)
    assert not closer.is_alive() and not any(t.is_alive() for t in threads)
    rt.close()
    # unload: INVALID_HANDLE, as every later call on the model; close: CLOSED, as every call
    # on the runtime. Never another error, and never an error that is not crossrt's.
    expected = crossrt.errors.InvalidHandleError if how == "unload" else crossrt.ClosedError
    errors = [o for o in outcomes.values() if isinstance(o, BaseException)]
    assert all(type(e) is expected for e in errors), errors
    assert len(errors) >= len(threads) - 1  # only the run holding the instance may finish
    code = StatusCode.INVALID_HANDLE if how == "unload" else StatusCode.CLOSED
    assert all(e.code is code for e in errors)


def test_unload_does_not_wait_behind_queued_requests() -> None:
    # The caller in line waits for the instance the gated run holds: closing must fail its
    # request at once instead of waiting for the instance (a worker in the same place used
    # to time out its join after 5 s and run the request on a closed program).
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(tiny()))
        outcomes, threads, long_run = _crowd(model, threads=2)
        done = threading.Event()

        def unload() -> None:
            model.unload()
            done.set()

        threading.Thread(target=unload, daemon=True).start()
        _until(lambda: 1 in outcomes, "the queued request failed while the run went on")
        assert isinstance(outcomes[1], crossrt.errors.InvalidHandleError)
        long_run.set()
        assert done.wait(WAIT)
        for t in threads:
            t.join(WAIT)


# -- item 4: a NumPy output buffer of the wrong size ------------------------------------------


def _dynamic() -> crossrt.Model:
    b = GraphBuilder("dyn")
    x = b.input("x", "float32", ["N", 8])
    b.output(b.op("Relu", [x], outputs=["y"]))
    return b.finish()


@pytest.mark.parametrize("device", ["cpu", "reference"])
@pytest.mark.parametrize("rows", [3, 5])
def test_wrong_size_numpy_output_for_a_dynamic_output_is_invalid(device: str, rows: int) -> None:
    driver = "reference" if device == "reference" else None
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(_dynamic(), "cpu", driver=driver))
        x = np.ones((4, 8), np.float32)
        for _ in range(2):  # the second call must not reuse a binding of the failed one
            with pytest.raises(crossrt.InvalidArgumentError) as info:
                model.run({"x": x}, outputs={"y": np.empty((rows, 8), np.float32)})
            assert info.value.code is StatusCode.INVALID
            assert "128 bytes" in info.value.message and "'y'" in info.value.message
            assert "onnxruntime" not in info.value.message.lower()
            assert info.value.details["needed"] == 128
        out = np.empty((4, 8), np.float32)
        assert model.run({"x": x}, outputs={"y": out})["y"] is out
        np.testing.assert_array_equal(out, 1)


def test_wrong_size_numpy_output_for_a_static_output_names_the_bytes() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(crossrt.compile(tiny()))
        with pytest.raises(crossrt.InvalidArgumentError) as info:
            model.run({"x": np.ones((4, 8), np.float32)}, outputs={"y": np.empty((3, 8))})
        assert info.value.code is StatusCode.INVALID
        assert "128 bytes" in info.value.message


# -- item 3: allocation failures are crossrt errors -------------------------------------------


_LIMITED = """
    import resource, re, sys
    import crossrt
    from crossrt import Tensor
    crossrt.Tensor((4,), device="sim:0").numpy()  # every driver and module loaded first
    vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    n = 700 << 20
    try:
        {make}
    except crossrt.CrossrtError as exc:
        print(type(exc).__name__, exc.code.name, exc.details.get("requested"), exc.message)
    except BaseException as exc:
        print("RAW", type(exc).__name__, exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
@pytest.mark.parametrize(
    ("make", "asked"),
    [
        ("Tensor.shared((2 * n,), 'uint8')", 1400 << 20),  # the segment's mapping
        ("Tensor((n,), 'uint8', device='sim:0').numpy()", 700 << 20),  # its host copy
    ],
)
def test_an_allocation_the_system_refuses_is_a_crossrt_error(make: str, asked: int) -> None:
    proc = _python(_LIMITED.replace("{make}", make))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.startswith(f"OutOfResourcesError FAIL_HOST_MEM_ALLOC {asked} "), out
    assert f"{asked} bytes of host memory" in out


# -- item 5: shared-memory segments of a dead process group -----------------------------------


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_named_segment_of_a_killed_process_group_is_removed_at_the_next_start() -> None:
    mine = crossrt.Tensor.shared((16,), "uint8", keep_name=True)  # a living owner's (it
    # also makes this process look for leftovers now, not during the test)
    child = _python(
        """
        import sys, crossrt
        from crossrt.runtime.memory import shm
        t = crossrt.Tensor.shared((16,), "uint8", keep_name=True)
        print(shm.segment_name(t), flush=True)
        sys.stdin.read()
        """,
        stdin=subprocess.PIPE,
        start_new_session=True,  # its own process group: the resource tracker dies with it
    )
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    os.killpg(child.pid, signal.SIGKILL)
    child.communicate(timeout=WAIT)
    leftover = Path("/dev/shm") / name
    try:
        assert name and leftover.exists()  # nothing ran at its death
        mine_name = shm.segment_name(mine)
        assert mine_name is not None and f"-{os.getpid()}-" in mine_name
        later = _python("import crossrt; crossrt.Runtime().close()")
        assert later.communicate(timeout=120)[0] == "" and later.returncode == 0
        assert not leftover.exists()
        assert (Path("/dev/shm") / mine_name).exists()
    finally:
        mine.free()
        if name.startswith("crossrt-"):
            leftover.unlink(missing_ok=True)  # never leave one behind, even failing


# -- item 5: core lock files in a group's runtime directory -----------------------------------


@pytest.fixture
def group_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime directory shared by a group: setgid, group-writable, reachable by others."""
    path = Path(tempfile.mkdtemp(prefix="crossrt-group-", dir="/tmp"))
    group = 4242 if os.geteuid() == 0 else os.getgid()
    if os.geteuid() == 0:
        os.chown(path, 0, group)
    os.chmod(path, 0o2770)
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(path))
    old = os.umask(0o022)
    try:
        yield path
    finally:
        os.umask(old)
        for f in path.iterdir():
            f.unlink()
        path.rmdir()


def test_core_lock_files_in_a_group_directory_are_group_writable(group_dir: Path) -> None:
    cpu = host_cpus().cpus[0]
    reserved = reservation.reserve_cores(visible_cores=cpu)
    try:
        lock = os.stat(group_dir / f"cpu{cpu}.lock")
        assert lock.st_mode & stat.S_IWGRP and lock.st_mode & stat.S_IRGRP
        assert not lock.st_mode & stat.S_IWOTH
        assert lock.st_gid == os.stat(group_dir).st_gid
    finally:
        reserved.release()


def _as_another_user(cpu: int) -> str:
    """Reserve ``cpu`` in a child running as another user of the directory's group (nobody,
    in group 4242); what it printed: the CPUs reserved, or the error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no threads of its own; it only reserves and exits
        code = 1
        try:
            os.close(r)
            os.setgroups([4242])
            os.setgid(4242)
            os.setuid(65534)
            reserved = reservation.reserve_cores(visible_cores=cpu)
            os.write(w, repr(reserved.host_cpus).encode())
            reserved.release()
            code = 0
        except BaseException as exc:
            os.write(w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as said:
        out = said.read()
    os.waitpid(pid, 0)
    return out


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a second user needs root to start")


@root_only
def test_another_user_of_the_group_takes_a_core_the_first_let_go(group_dir: Path) -> None:
    cpu = host_cpus().cpus[0]
    reservation.reserve_cores(visible_cores=cpu).release()
    assert _as_another_user(cpu) == f"({cpu},)"


@root_only
def test_a_lock_file_another_user_cannot_write_is_locked_read_only(group_dir: Path) -> None:
    cpu = host_cpus().cpus[0]
    lock = group_dir / f"cpu{cpu}.lock"
    lock.write_text('{"pid": 1, "name": "old", "cmdline": "", "started": null}')
    lock.chmod(0o644)  # as older versions made them: only their first user could write
    assert _as_another_user(cpu) == f"({cpu},)"


def test_a_lock_left_by_a_killed_process_is_taken_over(group_dir: Path) -> None:
    cpu = host_cpus().cpus[0]
    child = _python(
        f"""
        import sys
        from crossrt.runtime.cores import reservation
        reservation.reserve_cores(visible_cores={cpu})
        print("held", flush=True)
        sys.stdin.read()
        """,
        stdin=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    with pytest.raises(crossrt.OutOfResourcesError):
        reservation.reserve_cores(visible_cores=cpu)
    child.kill()
    child.communicate(timeout=WAIT)
    taken = reservation.reserve_cores(visible_cores=cpu)
    try:
        owner = json.loads((group_dir / f"cpu{cpu}.lock").read_text())
        assert owner["pid"] == os.getpid()
    finally:
        taken.release()


# -- item 7: host facts kept per affinity mask --------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here")
def test_host_cpus_follow_an_affinity_change() -> None:
    host.forget_host_facts()
    every = host_cpus()
    assert host_cpus() is every  # kept
    if len(every.cpus) < 2:
        pytest.skip("one CPU: no smaller mask to move to")
    seen: list[tuple[int, ...]] = []

    def pinned() -> None:
        os.sched_setaffinity(0, every.cpus[:1])  # this thread only
        seen.append(host_cpus().cpus)

    t = threading.Thread(target=pinned)
    t.start()
    t.join(WAIT)
    assert seen == [every.cpus[:1]]
    assert host_cpus() is every


# -- item 7: names from files never reach the terminal raw ----------------------------------


EVIL = "\x1b[31mred\x07"
EVIL_OUT = "out\x1b]0;title\x07\r\u202e"


@pytest.fixture(scope="module")
def evil_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = GraphBuilder("m\x1b[2Jodel")
    x = b.input(EVIL, "float32", [2, 3])
    b.output(b.op("Relu", [x], outputs=[EVIL_OUT], name="n\x1bode"))
    path = tmp_path_factory.mktemp("evil") / "evil.onnx"
    b.finish().save(path)
    return path


def _assert_safe(text: str) -> None:
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in text, repr(text)


@pytest.mark.parametrize("json_out", [False, True])
def test_inspect_escapes_control_characters(
    evil_model: Path, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    from crossrt.tools import inspect

    assert inspect.main([str(evil_model), *(["--json"] if json_out else [])]) == 0
    out, err = capsys.readouterr()
    _assert_safe(out + err)
    if not json_out:
        assert "\\x1b[31mred\\x07" in out


def test_compiled_inspect_run_and_cache_escape_control_characters(
    evil_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crossrt.tools import cache, compile, inspect, run

    crm = tmp_path / "evil.crm"
    cache_dir = tmp_path / "cache"
    argv = [str(evil_model), "-o", str(crm), "--cache-dir", str(cache_dir)]
    assert compile.main(argv) == 0
    assert inspect.main([str(crm)]) == 0
    assert run.main([str(evil_model), "-o", str(tmp_path / "out")]) == 0
    assert cache.main(["ls", "--cache-dir", str(cache_dir)]) == 0
    assert cache.main(["verify", "--cache-dir", str(cache_dir)]) == 0
    out, err = capsys.readouterr()
    _assert_safe(out + err)
    assert "\\x1b[31mred\\x07" in out + err


def test_errors_escape_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crossrt.tools import inspect

    assert inspect.main([str(tmp_path / "no\x1b[2Jfile.onnx")]) != 0
    _, err = capsys.readouterr()
    _assert_safe(err)
    assert "\\x1b[2J" in err
