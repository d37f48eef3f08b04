"""Tensor parallelism across two processes on loopback: each holds half the MLP's hidden
units, runs its shard with crossrt, and the all-reduce / all-gather give the single-process
result."""

from __future__ import annotations

import numpy as np
import pytest
from groups import run_group
from mlp import model, weights

import crossrt


@pytest.fixture(scope="module")
def whole() -> dict[str, np.ndarray]:
    w = weights()
    with crossrt.Runtime() as rt:
        return dict(rt.load(crossrt.compile(model(w), "cpu")).run({"x": w["x"]}))


@pytest.mark.parametrize("api", ["crossrt", "neuron"])
def test_two_shards_match_the_whole_model(whole: dict[str, np.ndarray], api: str) -> None:
    ranks = run_group("mlp", 2, api)
    for rank, got in enumerate(ranks):
        assert "y" in got, f"rank {rank}: {got}"
        np.testing.assert_allclose(np.array(got["y"]), whole["y"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.array(got["hidden"]), whole["hidden"], rtol=1e-6)
