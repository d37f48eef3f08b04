"""A model staged on a device: ``LoadedModel`` (nrt_model_t, bmruntime::Network)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compiler import Executable
from ..drivers import DeviceInfo, Program
from ..errors import ClosedError, InvalidHandleError
from ..model import TensorSpec
from .inputs import InputChecker

if TYPE_CHECKING:
    from .runtime import Runtime


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
        self._execute: Callable[..., dict[str, np.ndarray]] = (
            programs[0].run if len(programs) == 1 else self._walk
        )
        self._steps = [
            (node.inputs, program.run)
            for node, program in zip(executable.nodes, programs, strict=True)
        ]
        self._output_names = tuple(s.name for s in executable.outputs)

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

    def run(
        self, inputs: Any, outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model once (nrt_execute).

        Args:
            inputs: ``{name: array}``, or a list of arrays in input order (a single array
                for a one-input model). Every input is checked: name, dtype, rank and the
                static dimensions.
            outputs: optional preallocated arrays to write results into.

        Returns:
            ``{output name: array}``.

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
            if outputs:
                return execute(feed, self._checker.check_outputs(outputs, self.outputs))
            return execute(feed)
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
            result[name] = buffer
        return result

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

    def _close_from_runtime(self) -> None:
        self._release(
            ClosedError,
            f"the runtime that loaded model {self.name!r} was closed; "
            "create a new Runtime and load the model again",
        )

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "released"
        return f"LoadedModel({self.name!r}, {self.device.id}, cores={list(self.cores)}, {state})"
