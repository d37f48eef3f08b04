"""The running room of a loaded model: every way of running it reaches its instances here.

``Running`` is the base class of :class:`~crossrt.runtime.loaded.LoadedModel` (a base class,
not an object it holds: ``run`` is the hottest path there is, and one more call on it would
cost more than the whole of crossrt's share of a tiny model's run). The road of a request:

- ``run()`` checks the inputs (``inputs.py``) or takes a bound :class:`Request`'s binding
  (``binding.py``), takes an idle instance (``line.py``) and runs it in the caller's thread:
  in the common case (no ``outputs=``, ``output_names``, deadline or cancel token)
  :meth:`Instance.run_checked` (``instance.py``, the only caller of a program), which is the
  program's own ``run`` or the wrappers the model needs (``calls.py``); ``outputs=`` and a
  bound request bind that call (``binding.py``); a deadline, a cancel token or
  ``output_names`` go through :meth:`Calls.run_on` (``calls.py``) to the same instance;
- with every instance busy, it waits in line for one, or (a deadline, a cancel token,
  batching) is queued like ``run_async``/``infer`` (``queued_runs.py``, the base class of
  ``Running``): the scheduler's workers then run it through :meth:`Calls.finish`
  (``calls.py``), on the same instances and wrappers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError
from time import perf_counter_ns
from typing import Any, overload

import numpy as np

from ..compiler import Executable
from ..drivers.base import CancelToken
from ..drivers.boundary import program_error
from ..errors import CrossrtError, InvalidArgumentError
from ..model import TensorSpec
from .batching import Batching, refuse_unbatchable
from .binding import Binding, OutputBinder
from .calls import Calls
from .cores import pinning
from .cores.pinning import CALLER
from .inputs import InputChecker, output_names_checked
from .instance import Instance
from .memory.tensorset import TensorSet
from .memory.transfer import ResidentProgram
from .numerics import Numerics
from .queued_runs import QueuedRuns
from .request import Request
from .scheduler import Scheduler
from .statistics import SUM_AT, ModelStatistics, Statistics
from .views import Memory

log = logging.getLogger("crossrt")


class Running(QueuedRuns):
    """How a loaded model runs: ``run``, ``run_async``, ``infer`` and bound requests
    (see the module docstring). ``LoadedModel`` is the one class built on it."""

    name: str
    executable: Executable
    # Why run() refuses now (unloaded, closed, stopped); None while it may run. Set by the
    # model's start, stop and release.
    _refusal: tuple[type[Exception], str] | None = None
    _released: tuple[type[Exception], str] | None = None

    def _prepare_runs(
        self,
        instances: Sequence[Instance],
        memory: Memory,
        *,
        queue_depth: int | None,
        exec_timeout: float | None,
        check_numerics: Numerics,
        statistics: Statistics | None,
        batching: Batching | None,
    ) -> None:
        """Set up the road: input checks, outputs, what a run calls per instance, the
        scheduler (the ``LoadedModel`` constructor calls it once)."""
        executable = self.executable
        if batching is not None:
            refuse_unbatchable(self.name, executable, batching)
        self._refusal = self._released = None
        self._batching = batching
        self._check_numerics = check_numerics
        self._instances = tuple(instances)
        self._programs = [p for inst in instances for p in inst.programs]
        self._transfers = transfers = memory.transfers
        resident = [p for p in self._programs if isinstance(p, ResidentProgram)]
        for program in resident:
            program.transfers = transfers
        # Some program wants device memory: device tensors are handed over as they are and
        # device results are copied to the host only when the caller asks for host arrays.
        self._resident = bool(resident)
        self._checker = InputChecker(
            executable.inputs, transfers=transfers, keep_device=self._resident
        )
        # Only dynamic outputs need their shapes kept per run (static ones are known now), so
        # only their models pay for it.
        self._record_shapes = not all(s.is_static for s in executable.outputs)
        self._last = threading.local()
        self._exec_timeout = exec_timeout
        self._prepare_calls(memory, exec_timeout, check_numerics)
        self._output_names = tuple(s.name for s in executable.outputs)
        self._checked_names: set[tuple[str, ...]] = set()  # output_names= found valid
        self._scheduler = self._scheduled(instances, queue_depth, statistics, batching)
        self._line = self._scheduler.line
        self._take = self._line.idle.pop  # run() takes an instance without blocking
        self._give = self._line.idle.append

    def _prepare_calls(
        self, memory: Memory, exec_timeout: float | None, check_numerics: Numerics
    ) -> None:
        """The outputs' binder and what a run calls on each instance (:class:`Calls`)."""
        inputs = len(self.executable.inputs)
        self._binder = OutputBinder(
            self.executable.outputs,
            self._checker,
            memory.allocator,
            memory.owner,
            self._transfers,
            self._resident,
        )
        self._calling = Calls(
            self.name,
            inputs,
            exec_timeout,
            check_numerics,
            self._transfers if self._resident else None,
            self._last if self._record_shapes else None,
            self._binder,
        )
        # What run() calls on the instance it took (Instance.run_checked): the program itself when
        # nothing is added.
        self._calling.prepare(self._instances)
        self._direct = self._calling.direct  # read by every bound run

    def _scheduled(
        self,
        instances: Sequence[Instance],
        queue_depth: int | None,
        statistics: Statistics | None,
        batching: Batching | None,
    ) -> Scheduler:
        nodes = len(self.executable.nodes)
        depth = len(instances) + nodes + 1 if queue_depth is None else queue_depth
        if batching is not None and queue_depth is None:  # room for a batch per instance
            depth += batching.max_size * len(instances)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentError(f"queue_depth={queue_depth!r}: give a whole number >= 1")
        # Shape stages share their model's statistics: one model to the user.
        self._statistics = statistics or Statistics(len(instances))
        return Scheduler(
            self.name,
            instances,
            self._calling.finish,
            depth,
            self._exec_timeout,
            self._statistics,
            batching,
        )

    @overload
    def run(
        self,
        inputs: Any,
        outputs: None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> dict[str, np.ndarray]: ...

    @overload
    def run(
        self,
        inputs: Any,
        outputs: TensorSet,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> TensorSet: ...

    @overload
    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> dict[str, np.ndarray]: ...

    @overload
    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, Any],
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> Mapping[str, Any]: ...

    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> Any:
        """Run the model once (nrt_execute), in the calling thread.

        The calling thread is left on the CPUs it has: a user's thread is not pinned (its
        affinity is the user's) unless it runs within
        :func:`~crossrt.runtime.cores.pinning.pinned_runs`; a thread crossrt owns (the
        daemon's) computes on the CPUs of the instance it takes, as the workers of
        ``run_async`` do (``docs/cores.md``, "Pinning").

        Args:
            inputs: ``{name: array or Tensor}``, a :class:`TensorSet`, or a list in input
                order (a single value for a one-input model). Every input is checked: name,
                dtype, rank and the static dimensions. Host tensors and C-contiguous arrays
                are passed to the engine without a copy. Every call is checked; to run the
                same inputs and outputs many times without the checks, bind them once with
                :meth:`request`.
            outputs: where results go, by output name (see ``docs/memory.md``): a NumPy
                array or a :class:`Tensor` is written in place when the output's shape is
                static (a dynamic result is copied in, its shape set); ``None`` lets the
                runtime allocate a Tensor charged to this model. A :class:`TensorSet` gets
                the outputs it lacks added.
            deadline: a ``time.monotonic()`` time by which the result is wanted: past it,
                a request not started is not run and one running is stopped where the
                engine can (TIMEOUT), as :meth:`run_async`'s ``deadline``. It runs in this
                thread all the same when an instance is free.
            cancel: a token whose ``cancel()`` (from any thread) drops the request if it
                waits and stops it where the engine can if it runs: ``CancelledError``,
                counted ``CANCELLED``. The daemon cancels when a gRPC client goes away.
            output_names: only these outputs (distinct names), returned in this order, as
                ONNX Runtime's ``session.run(output_names, feed)``; a one-node model asks
                its engine for those alone where the engine can (onnxruntime fetches only
                those, though it runs every node, as ORT's own session does), others keep
                those of every output computed. ``outputs=`` may give buffers for these
                names only, in a dict. Default: every output.
            binding: what a bound :class:`Request` passes (its inputs and outputs checked
                and bound already: none of the checks run); not for direct use, with
                neither ``deadline``, ``cancel`` nor ``output_names``.

        Returns:
            ``{output name: array}``; with ``outputs=``, the arrays and Tensors given (and
            allocated) in their place; for a TensorSet, the set.

        Raises:
            InvalidInputError: (EXEC_BAD_INPUT) naming the input, expected and given; or
                an ``output_names`` entry the model has no output of, naming its outputs.
            InvalidHandleError: the model was unloaded.
            ClosedError: its runtime was closed.
            ExecutionError: the engine failed.
            DeadlineExceededError: (TIMEOUT) the ``deadline`` passed.
        """
        arrived = perf_counter_ns()
        statistics = self._statistics
        statistics.arrived()
        try:
            if self._refusal is not None:
                raise self._refusal[0](self._refusal[1])
            names = None if output_names is None else self._wanted(output_names, outputs)
            feed = self._checker.checked_feed(inputs) if binding is None else binding.feed
            ready = perf_counter_ns()
            if self._line.waiting:
                # Others wait for an instance: in line behind them. Taking the one just given
                # back would let a caller in a loop keep it for good (another thread's call
                # waited 2-3 s, the whole run, with 2 callers on one instance).
                raise IndexError
            inst, started = self._take(), ready
        except IndexError:  # every instance busy
            if deadline is not None or cancel is not None or self._batching is not None:
                # In the queue like run_async: there its deadline or token resolve it while
                # it waits, and batches form.
                return self._queued(feed, outputs, arrived, ready, deadline, cancel, names)
            inst = self._in_line()
            started = perf_counter_ns()
        except BaseException as exc:
            statistics.failed(exc)
            raise
        try:
            if pinning.marked and CALLER.moves and CALLER.cpus is not inst.pin:  # opted in
                CALLER.follow(inst.pin)  # computes on the instance's CPUs (cores/pinning.py)
            if names is not None or deadline is not None or cancel is not None:
                result = self._calling.run_on(inst, feed, outputs, names, binding, deadline, cancel)
            elif outputs is None or (not outputs and type(outputs) is dict):
                result = inst.run_checked(feed)  # the common case: the program, or its wrappers
            elif binding is not None:  # a bound request (outputs given, bound in place)
                binding.call_on(inst, self._direct)()
                result = dict(outputs)
            else:  # outputs=: written into them (no more call than this on these paths)
                result = self._binder.run(inst.run_checked, feed, outputs)
        except BaseException as exc:
            statistics.failed(exc)
            self._mapped(exc, inst, binding is not None)
            raise
        finally:
            self._give(inst)
            if self._line.waiting:  # others are in line for an instance: the first gets it
                self._line.hand_over()
        done = perf_counter_ns()  # Statistics.succeeded, inlined: this is the hottest path
        statistics.record(
            (done, arrived, started - ready, ready - arrived, done - started, inst.index)
        )
        if len(statistics.pending) > SUM_AT:
            statistics.sum()
        return result

    def _in_line(self) -> Instance:
        """``run()`` with every instance busy: in line for one, to run in this thread. The
        thread giving one back hands it over, one hand-off instead of two through a worker
        (8 threads on the tiny model: p99 0.42-0.46 ms against 2.4-2.6 ms through the
        queue)."""
        waited = self._line.take_in_turn()
        if waited is None:  # the model closed meanwhile
            error = self._scheduler.closing_error()
            self._statistics.failed(error)
            raise error from None
        return waited

    def _mapped(self, exc: BaseException, inst: Instance, bound: bool) -> None:
        """Raise what ``run()`` raises for ``exc`` raised on ``inst`` where that is not
        ``exc`` itself: the model's reason when it was unloaded or closed meanwhile, a
        driver's own error mapped (the program is called unguarded)."""
        if not isinstance(exc, Exception):
            return
        if self._released is not None:  # unloaded or closed while running
            raise self._released[0](self._released[1]) from None
        if not isinstance(exc, CrossrtError | CancelledError):  # a driver's, unguarded
            raise program_error(inst.programs[0], exc, "a bound call" if bound else "run") from exc

    def _wanted(self, output_names: Any, outputs: Any) -> tuple[str, ...]:
        """``output_names`` checked (:func:`output_names_checked`), once per selection a
        caller makes without ``outputs=``."""
        names = tuple(output_names) if isinstance(output_names, list | tuple) else ()
        try:
            if outputs is None and names in self._checked_names:
                return names
        except TypeError:  # an unhashable entry: refused below
            pass
        names = output_names_checked(self.name, self._output_names, output_names, outputs)
        if len(self._checked_names) < 64:  # a caller's few selections, not every one
            self._checked_names.add(names)
        return names

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs ``run`` returns."""
        return self.executable.outputs

    def statistics(self) -> ModelStatistics:
        """This model's request statistics since it was loaded: counts by outcome, time
        queued, checking inputs, running and handing outputs back, the latency histogram and
        its percentiles, per instance runs (``docs/statistics.md``)."""
        return self._statistics.snapshot()

    def request(self, inputs: Any = None, outputs: Mapping[str, Any] | None = None) -> Request:
        """A :class:`Request` with its inputs (and outputs) bound once, to run many times
        (``OH_NNExecutor``, ``bmruntime::Network``, ORT's IOBinding, OpenVINO's
        ``InferRequest``): see :class:`Request` for when its runs skip the checks."""
        return Request(self, self._checker, self._bind, inputs, outputs)

    def _bind(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> Binding | None:
        """A bound request's :class:`Binding`, checked now (``None``: it cannot be bound)."""
        return self._binder.bind(inputs, self._checker.checked_feed(inputs), outputs)


def statistics_of(model: Running) -> Statistics:
    """``model``'s statistics recorder itself, for the observing room: a profile taps it
    (``profiler.py``); users read :meth:`Running.statistics`."""
    return model._statistics


def instances_of(model: Running) -> tuple[Instance, ...]:
    """``model``'s instances themselves, for the observing room: a profile traces their nodes
    (``profiler.py``); users read ``model.instances``."""
    return model._instances
