"""The Unix socket's relay copies gRPC's bytes in a process of its own (``server/pump.py``),
not in the daemon's threads, where each copy waited for the GIL; and when that process dies,
its connections are cut and the daemon copies the next ones itself."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from serving import Daemon, make_repository, start_daemon
from test_connections import eventually
from tritonclient.utils import InferenceServerException

CONNECTIONS = 8


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path, make_repository(tmp_path / "models"))
    yield d
    assert d.stop() == 0, "".join(d.log)


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def pump_processes(pid: int) -> list[int]:
    """The daemon's children running the pump module."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError):
            continue
        if ppid == pid and b"pump.py" in command:
            found.append(int(entry))
    return found


def infer(client: tc.InferenceServerClient) -> np.ndarray:
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_data_from_numpy(np.ones((4, 8), np.float32))
    answer = client.infer("tiny", [x]).as_numpy("y")
    assert answer is not None and answer.shape == (4, 8)
    return answer


def test_relayed_grpc_connections_are_copied_outside_the_daemon(daemon: Daemon) -> None:
    want = infer(daemon.client())  # the first connection: threads of gRPC's pool now started
    before = threads(daemon.proc.pid)
    # A connection each (gRPC shares one between channels to one address by default).
    own = [("grpc.use_local_subchannel_pool", 1)]
    clients = [tc.InferenceServerClient(daemon.url, channel_args=own) for _ in range(CONNECTIONS)]
    try:
        for c in clients:
            np.testing.assert_array_equal(infer(c), want)
        # On the daemon's threads, each open connection held two copying threads (+16).
        grown = threads(daemon.proc.pid) - before
        assert grown < CONNECTIONS, f"{grown} threads more in the daemon for {CONNECTIONS}"
        assert len(pump_processes(daemon.proc.pid)) == 1
    finally:
        for c in clients:
            c.close()


def test_a_dead_pump_process_cuts_its_connections_and_the_daemon_copies(daemon: Daemon) -> None:
    client = daemon.client()
    want = infer(client)
    (pump,) = pump_processes(daemon.proc.pid)
    os.kill(pump, signal.SIGKILL)
    assert eventually(lambda: any("pump process ended" in line for line in daemon.log))

    def served_again() -> bool:
        try:
            return bool(np.array_equal(infer(client), want))  # gRPC reconnects
        except InferenceServerException:
            return False

    assert eventually(served_again), "".join(daemon.log)
    fresh = daemon.client()
    np.testing.assert_array_equal(infer(fresh), want)
    fresh.close()
    client.close()
    assert daemon.proc.poll() is None


def test_the_pump_process_ignores_the_daemons_signals(daemon: Daemon) -> None:
    """Ctrl-C or SIGTERM to the daemon's process group reaches the pump process too; the
    daemon drains on them, and the answers it drains still need copying."""
    client = daemon.client()
    want = infer(client)
    (pump,) = pump_processes(daemon.proc.pid)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(pump, signum)
    np.testing.assert_array_equal(infer(client), want)  # the same connection, still copied
    assert pump_processes(daemon.proc.pid) == [pump]
    client.close()
