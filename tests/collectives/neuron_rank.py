"""One rank of the tensor-parallel MLP written against Neuron's API, as a libnrt program does
it: load the shard's "NEFF", execute, then the host-driven collectives (nrt_cc_global_comm_init,
nrta_cc_prepare / nrta_cc_schedule ALLREDUCE with ADD, nrt_all_gather, nrt_barrier)."""

from __future__ import annotations

import os
import select

import numpy as np

import crossrt
from crossrt.compat.neuron import (
    NRT_CC_ALLREDUCE,
    NRT_DTYPE_FLOAT32,
    NRT_FRAMEWORK_TYPE_NO_FW,
    NRT_OP_ADD,
    NRT_SUCCESS,
    NRT_TENSOR_PLACEMENT_VIRTUAL,
    global_communicator,
    nrt_add_tensor_to_tensor_set,
    nrt_all_gather,
    nrt_allocate_tensor_set,
    nrt_barrier,
    nrt_cc_comm_t,
    nrt_cc_global_comm_init,
    nrt_close,
    nrt_execute,
    nrt_init,
    nrt_load_collectives,
    nrt_tensor_allocate,
    nrt_tensor_list_t,
    nrt_tensor_read,
    nrt_tensor_write,
    nrta_cc_prepare,
    nrta_cc_schedule,
    nrta_error_tracker_create,
    nrta_error_tracker_get_list,
    nrta_get_completion_handle,
)


def check(result: object, what: str) -> object:
    status = result[0] if isinstance(result, tuple) else result
    if status != NRT_SUCCESS:
        raise SystemExit(f"{what} failed: {status!r}")
    return result[1] if isinstance(result, tuple) else None


def tensor(size: int, name: str) -> object:
    return check(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_VIRTUAL, 0, size, name), name)


def combine(exe: crossrt.Executable, w: dict, rank: int, size: int, root: str) -> dict:
    os.environ["NEURON_RT_ROOT_COMM_ID"] = root
    check(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), "nrt_init")
    neff = exe.to_bytes()
    # as libnrt, nrt_load_collectives builds the global communicator (NEURON_RT_ROOT_COMM_ID)
    model = check(nrt_load_collectives(neff, len(neff), -1, -1, rank, size), "load")
    assert global_communicator() is not None
    x = np.ascontiguousarray(w["x"])
    hidden_shape = (x.shape[0], w["w1"].shape[1] // size)
    y_shape = (x.shape[0], w["w2"].shape[1])
    inputs, outputs = (
        check(nrt_allocate_tensor_set(), "set"),
        check(nrt_allocate_tensor_set(), "set"),
    )
    t_x = tensor(x.nbytes, "x")
    check(nrt_tensor_write(t_x, x, 0, x.nbytes), "write x")
    t_hidden, t_partial = (
        tensor(4 * np.prod(hidden_shape), "hidden"),
        tensor(4 * np.prod(y_shape), "partial"),
    )
    check(nrt_add_tensor_to_tensor_set(inputs, "x", t_x), "add x")
    check(nrt_add_tensor_to_tensor_set(outputs, "hidden", t_hidden), "add hidden")
    check(nrt_add_tensor_to_tensor_set(outputs, "partial", t_partial), "add partial")
    check(nrt_execute(model, inputs, outputs), "nrt_execute")

    check(nrt_cc_global_comm_init(0, rank, size), "nrt_cc_global_comm_init")
    comm = nrt_cc_comm_t(list(range(size)), rank, size, rank, size, 0)
    t_sum = tensor(4 * np.prod(y_shape), "sum")
    ctx = check(
        nrta_cc_prepare(
            comm, nrt_tensor_list_t([t_partial], 1), nrt_tensor_list_t([t_sum], 1),
            NRT_DTYPE_FLOAT32, NRT_OP_ADD, NRT_CC_ALLREDUCE,
        ),
        "nrta_cc_prepare",
    )  # fmt: skip
    err = check(nrta_error_tracker_create(0), "tracker")
    seq = check(nrta_cc_schedule(ctx, 0, err), "nrta_cc_schedule")
    fd = check(nrta_get_completion_handle(seq), "completion handle")
    assert select.select([fd], [], [], 60)[0], "the all-reduce did not complete"
    os.close(fd)
    assert check(nrta_error_tracker_get_list(err), "errors") == []
    y = np.empty(y_shape, np.float32)
    check(nrt_tensor_read(t_sum, y, 0, y.nbytes), "read sum")

    mine = np.empty(hidden_shape, np.float32)
    check(nrt_tensor_read(t_hidden, mine, 0, mine.nbytes), "read hidden")
    blocks = np.empty((size, *hidden_shape), np.float32)
    check(nrt_all_gather(0, rank, size, mine.nbytes, mine, blocks), "nrt_all_gather")
    check(nrt_barrier(0, rank, size), "nrt_barrier")
    check(nrt_close(), "nrt_close")
    return {"y": (y + w["b2"]).tolist(), "hidden": np.concatenate(list(blocks), axis=1).tolist()}


def sendrecv(rank: int, root: str) -> dict:
    """Rank 1 sends a tensor to rank 0 with ``nrt_async_sendrecv_*``: the flow of a KV-cache
    hand-over between two hosts."""
    from crossrt.compat import neuron as nrt

    host, port = root.rsplit(":", 1)
    os.environ["NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED"] = "1"
    os.environ["NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT"] = port
    check(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), "nrt_init")
    check(nrt.nrt_async_sendrecv_init(0), "init")
    values = np.arange(8, dtype=np.float32) + 100
    t = tensor(values.nbytes, "kv")
    if rank == 1:
        comm = check(nrt.nrt_async_sendrecv_connect(host, 0, 0), "connect")
    else:
        comm = check(nrt.nrt_async_sendrecv_accept(host, 0, 0), "accept")
    while not check(nrt.nrt_async_sendrecv_test_comm(comm), "test_comm"):
        select.select([], [], [], 0.01)  # the seed's programs poll test_comm
    if rank == 1:
        check(nrt_tensor_write(t, values, 0, values.nbytes), "write")
        req = check(nrt.nrt_async_sendrecv_send_tensor(t, 0, values.nbytes, comm), "send")
    else:
        req = check(nrt.nrt_async_sendrecv_recv_tensor(t, 0, values.nbytes, comm), "recv")
    while not (done := check(nrt.nrt_async_sendrecv_test_request(req), "test_request"))[0]:
        select.select([], [], [], 0.01)
    got = np.empty(8, np.float32)
    check(nrt_tensor_read(t, got, 0, got.nbytes), "read")
    check(nrt.nrt_async_sendrecv_flush(0), "flush")
    check(nrt.nrt_async_sendrecv_close(0), "close")
    check(nrt_close(), "nrt_close")
    return {"rank": rank, "got": got.tolist(), "size": done[1]}
