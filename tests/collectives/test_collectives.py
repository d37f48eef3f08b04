"""Each collective across two real processes on loopback (``ranks.py``), the failures a group
meets (a peer that dies, a peer that never calls), and one ``mpiexec -n 2`` job."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
from groups import BOUND, HERE, run_group


@pytest.fixture(scope="module")
def both() -> list[dict[str, Any]]:
    return run_group("collectives")


def test_both_ranks_joined(both: list[dict[str, Any]]) -> None:
    assert [(r.get("rank"), r.get("size")) for r in both] == [(0, 2), (1, 2)], both


def test_all_reduce_sum_max_min_prod(both: list[dict[str, Any]]) -> None:
    for got in both:  # rank r contributed arange(6) + 10 r; prod: r + 2
        assert got["sum"] == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
        assert got["max"] == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
        assert got["min"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert got["prod"] == [6, 6, 6]
        assert got["in_place"] == [1.0, 3.0, 5.0]  # out=data: MPI_IN_PLACE
        assert got["tensor"] == [3.0, 3.0, 3.0]  # a host Tensor into a sim device Tensor


def test_all_gather_in_rank_order_along_an_axis(both: list[dict[str, Any]]) -> None:
    for got in both:
        assert got["gather0"] == [[0, 0], [1, 1]]
        assert got["gather1"] == [[0.0, 1.0], [0.0, 1.0]]  # float16 travels as bytes


def test_reduce_scatter_gives_each_rank_its_block(both: list[dict[str, Any]]) -> None:
    # sum of arange(4) + r over r in {0, 1} = [1, 3, 5, 7]: rank 0 gets [1, 3], rank 1 [5, 7]
    assert [got["scatter"] for got in both] == [[1.0, 3.0], [5.0, 7.0]]


def test_send_and_recv(both: list[dict[str, Any]]) -> None:
    assert both[1]["recv"] == [0, 1, 2, 3, 4]
    assert both[0]["recv"] == [0, 2, 4, 6, 8]


def test_a_receive_buffer_too_small_is_invalid_and_keeps_the_group(
    both: list[dict[str, Any]],
) -> None:
    assert both[1]["short_recv"].startswith("INVALID: recv: the peer sent more bytes")


def test_overlapping_buffers_are_invalid_and_keep_the_group(both: list[dict[str, Any]]) -> None:
    for got in both:
        assert got["overlap"].startswith("INVALID: reduce_scatter: out overlaps"), got
        assert got["after"] == [2.0]


def test_a_dead_peer_is_an_error_at_once_not_a_hang() -> None:
    survivor, dead = run_group("dead_peer")
    assert dead == {"stderr": dead.get("stderr", "")}  # it printed nothing: it died
    assert survivor["error"] == "EXEC_HW_ERR_COLLECTIVES", survivor
    assert "rank 1 exited" in survivor["message"]
    assert survivor["seconds"] < 30  # the watch, not the 60 s timeout
    assert survivor["then"] == "EXEC_HW_ERR_COLLECTIVES"  # broken stays broken


def test_a_peer_that_never_calls_is_a_timeout() -> None:
    waiting, _ = run_group("timeout")
    assert waiting["error"] == "TIMEOUT", waiting
    assert "every rank calls the same collectives" in waiting["message"]


def test_one_mpiexec_job_is_a_group_from_the_environment() -> None:
    from crossrt.collectives import mpiexec

    code = (
        "import json, numpy as np; from crossrt.collectives import Communicator;"
        "c = Communicator.from_env(timeout=60);"
        "print(json.dumps([c.rank, c.size, c.all_reduce(np.array([c.rank + 1.0])).tolist()]))"
    )
    done = subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=BOUND, cwd=HERE,
    )  # fmt: skip
    # the ranks' lines reach mpiexec's stdout as they come: one may run into the other
    found = sorted(re.findall(r"\[\d, \d, \[[\d.]+\]\]", done.stdout))
    assert found == ["[0, 2, [3.0]]", "[1, 2, [3.0]]"], (done.returncode, done.stdout, done.stderr)


def test_neuron_sendrecv_moves_a_tensor_between_processes() -> None:
    receiver, sender = run_group("sendrecv")
    assert receiver.get("got") == [100.0 + i for i in range(8)], receiver
    assert receiver["size"] == sender["size"] == 32


def test_groups_of_some_ranks() -> None:
    zero, one, two = run_group("groups", 3)
    assert zero.get("sum") == two.get("sum") == [4.0, 4.0, 4.0], (zero, two)
    assert one["sum"] == [7.0, 7.0, 7.0]  # a group of one: its own data
    assert zero["gather"] == two["gather"] == [2, 2, 0, 0]  # in the group's order
    assert (zero["scatter"], two["scatter"]) == ([2.0, 4.0], [6.0, 8.0])
    assert zero["world"] == one["world"] == two["world"] == [3]
    # Neuron's replica group [2, 0]: an ALLGATHER in that order, rank 1 not a member
    assert zero["neuron"] == two["neuron"] == [2.0, 2.0, 0.0, 0.0]
    assert one["neuron"] == "not a member"
