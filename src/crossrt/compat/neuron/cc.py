"""``nrta_cc_prepare`` / ``nrta_cc_schedule``: host-driven collectives on the COLLECTIVES
execution unit, over the global communicator (``collectives.py``).

``nrta_cc_prepare`` checks everything a collective needs (the global communicator, the replica
group, live tensors, sizes, element type, reduction) and returns a context;
``nrta_cc_schedule`` queues it on the COLLECTIVES unit of ``comm.vnc``, completed and tracked
like every ``nrta_*`` request (its failure goes to the error tracker), and frees the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from ...collectives import REDUCIBLE_DTYPES, Communicator
from ...dtypes import from_name
from ...memory import Tensor
from .collectives import global_communicator, global_id
from .execution_units import NRTA_XU_COLLECTIVES, Request
from .nrta import _explicit, _schedule
from .state import _state
from .status import NRT_STATUS, NrtError, guarded
from .types import nrt_dtype_t

__all__ = [
    "NRT_CC_ALLGATHER",
    "NRT_CC_ALLREDUCE",
    "NRT_CC_REDUCESCATTER",
    "NRT_OP_ADD",
    "NRT_OP_FMA",
    "NRT_OP_INVALID",
    "NRT_OP_MAX",
    "NRT_OP_MIN",
    "nrt_cc_comm_t",
    "nrt_cc_context_t",
    "nrt_cc_op_type_t",
    "nrt_op_type_t",
    "nrt_tensor_list_t",
    "nrta_cc_prepare",
    "nrta_cc_schedule",
]


class nrt_op_type_t(IntEnum):
    """The reduction of an all-reduce or reduce-scatter."""

    NRT_OP_ADD = 0
    NRT_OP_FMA = 1
    NRT_OP_MAX = 2
    NRT_OP_MIN = 3
    NRT_OP_INVALID = 0xF


NRT_OP_ADD = nrt_op_type_t.NRT_OP_ADD
NRT_OP_FMA = nrt_op_type_t.NRT_OP_FMA
NRT_OP_MAX = nrt_op_type_t.NRT_OP_MAX
NRT_OP_MIN = nrt_op_type_t.NRT_OP_MIN
NRT_OP_INVALID = nrt_op_type_t.NRT_OP_INVALID

_REDUCTIONS = {NRT_OP_ADD: "sum", NRT_OP_MAX: "max", NRT_OP_MIN: "min"}


class nrt_cc_op_type_t(IntEnum):
    """The collective ``nrta_cc_prepare`` sets up."""

    NRT_CC_ALLGATHER = 0
    NRT_CC_ALLREDUCE = 1
    NRT_CC_REDUCESCATTER = 2


NRT_CC_ALLGATHER = nrt_cc_op_type_t.NRT_CC_ALLGATHER
NRT_CC_ALLREDUCE = nrt_cc_op_type_t.NRT_CC_ALLREDUCE
NRT_CC_REDUCESCATTER = nrt_cc_op_type_t.NRT_CC_REDUCESCATTER


@dataclass
class nrt_cc_comm_t:
    """The replica group a host-driven collective runs over (filled in by the caller).

    ``replica_group`` lists the global ranks taking part (None: all of them, in order);
    ``rank`` is this process's place in it, ``rank_n`` its length; ``ctx_device_id`` /
    ``ctx_device_count`` are the global rank and world of ``nrt_cc_global_comm_init``;
    ``vnc`` the NeuronCore whose COLLECTIVES unit runs it."""

    replica_group: list[int] | None = None
    rank: int = 0
    rank_n: int = 1
    ctx_device_id: int = 0
    ctx_device_count: int = 1
    vnc: int = 0


@dataclass
class nrt_tensor_list_t:
    """Tensors of a collective: ``tensors[i]`` of input list pairs with ``tensors[i]`` of
    the output list."""

    tensors: list[Tensor] = field(default_factory=list)
    num_tensors: int = 0


@dataclass(eq=False)
class nrt_cc_context_t:
    """A prepared collective; ``nrta_cc_schedule`` runs it once, then it is freed."""

    comm: Communicator
    vnc: int
    cc_op: nrt_cc_op_type_t
    reduction: str
    dtype: np.dtype[Any]
    pairs: list[tuple[Tensor, Tensor]]
    group: list[int] | None = None
    """The replica group's global ranks; None: the whole global group."""
    used: bool = False


