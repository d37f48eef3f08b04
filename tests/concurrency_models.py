"""Models and helpers shared by the scheduler and core-group tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import crossrt
from crossrt import GraphBuilder
from crossrt.drivers import Program


def tiny() -> crossrt.Model:
    """y = x @ W + 1 on [4, 8]: cheap, deterministic, different per input."""
    b = GraphBuilder("tiny_mm")
    x = b.input("x", "float32", [4, 8])
    w = b.constant(np.arange(64, dtype=np.float32).reshape(8, 8) / 64)
    b.output(b.op("Add", [b.op("MatMul", [x, w]), b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


def batchable(doubled: bool = False) -> crossrt.Model:
    """y = x @ W + 1 on [N, 8], N dynamic: requests can be batched. ``doubled``: y is
    Concat(x, x) along the first dimension instead, [2N, 8], an output that does not follow
    the batch."""
    b = GraphBuilder("batchable")
    x = b.input("x", "float32", ["N", 8])
    if doubled:
        b.output(b.op("Concat", [x, x], axis=0, outputs=["y"]))
        return b.finish()
    w = b.constant(np.arange(64, dtype=np.float32).reshape(8, 8) / 64)
    b.output(b.op("Add", [b.op("MatMul", [x, w]), b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


def slow_rows(chain: int = 400, size: int = 512) -> crossrt.Model:
    """A chain of MatMuls on [N, size] rows, N dynamic: batchable, and slow enough (tens of
    ms a row) for requests to queue behind a run."""
    b = GraphBuilder("slow_rows")
    x = b.input("x", "float32", ["N", size])
    w = b.constant(np.eye(size, dtype=np.float32))
    h = x
    for _ in range(chain):
        h = b.op("MatMul", [h, w])
    b.output(b.op("Identity", [h], outputs=["y"]))
    return b.finish()


def heavy(chain: int = 24, size: int = 512) -> crossrt.Model:
    """A chain of MatMuls long enough for a timeout to strike mid-run."""
    b = GraphBuilder("heavy")
    x = b.input("x", "float32", [size, size])
    w = b.constant(np.eye(size, dtype=np.float32))
    h = x
    for _ in range(chain):
        h = b.op("MatMul", [h, w])
    b.output(h)
    return b.finish()


def endless(size: int = 64) -> crossrt.Model:
    """A Loop of 2**40 MatMuls on [size, size]: a run that ends only when the engine stops it
    (ORT checks its terminate flag between the iterations of a Loop's body too), on any
    machine. Compiles in milliseconds, where a chain of thousands of nodes takes seconds."""
    value = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "w_body"], ["h_out"]),
            helper.make_node("Identity", ["more_in"], ["more_out"]),
        ],
        "endless_body",
        [
            value("i", TensorProto.INT64, []),
            value("more_in", TensorProto.BOOL, []),
            value("h_in", TensorProto.FLOAT, [size, size]),
        ],
        [value("more_out", TensorProto.BOOL, []), value("h_out", TensorProto.FLOAT, [size, size])],
        initializer=[numpy_helper.from_array(np.eye(size, dtype=np.float32), "w_body")],
    )
    b = GraphBuilder("endless")
    x = b.input("x", "float32", [size, size])
    trips = b.constant(np.array(2**40, np.int64))
    more = b.constant(np.array(True))
    b.output(b.op("Loop", [trips, more, x], outputs=["y"], body=body), "float32", [size, size])
    return b.finish()


def pipelined(size: int = 256, chain: int = 6) -> crossrt.Model:
    """MatMuls (ORT) -> int16 Max (reference: ORT has none) -> MatMuls (ORT): three nodes."""
    b = GraphBuilder("pipelined")
    x = b.input("x", "float32", [size, size])
    w = b.constant(np.eye(size, dtype=np.float32))
    h = x
    for _ in range(chain):
        h = b.op("MatMul", [h, w])
    as_int = b.op("Cast", [b.op("Relu", [h])], to=TensorProto.INT16)
    back = b.op("Cast", [b.op("Max", [as_int, as_int])], to=TensorProto.FLOAT)
    for _ in range(chain):
        back = b.op("MatMul", [back, w])
    b.output(back)
    return b.finish()


class GatedProgram(Program):
    """Wraps a program: each run signals ``started`` then waits for ``gate`` (tests only)."""

    def __init__(self, inner: Program) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls = 0
        self.fail: Exception | None = None

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        self.calls += 1
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail is not None:
            raise self.fail
        return self.inner.run(inputs, outputs)

    def close(self) -> None:
        self.gate.set()
        self.inner.close()


def gate(model: crossrt.LoadedModel, instance: int = 0) -> GatedProgram:
    """Put a :class:`GatedProgram` in front of one instance's (single) program."""
    inst = model._instances[instance]
    gated = GatedProgram(inst.programs[0])
    inst.programs[0] = gated
    inst.run_checked_with(model._calling.plain(inst))  # what run() calls on it
    return gated


class AffinityProgram(Program):
    """Wraps a program: each run records its instance's ``pin`` and the CPUs the thread
    calling the engine may run on, read as the engine starts (tests only)."""

    def __init__(self, inner: Program, pin: tuple[int, ...] | None, seen: list[Any]) -> None:
        self.inner, self.pin, self.seen = inner, pin, seen

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        self.seen.append((self.pin, os.sched_getaffinity(0)))
        return self.inner.run(inputs, outputs)

    def close(self) -> None:
        self.inner.close()


def watch_affinity(model: crossrt.LoadedModel) -> list[tuple[tuple[int, ...] | None, set[int]]]:
    """Put an :class:`AffinityProgram` in front of each instance's (single) program; the list
    its runs append ``(instance's pin, the engine thread's CPUs)`` to."""
    seen: list[tuple[tuple[int, ...] | None, set[int]]] = []
    for inst in model._instances:
        inst.programs[0] = AffinityProgram(inst.programs[0], inst.pin, seen)
        inst.run_checked_with(model._calling.plain(inst))  # what run() calls on it
    return seen
