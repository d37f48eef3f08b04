"""The backend: MPI through mpi4py (the ``collectives`` extra installs mpi4py and MPICH's wheel,
``mpiexec`` included).

mpi4py is imported on first use, so ``import crossrt`` never starts MPI. A group of processes
is either one MPI job (``mpiexec -n N python app.py``: its world) or processes launched one by
one that meet at the root's address (:func:`join`), each an MPI job of its own
(``mpiexec -n 1 python app.py``): MPICH's port calls do not connect processes started without
a launcher (pmodels/mpich#7805), so :func:`join` refuses those, saying how to start them.

Every operation is started non-blocking and waited for by :func:`wait`, which gives up at a
deadline or when :class:`~crossrt.collectives.rendezvous.Watch` saw a peer exit, where MPI's
own wait would block forever.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import DeadlineExceededError, StatusCode, UnsupportedError
from .errors import CollectiveError
from .rendezvous import Watch, accept_ranks, connect_root, listen, parse_address

_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
"""What MPI launchers (MPICH's hydra, Open MPI) tell each process about its job."""


def load() -> ModuleType:
    """``mpi4py.MPI``, initialized (MPI_THREAD_MULTIPLE) on first call."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UnsupportedError(
            f"crossrt.collectives needs mpi4py and an MPI library ({exc}); install them with "
            "`pip install 'crossrt[collectives]'` (mpi4py and MPICH's wheel)",
            code=StatusCode.DRIVER_UNAVAILABLE,
        ) from None
    return MPI


def launched() -> bool:
    """Whether an MPI launcher (``mpiexec``) started this process."""
    return any(name in os.environ for name in (*_LAUNCHER_SIZE, "PMI_RANK", "PMI_FD"))


def launched_size() -> int:
    """The size of the MPI job this process was launched in (1 without a launcher)."""
    for name in _LAUNCHER_SIZE:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def mpiexec() -> str:
    """The ``mpiexec`` beside this interpreter (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UnsupportedError(
            "no mpiexec beside this Python or on PATH; install `crossrt[collectives]`",
            code=StatusCode.DRIVER_UNAVAILABLE,
        )
    return found


def _found_mpiexec() -> str:
    try:
        return mpiexec()
    except UnsupportedError:
        return "no mpiexec found: install `crossrt[collectives]`"


def world() -> Any:
    """A duplicate of the launched job's world communicator."""
    return load().COMM_WORLD.Dup()


def join(rank: int, size: int, root: str, timeout: float) -> tuple[Any, Watch]:
    """Rank ``rank`` of ``size`` processes meeting at ``root`` (``host:port``, where rank 0
    listens): an MPI communicator of the group, ranks in the order asked, and the watch
    that sees a peer exit. Bounded by ``timeout`` seconds while peers are awaited."""
    host, port = parse_address(root)
    if launched_size() > 1:
        raise UnsupportedError(
            f"this process is one of {launched_size()} of an mpiexec job: use "
            "Communicator.from_env() (the job's world), or start each rank with `mpiexec -n 1`",
            code=StatusCode.INVALID,
        )
    if not launched():  # checked before MPI starts in this process
        raise UnsupportedError(
            "MPI cannot connect processes started without a launcher (MPICH singletons, "
            "pmodels/mpich#7805): start each rank as `mpiexec -n 1 python ...` "
            f"({_found_mpiexec()}), or all of them as one job with `mpiexec -n {size}` and "
            "Communicator.from_env()",
            code=StatusCode.INVALID,
        )
    # MPI's own connect waits this long (MPICH's default: 180 s); read when MPI starts, so
    # the first communicator's timeout sets it for the process. MPI_Comm_accept has no bound:
    # a rank dying between taking the port name and connecting leaves rank 0 waiting there.
    os.environ.setdefault(_CONNECT_TIMEOUT, str(max(1, math.ceil(timeout))))
    MPI = load()
    try:
        return _meet(MPI, rank, size, host, port, time.monotonic() + timeout)
    except MPI.Exception as exc:
        raise CollectiveError(
            f"rank {rank} of {size}: MPI could not connect the group at {root} ({exc}); "
            "check that every rank runs and reaches that address"
        ) from None


_CONNECT_TIMEOUT = "MPIR_CVAR_CH4_COMM_CONNECT_TIMEOUT"


def _meet(
    MPI: Any, rank: int, size: int, host: str, port: int, deadline: float
) -> tuple[Any, Watch]:
    if rank == 0:
        port_name = MPI.Open_port()
        try:
            peers = accept_ranks(listen(host, port), size, deadline)
            comm = MPI.COMM_SELF
            for order, (_, sock) in enumerate(peers, start=1):
                sock.sendall(f"{order} {port_name}\n".encode())
                comm = _grow(comm, comm.Accept(port_name, root=0), high=False)
        finally:
            MPI.Close_port(port_name)
        watch = Watch(0, dict(peers))
    else:
        sock, order, port_name = connect_root(host, port, rank, size, deadline)
        comm = _grow(MPI.COMM_SELF, MPI.COMM_SELF.Connect(port_name, root=0), high=True)
        for _ in range(order + 1, size):
            comm = _grow(comm, comm.Accept(port_name, root=0), high=False)
        watch = Watch(rank, {0: sock})
    ordered = comm.Split(0, rank)
    comm.Free()
    return ordered, watch


def _grow(comm: Any, inter: Any, high: bool) -> Any:
    """The intracommunicator of ``comm`` and the process ``inter`` reached."""
    merged = inter.Merge(high=high)
    inter.Free()
    if comm is not load().COMM_SELF:
        comm.Free()
    return merged


class _All:
    """Requests tested as one."""

    def __init__(self, test: Any) -> None:
        self.Test = test


def local_error(exc: BaseException) -> str | None:
    """What to fix when ``exc`` is an MPI error of this rank's buffers alone (the group is
    unaffected): a receive buffer too small, or overlapping buffers; else None."""
    MPI = sys.modules.get("mpi4py.MPI")  # an MPI error needs MPI started: never start it here
    if MPI is None or not isinstance(exc, MPI.Exception):
        return None
    if exc.Get_error_class() == MPI.ERR_TRUNCATE:
        return "the peer sent more bytes than out holds; give out of the sent size"
    if exc.Get_error_class() == MPI.ERR_BUFFER:
        return "out overlaps the data sent; give an out of its own"
    return None


def wait(request: Any, what: str, deadline: float, watch: Watch | None, status: Any = None) -> None:
    """Wait for the MPI ``request`` (or a list of them) while polling it (MPI progresses only
    when called), up to ``deadline``; a peer that exited or the deadline raise. ``status`` (one
    request) is filled when it completes."""
    if isinstance(request, list):
        requests, test_all = request, load().Request.Testall
        request = _All(lambda _: test_all(requests))
    spins = 0
    while not request.Test(status):
        spins += 1
        if spins % 64:
            continue
        if watch is not None and watch.failure is not None:
            raise CollectiveError(
                f"{what}: {watch.failure}; the communicator is broken: create a new one "
                "(every rank), or end the process"
            )
        if time.monotonic() > deadline:
            raise DeadlineExceededError(
                f"{what} did not complete in its timeout: a peer has not called it, or is "
                "stuck; the communicator is broken. Check that every rank calls the same "
                "collectives in the same order, or give a longer timeout",
                details={"operation": what},
            )
        os.sched_yield()  # ranks may share cores: let the peer run
