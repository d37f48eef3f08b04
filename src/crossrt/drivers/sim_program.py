"""The ``sim`` driver's program: a host engine's program computing on simulated device memory.

A device program reads its inputs where they lie in device memory and writes its outputs
there; the host never sees them unless someone copies them out. The simulation keeps that
shape: inputs are NumPy views of the device buffers (no copy, read-only), outputs are views
of buffers allocated on the device, and the host engine computes from the former into the
latter. Only an output whose shape is known after the run (a dynamic one) is copied into a
device buffer afterwards, as a device writes a result whose size it learns while computing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidHandleError, InvalidInputError
from ..model.spec import TensorSpec
from .base import CancelToken, DeviceArray, DeviceInfo, Program, Residence
from .sim_memory import DeviceMemory

if TYPE_CHECKING:
    from .sim_artifact import Header


class SimProgram(Program):
    """A host engine's program staged on a simulated device; ``run`` is thread-safe when the
    engine's is.

    Args:
        memory: the device's memory.
        spend_compute: the latency model's wait for a number of operators
            (``SimDriver.spend_compute``).
        device: the device the program is staged on.
        host: the host engine's program, which computes.
        header: the sim artifact's header (the model's inputs and outputs, its operators).
    """

    def __init__(
        self,
        memory: DeviceMemory,
        spend_compute: Callable[[int, CancelToken | None], None],
        device: DeviceInfo,
        host: Program,
        header: Header,
    ) -> None:
        self.device = device
        self._spend_compute = spend_compute
        self._host = host
        self._memory = memory
        self._ops = header.ops
        # Tensors of fixed-size elements live in device memory. Strings (no fixed size) and
        # values that are not tensors (sequences, maps) stay on the host and pass as they are.
        self._inputs = _on_device(header.inputs)
        self._outputs = _on_device(header.outputs)

    def residence(self) -> Mapping[str, Residence]:
        return {name: Residence.DEVICE for name in (*self._inputs, *self._outputs)}

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run on device inputs (:class:`DeviceArray` on this device), into the device
        outputs given or into new buffers on this device, which the caller then owns."""
        return self._execute(inputs, outputs, None)

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._execute(inputs, outputs, cancel)

    def bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Callable[[], dict[str, Any]]:
        """Prepare once the views of the device buffers; each call only computes.

        Outputs not given whose shape is fixed are allocated on the device here, once: every
        call returns the same :class:`DeviceArray` values, overwritten. They belong to the
        binding and are freed when the call is dropped (unless freed before). An output of
        dynamic shape gets a new buffer on each call, which the caller owns as after ``run``.
        """
        feed = self._feed(inputs)
        targets, made = self._targets(outputs)
        try:
            call = self._host.bind(feed, self._views(targets))
        except BaseException:
            _free_live(self._memory, made)
            raise
        bound = _BoundCall(self, call, targets)
        weakref.finalize(bound, _free_live, self._memory, made)
        return bound

    def close(self) -> None:
        self._host.close()

    # -- between device memory and the host engine -------------------------------------------

    def _execute(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        cancel: CancelToken | None,
    ) -> dict[str, Any]:
        feed = self._feed(inputs)
        targets, made = self._targets(outputs)
        try:
            self._spend_compute(self._ops, cancel)
            views = self._views(targets)
            if cancel is None:
                results = self._host.run(feed, views)
            else:
                results = self._host.run_cancellable(feed, cancel, views)
            return self._collect(results, targets)
        except BaseException:
            _free_live(self._memory, made)  # a failed run leaves no buffer behind
            raise

    def _feed(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs as the engine takes them: device tensors as read-only views."""
        return {
            name: self._view(value, "input", name) if name in self._inputs else value
            for name, value in inputs.items()
        }

    def _targets(
        self, outputs: Mapping[str, Any] | None
    ) -> tuple[dict[str, DeviceArray], list[Any]]:
        """Where each device output goes: the caller's buffer, or one allocated now for an
        output of fixed shape; and the buffers allocated now."""
        targets: dict[str, DeviceArray] = {}
        for name, array in (outputs or {}).items():
            targets[name] = self._checked_target(name, array)
        made: list[Any] = []
        try:
            for name, spec in self._outputs.items():
                if name not in targets and spec.is_static and spec.dtype is not None:
                    shape = tuple(d for d in spec.shape or () if isinstance(d, int))
                    targets[name] = self._allocate(spec.dtype.numpy, shape)
                    made.append(targets[name].buffer)
        except BaseException:
            _free_live(self._memory, made)
            raise
        return targets, made

    def _checked_target(self, name: str, value: Any) -> DeviceArray:
        spec = self._outputs.get(name)
        if spec is None:
            raise InvalidInputError(
                f"output {name!r} is not a device output of this program; its device outputs "
                f"are {', '.join(self._outputs) or 'none'}",
                details={"output": name, "device": self.device.id},
            )
        array = self._device_array(value, "output", name)
        assert spec.dtype is not None  # _on_device keeps typed tensors only
        if array.dtype != spec.dtype.numpy or (spec.is_static and spec.shape != array.shape):
            raise InvalidInputError(
                f"output {name!r} is {spec.describe()}, but the buffer given for it is "
                f"{array.dtype} {list(array.shape)}; pass one of that dtype and shape, or none "
                "to receive the result",
                details={"output": name, "device": self.device.id},
            )
        self._view(array, "output", name)  # live, and large enough
        return array

    def _views(self, targets: Mapping[str, DeviceArray]) -> dict[str, np.ndarray] | None:
        views = {name: self._view(a, "output", name, writable=True) for name, a in targets.items()}
        return views or None

    def _view(self, value: Any, usage: str, name: str, writable: bool = False) -> np.ndarray:
        """The NumPy view of a device tensor's bytes, as the device itself reads them."""
        array = self._device_array(value, usage, name)
        raw = self._memory.region(array.buffer, array.offset, array.nbytes, f"{usage} {name!r}")
        view = raw.view(array.dtype).reshape(array.shape)
        view.flags.writeable = writable  # the device reads its inputs, never writes them
        return view

    def _device_array(self, value: Any, usage: str, name: str) -> DeviceArray:
        """``value``, checked to be a tensor in this device's memory."""
        here = self.device.id
        if not isinstance(value, DeviceArray):
            raise InvalidInputError(
                f"{usage} {name!r} is a {type(value).__name__}, but the program on {here} "
                "takes it in device memory (Program.residence: DEVICE); copy it to the device "
                "with the driver's allocate and copy_in, or run through a LoadedModel",
                details={usage: name, "device": here},
            )
        if value.device != here:
            raise InvalidInputError(
                f"{usage} {name!r} lies in the memory of {value.device}, but the program runs "
                f"on {here}; copy it to {here} through the host, or with copy_device between "
                "linked devices",
                details={usage: name, "device": value.device, "expected_device": here},
            )
        return value

    def _collect(
        self, results: Mapping[str, Any], targets: Mapping[str, DeviceArray]
    ) -> dict[str, Any]:
        """The engine's results as the program returns them: device outputs as DeviceArrays."""
        collected: dict[str, Any] = {}
        for name, value in results.items():
            if name in targets:  # the engine wrote into the device buffer
                collected[name] = targets[name]
            elif name in self._outputs:  # a dynamic shape, known only now
                array = np.ascontiguousarray(value)
                target = self._allocate(array.dtype, array.shape)
                raw = self._memory.region(target.buffer, 0, target.nbytes, "run")
                raw[:] = array.reshape(-1).view(np.uint8)
                collected[name] = target
            else:
                collected[name] = value
        return collected

    def _allocate(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> DeviceArray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return DeviceArray(self._memory.allocate(nbytes), self.device.id, dtype, shape)


class _BoundCall:
    """A run prepared by :meth:`SimProgram.bind`: compute, then hand back the device outputs."""

    __slots__ = ("__weakref__", "_call", "_program", "_targets")

    def __init__(
        self,
        program: SimProgram,
        call: Callable[[], dict[str, Any]],
        targets: dict[str, DeviceArray],
    ) -> None:
        self._program = program
        self._call = call
        self._targets = targets

    def __call__(self) -> dict[str, Any]:
        program = self._program
        program._spend_compute(program._ops, None)
        return program._collect(self._call(), self._targets)


def _on_device(specs: tuple[TensorSpec, ...]) -> dict[str, TensorSpec]:
    return {
        spec.name: spec
        for spec in specs
        if spec.kind == "tensor" and spec.dtype is not None and spec.dtype.numpy.kind not in "OUS"
    }


def _free_live(memory: DeviceMemory, buffers: list[Any]) -> None:
    """Free the buffers no one has freed yet (a caller may have taken one over)."""
    for buffer in buffers:
        if not buffer.freed:
            with contextlib.suppress(InvalidHandleError):  # freed meanwhile by its taker
                memory.free(buffer)
