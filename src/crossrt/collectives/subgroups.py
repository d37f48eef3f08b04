"""Collectives among some ranks of a communicator (Neuron's replica groups), over messages
between the members: MPI's way to a sub-communicator (``MPI_Comm_create_group``) blocks
with no bound when a member is gone, messages are waited for like every other call.

Each member sends its data to every other member and combines what it received in the
group's order, so every member computes the same result, bit for bit. That is n - 1 messages
per member: meant for the small groups of tensor parallelism, not for large worlds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

GROUP_TAG = 32000
"""The message tag of group collectives; user tags are below it (MPI allows at least 32767)."""

_REDUCE = {
    "SUM": np.add.reduce,
    "PROD": np.multiply.reduce,
    "MAX": np.maximum.reduce,
    "MIN": np.minimum.reduce,
}


def members(group: Any, rank: int, size: int, what: str) -> list[int]:
    """``group`` checked: distinct ranks of ``0..size-1``, this ``rank`` among them."""
    try:
        given = list(group)
    except TypeError:
        given = [None]
    if isinstance(group, str | bytes) or not all(
        isinstance(r, int | np.integer) and not isinstance(r, bool) for r in given
    ):
        raise InvalidArgumentError(f"{what}: group {group!r} is not a list of ranks")
    ranks = [int(r) for r in given]
    if len(set(ranks)) != len(ranks) or not all(0 <= r < size for r in ranks):
        raise InvalidArgumentError(
            f"{what}: group {ranks} must list distinct ranks of 0..{size - 1}"
        )
    if rank not in ranks:
        raise InvalidArgumentError(
            f"{what}: this process (rank {rank}) is not in group {ranks}; only members call it"
        )
    return ranks


def exchange(
    comm: Any, ranks: Sequence[int], rank: int, data: np.ndarray
) -> tuple[list[Any], list[np.ndarray]]:
    """Start sending ``data`` to every other member and receiving theirs: ``(requests,
    arrays in group order)``, the arrays filled once the requests complete."""
    requests: list[Any] = []
    arrays: list[np.ndarray] = []
    raw = data.reshape(-1).view(np.uint8)
    for peer in ranks:
        if peer == rank:
            arrays.append(data)
            continue
        into = np.empty_like(data)
        requests.append(comm.Irecv(into.reshape(-1).view(np.uint8), source=peer, tag=GROUP_TAG))
        requests.append(comm.Isend(raw, dest=peer, tag=GROUP_TAG))
        arrays.append(into)
    return requests, arrays


def reduce(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The members' arrays combined by ``op`` (a :class:`ReduceOp` name), in group order."""
    stack = np.stack(arrays)
    result: np.ndarray = _REDUCE[op](stack, axis=0, dtype=stack.dtype)
    return result