@guarded("pair")
def nrta_cc_prepare(
    comm: nrt_cc_comm_t,
    input: nrt_tensor_list_t,
    output: nrt_tensor_list_t,
    dtype: int,
    op: int,
    cc_op: int,
) -> tuple[NRT_STATUS, nrt_cc_context_t | None]:
    """Check a collective over ``comm``'s replica group (every member calls it; ``rank`` is
    this process's place in ``replica_group``) and return its context: ALLREDUCE
    (output ``i`` as large as input ``i``), ALLGATHER (output ``rank_n`` times input) or
    REDUCESCATTER (input ``rank_n`` times output), elements of ``dtype``, reduced by ``op``
    (ADD, MAX, MIN; FMA is refused)."""
    _explicit()
    if not isinstance(comm, nrt_cc_comm_t):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{comm!r} is not an nrt_cc_comm_t")
    group = global_communicator()
    if group is None or global_id() != (comm.ctx_device_id, comm.ctx_device_count):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            "no global communicator for ctx_device_id "
            f"{comm.ctx_device_id!r} of {comm.ctx_device_count!r}: call "
            "nrt_cc_global_comm_init(vnc, ctx_device_id, ctx_device_count) first",
        )
    members = _replicas(comm, group)
    vnc = _state.require_nc(comm.vnc, "vnc")
    kind = _enum(nrt_cc_op_type_t, cc_op, "cc_op")
    element = _dtype(dtype)
    reduction = ""
    if kind is not NRT_CC_ALLGATHER:
        which = _enum(nrt_op_type_t, op, "op")
        if which not in _REDUCTIONS:
            raise NrtError(
                NRT_STATUS.NRT_INVALID, f"{which.name}: the reductions here are ADD, MAX and MIN"
            )
        reduction = _REDUCTIONS[which]
        if element.name not in REDUCIBLE_DTYPES:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{element.name} elements cannot be reduced here; reduce float32 or integers",
            )
    pairs = _pairs(input, output, kind, element, len(members))
    whole = members == list(range(group.size))
    return NRT_STATUS.NRT_SUCCESS, nrt_cc_context_t(
        group, vnc, kind, reduction, element, pairs, None if whole else members
    )


def _replicas(comm: nrt_cc_comm_t, group: Communicator) -> list[int]:
    """The global ranks of ``comm.replica_group`` (None: all), checked against ``rank`` /
    ``rank_n`` and this process's global rank."""
    given = list(range(group.size)) if comm.replica_group is None else comm.replica_group
    try:
        members = [int(r) for r in given]
        if any(isinstance(r, bool) or r != int(r) for r in given):
            raise ValueError
    except (TypeError, ValueError):
        raise NrtError(NRT_STATUS.NRT_INVALID, f"replica_group {given!r}: list ranks") from None
    if len(set(members)) != len(members) or not all(0 <= r < group.size for r in members):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"replica_group {members}: distinct global ranks of 0..{group.size - 1}",
        )
    if group.rank not in members or (comm.rank, comm.rank_n) != (
        members.index(group.rank),
        len(members),
    ):
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"replica_group {members} with rank {comm.rank!r} of {comm.rank_n!r}: this "
            f"process (global rank {group.rank}) must be in it, rank its place in the list "
            "and rank_n its length",
        )
    return members


def _enum(kind: type[IntEnum], value: Any, what: str) -> Any:
    try:
        if isinstance(value, bool):
            raise ValueError
        return kind(value)
    except (ValueError, TypeError):
        raise NrtError(
            NRT_STATUS.NRT_INVALID, f"{what} {value!r} is not an {kind.__name__}"
        ) from None


