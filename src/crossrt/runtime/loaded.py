"""A model staged on a device: ``LoadedModel`` (nrt_model_t, bmruntime::Network)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..compiler import Executable
from ..drivers import DeviceInfo, Program, get_driver
from ..drivers.base import CancelToken
from ..errors import (
    ClosedError,
    DeadlineExceededError,
    InvalidArgumentError,
    InvalidHandleError,
    OperationForbiddenError,
)
from ..model import TensorSpec
from . import watchdog
from .binding import OutputBinder
from .inputs import InputChecker
from .memory.allocator import Allocator, OwnerStats, device_allocator
from .memory.tensorset import TensorSet
from .memory.transfer import (
    ResidentProgram,
    Transfers,
    TransferStats,
    release_made,
    to_host_results,
)
from .numerics import checking
from .scheduler import Instance, Scheduler
from .serving import ConcurrentRuns
from .shapes import DimRange, declared_ranges

if TYPE_CHECKING:
    from .cores.groups import CoreGroup
    from .runtime import Runtime

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


class LoadedModel(ConcurrentRuns):
    """An :class:`Executable` loaded on a device's cores, ready to run.

    Created by :meth:`Runtime.load`. ``run`` may be called from several threads at once: it
    runs in the caller's thread on an idle instance, or waits in the model's queue. For
    queued runs see :meth:`run_async` and :meth:`infer`; for instances, the queue, core
    groups (:meth:`start`, :meth:`stop`), timeouts and pipelining, ``docs/concurrency.md``.

    Attributes:
        memory_owner: the key its memory is charged to in the allocator statistics.
    """

    def __init__(
        self,
        runtime: Runtime,
        executable: Executable,
        instances: Sequence[Instance],
        device: DeviceInfo,
        cores: tuple[int, ...],
        group: CoreGroup,
        *,
        queue_depth: int | None = None,
        exec_timeout: float | None = None,
        check_numerics: bool = False,
    ) -> None:
        self.executable = executable
        self.device = device
        self.cores = cores
        self.group = group
        self.check_numerics = check_numerics
        self._runtime = runtime
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
        for inst in self._instances:
            inst.call = self._inline(inst)
        # Whether run() calls a program with nothing around it (_inline): then a repeated bound
        # call goes straight into the program's own binding (Binding.call_on).
        self._direct = all(inst.call == inst.programs[0].run for inst in self._instances)
        self._output_names = tuple(s.name for s in executable.outputs)
        self.memory_owner = f"{executable.name}#{next(_serial)}"
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
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentError(f"queue_depth={queue_depth!r}: give a whole number >= 1")
        self._scheduler = Scheduler(executable.name, instances, self._finish, depth, exec_timeout)
        # A model never unloaded stops its workers when collected; at exit, daemon workers
        # just end (joining them could hold the exit up behind a long run).
        weakref.finalize(self, self._scheduler.close).atexit = False
        self._take = self._scheduler.idle.pop  # run() takes an instance without blocking
        self._give = self._scheduler.idle.append

    def _inline(self, inst: Instance) -> Callable[..., dict[str, np.ndarray]]:
        """What ``run()`` calls on an instance it holds: the program itself when nothing is
        added, so the common case costs no extra Python call."""
        execute: Callable[..., dict[str, np.ndarray]]
        if len(inst.programs) == 1 and self._exec_timeout is None:
            execute = inst.programs[0].run
        elif self._exec_timeout is None:
            execute = inst.execute
        else:
            execute = _timed(self.name, inst, self._exec_timeout)
        if self._resident:
            execute = _on_host(execute, self.transfers)
        if self.check_numerics:
            execute = checking(self.name, execute)
        return _recording(execute, self._last) if self._record_shapes else execute

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
    def name(self) -> str:
        """The model's name."""
        return self.executable.name

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
    def run(self, inputs: Any, outputs: None = None) -> dict[str, np.ndarray]: ...

    @overload
    def run(self, inputs: Any, outputs: TensorSet) -> TensorSet: ...

    @overload
    def run(self, inputs: Any, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @overload
    def run(self, inputs: Any, outputs: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def run(self, inputs: Any, outputs: Mapping[str, Any] | None = None) -> Any:
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

        Returns:
            ``{output name: array}``; with ``outputs=``, the arrays and Tensors given (and
            allocated) in their place; for a TensorSet, the set.

        Raises:
            InvalidInputError: (EXEC_BAD_INPUT) naming the input, expected and given.
            InvalidHandleError: the model was unloaded.
            ClosedError: its runtime was closed.
            ExecutionError: the engine failed.
        """
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        # The same inputs and output tensors as the last bound call, unchanged: checked then.
        checked = None if outputs is None else self._binder.reuse(inputs, outputs)
        feed = self._checker.check(inputs) if checked is None else checked.feed
        try:
            inst = self._take()
        except IndexError:  # every instance busy: wait in the queue like run_async
            future = self._scheduler.submit(feed, outputs, block=True, timeout=None, deadline=None)
            return future.result()
        try:
            if checked is not None:
                assert outputs is not None  # reuse() finds no call without them
                checked.call_on(inst, self._direct)()
                return dict(outputs)  # each output is a tensor bound in place
            if outputs is None or (not outputs and type(outputs) is dict):
                return inst.call(feed)
            return self._binder.run(inst.call, feed, outputs, inputs)
        except Exception:
            if self._released is not None:  # unloaded or closed while running
                raise self._released[0](self._released[1]) from None
            raise
        finally:
            self._give(inst)
            if self._scheduler.waiting:  # a worker took a request and waits for an instance
                self._scheduler.wake()

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

    def unload(self) -> None:
        """Release the model (nrt_unload). Later calls raise INVALID_HANDLE."""
        self._release(InvalidHandleError, f"model {self.name!r} was unloaded; load it again")
        self._runtime._forget(self)

    def _release(self, error: type[Exception], message: str) -> None:
        with self._lock:
            if self._released is not None:
                return
            self._released = self._refusal = (error, message)
            programs, self._programs = self._programs, []
        self._scheduler.close()
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


def _on_host(
    execute: Callable[..., dict[str, Any]], transfers: Transfers
) -> Callable[..., dict[str, Any]]:
    """``execute``, with the device results of a plain run (no ``outputs=``) copied to the
    host: a plain ``run()`` returns host arrays."""

    def run(feed: dict[str, Any], outputs: Any = None, *rest: Any) -> dict[str, Any]:
        result = execute(feed, outputs, *rest) if outputs is not None else execute(feed)
        return to_host_results(result, transfers) if outputs is None else result

    return run


def _recording(
    execute: Callable[..., dict[str, np.ndarray]], last: threading.local
) -> Callable[..., dict[str, np.ndarray]]:
    """``execute``, keeping each run's output shapes for ``output_shapes`` in ``last``."""

    def run(*args: Any) -> dict[str, np.ndarray]:
        result = execute(*args)
        last.shapes = {name: getattr(v, "shape", None) for name, v in result.items()}
        return result

    return run


def _timed(name: str, inst: Instance, limit: float) -> Callable[..., dict[str, np.ndarray]]:
    """``inst.execute`` stopped by the watchdog after ``limit`` seconds (TIMEOUT)."""

    def run(feed: dict[str, Any], outputs: Any = None) -> dict[str, np.ndarray]:
        token = CancelToken()
        end = time.monotonic() + limit
        watchdog.watch(token, end)
        try:
            result = inst.execute(feed, outputs, token)
        finally:
            expired = watchdog.finish(token)
        if expired or time.monotonic() > end:
            release_made(result, outputs)  # device results nobody will receive
            raise DeadlineExceededError(
                f"model {name!r}: the run took longer than its execution timeout of {limit} s; "
                "raise exec_timeout (or CROSSRT_EXEC_TIMEOUT) or give the model more cores",
                details={"model": name, "exec_timeout": limit},
            )
        return result

    return run
