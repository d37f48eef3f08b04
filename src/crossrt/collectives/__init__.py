"""Collectives across processes and hosts: a :class:`Communicator` with all-reduce,
all-gather, reduce-scatter, barrier, send and recv on NumPy arrays and crossrt Tensors,
over MPI (mpi4py; the ``collectives`` extra). docs/collectives.md says how to start the
ranks and what each call does; ``crossrt.compat.neuron`` gives Neuron's collective API over it.

::

    from crossrt.collectives import Communicator

    with Communicator.join(rank, 2, "127.0.0.1:29500") as comm:
        total = comm.all_reduce(partial)           # sum over the ranks, on every rank
"""

from .communicator import DEFAULT_TIMEOUT, REDUCIBLE_DTYPES, Communicator, ReduceOp
from .errors import CollectiveError
from .mpi import launched_size, mpiexec

__all__ = [
    "DEFAULT_TIMEOUT",
    "REDUCIBLE_DTYPES",
    "CollectiveError",
    "Communicator",
    "ReduceOp",
    "launched_size",
    "mpiexec",
]
