"""Groups of real processes for the collectives tests: each rank ``mpiexec -n 1 python
ranks.py SCENARIO RANK SIZE ROOT``, meeting at a free loopback port. Every process is
waited for with a bound and killed if it outlives it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mpi4py", reason="the collectives extra (mpi4py, mpich) is not installed")

HERE = Path(__file__).resolve().parent
BOUND = 90  # seconds a group may take, all of it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SHM = Path("/dev/shm")


def mpich_segments() -> set[str]:
    """MPICH's shared-memory segments on this machine (``mpich_shm_*``)."""
    return {p.name for p in SHM.glob("mpich_shm_*")} if SHM.is_dir() else set()


def remove_orphaned(before: set[str]) -> None:
    """Unlink the MPICH segments made since ``before`` that no process maps any more: a rank
    that dies without MPI_Finalize (a test's crashed peer) leaves its segment behind."""
    mapped = ""
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped += maps.read_text()
        except OSError:
            continue  # gone, or not ours to read
    for name in mpich_segments() - before:
        if name not in mapped:
            (SHM / name).unlink(missing_ok=True)


def run_group(scenario: str, size: int = 2, *extra: str, env: dict | None = None) -> list[Any]:
    """Run ``scenario`` on ``size`` ranks; each rank's JSON line (None for a rank that printed
    none), in rank order."""
    from crossrt.collectives import mpiexec

    before = mpich_segments()
    root = f"127.0.0.1:{free_port()}"
    environ = {**os.environ, "PYTHONPATH": str(HERE), **(env or {})}
    command = [mpiexec(), "-n", "1", sys.executable, str(HERE / "ranks.py"), scenario]
    procs = [
        subprocess.Popen(
            [*command, str(rank), str(size), root, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
        )
        for rank in range(size)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=BOUND)
            line = next((ln for ln in out.splitlines() if ln.startswith("{")), None)
            results.append(json.loads(line) if line else {"stderr": err[-2000:]})
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        remove_orphaned(before)
    return results
