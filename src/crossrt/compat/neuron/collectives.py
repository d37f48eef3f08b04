"""Neuron's global communicator over :mod:`crossrt.collectives` (MPI): ``nrt_build_global_comm``,
``nrt_cc_global_comm_init``, ``nrt_barrier``, ``nrt_all_gather``.

The process's rank in the global group is ``g_device_id`` of ``g_device_count``; the ranks meet
at ``NEURON_RT_ROOT_COMM_ID`` (``ip:port``, where rank 0 listens), or are the processes of one
``mpiexec -n g_device_count`` job. ``nrt_build_global_comm`` and ``nrt_cc_global_comm_init``
(two generations of one setup, as in libnrt) make the process's one global communicator;
``nrt_barrier`` and ``nrt_all_gather`` make it too when none exists, as
``nrt_load_collectives`` does in libnrt. ``cc.py`` runs ``nrta_cc_*`` over it.

A peer that exits, or a collective not answered within ``NEURON_RT_EXEC_TIMEOUT``, is
``NRT_EXEC_HW_ERR_COLLECTIVES`` / ``NRT_TIMEOUT`` (in the error tracker for a scheduled one),
and the communicator stays broken: every later collective returns the same until the
process builds a new one after ``nrt_close``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ...collectives import Communicator, launched_size
from .env import load_settings
from .state import _state
from .status import NRT_STATUS, NrtError, guarded

__all__ = [
    "global_communicator",
    "nrt_all_gather",
    "nrt_barrier",
    "nrt_build_global_comm",
    "nrt_cc_global_comm_init",
]


_lock = threading.Lock()


class _Global:
    """The process's one global communicator, and its ``(g_device_id, g_device_count)``."""

    comm: Communicator | None = None
    id: tuple[int, int] = (0, 0)


_global = _Global()


def global_communicator() -> Communicator | None:
    """The global communicator ``nrt_build_global_comm`` made (for code mixing both APIs)."""
    return _global.comm


def global_id() -> tuple[int, int]:
    """``(g_device_id, g_device_count)`` of the global communicator ((0, 0): none)."""
    return _global.id if _global.comm is not None else (0, 0)


def _count(value: Any, what: str, bound: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give a whole number >= 0")
    if bound is not None and value >= bound:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value} is not below {bound}")
    return value


def _build(vnc: Any, g_device_id: Any, g_device_count: Any) -> Communicator:
    """The global communicator of rank ``g_device_id`` of ``g_device_count``: the one built
    already, or a new one."""
    _state.require_nc(vnc)
    count = _count(g_device_count, "g_device_count")
    if count < 1:
        raise NrtError(NRT_STATUS.NRT_INVALID, "g_device_count 0: give the world size, >= 1")
    rank = _count(g_device_id, "g_device_id", count)
    with _lock:
        existing = _global.comm
        if existing is not None:
            if _global.id != (rank, count):
                raise NrtError(
                    NRT_STATUS.NRT_INVALID,
                    f"the global communicator is rank {_global.id[0]} of {_global.id[1]}, "
                    f"not {rank} of {count}",
                )
            return existing
        timeout = load_settings().exec_timeout
        if count == 1:
            comm = Communicator.solo(timeout=timeout)
        elif launched_size() == count:
            comm = Communicator.from_env(timeout=timeout)
            if comm.rank != rank:
                comm.close()
                raise NrtError(
                    NRT_STATUS.NRT_INVALID,
                    f"mpiexec made this process rank {comm.rank}; g_device_id is {rank}",
                )
        else:
            root = os.environ.get("NEURON_RT_ROOT_COMM_ID", "").strip()
            if not root:
                raise NrtError(
                    NRT_STATUS.NRT_INVALID,
                    f"{count} ranks need NEURON_RT_ROOT_COMM_ID=ip:port (where rank 0 "
                    "listens), the same in every rank's environment",
                )
            comm = Communicator.join(rank, count, root, timeout=timeout)
        _global.comm, _global.id = comm, (rank, count)
        return comm


def ranks_are_processes(count: int) -> bool:
    """Whether the ranks of a group of ``count`` are processes (``NEURON_RT_ROOT_COMM_ID``
    set, or this process one of an ``mpiexec -n count`` job) rather than cores of this one."""
    return bool(os.environ.get("NEURON_RT_ROOT_COMM_ID", "").strip()) or launched_size() == count


build_global = _build
"""The global communicator for ``nrt_load_collectives``: the one built, or a new one."""


def _close() -> None:
    with _lock:
        comm, _global.comm = _global.comm, None
    if comm is not None:
        comm.close()


@guarded()
def nrt_build_global_comm(vnc: int, g_device_id: int, g_device_count: int) -> NRT_STATUS:
    """Join the global group as rank ``g_device_id`` of ``g_device_count`` (after
    ``nrt_init``); waits for every rank, up to ``NEURON_RT_EXEC_TIMEOUT``."""
    _build(vnc, g_device_id, g_device_count)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_cc_global_comm_init(vnc: int, g_device_id: int, g_device_count: int) -> NRT_STATUS:
    """The global communicator for host-driven collectives: :func:`nrt_build_global_comm`."""
    _build(vnc, g_device_id, g_device_count)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_barrier(vnc: int, g_device_id: int, g_device_count: int) -> NRT_STATUS:
    """Return once every rank of the global group has called it."""
    _build(vnc, g_device_id, g_device_count).barrier()
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_all_gather(
    vnc: int,
    g_device_id: int,
    g_device_count: int,
    rank_input_size: int,
    input: Any,
    output: Any,
) -> NRT_STATUS:
    """Gather ``rank_input_size`` bytes of ``input`` from every rank into ``output``
    (writable, ``g_device_count * rank_input_size`` bytes or more), in rank order."""
    comm = _build(vnc, g_device_id, g_device_count)
    size = _count(rank_input_size, "rank_input_size")
    source, target = _bytes(input, "input", size), _bytes(output, "output", size * comm.size)
    if target.readonly:
        raise NrtError(NRT_STATUS.NRT_INVALID, "output is read-only")
    gathered = comm.all_gather(np.frombuffer(source, np.uint8, size))
    np.frombuffer(target, np.uint8, size * comm.size)[:] = gathered
    return NRT_STATUS.NRT_SUCCESS


def _bytes(buf: Any, what: str, size: int) -> memoryview:
    try:
        view = memoryview(buf).cast("B")
    except (TypeError, ValueError):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} is not a contiguous buffer") from None
    if view.nbytes < size:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} holds {view.nbytes} bytes; {size} needed")
    return view


_state.on_close.append(_close)
