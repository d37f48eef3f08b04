"""``Communicator``: a group of processes and the collectives among them, on NumPy arrays and
host-readable crossrt Tensors.

Every rank calls the same collectives in the same order (as with MPI, NCCL or Neuron's
collectives). A call waits at most the communicator's ``timeout``; a peer that exits breaks
the communicator at once on every rank (:class:`CollectiveError`), a call not answered in
time raises :class:`~crossrt.errors.DeadlineExceededError`. A broken communicator refuses
every later call: create a new one.
"""

from __future__ import annotations

import threading
import time
from enum import StrEnum
from typing import Any

import numpy as np

from ..errors import (
    ClosedError,
    CrossrtError,
    InvalidArgumentError,
    StatusCode,
    UnsupportedError,
)
from ..memory import Tensor
from . import mpi, subgroups
from .errors import CollectiveError
from .rendezvous import Watch

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective (or joining the group) waits for the peers by default."""


class ReduceOp(StrEnum):
    """How :meth:`Communicator.all_reduce` and :meth:`~Communicator.reduce_scatter` combine."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"


REDUCIBLE_DTYPES = frozenset(
    ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
)
"""Element types all-reduce and reduce-scatter combine (MPI's arithmetic types)."""


class Communicator:
    """A group of ``size`` processes; this one is ``rank``.

    Make one with :meth:`join` (processes that meet at rank 0's address), :meth:`from_env`
    (the processes of one ``mpiexec -n N`` job) or :meth:`solo` (a group of one, no MPI).
    """

    def __init__(self, comm: Any, rank: int, size: int, watch: Watch | None, timeout: float):
        self._comm = comm
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self._watch = watch
        self._lock = threading.Lock()  # one collective at a time: all ranks keep one order
        self._broken: str | None = None
        self._closed = False

    # -- making one ------------------------------------------------------------------------

    @classmethod
    def join(
        cls, rank: int, size: int, root: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> Communicator:
        """Rank ``rank`` of ``size`` processes meeting at ``root`` (``host:port``; rank 0
        listens there): each process calls it with its own rank, on this host or others.
        Each must be started by an MPI launcher (``mpiexec -n 1 python app.py``).

        Raises:
            InvalidArgumentError: a bad rank, size, address or timeout.
            DeadlineExceededError: the group was not complete within ``timeout`` seconds.
        """
        _check_rank(rank, size)
        _check_timeout(timeout)
        if size == 1:
            return cls.solo(timeout=timeout)
        comm, watch = mpi.join(rank, size, root, timeout)
        return cls(comm, rank, size, watch, timeout)

    @classmethod
    def from_env(cls, *, timeout: float = DEFAULT_TIMEOUT) -> Communicator:
        """The processes of the MPI job this one was launched in (``mpiexec -n N``), ranked
        as the launcher ranked them; a process started alone is a group of one."""
        _check_timeout(timeout)
        if mpi.launched_size() <= 1:
            return cls.solo(timeout=timeout)
        comm = mpi.world()
        return cls(comm, comm.Get_rank(), comm.Get_size(), None, timeout)

    @classmethod
    def solo(cls, *, timeout: float = DEFAULT_TIMEOUT) -> Communicator:
        """A group of one process: every collective is a copy; MPI is not needed."""
        return cls(None, 0, 1, None, timeout)

    # -- collectives -----------------------------------------------------------------------

    def all_reduce(
        self, data: Any, op: ReduceOp | str = "sum", *, out: Any = None, group: Any = None
    ) -> Any:
        """Every rank's ``data`` combined element-wise by ``op`` (sum, prod, max, min), on
        every rank: a new array, or written into ``out`` (an array or a Tensor). ``group``:
        only these ranks take part (each of them calls it with the same list)."""
        reduce = _op(op)
        send = _input(data, "all_reduce")
        _reducible(send, "all_reduce")
        recv = _output(out, send.shape, send.dtype, "all_reduce")
        if group is not None:
            recv[...] = subgroups.reduce(self._gather(group, send, "all_reduce"), reduce)
        elif self._comm is None:
            recv[...] = send
        else:
            MPI = mpi.load()
            source = MPI.IN_PLACE if np.shares_memory(send, recv) else send  # out=data
            self._run("all_reduce", lambda c: c.Iallreduce(source, recv, op=getattr(MPI, reduce)))
        return _deliver(recv, out)

    def all_gather(self, data: Any, *, axis: int = 0, out: Any = None, group: Any = None) -> Any:
        """Every rank's ``data`` (same shape and dtype on each) concatenated in rank order
        (``group``'s order) along ``axis``, on every rank (of ``group``)."""
        send = _input(data, "all_gather")
        if send.ndim == 0:
            send = send.reshape(1)
        if not -send.ndim <= axis < send.ndim:
            raise InvalidArgumentError(f"all_gather: axis {axis} of a {send.ndim}-d array")
        blocks = np.empty((self.size, *send.shape), send.dtype)
        if group is not None:
            blocks = np.stack(self._gather(group, send, "all_gather"))
        elif self._comm is None:
            blocks[0] = send
        else:
            self._run("all_gather", lambda c: c.Iallgather(_bytes(send), _bytes(blocks)))
        gathered = np.concatenate(list(blocks), axis=axis)
        if out is None:
            return gathered
        target = _output(out, gathered.shape, gathered.dtype, "all_gather")
        target[...] = gathered
        return _deliver(target, out)

    def reduce_scatter(
        self, data: Any, op: ReduceOp | str = "sum", *, out: Any = None, group: Any = None
    ) -> Any:
        """Every rank's ``data`` combined by ``op``, then split along axis 0 into ``size``
        (``len(group)``) equal blocks: rank ``r`` (the ``r``-th of ``group``) gets block
        ``r``."""
        reduce = _op(op)
        send = _input(data, "reduce_scatter")
        _reducible(send, "reduce_scatter")
        n = self.size if group is None else len(group)
        if send.ndim == 0 or send.shape[0] % max(n, 1):
            raise InvalidArgumentError(
                f"reduce_scatter: axis 0 of shape {list(send.shape)} does not split into "
                f"{n} equal blocks; pad it to a multiple of {n}"
            )
        shape = (send.shape[0] // n, *send.shape[1:])
        recv = _output(out, shape, send.dtype, "reduce_scatter")
        if group is not None:
            whole = subgroups.reduce(self._gather(group, send, "reduce_scatter"), reduce)
            recv[...] = np.split(whole, n)[list(group).index(self.rank)]
        elif self._comm is None:
            recv[...] = send
        else:
            MPI = mpi.load()
            self._run(
                "reduce_scatter",
                lambda c: c.Ireduce_scatter_block(send, recv, op=getattr(MPI, reduce)),
            )
        return _deliver(recv, out)

    def barrier(self) -> None:
        """Return once every rank has called it."""
        if self._comm is not None:
            self._run("barrier", lambda c: c.Ibarrier())
        else:
            self._usable("barrier")

    def send(self, data: Any, dest: int, *, tag: int = 0) -> None:
        """Send ``data`` to rank ``dest``, which receives it with :meth:`recv` (same tag,
        0..31999); returns once it has been received or buffered."""
        array = _input(data, "send")
        self._peer(dest, "send")
        _check_tag(tag, "send")
        self._run("send", lambda c: c.Isend(_bytes(array), dest=dest, tag=tag))

    def recv(self, out: Any, source: int, *, tag: int = 0) -> Any:
        """Receive what rank ``source`` sent (same tag) into ``out`` (an array or a Tensor
        of the sent size), and return ``out``."""
        if out is None:
            raise InvalidArgumentError("recv: give out=, an array or Tensor to receive into")
        self._peer(source, "recv")
        _check_tag(tag, "recv")
        recv = _output(out, None, None, "recv")
        MPI = mpi.load()
        status = MPI.Status()
        self._run("recv", lambda c: c.Irecv(_bytes(recv), source=source, tag=tag), status)
        got = status.Get_count(MPI.BYTE)
        if got != recv.nbytes:
            raise InvalidArgumentError(
                f"recv: rank {source} sent {got} bytes; out holds {recv.nbytes}: give out of "
                "the sent size"
            )
        return _deliver(recv, out)

    # -- state -----------------------------------------------------------------------------

    @property
    def broken(self) -> str | None:
        """Why the communicator can no longer be used, or ``None``."""
        return self._broken

    def close(self) -> None:
        """Leave the group (the peers see this as no failure); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._watch is not None:
                self._watch.close()
            if self._comm is not None and self._broken is None:
                self._comm.Free()  # a broken one may have operations pending: leave it

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"broken: {self._broken}" if self._broken else "ok"
        return f"Communicator(rank={self.rank}, size={self.size}, {state})"

    # -- internals -------------------------------------------------------------------------

    def _gather(self, group: Any, data: np.ndarray, what: str) -> list[np.ndarray]:
        """Every member's ``data``, in ``group``'s order."""
        ranks = subgroups.members(group, self.rank, self.size, what)
        if len(ranks) == 1:
            self._usable(what)
            return [data]
        arrays: list[np.ndarray] = []

        def start(c: Any) -> list[Any]:
            requests, received = subgroups.exchange(c, ranks, self.rank, data)
            arrays.extend(received)
            return requests

        self._run(what, start)
        return arrays

    def _usable(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"{what}: the communicator was closed; create a new one")
        if self._broken is not None:
            raise CollectiveError(
                f"{what}: the communicator is broken ({self._broken}); create a new one"
            )

    def _peer(self, rank: Any, what: str) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise InvalidArgumentError(f"{what}: rank {rank!r} is not in 0..{self.size - 1}")
        if rank == self.rank:
            raise InvalidArgumentError(f"{what}: rank {rank} is this process; give a peer")

    def _run(self, what: str, start: Any, status: Any = None) -> None:
        with self._lock:
            self._usable(what)
            try:
                request = start(self._comm)
                deadline = time.monotonic() + self.timeout
                mpi.wait(request, what, deadline, self._watch, status)
            except CrossrtError as exc:
                self._broken = exc.message
                raise
            except Exception as exc:
                local = mpi.local_error(exc)
                if local is not None:  # this rank's buffers: the group is fine
                    raise InvalidArgumentError(f"{what}: {local}") from None
                self._broken = f"MPI failed: {exc}"  # the group is in an unknown state
                raise CollectiveError(f"{what}: MPI failed: {exc}") from None


def _check_rank(rank: Any, size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InvalidArgumentError(f"size {size!r}: give the number of processes, >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise InvalidArgumentError(f"rank {rank!r}: give this process's rank in 0..{size - 1}")


def _check_tag(tag: Any, what: str) -> None:
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < subgroups.GROUP_TAG:
        raise InvalidArgumentError(f"{what}: tag {tag!r}: give 0..{subgroups.GROUP_TAG - 1}")


def _check_timeout(timeout: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidArgumentError(f"timeout {timeout!r}: give seconds > 0")


def _op(op: Any) -> str:
    try:
        return ReduceOp(op.value if isinstance(op, ReduceOp) else str(op).lower()).name
    except ValueError:
        raise InvalidArgumentError(
            f"reduction {op!r}: one of {', '.join(o.value for o in ReduceOp)}"
        ) from None


def _input(data: Any, what: str) -> np.ndarray:
    if isinstance(data, Tensor):
        return np.ascontiguousarray(data.numpy())
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise InvalidArgumentError(f"{what}: an array of Python objects cannot be sent")
        return np.ascontiguousarray(data)
    raise InvalidArgumentError(
        f"{what}: {type(data).__name__} is not a NumPy array or a crossrt Tensor"
    )


def _reducible(array: np.ndarray, what: str) -> None:
    if array.dtype.name not in REDUCIBLE_DTYPES:
        raise UnsupportedError(
            f"{what}: {array.dtype.name} elements cannot be reduced here (MPI has no "
            f"{array.dtype.name} arithmetic); cast to float32 and back",
            code=StatusCode.INVALID,
        )


def _output(out: Any, shape: Any, dtype: Any, what: str) -> np.ndarray:
    """Where results go: a new array, ``out`` itself, or a writable view of a host Tensor
    (a Tensor the host cannot address gets a staging array, written by :func:`_deliver`)."""
    if out is None:
        return np.empty(shape, dtype)
    if isinstance(out, Tensor):
        view = out.numpy()
        target = view if out.is_host else np.empty_like(view)
    elif isinstance(out, np.ndarray):
        target = out
    else:
        raise InvalidArgumentError(
            f"{what}: out is a {type(out).__name__}; give a NumPy array or a crossrt Tensor"
        )
    if not target.flags.c_contiguous or not target.flags.writeable:
        raise InvalidArgumentError(f"{what}: out must be a writable, C-contiguous array")
    if shape is not None and (target.shape != tuple(shape) or target.dtype != dtype):
        raise InvalidArgumentError(
            f"{what}: out is {target.dtype} {list(target.shape)}; the result is "
            f"{np.dtype(dtype)} {list(shape)}"
        )
    return target


def _deliver(result: np.ndarray, out: Any) -> Any:
    if isinstance(out, Tensor):
        if not out.is_host:
            out.write(result)
        return out
    return result if out is None else out


def _bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes, so any element type travels (MPI knows no float16 or bool)."""
    return array.reshape(-1).view(np.uint8)
