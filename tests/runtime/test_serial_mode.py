"""``Runtime.load(mode="serial")``: neuron-rtd's shared NC mode (seed 003). The nodes share
the instance's cores, as in ``shared``, and one request at a time goes through them: no
pipelining."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import crossrt
from concurrency_models import pipelined


def test_serial_mode_runs_one_request_at_a_time_through_the_nodes(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(pipelined(), fallback="cpu")
    assert len(exe.nodes) == 3
    model = rt.load(exe, mode="serial", queue_depth=8)
    trace: list[tuple[int, int, int, int, int]] = []
    for inst in model._scheduler.instances:
        inst.trace = trace
    inputs = [np.random.default_rng(i).random((256, 256), dtype=np.float32) for i in range(6)]
    futures = [model.run_async({"x": a}) for a in inputs]
    name = model.outputs[0].name
    reference = rt.load(exe, mode="shared")
    for future, a in zip(futures, inputs, strict=True):
        np.testing.assert_array_equal(future.result(60)[name], reference.run({"x": a})[name])
    spans = sorted((start, end, node) for _, node, _, start, end in trace)
    assert [node for _, _, node in spans] == [0, 1, 2] * len(inputs)
    for before, after in itertools.pairwise(spans):
        assert after[0] >= before[1], f"node run {after} began before {before} ended"


def test_an_unknown_mode_names_the_three(rt: crossrt.Runtime) -> None:
    exe = crossrt.compile(pipelined(size=8, chain=1), fallback="cpu")
    with pytest.raises(crossrt.InvalidArgumentError, match="'serial'"):
        rt.load(exe, mode="pipelined")