def _dtype(dtype: Any) -> np.dtype[Any]:
    code = _enum(nrt_dtype_t, dtype, "dtype")
    if code is nrt_dtype_t.NRT_DTYPE_UNKNOWN:
        raise NrtError(NRT_STATUS.NRT_INVALID, "dtype NRT_DTYPE_UNKNOWN: give the elements' type")
    return from_name(code.name.removeprefix("NRT_DTYPE_").lower()).numpy


def _pairs(
    input: Any, output: Any, kind: nrt_cc_op_type_t, dtype: np.dtype[Any], n: int
) -> list[tuple[Tensor, Tensor]]:
    lists = []
    for what, given in (("input", input), ("output", output)):
        if not isinstance(given, nrt_tensor_list_t):
            raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{what} is not an nrt_tensor_list_t")
        tensors = list(given.tensors)
        if given.num_tensors != len(tensors) or not tensors:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{what}: num_tensors {given.num_tensors!r} but {len(tensors)} tensors given",
            )
        for tensor in tensors:
            if not isinstance(tensor, Tensor) or tensor.freed:
                raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{what}: {tensor!r} is not live")
        lists.append(tensors)
    if len(lists[0]) != len(lists[1]):
        raise NrtError(NRT_STATUS.NRT_INVALID, "input and output hold different tensor counts")
    factor = {NRT_CC_ALLREDUCE: (1, 1), NRT_CC_ALLGATHER: (1, n), NRT_CC_REDUCESCATTER: (n, 1)}
    per_in, per_out = factor[kind]
    for i, (src, dst) in enumerate(zip(*lists, strict=True)):
        if src.size % dtype.itemsize:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"input {i}: {src.size} bytes are not whole {dtype.name} elements",
            )
        if kind is NRT_CC_REDUCESCATTER and (src.size // dtype.itemsize) % n:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"REDUCESCATTER: input {i}'s {src.size // dtype.itemsize} elements do not "
                f"split into {n} equal blocks",
            )
        if src.size * per_out != dst.size * per_in:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{kind.name}: input {i} holds {src.size} bytes, output {i} {dst.size}; "
                f"the output must hold {src.size * per_out // per_in}",
            )
    return list(zip(*lists, strict=True))


@guarded("pair")
def nrta_cc_schedule(
    cc_ctx: nrt_cc_context_t, queue: int, err: Any
) -> tuple[NRT_STATUS, int | None]:
    """Schedule the prepared collective on its NeuronCore's COLLECTIVES unit (``queue``
    0..2); the context is freed once scheduled. A failure (a peer that exited:
    NRT_EXEC_HW_ERR_COLLECTIVES; no answer in time: NRT_TIMEOUT) goes to ``err``."""
    _explicit()
    if not isinstance(cc_ctx, nrt_cc_context_t) or cc_ctx.used:
        raise NrtError(
            NRT_STATUS.NRT_INVALID_HANDLE, f"{cc_ctx!r} is not a prepared, unscheduled context"
        )
    request = Request("nrta_cc_schedule", lambda: _run(cc_ctx), None)
    seq = _schedule(cc_ctx.vnc, NRTA_XU_COLLECTIVES, queue, err, request)
    cc_ctx.used = True
    return NRT_STATUS.NRT_SUCCESS, seq


def _run(ctx: nrt_cc_context_t) -> NRT_STATUS:
    for src, dst in ctx.pairs:
        data = np.empty(src.size // ctx.dtype.itemsize, ctx.dtype)
        src.read(data.view(np.uint8))
        if ctx.cc_op is NRT_CC_ALLREDUCE:
            result = ctx.comm.all_reduce(data, ctx.reduction, group=ctx.group)
        elif ctx.cc_op is NRT_CC_ALLGATHER:
            result = ctx.comm.all_gather(data, group=ctx.group)
        else:
            result = ctx.comm.reduce_scatter(data, ctx.reduction, group=ctx.group)
        dst.write(np.ascontiguousarray(result).view(np.uint8))
    return NRT_STATUS.NRT_SUCCESS
