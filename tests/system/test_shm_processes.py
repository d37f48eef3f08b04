"""Shared-memory tensors across processes: another process maps a segment through its fd, and
a named segment is removed when the process that made it exits or crashes. The tensors
themselves (fd, offset, size, permissions, names) are tested in tests/unit/test_shm.py."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import crossrt

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs Linux /dev/shm")
TIMEOUT = 60


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _child(code: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def _wait_exit(pid: int) -> None:
    """Wait, bounded, for a process that is not our child to end (a pidfd becomes readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], TIMEOUT)
        assert ready, f"process {pid} did not end within {TIMEOUT} s"
    finally:
        os.close(fd)


def test_another_process_maps_the_segment_through_its_fd() -> None:
    t = crossrt.shared_tensor((4,), "int32")
    t.numpy()[:] = [1, 2, 3, 4]
    child = _child(
        f"""
        from crossrt.runtime.memory.tensor import tensor_from_fd
        v = tensor_from_fd({t.fd}, 16, dtype="int32", shape=(4,))
        print(v.numpy().tolist(), flush=True)
        v.numpy()[:] *= 10
        """,
        pass_fds=(t.fd,),
    )
    out, err = child.communicate(timeout=TIMEOUT)
    assert child.returncode == 0, err
    assert out.strip() == "[1, 2, 3, 4]"
    assert t.numpy().tolist() == [10, 20, 30, 40]


def test_named_segment_is_unlinked_when_its_process_exits_normally() -> None:
    child = _child(
        """
        import crossrt
        from crossrt.runtime.memory.shm import segment_name
        t = crossrt.shared_tensor((64,), "uint8", keep_name=True)
        print(segment_name(t), flush=True)
        """
    )
    out, err = child.communicate(timeout=TIMEOUT)
    assert child.returncode == 0, err
    assert out.strip() and out.strip() not in _shm_names()


@pytest.mark.parametrize("how", ["SIGKILL", "os._exit"])
def test_named_segment_is_cleaned_up_after_its_process_crashes(how: str) -> None:
    crash = "os.kill(os.getpid(), signal.SIGKILL)" if how == "SIGKILL" else "os._exit(3)"
    child = _child(
        f"""
        import os, signal, sys
        from multiprocessing import resource_tracker
        import crossrt
        from crossrt.runtime.memory.shm import segment_name
        t = crossrt.shared_tensor((4096,), "uint8", keep_name=True)
        print(segment_name(t), resource_tracker._resource_tracker._pid, flush=True)
        sys.stdin.readline()  # until the parent has seen the segment
        {crash}
        """
    )
    assert child.stdout is not None and child.stdin is not None
    name, tracker = child.stdout.readline().split()
    assert name in _shm_names()
    child.stdin.write("go\n")
    child.stdin.flush()
    returncode = child.wait(timeout=TIMEOUT)
    assert returncode == (-signal.SIGKILL if how == "SIGKILL" else 3)
    _wait_exit(int(tracker))  # the tracker unlinks what a dead process leaked, then ends
    assert name not in _shm_names()
    child.communicate(timeout=TIMEOUT)


def test_memfd_segment_of_a_crashed_process_leaves_no_name_behind() -> None:
    child = _child(
        """
        import os, signal, sys
        import crossrt
        from crossrt.runtime.memory.shm import segment_name
        t = crossrt.shared_tensor((4096,), "uint8")
        print(segment_name(t), t.fd, flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert child.stdout is not None and child.stdin is not None
    label, fd = child.stdout.readline().split()
    assert Path(f"/proc/{child.pid}/fd/{fd}").readlink().name.startswith(f"memfd:{label}")
    assert not any(label in n for n in _shm_names())
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert not any(label in n for n in _shm_names())
    child.communicate(timeout=TIMEOUT)
