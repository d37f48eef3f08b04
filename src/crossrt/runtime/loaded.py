"""A model staged on a device: ``LoadedModel`` (nrt_model_t, bmruntime::Network)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from functools import partial
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..compiler import Executable
from ..drivers import DeviceInfo, Program, get_driver, program_error
from ..drivers.base import CancelToken
from ..errors import (
    ClosedError,
    CrossrtError,
    InvalidArgumentError,
    InvalidHandleError,
    OperationForbiddenError,
)
from ..model import TensorSpec
from .batching import Batching, why_not_batchable
from .binding import OutputBinder
from .calls import on_host, recording, stoppable, timed
from .inputs import InputChecker, output_names_checked
from .memory.allocator import Allocator, OwnerStats, device_allocator
from .memory.tensorset import TensorSet
from .memory.transfer import (
    ResidentProgram,
    Transfers,
    TransferStats,
    to_host_results,
)
from .numerics import checking
from .request import Request, repeat
from .scheduler import Instance, Scheduler, late
from .shapes import DimRange, declared_ranges
from .statistics import SUM_AT, ModelStatistics, Statistics

if TYPE_CHECKING:
    from .cores.groups import CoreGroup

log = logging.getLogger("crossrt")
_serial = itertools.count(1)


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as ``nrt_get_model_tensor_info`` reports it.

    Attributes:
        name: tensor name.
        usage: ``"input"`` or ``"output"``.
        dtype: element type name (``"float32"``), or the value kind for non-tensors.
        shape: dims, with ``None`` or a symbolic name for dynamic ones.
        size: bytes for one value when the shape is static, else ``None``.
    """

    name: str
    usage: str
    dtype: str
    shape: tuple[int | str | None, ...] | None
    size: int | None


