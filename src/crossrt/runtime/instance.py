"""An instance: one copy of a model's programs on its own cores, and the one walk over them.

This is the only runtime module that calls a program (``run``, ``run_cancellable``,
``run_outputs``, ``bind``): a ``run()`` in its caller's thread, a queued request in a worker, a
batch, a bound request and each stage thread of a pipelined multi-node model all reach the
engine through :class:`Instance`. A multi-node executable is walked node by node by
:meth:`Instance.step`, whether one thread takes a request through every node
(:meth:`Instance.execute`, the nodes' locks taken hand over hand) or one stage thread per node
passes requests along (``pipeline.py``), sharing those locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..drivers import Program
from ..drivers.base import CancelToken
from ..drivers.boundary import unguarded
from .memory.allocator import count_copy


@dataclass(eq=False)
class Instance:
    """One copy of a model's programs on its own cores."""

    index: int
    cores: tuple[int, ...]
    programs: list[Program]
    steps: Sequence[tuple[Sequence[str], Sequence[str]]]  # per node: its inputs, its outputs
    output_names: tuple[str, ...]
    pin: tuple[int, ...] | None = None
    """The host CPUs of its cores when they are part of the process's: workers running it
    pin themselves there, and so do the daemon's threads (a user's ``run()`` thread only
    within ``pinned_runs``: ``cores/pinning.py``)."""
    device: str = ""
    """The device it runs on (a load across devices has instances on several)."""
    pipelined: bool = True
    """For a multi-node executable: requests pass through the nodes in a pipeline (a stage
    thread per node); ``False``: one request at a time walks all the nodes (``serial``)."""
    locks: list[threading.Lock] = field(default_factory=list)
    trace: MutableSequence[tuple[int, int, int, int, int]] | None = None
    """While a profile records a multi-node instance: ``(instance, node, request id, start,
    end)`` per node run (``time.perf_counter_ns()``; request id 0 for a ``run()`` walk)."""

    def __post_init__(self) -> None:
        self.locks = [threading.Lock() for _ in self.programs]

    def whole(self, inputs: int) -> bool:
        """Whether it is one program reading all ``inputs`` of the model: then that program
        can be called as it is."""
        return len(self.programs) == 1 and len(self.steps[0][0]) == inputs

    def direct(self, inputs: int) -> Callable[..., dict[str, np.ndarray]]:
        """What a run on this instance calls when nothing is wrapped around it: the program
        itself where it is :meth:`whole` (no extra Python call on the hottest path; the
        caller maps what it raises), else :meth:`execute`."""
        return unguarded(self.programs[0].run) if self.whole(inputs) else self.execute

    def run_checked(
        self, feed: dict[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one request's checked inputs: what ``run()`` calls on the instance it took,
        in its caller's thread. The model puts in its place, on this instance, what its runs
        call (:meth:`run_checked_with`): the program's own ``run`` (:meth:`direct`), or the wrappers
        the model needs around it (``calls.py``), so that the hottest path costs no Python
        call of crossrt's between ``run()`` and the engine. Until then it is :meth:`execute`.
        ``outputs``: arrays to write the results into (a bound request's)."""
        return self.execute(feed, outputs)

    def run_checked_with(self, call: Callable[..., dict[str, np.ndarray]]) -> None:
        """Make :meth:`run_checked` call ``call`` on this instance from now on (an attribute of the
        instance, found before the method: no extra call)."""
        # An assignment, not self.__dict__[...]: reading __dict__ makes CPython give up the
        # instance's inline attribute values, and every attribute read of it gets slower.
        self.run_checked = call  # type: ignore[method-assign]

    def bind(self, feed: dict[str, Any], bound: dict[str, Any]) -> Callable[[], Any]:
        """The single program's own call prepared on exactly these arrays
        (:meth:`Program.bind`), for a bound request run many times."""
        return self.programs[0].bind(feed, bound)

    def selecting(self) -> Callable[[dict[str, Any], Sequence[str]], dict[str, Any]]:
        """The single program's ``run_outputs`` (only the outputs asked for), unguarded as
        :meth:`direct`."""
        selecting: Callable[[dict[str, Any], Sequence[str]], dict[str, Any]]
        selecting = unguarded(self.programs[0].run_outputs)
        return selecting

    def execute(
        self,
        feed: dict[str, Any],
        outputs: Mapping[str, np.ndarray] | None = None,
        cancel: CancelToken | None = None,
    ) -> dict[str, np.ndarray]:
        """Run once. A single node needs no lock (its caller took the instance); a multi-node
        walk takes the nodes' locks hand over hand, sharing them with the pipeline stages."""
        if len(self.programs) == 1:
            program = self.programs[0]
            names = self.steps[0][0]
            if len(names) != len(feed):  # inputs the node does not read (a type-only input)
                feed = {n: feed[n] for n in names}
            if cancel is None:
                return program.run(feed, outputs)
            return program.run_cancellable(feed, cancel, outputs)
        values = dict(feed)
        held = 0
        self.locks[0].acquire()
        try:
            for j in range(len(self.programs)):
                if j:
                    self.locks[j].acquire()
                    self.locks[j - 1].release()
                    held = j
                self.step(j, values, cancel)
        finally:
            self.locks[held].release()
        return assemble(values, self.output_names, outputs)

    def step(
        self, j: int, values: dict[str, Any], cancel: CancelToken | None, request: int = 0
    ) -> None:
        """Run node ``j`` on ``values`` (every value computed so far, by name) and add what it
        makes; its caller holds ``locks[j]``. Traced while a profile records (``request``:
        the id it is traced under, 0 for a walk in one thread)."""
        program = self.programs[j]
        inputs = {n: values[n] for n in self.steps[j][0]}
        if self.trace is None:
            values.update(_run_node(program, inputs, cancel))
            return
        start = time.perf_counter_ns()
        values.update(_run_node(program, inputs, cancel))
        self.trace.append((self.index, j, request, start, time.perf_counter_ns()))


def _run_node(
    program: Program, inputs: dict[str, Any], cancel: CancelToken | None
) -> dict[str, np.ndarray]:
    """One node's run, cancellable when a timeout applies."""
    return program.run(inputs) if cancel is None else program.run_cancellable(inputs, cancel)


def assemble(
    values: dict[str, Any], names: Sequence[str], outputs: Mapping[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The graph outputs out of every value computed, copied into ``outputs`` where given."""
    result = {name: values[name] for name in names}
    for name, buffer in (outputs or {}).items():
        np.copyto(buffer, result[name], casting="no")
        count_copy(buffer.nbytes)
        result[name] = buffer
    return result
