"""What a communicator and Neuron's collective calls refuse, in this process: a group of one
(no MPI needed) and arguments checked before anything is sent."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

import crossrt
from crossrt.collectives import CollectiveError, Communicator
from crossrt.compat import neuron as nrt
from crossrt.errors import ClosedError, InvalidArgumentError, StatusCode, UnsupportedError
from crossrt.memory import Placement


def test_a_group_of_one_copies() -> None:
    with Communicator.solo() as comm:
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(comm.all_reduce(data, "max"), data)
        np.testing.assert_array_equal(comm.all_gather(data, axis=1), data)
        np.testing.assert_array_equal(comm.reduce_scatter(data), data)
        comm.barrier()
    assert Communicator.join(0, 1, "127.0.0.1:1").size == 1


def test_tensors_in_and_out() -> None:
    comm = Communicator.solo()
    src = crossrt.Tensor([4], "float32", placement=Placement.HOST)
    src.write(np.arange(4, dtype=np.float32))
    host_out = crossrt.Tensor([4], "float32", placement=Placement.HOST)
    assert comm.all_reduce(src, out=host_out) is host_out
    np.testing.assert_array_equal(host_out.numpy(), np.arange(4))
    device_out = crossrt.Tensor([4], "float32", device="sim:0")  # memory the host cannot address
    comm.all_reduce(src, "sum", out=device_out)
    np.testing.assert_array_equal(device_out.numpy(), np.arange(4))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda c: c.all_reduce([1, 2]), InvalidArgumentError, "not a NumPy array"),
        (lambda c: c.all_reduce(np.ones(2), "mean"), InvalidArgumentError, "sum, prod"),
        (lambda c: c.all_reduce(np.ones(2, np.float16)), UnsupportedError, "cast to float32"),
        (lambda c: c.all_reduce(np.ones(2), out=np.ones(3)), InvalidArgumentError, "result is"),
        (lambda c: c.all_gather(np.ones(2), axis=2), InvalidArgumentError, "axis 2"),
        (lambda c: c.recv(None, 0), InvalidArgumentError, "give out="),
        (lambda c: c.send(np.ones(2), 1), InvalidArgumentError, "not in 0..0"),
        (lambda c: c.send(np.ones(2), 0), InvalidArgumentError, "this process"),
        (lambda c: c.all_reduce(np.array([object()])), InvalidArgumentError, "Python objects"),
        (lambda c: c.all_reduce(np.ones(2), group=[0, 0]), InvalidArgumentError, "distinct"),
        (lambda c: c.all_gather(np.ones(2), group="0"), InvalidArgumentError, "list of ranks"),
        (lambda c: c.reduce_scatter(np.ones(2), group=[1]), InvalidArgumentError, "0..0"),
    ],
)
def test_bad_arguments_are_refused_by_name(call, error, words: str) -> None:
    with pytest.raises(error, match=words):
        call(Communicator.solo())


def test_a_closed_communicator_says_so() -> None:
    comm = Communicator.solo()
    comm.close()
    with pytest.raises(ClosedError, match="closed"):
        comm.barrier()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((2, 2, "127.0.0.1:1"), "rank 2"),
        ((0, 0, "127.0.0.1:1"), "size 0"),
        ((1, 2, "localhost"), "host:port"),
        ((1, 2, "127.0.0.1:99999"), "host:port"),
    ],
)
def test_join_checks_its_arguments(args: tuple, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        Communicator.join(*args)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        Communicator.join(0, 2, "127.0.0.1:1", timeout=0)


def test_a_process_started_without_mpiexec_is_told_how_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UnsupportedError, match="mpiexec -n 1") as caught:
        Communicator.join(1, 2, "127.0.0.1:1")
    assert caught.value.code is StatusCode.INVALID


def test_collective_error_is_neurons_stuck_collective() -> None:
    assert CollectiveError("x").code is StatusCode.EXEC_HW_ERR_COLLECTIVES
    assert nrt.TO_NRT[StatusCode.EXEC_HW_ERR_COLLECTIVES] == nrt.NRT_EXEC_HW_ERR_COLLECTIVES


# -- Neuron's calls ----------------------------------------------------------------------------


@pytest.fixture
def neuron(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NEURON_RT_ROOT_COMM_ID", raising=False)
    logging.disable(logging.CRITICAL)  # every refusal is logged
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_SUCCESS
    yield
    nrt.nrt_close()
    logging.disable(logging.NOTSET)


def _tensor(nbytes: int, values: np.ndarray | None = None) -> crossrt.Tensor:
    status, t = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_VIRTUAL, 0, nbytes, "t")
    assert status == nrt.NRT_SUCCESS
    if values is not None:
        assert nrt.nrt_tensor_write(t, values, 0, values.nbytes) == nrt.NRT_SUCCESS
    return t


def _list(*tensors: crossrt.Tensor) -> nrt.nrt_tensor_list_t:
    return nrt.nrt_tensor_list_t(list(tensors), len(tensors))


def test_before_nrt_init_the_global_comm_is_uninitialized() -> None:
    assert nrt.nrt_build_global_comm(0, 0, 1) == nrt.NRT_UNINITIALIZED


def test_global_comm_arguments(neuron: None) -> None:
    assert nrt.nrt_build_global_comm(0, 1, 2) == nrt.NRT_INVALID  # no NEURON_RT_ROOT_COMM_ID
    assert nrt.nrt_build_global_comm(0, 2, 2) == nrt.NRT_INVALID
    assert nrt.nrt_build_global_comm(0, 0, 0) == nrt.NRT_INVALID
    assert nrt.nrt_build_global_comm(9999, 0, 1) == nrt.NRT_INVALID
    assert nrt.nrt_cc_global_comm_init(0, 0, 1) == nrt.NRT_SUCCESS
    assert nrt.nrt_build_global_comm(0, 0, 1) == nrt.NRT_SUCCESS  # the same one again
    assert nrt.global_communicator() is not None


def test_barrier_and_all_gather_of_one(neuron: None) -> None:
    assert nrt.nrt_barrier(0, 0, 1) == nrt.NRT_SUCCESS
    out = bytearray(4)
    assert nrt.nrt_all_gather(0, 0, 1, 4, b"abcd", out) == nrt.NRT_SUCCESS
    assert out == b"abcd"
    assert nrt.nrt_all_gather(0, 0, 1, 8, b"abcd", bytearray(8)) == nrt.NRT_INVALID  # short in
    assert nrt.nrt_all_gather(0, 0, 1, 4, b"abcd", bytearray(2)) == nrt.NRT_INVALID  # short out
    assert nrt.nrt_all_gather(0, 0, 1, 4, b"abcd", b"wxyz") == nrt.NRT_INVALID  # read-only


def test_nrta_cc_allreduce_of_one_runs_on_the_collectives_unit(neuron: None) -> None:
    assert nrt.nrt_cc_global_comm_init(0, 0, 1) == nrt.NRT_SUCCESS
    values = np.arange(4, dtype=np.float32)
    src, dst = _tensor(16, values), _tensor(16)
    comm = nrt.nrt_cc_comm_t([0], 0, 1, 0, 1, 0)
    status, ctx = nrt.nrta_cc_prepare(
        comm, _list(src), _list(dst), nrt.NRT_DTYPE_FLOAT32, nrt.NRT_OP_MAX, nrt.NRT_CC_ALLREDUCE
    )
    assert status == nrt.NRT_SUCCESS
    _, err = nrt.nrta_error_tracker_create(0)
    status, seq = nrt.nrta_cc_schedule(ctx, 0, err)
    assert status == nrt.NRT_SUCCESS
    assert nrt.NRTA_SEQ_GET_XU_ID(seq) & 0xF == nrt.NRTA_XU_COLLECTIVES
    assert nrt.nrta_cc_schedule(ctx, 0, err) == (nrt.NRT_INVALID_HANDLE, None)  # freed
    _, fd = nrt.nrta_get_completion_handle(seq)
    import select

    assert select.select([fd], [], [], 30)[0]
    got = np.empty(4, np.float32)
    nrt.nrt_tensor_read(dst, got, 0, 16)
    np.testing.assert_array_equal(got, values)
    assert nrt.nrta_error_tracker_get_list(err) == (nrt.NRT_SUCCESS, [])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"out": 8}, "NRT_INVALID"),  # all-reduce output smaller than its input
        ({"op": 1}, "NRT_INVALID"),  # FMA
        ({"op": 7}, "NRT_INVALID"),
        ({"dtype": 0}, "NRT_INVALID"),  # UNKNOWN
        ({"dtype": 2}, "NRT_INVALID"),  # FLOAT16 cannot be reduced
        ({"cc_op": 9}, "NRT_INVALID"),
        ({"group": [1, 0]}, "NRT_INVALID"),  # rank 1 is not in a world of one
        ({"group": [0, 0]}, "NRT_INVALID"),  # twice
        ({"group": ["0"]}, "NRT_INVALID"),
        ({"ctx": (3, 4)}, "NRT_INVALID"),  # no such global communicator
        ({"count": 2}, "NRT_INVALID"),  # num_tensors says 2, one given
        ({"comm": None}, "NRT_INVALID_HANDLE"),
    ],
)
def test_nrta_cc_prepare_refusals(neuron: None, change: dict, expected: str) -> None:
    assert nrt.nrt_cc_global_comm_init(0, 0, 1) == nrt.NRT_SUCCESS
    ctx_id, ctx_count = change.get("ctx", (0, 1))
    comm = nrt.nrt_cc_comm_t(change.get("group", [0]), 0, 1, ctx_id, ctx_count, 0)
    src, dst = _tensor(16), _tensor(change.get("out", 16))
    inputs = nrt.nrt_tensor_list_t([src], change.get("count", 1))
    status, ctx = nrt.nrta_cc_prepare(
        change.get("comm", comm),
        inputs,
        _list(dst),
        change.get("dtype", nrt.NRT_DTYPE_FLOAT32),
        change.get("op", nrt.NRT_OP_ADD),
        change.get("cc_op", nrt.NRT_CC_ALLREDUCE),
    )
    assert (status.name, ctx) == (expected, None)


def test_all_gather_and_reduce_scatter_sizes(neuron: None) -> None:
    assert nrt.nrt_cc_global_comm_init(0, 0, 1) == nrt.NRT_SUCCESS
    comm = nrt.nrt_cc_comm_t(None, 0, 1, 0, 1, 0)
    for cc_op in (nrt.NRT_CC_ALLGATHER, nrt.NRT_CC_REDUCESCATTER):
        good = nrt.nrta_cc_prepare(
            comm, _list(_tensor(8)), _list(_tensor(8)), nrt.NRT_DTYPE_INT32, 0, cc_op
        )
        assert good[0] == nrt.NRT_SUCCESS
        bad = nrt.nrta_cc_prepare(
            comm, _list(_tensor(8)), _list(_tensor(4)), nrt.NRT_DTYPE_INT32, 0, cc_op
        )
        assert bad == (nrt.NRT_INVALID, None)


def test_nrt_close_ends_the_global_comm(neuron: None) -> None:
    assert nrt.nrt_build_global_comm(0, 0, 1) == nrt.NRT_SUCCESS
    comm = nrt.global_communicator()
    nrt.nrt_close()
    assert nrt.global_communicator() is None
    with pytest.raises(ClosedError):
        comm.barrier()
    assert nrt.nrt_barrier(0, 0, 1) == nrt.NRT_CLOSED
    assert nrt.nrt_init(nrt.NRT_FRAMEWORK_TYPE_NO_FW, "", "") == nrt.NRT_SUCCESS


def test_sendrecv_needs_its_variables_and_a_launcher(
    neuron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert nrt.nrt_async_sendrecv_init(0) == nrt.NRT_FAILURE  # not EXPERIMENTAL_ENABLED
    monkeypatch.setenv("NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED", "1")
    assert nrt.nrt_async_sendrecv_init(0) == nrt.NRT_INVALID  # no BOOTSTRAP_PORT
    monkeypatch.setenv("NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT", "29400")
    assert nrt.nrt_async_sendrecv_connect("127.0.0.1", 0, 0) == (nrt.NRT_INVALID, None)  # no init
    assert nrt.nrt_async_sendrecv_init(0) == nrt.NRT_SUCCESS
    assert nrt.nrt_async_sendrecv_init(0) == nrt.NRT_FAILURE  # twice
    status, comm = nrt.nrt_async_sendrecv_connect("127.0.0.1", 0, 0)
    assert status == nrt.NRT_SUCCESS
    t = _tensor(8)
    assert nrt.nrt_async_sendrecv_send_tensor(t, 0, 8, comm) == (nrt.NRT_FAILURE, None)
    comm.joined.exception(timeout=30)  # this process has no mpiexec: joining fails, saying so
    assert nrt.nrt_async_sendrecv_test_comm(comm) == (nrt.NRT_INVALID, None)
    assert nrt.nrt_async_sendrecv_recv_tensor(t, 0, 8, comm) == (nrt.NRT_INVALID_HANDLE, None)
    assert nrt.nrt_async_sendrecv_test_request(None) == (nrt.NRT_INVALID_HANDLE, None)
    assert nrt.nrt_async_sendrecv_flush(0) == nrt.NRT_SUCCESS
    assert nrt.nrt_async_sendrecv_close(0) == nrt.NRT_SUCCESS
    assert nrt.nrt_async_sendrecv_test_comm(comm) == (nrt.NRT_INVALID_HANDLE, None)  # closed


# -- the meeting at rank 0's address -----------------------------------------------------------


def test_rank_0_waits_for_the_others_only_until_the_timeout() -> None:
    import time

    from groups import free_port

    from crossrt.collectives import rendezvous
    from crossrt.errors import DeadlineExceededError

    port = free_port()
    with pytest.raises(DeadlineExceededError, match=r"ranks \[1\]"):
        rendezvous.accept_ranks(rendezvous.listen("127.0.0.1", port), 2, time.monotonic() + 0.3)
    with pytest.raises(DeadlineExceededError, match="could not reach rank 0"):
        rendezvous.connect_root("127.0.0.1", port, 1, 2, time.monotonic() + 0.3)


def test_rank_0_refuses_a_rank_that_does_not_fit_and_ignores_strangers() -> None:
    import socket
    import threading
    import time

    from groups import free_port

    from crossrt.collectives import rendezvous

    port = free_port()
    deadline = time.monotonic() + 20
    joined: list = []
    server = rendezvous.listen("127.0.0.1", port)  # listening before anyone connects
    root = threading.Thread(
        target=lambda: joined.extend(rendezvous.accept_ranks(server, 2, deadline))
    )
    root.start()
    refused: list[Exception] = []
    answers: list = []
    joiner = threading.Thread(
        target=lambda: answers.append(rendezvous.connect_root("127.0.0.1", port, 1, 2, deadline))
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:
            stranger.sendall(b"GET / HTTP/1.0\n")  # not a rank: closed, rank 0 waits on
        try:
            rendezvous.connect_root("127.0.0.1", port, 1, 3, deadline)  # wrong group size
        except InvalidArgumentError as exc:
            refused.append(exc)
        joiner.start()
    finally:
        root.join(timeout=20)
    assert "the group has 2 ranks, this one says 3" in str(refused[0])
    assert [rank for rank, _ in joined] == [1]
    joined[0][1].sendall(b"1 the-port\n")  # what mpi.join sends: order, MPI port name
    joiner.join(timeout=20)
    sock, order, port_name = answers[0]
    assert (order, port_name) == (1, "the-port")
    sock.close()
    joined[0][1].close()
