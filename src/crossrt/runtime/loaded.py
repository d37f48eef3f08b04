"""A model staged on a device: ``LoadedModel`` (nrt_model_t, bmruntime::Network)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..compiler import Executable
from ..drivers import DeviceInfo, Program, get_driver
from ..errors import ClosedError, InvalidHandleError, OperationForbiddenError
from ..model import TensorSpec
from .binding import OutputBinder
from .inputs import InputChecker
from .memory import Allocator, OwnerStats, count_copy, device_allocator
from .shapes import DimRange, declared_ranges
from .tensorset import TensorSet

if TYPE_CHECKING:
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


class LoadedModel:
    """An :class:`Executable` loaded on a device's cores, ready to run.

    Created by :meth:`Runtime.load`. ``run`` may be called from several threads at once.

    Attributes:
        memory_owner: the key its memory is charged to in the allocator statistics.
    """

    def __init__(
        self,
        runtime: Runtime,
        executable: Executable,
        programs: Sequence[Program],
        device: DeviceInfo,
        cores: tuple[int, ...],
    ) -> None:
        self.executable = executable
        self.device = device
        self.cores = cores
        self._runtime = runtime
        self._programs: list[Program] = list(programs)
        self._checker = InputChecker(executable.inputs)
        self._released: tuple[type[Exception], str] | None = None
        self._lock = threading.Lock()
        # One node: call its program directly, no graph walk on the hot path.
        execute: Callable[..., dict[str, np.ndarray]] = (
            programs[0].run if len(programs) == 1 else self._walk
        )
        # Only dynamic outputs need their shapes kept per run (static ones are known now), so
        # only their models pay for it.
        self._record_shapes = not all(s.is_static for s in executable.outputs)
        self._last = threading.local()
        self._execute = _recording(execute, self._last) if self._record_shapes else execute
        self._steps = [
            (node.inputs, program.run)
            for node, program in zip(executable.nodes, programs, strict=True)
        ]
        self._output_names = tuple(s.name for s in executable.outputs)
        self.memory_owner = f"{executable.name}#{next(_serial)}"
        self._device_memory: Allocator | None = None
        self._binder = OutputBinder(
            executable.outputs, self._checker, self._allocator, self.memory_owner
        )
        self._dim_ranges: dict[str, tuple[DimRange, ...]] | None = None

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
                are passed to the engine without a copy.
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
        execute = self._execute  # held, so an unload racing this call cannot pull it away
        if self._released is not None:
            raise self._released[0](self._released[1])
        feed = self._checker.check(inputs)
        try:
            if outputs is None or (not outputs and type(outputs) is dict):
                return execute(feed)
            return self._binder.run(execute, feed, outputs)
        except Exception:
            if self._released is not None:  # unloaded or closed while running
                raise self._released[0](self._released[1]) from None
            raise

    def _walk(
        self, feed: dict[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Run a multi-node executable: each node on its driver, tensors passed between them."""
        values = dict(feed)
        for inputs, run in self._steps:
            values.update(run({name: values[name] for name in inputs}))
        result = {name: values[name] for name in self._output_names}
        for name, buffer in (outputs or {}).items():
            np.copyto(buffer, result[name], casting="no")
            count_copy(buffer.nbytes)
            result[name] = buffer
        return result

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
            self._released = (error, message)
            programs, self._programs = self._programs, []
        for program in programs:
            program.close()
        if self._device_memory is not None:  # its stats go once its tensors are freed
            self._device_memory.forget(self.memory_owner)

    def _close_from_runtime(self) -> None:
        self._release(
            ClosedError,
            f"the runtime that loaded model {self.name!r} was closed; "
            "create a new Runtime and load the model again",
        )

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "released"
        return f"LoadedModel({self.name!r}, {self.device.id}, cores={list(self.cores)}, {state})"


def _recording(
    execute: Callable[..., dict[str, np.ndarray]], last: threading.local
) -> Callable[..., dict[str, np.ndarray]]:
    """``execute``, keeping each run's output shapes for ``output_shapes`` in ``last``."""

    def run(*args: Any) -> dict[str, np.ndarray]:
        result = execute(*args)
        last.shapes = {name: getattr(v, "shape", None) for name, v in result.items()}
        return result

    return run
