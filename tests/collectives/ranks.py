"""One rank of the tests' groups, run as ``mpiexec -n 1 python ranks.py SCENARIO RANK SIZE
ROOT`` by ``conftest.py``. It prints one JSON line with what it saw, and exits 0."""

from __future__ import annotations

import json
import os
import select
import sys
import time

import numpy as np

import crossrt
from crossrt.collectives import CollectiveError, Communicator
from crossrt.errors import CrossrtError
from crossrt.memory import Placement


def collectives(comm: Communicator) -> dict:
    """Each collective once, with values that tell the ranks apart."""
    r = comm.rank
    mine = np.arange(6, dtype=np.float32) + 10 * r
    got = {
        "sum": comm.all_reduce(mine).tolist(),
        "max": comm.all_reduce(mine, "max").tolist(),
        "min": comm.all_reduce(mine, "min").tolist(),
        "prod": comm.all_reduce(np.full(3, r + 2, np.int64), "prod").tolist(),
        "in_place": comm.all_reduce(both := np.arange(3.0) + r, out=both).tolist(),
        "gather0": comm.all_gather(np.full((1, 2), r, np.int32)).tolist(),
        "gather1": comm.all_gather(np.full((2, 1), r, np.float16), axis=1).tolist(),
        "scatter": comm.reduce_scatter(np.arange(4, dtype=np.float64) + r).tolist(),
    }
    src = crossrt.Tensor([3], "float32", placement=Placement.HOST)
    src.write(np.full(3, r + 1.0, np.float32))
    dst = crossrt.Tensor([3], "float32", device="sim:0")  # memory the host cannot address
    got["tensor"] = comm.all_reduce(src, out=dst).numpy().tolist()
    comm.barrier()
    peer = 1 - r
    if r == 0:
        comm.send(np.arange(5, dtype=np.int16), peer, tag=7)
        back = comm.recv(np.empty(5, np.int16), peer, tag=8)
        got["recv"] = back.tolist()
    else:
        got["recv"] = comm.recv(np.empty(5, np.int16), peer, tag=7).tolist()
        comm.send(got_back := np.asarray(got["recv"], np.int16) * 2, peer, tag=8)
        del got_back
    try:
        comm.recv(np.empty(2, np.int16), peer, tag=9) if r else comm.send(
            np.arange(5, dtype=np.int16), peer, tag=9
        )
        got["short_recv"] = "accepted"
    except CrossrtError as exc:
        got["short_recv"] = f"{exc.code.name}: {exc.message}"
    try:
        block = np.arange(4.0)
        comm.reduce_scatter(block, out=block[:2])
        got["overlap"] = "accepted"
    except CrossrtError as exc:
        got["overlap"] = f"{exc.code.name}: {exc.message}"
    got["after"] = comm.all_reduce(np.ones(1)).tolist()  # the group still works
    return got


def dead_peer(comm: Communicator) -> dict:
    """Rank 1 exits abruptly after the first all-reduce; rank 0's second one must fail."""
    comm.all_reduce(np.ones(4, np.float32))
    if comm.rank == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, np.float32))
        return {"error": None}
    except CollectiveError as exc:
        return {
            "error": exc.code.name,
            "message": exc.message,
            "seconds": time.monotonic() - start,
            "then": _again(comm),
        }


def timeout(comm: Communicator) -> dict:
    """Rank 1 never calls the barrier rank 0 waits in; rank 0 times out."""
    comm.timeout = 1.0
    if comm.rank == 1:
        time.sleep(0)  # leaves without calling: its close says bye, no death
        return {}
    try:
        comm.barrier()
        return {"error": None}
    except CrossrtError as exc:
        return {"error": exc.code.name, "message": exc.message}


def groups(comm: Communicator) -> dict:
    """Three ranks; ranks 0 and 2 form groups, rank 1 a group of its own; then Neuron's
    replica group [2, 0] over the global communicator."""
    r = comm.rank
    got: dict = {}
    if r in (0, 2):
        got["sum"] = comm.all_reduce(np.full(3, r + 1.0), group=[0, 2]).tolist()
        got["gather"] = comm.all_gather(np.full(2, r), group=[2, 0]).tolist()
        got["scatter"] = comm.reduce_scatter(np.arange(4.0) + r, group=[0, 2]).tolist()
    else:
        got["sum"] = comm.all_reduce(np.full(3, 7.0), group=[1]).tolist()
    got["world"] = comm.all_reduce(np.array([r], np.int64)).tolist()  # group tags apart
    got["neuron"] = neuron_replicas(r, comm.size)
    return got


def neuron_replicas(rank: int, size: int) -> list | str:
    from crossrt.compat import neuron as nrt

    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_SUCCESS
    assert nrt.nrt_build_global_comm(0, rank, size) == nrt.NRT_SUCCESS
    result: list | str = "not a member"
    if rank != 1:
        place = [2, 0].index(rank)
        comm = nrt.nrt_cc_comm_t([2, 0], place, 2, rank, size, 0)
        _, src = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_VIRTUAL, 0, 8, "src")
        _, dst = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_VIRTUAL, 0, 16, "dst")
        nrt.nrt_tensor_write(src, np.full(2, rank, np.float32), 0, 8)
        status, ctx = nrt.nrta_cc_prepare(
            comm,
            nrt.nrt_tensor_list_t([src], 1),
            nrt.nrt_tensor_list_t([dst], 1),
            nrt.NRT_DTYPE_FLOAT32,
            nrt.NRT_OP_ADD,
            nrt.NRT_CC_ALLGATHER,
        )
        assert status == nrt.NRT_SUCCESS, status
        _, seq = nrt.nrta_cc_schedule(ctx, 0, None)
        _, fd = nrt.nrta_get_completion_handle(seq)
        assert select.select([fd], [], [], 60)[0]
        os.close(fd)
        out = np.empty(4, np.float32)
        nrt.nrt_tensor_read(dst, out, 0, 16)
        result = out.tolist()
    assert nrt.nrt_barrier(0, rank, size) == nrt.NRT_SUCCESS
    nrt.nrt_close()
    return result


def _again(comm: Communicator) -> str:
    try:
        comm.barrier()
        return "ok"
    except CrossrtError as exc:
        return exc.code.name


def main() -> None:
    scenario, rank, size, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if scenario == "sendrecv":
        from neuron_rank import sendrecv

        print(json.dumps(sendrecv(rank, root)), flush=True)
        return
    if scenario == "mlp":
        from mlp_rank import run

        print(json.dumps(run(rank, size, root, sys.argv[5])), flush=True)
        return
    os.environ["NEURON_RT_ROOT_COMM_ID"] = root  # for the scenarios that use Neuron's calls too
    comm = Communicator.join(rank, size, root, timeout=60)
    result = {"rank": comm.rank, "size": comm.size, **globals()[scenario](comm)}
    print(json.dumps(result), flush=True)
    comm.close()  # a broken one too: the process then ends as usual


if __name__ == "__main__":
    main()