class LoadedModel:
    """An :class:`Executable` loaded on a device's cores, ready to run.

    Created by :meth:`Runtime.load`. ``run`` may be called from several threads at once: it
    runs in the caller's thread on an idle instance, waiting in line for one when all are
    busy. For
    queued runs see :meth:`run_async` and :meth:`infer`; for instances, the queue, core
    groups (:meth:`start`, :meth:`stop`), timeouts and pipelining, ``docs/concurrency.md``.

    Attributes:
        memory_owner: the key its memory is charged to in the allocator statistics.
    """

    def __init__(
        self,
        forget: Callable[[LoadedModel], None],
        executable: Executable,
        instances: Sequence[Instance],
        device: DeviceInfo,
        cores: tuple[int, ...],
        group: CoreGroup,
        *,
        queue_depth: int | None = None,
        exec_timeout: float | None = None,
        check_numerics: bool = False,
        statistics: Statistics | None = None,
        batching: Batching | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or executable.name
        """The name the model was loaded under (``Runtime.load(name=)``), else its graph's
        name: errors, ``crossrt top`` and profile traces call it so."""
        if batching is not None:
            why = why_not_batchable(
                executable.inputs,
                executable.outputs,
                len(executable.nodes),
                bool(executable.stages),
            )
            if why is not None:
                raise InvalidArgumentError(
                    f"model {self.name!r} cannot be batched: {why}; load it without max_batch_size",
                    details={"max_batch_size": batching.max_size},
                )
        self.batching = batching
        """How its queued requests are batched (``max_batch_size``); ``None``: they run one
        by one."""
        self.executable = executable
        self.device = device
        self.cores = cores
        self.group = group
        self.check_numerics = check_numerics
        self.served_as: str | None = None
        """``NAME:VERSION`` when a daemon serves this model (its repository's name for it,
        which ``crossrt top`` and ``crossrt profile`` show beside :attr:`name`)."""
        self._forget = forget  # the runtime's: it stops counting this model
        self._instances = tuple(instances)
        self._programs: list[Program] = [p for inst in instances for p in inst.programs]
        # Bytes moved between host and device memory for this model, per direction.
        self.transfers = Transfers()
        resident = [p for p in self._programs if isinstance(p, ResidentProgram)]
        for program in resident:
            program.transfers = self.transfers
        # Some program wants device memory: device tensors are handed over as they are and
        # device results are copied to the host only when the caller asks for host arrays.
        self._resident = bool(resident)
        self._checker = InputChecker(
            executable.inputs, transfers=self.transfers, keep_device=self._resident
        )
        self._released: tuple[type[Exception], str] | None = None
        # Why run() refuses now (unloaded, closed, stopped); None while it may run.
        self._refusal: tuple[type[Exception], str] | None = None
        self._lock = threading.Lock()
        # Only dynamic outputs need their shapes kept per run (static ones are known now), so
        # only their models pay for it.
        self._record_shapes = not all(s.is_static for s in executable.outputs)
        self._last = threading.local()
        self._exec_timeout = exec_timeout
        # What run() calls on the instance it took, by its index: the program itself when
        # nothing is added (see _inline).
        self._calls = [self._inline(inst) for inst in self._instances]
        # Whether run() calls a program with nothing around it (_inline): then a repeated bound
        # call goes straight into the program's own binding (Binding.call_on).
        self._direct = all(
            inst.whole(len(executable.inputs)) and call == inst.direct(len(executable.inputs))
            for call, inst in zip(self._calls, self._instances, strict=True)
        )
        # Whether run() with output_names may ask the program for those outputs alone (one
        # program reading every input, nothing but the output shapes kept around it).
        self._selectable = (
            exec_timeout is None
            and not self._resident
            and not check_numerics
            and all(inst.whole(len(executable.inputs)) for inst in self._instances)
        )
        self._output_names = tuple(s.name for s in executable.outputs)
        self._checked_names: set[tuple[str, ...]] = set()  # output_names= found valid
        # Per instance index: its program and that program's run_outputs, unguarded as
        # run() calls run (made again for a program swapped in since).
        self._run_outputs: dict[int, tuple[Program, Callable[..., dict[str, Any]]]] = {}
        self.memory_owner = f"{self.name}#{next(_serial)}"
        self._device_memory: Allocator | None = None
        self._binder = OutputBinder(
            executable.outputs,
            self._checker,
            self._allocator,
            self.memory_owner,
            self.transfers,
            self._resident,
        )
        self._dim_ranges: dict[str, tuple[DimRange, ...]] | None = None
        nodes = len(executable.nodes)
        depth = len(instances) + nodes + 1 if queue_depth is None else queue_depth
        if batching is not None and queue_depth is None:  # room for a batch per instance
            depth += batching.max_size * len(instances)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentError(f"queue_depth={queue_depth!r}: give a whole number >= 1")
        # Shape stages share their model's statistics: one model to the user.
        self._statistics = statistics or Statistics(len(instances))
        self._scheduler = Scheduler(
            self.name,
            instances,
            self._finish,
            depth,
            exec_timeout,
            self._statistics,
            batching,
        )
        # A model never unloaded stops its workers when collected; at exit, daemon workers
        # just end (joining them could hold the exit up behind a long run).
        weakref.finalize(self, self._scheduler.close).atexit = False
        self._take = self._scheduler.idle.pop  # run() takes an instance without blocking
        self._give = self._scheduler.idle.append

    def _inline(
        self, inst: Instance, deadline: float | None = None, cancel: CancelToken | None = None
    ) -> Callable[..., dict[str, np.ndarray]]:
        """What ``run()`` calls on an instance it holds: the program itself when nothing is
        added, so the common case costs no extra Python call; with a ``deadline``, the run
        stopped by the watchdog then (made per call)."""
        execute: Callable[..., dict[str, np.ndarray]]
        plain = self._exec_timeout is None and deadline is None and cancel is None
        if plain:
            execute = inst.direct(len(self.executable.inputs))  # run() maps what it raises
        elif self._exec_timeout is None and deadline is None:
            assert cancel is not None
            execute = stoppable(inst, cancel)
        else:
            execute = timed(self.name, inst, self._exec_timeout, deadline, cancel)
        if self._resident:
            execute = on_host(execute, self.transfers)
        if self.check_numerics:
            execute = checking(self.name, execute)
        return recording(execute, self._last) if self._record_shapes else execute

    def _finish(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], outputs: Any
    ) -> Any:
        """A queued request's run in a worker: outputs bound, results checked."""
        if self.check_numerics:
            execute = checking(self.name, execute)
        if outputs is None or (not outputs and type(outputs) is dict):
            result = execute(feed)
            return to_host_results(result, self.transfers) if self._resident else result
        return self._binder.run(execute, feed, outputs)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs ``run`` takes."""
        return self.executable.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs ``run`` returns."""
        return self.executable.outputs

    @property
    def loaded(self) -> bool:
        """False once unloaded (or its runtime closed)."""
        return self._released is None

    @overload
    def run(
        self,
        inputs: Any,
        outputs: None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
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
    ) -> Mapping[str, Any]: ...

    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
    ) -> Any:
        """Run the model once (nrt_execute).

        Args:
            inputs: ``{name: array or Tensor}``, a :class:`TensorSet`, or a list in input
                order (a single value for a one-input model). Every input is checked: name,
                dtype, rank and the static dimensions. Host tensors and C-contiguous arrays
                are passed to the engine without a copy. A call that passes the same
                objects as the last one with tensors for ``outputs``, none changed since,
                reuses that call's checks.
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
            # The same inputs and output tensors as the last bound call, unchanged: checked
            # then.
            checked = (
                None
                if outputs is None or deadline is not None or cancel is not None or names
                else self._binder.reuse(inputs, outputs)
            )  # fmt: skip
            feed = self._checker.check(inputs) if checked is None else checked.feed
            ready = perf_counter_ns()
            if self._scheduler.waiting:
                # Others wait for an instance: in line behind them. Taking the one just given
                # back would let a caller in a loop keep it for good (another thread's call
                # waited 2-3 s, the whole run, with 2 callers on one instance).
                raise IndexError
            inst = self._take()
            started = ready
        except IndexError:  # every instance busy
            if deadline is not None or cancel is not None or self.batching is not None:
                # In the queue like run_async: there its deadline or token resolve it while
                # it waits, and batches form.
                queued = self._queued(feed, outputs, arrived, ready, deadline, cancel)
                return queued if names is None else {n: queued[n] for n in names}
            # In line for an instance, to run in this thread: the thread giving one back
            # hands it over, one hand-off instead of two through a worker (8 threads on the
            # tiny model: p99 0.42-0.46 ms against 2.4-2.6 ms through the queue).
            waited = self._scheduler.take_in_turn()
            if waited is None:  # the model closed meanwhile
                error = self._scheduler.closing_error()
                statistics.failed(error)
                raise error from None
            inst, started = waited, perf_counter_ns()
        except BaseException as exc:
            statistics.failed(exc)
            raise
        try:
            if deadline is None and cancel is None:  # the common case: two checks, no more
                call = self._calls[inst.index]
            else:
                if deadline is not None and time.monotonic() >= deadline:
                    raise late(self.name, "its deadline passed before it could start")
                call = self._inline(inst, deadline, cancel)
            if checked is not None:
                assert outputs is not None  # reuse() finds no call without them
                checked.call_on(inst, self._calls[inst.index], self._direct)()
                result: Any = dict(outputs)  # each output is a tensor bound in place
            elif names is not None:
                result = self._selected(inst, call, feed, outputs, inputs, names)
            elif outputs is None or (not outputs and type(outputs) is dict):
                result = call(feed)
            else:
                result = self._binder.run(call, feed, outputs, inputs)
        except BaseException as exc:
            statistics.failed(exc)
            if not isinstance(exc, Exception):
                raise
            if self._released is not None:  # unloaded or closed while running
                raise self._released[0](self._released[1]) from None
            if not isinstance(exc, CrossrtError | CancelledError):  # a driver's, unguarded
                what = "run" if checked is None else "a bound call"
                raise program_error(inst.programs[0], exc, what) from exc
            raise
        finally:
            self._give(inst)
            if self._scheduler.waiting:  # others are in line for an instance: the first gets it
                self._scheduler.hand_over()
        done = perf_counter_ns()  # Statistics.succeeded, inlined: this is the hottest path
        statistics.record(
            (done, arrived, started - ready, ready - arrived, done - started, inst.index)
        )
        if len(statistics.pending) > SUM_AT:
            statistics.sum()
        return result

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

    def _selected(
        self,
        inst: Instance,
        call: Callable[..., Any],
        feed: dict[str, Any],
        outputs: Mapping[str, Any] | None,
        inputs: Any,
        names: tuple[str, ...],
    ) -> dict[str, Any]:
        """The outputs ``names`` of one run on ``inst``: asked of the program itself when
        nothing is wrapped around it (its engine may fetch or compute fewer), else every
        output computed and those kept."""
        if not outputs and self._selectable and call is self._calls[inst.index]:
            program = inst.programs[0]
            known = self._run_outputs.get(inst.index)
            if known is None or known[0] is not program:
                known = self._run_outputs[inst.index] = (program, inst.selecting())
            result = known[1](feed, names)
            if self._record_shapes:  # output_shapes() then has the outputs of this run
                self._last.shapes = {n: getattr(v, "shape", None) for n, v in result.items()}
            return result
        every = self._binder.run(call, feed, outputs, inputs) if outputs else call(feed)
        return {n: every[n] for n in names}

    def _queued(
        self,
        feed: dict[str, Any],
        outputs: Any,
        arrived: int,
        checked: int,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
    ) -> Any:
        """``run()`` when every instance is busy: in the queue, waiting for its result. An
        unload or a close fails it at once with the model's reason unless it is running."""
        self._statistics.handed_on()  # counted again by the queue, with its outcome
        future = self._scheduler.submit(
            feed,
            outputs,
            block=True,
            timeout=None,
            deadline=deadline,
            arrived=arrived,
            checked=checked,
            cancel=cancel,
        )
        try:
            return future.result()
        except Exception as exc:
            released = self._released
            if released is not None and not isinstance(exc, released[0]):
                raise released[0](released[1]) from None  # it ran as the model closed
            raise

    def output_shapes(self) -> dict[str, tuple[int, ...] | None]:
        """The output shapes of this thread's last run (``OH_NNExecutor_GetOutputShape``).

        Static outputs need no run. ``None`` for an output that is not a tensor.

        Raises:
            OperationForbiddenError: the model has dynamic outputs and this thread has not
                run it yet.
        """
        shapes = getattr(self._last, "shapes", None)
        if shapes is not None:
            return dict(shapes)
        if self._record_shapes:
            raise OperationForbiddenError(
                f"model {self.name!r} has dynamic outputs and this thread has not run it yet; "
                "their shapes are known after a run",
                details={"model": self.name},
            )
        return {s.name: tuple(d for d in s.shape or () if isinstance(d, int)) for s in self.outputs}

    def input_dim_ranges(self) -> dict[str, tuple[DimRange, ...]]:
        """Per input, ``(min, max)`` per dimension (``OH_NNExecutor_GetInputDimRange``).

        Static dimensions give ``(d, d)``; dynamic ones ``(1, None)`` unless the model
        declares ranges in its ``crossrt.dim_ranges`` metadata (see ``docs/memory.md``).
        """
        if self._dim_ranges is None:
            self._dim_ranges = declared_ranges(self.executable)
        return dict(self._dim_ranges)

    # -- memory --------------------------------------------------------------------------

    def _allocator(self) -> Allocator:
        if self._device_memory is None:
            driver = get_driver(self.device.driver)
            allocator = device_allocator(driver, self.device)
            allocator.register(self.memory_owner, f"model {self.name!r}")
            self._device_memory = allocator
        return self._device_memory

    @property
    def memory_budget(self) -> int | None:
        """Bytes this model may hold on its device (``None``: no limit)."""
        return self._allocator().budget(self.memory_owner)

    def set_memory_budget(self, nbytes: int | None) -> None:
        """Limit the memory charged to this model on its device: outputs the runtime
        allocates for it and tensors made with ``owner=model``. An allocation past the
        budget raises OutOfResourcesError (RESOURCE) naming the model."""
        self._allocator().set_budget(self.memory_owner, nbytes)

    def memory_stats(self) -> OwnerStats:
        """The memory charged to this model on its device."""
        return self._allocator().owner_stats(self.memory_owner)

    def transfer_stats(self) -> TransferStats:
        """The bytes this model's runs moved between host and device memory, per direction.

        A model whose programs take host memory moves nothing unless given device tensors; one
        on a device with its own memory (``sim``, a GPU) copies each host input in and each
        output the caller wants on the host out, and nothing for device tensors on its device.
        """
        return self.transfers.stats()

    def stats(self) -> dict[str, Any]:
        """What this model has done, as a JSON-friendly dict: ``transfers`` (bytes and copies
        per direction, see :meth:`transfer_stats`) and ``memory`` (see :meth:`memory_stats`)."""
        return {
            "model": self.name,
            "device": self.device.id,
            "transfers": self.transfers.stats().to_dict(),
            "memory": dataclasses.asdict(self.memory_stats()) if self._device_memory else None,
        }

    def tensor_info(self) -> list[TensorInfo]:
        """Inputs then outputs, with dtype, shape and byte size (nrt_get_model_tensor_info)."""
        infos = []
        for usage, specs in (("input", self.inputs), ("output", self.outputs)):
            for s in specs:
                size = None
                if s.is_static and s.dtype is not None and s.dtype.itemsize:
                    size = int(np.prod([d for d in s.shape or () if isinstance(d, int)])) * (
                        s.dtype.itemsize
                    )
                dtype = s.dtype.name if s.dtype else s.kind
                infos.append(TensorInfo(s.name, usage, dtype, s.shape, size))
        return infos

    # -- queued and asyncio runs, requests, repeats, instances, start/stop ----------------

    def run_async(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
        deadline: float | None = None,
        callback: Callable[[Any, Any], None] | None = None,
        user_data: Any = None,
    ) -> Future[Any]:
        """Queue one run; return a :class:`concurrent.futures.Future` of its result.

        Inputs are checked now, in the caller's thread; the run happens on a worker thread
        of an instance (for a multi-node executable, one stage thread per node: several
        requests are in flight at once, each on a different node). Keep the input arrays
        unchanged until the future is done: they are not copied. When the queue is full
        (``queue_depth`` requests waiting or running), the call waits for room in this
        thread: backpressure, as OpenVINO's ``AsyncInferQueue.start_async``. From asyncio,
        ``await`` :meth:`infer` instead, which waits without blocking the event loop.

        Args:
            inputs: as for :meth:`run`.
            outputs: as for :meth:`run`.
            block: when the queue is full, wait for room (default); ``False``: raise
                QUEUE_FULL at once instead.
            timeout: the most seconds to wait for room (``None``: no limit), then
                QUEUE_FULL.
            deadline: a ``time.monotonic()`` time: a request still queued then is not run,
                and one still running is stopped where the engine can; either way its
                future raises TIMEOUT.
            callback: called as ``callback(result_or_error, user_data)`` when it completes
                (``OH_NNExecutor_SetOnRunDone``), in the worker thread (or here, when it
                completed already); an exception it raises is logged.
            user_data: passed to ``callback`` as it is.

        Returns:
            A future; ``cancel()`` succeeds while the request is still queued, and a
            cancelled request never runs.

        Raises:
            OutOfResourcesError: (QUEUE_FULL) the queue is full and ``block`` is false, or
                there was no room within ``timeout``.
            InvalidInputError: as for :meth:`run`.
            OperationForbiddenError: the model is stopped.
        """
        arrived = perf_counter_ns()
        feed = self._admitted_feed(inputs)
        on_done = None if callback is None else partial(_call_back, callback, user_data)
        return self._scheduler.submit(
            feed,
            outputs,
            block=block,
            timeout=timeout,
            deadline=deadline,
            on_done=on_done,
            arrived=arrived,
            checked=perf_counter_ns(),
        )

    def _admitted_feed(self, inputs: Any) -> dict[str, Any]:
        """The checked inputs of a request for the queue; a refused one is counted failed."""
        try:
            if self._refusal is not None:
                raise self._refusal[0](self._refusal[1])
            return self._checker.check(inputs)
        except BaseException as exc:
            self._statistics.arrived()
            self._statistics.failed(exc)
            raise

    def statistics(self) -> ModelStatistics:
        """This model's request statistics since it was loaded: counts by outcome, time
        queued, checking inputs, running and handing outputs back, the latency histogram and
        its percentiles, per instance runs (``docs/statistics.md``)."""
        return self._statistics.snapshot()

    async def infer(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> Any:
        """``await model.infer(inputs)``: :meth:`run_async` for asyncio.

        When the queue is full the request waits in line for room, first come first
        admitted, and ``asyncio.gather`` of more requests than ``queue_depth`` runs them
        all. No thread waits per request, for room or for the result, and the event loop
        never blocks: a slot that frees admits the next request in line, and the worker
        resolves the awaiting task through the loop (``call_soon_threadsafe``). Cancelling
        the task cancels a request still waiting or queued.

        Args and errors are :meth:`run_async`'s, the wait for room happening in the event
        loop instead of the caller's thread.
        """
        arrived = perf_counter_ns()
        feed = self._admitted_feed(inputs)
        future = self._scheduler.submit(
            feed,
            outputs,
            block=block,
            timeout=timeout,
            deadline=deadline,
            detached=True,
            arrived=arrived,
            checked=perf_counter_ns(),
        )
        return await asyncio.wrap_future(future)

    def request(self, inputs: Any = None, outputs: Mapping[str, Any] | None = None) -> Request:
        """A :class:`Request` with its inputs (and outputs) bound once, to run many times
        (``OH_NNExecutor``, ``bmruntime::Network``)."""
        return Request(self, inputs, outputs)

    def run_repeat(
        self, inputs: Any, n: int, feedback: Mapping[str, str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run ``n`` times, each run's outputs fed back as the next run's inputs
        (``nrt_execute_repeat``); returns the last run's outputs.

        Args:
            inputs: the first run's inputs, as for :meth:`run`.
            n: how many runs.
            feedback: ``{output name: input name}``; default: outputs whose name is an
                input's name.
        """
        return repeat(self, inputs, n, feedback)

    @property
    def instance_count(self) -> int:
        """How many copies of the model run in parallel, each on its own cores."""
        return len(self._instances)

    @property
    def instance_cores(self) -> list[tuple[int, ...]]:
        """The core indices of each instance (on its device: :attr:`instance_devices`)."""
        return [inst.cores for inst in self._instances]

    @property
    def instance_devices(self) -> list[str]:
        """The device of each instance: :attr:`device`'s id, or for a load across devices
        (``Runtime.load(exe, ["sim:0", "sim:1"])``) each instance's own."""
        return [inst.device or self.device.id for inst in self._instances]

    @property
    def queue_depth(self) -> int:
        """How many :meth:`run_async` requests may be waiting or running at once."""
        return self._scheduler.depth

    @property
    def exec_timeout(self) -> float | None:
        """Seconds one run may take before it is stopped with TIMEOUT (``None``: no limit)."""
        return self._exec_timeout

    @property
    def running(self) -> bool:
        """Whether the model is started on its core group (and loaded)."""
        return self._released is None and self.group.running is self

    def start(self) -> None:
        """Make the model the one running on its core group.

        Raises:
            OperationForbiddenError: another model of the group is running; stop it first.
            InvalidHandleError: the model was unloaded.
        """
        with self._lock:
            if self._released is not None:
                raise self._released[0](self._released[1])
            self.group._start(self)
            self._refusal = None

    def stop(self) -> None:
        """Stop running the model; it stays loaded and can be started again. ``run`` then
        raises OPERATION_FORBIDDEN. Requests already queued still run."""
        with self._lock:
            if self._released is not None:
                return
            self.group._stop(self)
            self._refusal = (
                OperationForbiddenError,
                f"model {self.name!r} is stopped on its core group "
                f"{list(self.group.indices)}; call model.start() (after stopping the group's "
                "running model) to run it",
            )

    def unload(self) -> None:
        """Release the model (nrt_unload). Later calls raise INVALID_HANDLE."""
        self._release(InvalidHandleError, f"model {self.name!r} was unloaded; load it again")
        self._forget(self)

    def _release(self, error: type[Exception], message: str) -> None:
        with self._lock:
            if self._released is not None:
                return
            self._released = self._refusal = (error, message)
            programs, self._programs = self._programs, []
        self._scheduler.close(partial(error, message))
        self._binder.forget()
        for program in programs:
            program.close()
        if self._device_memory is not None:  # its stats go once its tensors are freed
            self._device_memory.forget(self.memory_owner)
        self.group._remove(self)

    def _close_from_runtime(self) -> None:
        self._release(
            ClosedError,
            f"the runtime that loaded model {self.name!r} was closed; "
            "create a new Runtime and load the model again",
        )

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "released"
        return f"LoadedModel({self.name!r}, {self.device.id}, cores={list(self.cores)}, {state})"


def _call_back(callback: Callable[[Any, Any], None], user_data: Any, future: Future[Any]) -> None:
    if future.cancelled():
        outcome: Any = CancelledError()
    else:
        outcome = future.exception() or future.result()
    try:
        callback(outcome, user_data)
    except Exception:
        log.exception("crossrt: a run_async callback raised")
