"""The openvino driver's worker process never outlives the process that started it: not after
a normal exit, not after SIGKILL, not while a forked child of that process (a prefork server,
a multiprocessing pool) still holds the write end of the worker's request pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import crossrt

pytest.importorskip("openvino")

pytestmark = pytest.mark.usefixtures("runtime_dir")

_SCRIPT = "crossrt/drivers/openvino/_worker.py"

# Compiles a one-node model with openvino (the worker starts), prints the worker's pid, then
# (with "fork") forks a child that keeps every inherited descriptor, and waits for the end of
# its input to exit.
_PARENT = """
import os, sys, time
import crossrt
from crossrt.model import GraphBuilder
b = GraphBuilder("relu")
b.output(b.op("Relu", [b.input("x", "float32", [1, 4])]), shape=[1, 4])
exe = crossrt.compile(b.finish(), "cpu", driver="openvino")
from crossrt.drivers import get_driver
worker = get_driver("openvino")._worker._process
print(worker.pid, flush=True)
if sys.argv[1] == "fork" and os.fork() == 0:
    sys.stdin.read()  # the forked child: holds the pipes until the test closes its stdin
    os._exit(0)
print("waiting", flush=True)
sys.stdin.read()  # until the test closes it (or kills this process)
sys.exit(0)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still the worker (not gone, not a zombie, not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return _SCRIPT.encode() in cmdline and state != "Z"


def _gone(pid: int, seconds: float = 20.0) -> bool:
    """Wait (bounded) for the worker to exit: polls /proc, as an unrelated process cannot
    wait on it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _start(how: str) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"the parent printed {line!r} (exit {parent.poll()})"
    worker = int(line)
    assert _alive(worker)
    return parent, worker


def test_a_normal_exit_leaves_no_worker() -> None:
    parent, worker = _start("exit")
    assert parent.stdout is not None and parent.stdin is not None
    assert parent.stdout.readline().strip() == "waiting"
    parent.stdin.close()
    assert parent.wait(60) == 0
    assert _gone(worker), f"worker {worker} outlived its parent"


@pytest.mark.parametrize("how", ["wait", "fork"])
def test_sigkill_of_the_parent_leaves_no_worker(how: str) -> None:
    parent, worker = _start(how)
    assert parent.stdout is not None
    assert parent.stdout.readline().strip() == "waiting"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(60)
    try:
        # With "fork", a child of the dead parent still holds the worker's request pipe: the
        # worker sees no end of its input and must notice its parent's death otherwise.
        assert _gone(worker), f"worker {worker} outlived its parent ({how})"
    finally:
        assert parent.stdin is not None
        parent.stdin.close()  # the forked child, if any, ends
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_the_worker_keeps_openvinos_telemetry_out() -> None:
    """OpenVINO's telemetry forked a child from a thread of the worker (to post to Google
    Analytics); a fork taken while the worker waited on stdin deadlocked and outlived the
    worker. With ``_no_telemetry()`` OpenVINO reads a model through its own stub."""
    script = str(Path(crossrt.__file__).parent / "drivers" / "openvino" / "_worker.py")
    code = (
        "import runpy, sys\n"
        f"worker = runpy.run_path({script!r})\n"
        "worker['_no_telemetry']()\n"
        "import openvino\n"
        "from crossrt.model import GraphBuilder\n"
        "b = GraphBuilder('relu')\n"
        "b.output(b.op('Relu', [b.input('x', 'float32', [1, 4])]), shape=[1, 4])\n"
        "openvino.Core().read_model(b.finish().proto.SerializeToString())\n"
        "print(sorted(m for m in sys.modules if 'telemetry' in m))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout.strip()
    assert "openvino.tools.ovc.telemetry_stub" in loaded, loaded
    assert "'openvino_telemetry.main'" not in loaded, loaded
