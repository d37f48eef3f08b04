"""An ONNX Runtime session on a GPU as a crossrt Program with device-resident tensors.

Its numeric tensor inputs and outputs live in the GPU's memory (:meth:`residence` says
DEVICE): a run takes :class:`DeviceArray` values over :class:`.gpu_memory.GpuBuffer` blocks
and binds them to the session by address (ORT's IOBinding), so nothing crosses to the host
unless the caller's data lies there, and the runtime then moves it through the driver's
memory hooks, counted. Outputs go into the device buffers given, or into new ones: allocated
here for a fixed shape, else the block ORT allocated, adopted without a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ... import dtypes
from ...errors import CrossrtError, InvalidInputError
from ..base import CancelToken, DeviceArray, Program, Residence, check_range
from .gpu_memory import GpuMemory
from .program import ORT_SEVERITY, cancellable_options, run_failure, run_options


def _numeric(type_name: str) -> np.dtype[Any] | None:
    """The NumPy dtype of an ORT tensor type name (``"tensor(float)"``), or ``None`` for a
    value that is no numeric tensor (a sequence, a map, strings)."""
    if not (type_name.startswith("tensor(") and type_name.endswith(")")):
        return None
    try:
        kind = dtypes.from_onnx(getattr(onnx.TensorProto, type_name[7:-1].upper()))
    except Exception:
        return None
    numpy = kind.numpy
    return numpy if numpy is not None and numpy.kind in "biuf" else None


class GpuProgram(Program):
    """An ORT session placed on a GPU, its tensors in the GPU's memory.

    Args:
        session: the session (CUDA provider first).
        memory: the GPU's memory.
        severity: ORT's log severity for runs.
    """

    def __init__(
        self, session: ort.InferenceSession, memory: GpuMemory, severity: int = ORT_SEVERITY[None]
    ) -> None:
        self.session = session
        self.memory = memory
        self._device = memory.device.id
        self._ort = (memory.api.ort_device, memory.index)
        self._outputs = {o.name: (_numeric(o.type), o.shape) for o in session.get_outputs()}
        self._severity = severity
        self._options = run_options(severity)
        numeric = [i.name for i in session.get_inputs() if _numeric(i.type) is not None]
        numeric += [n for n, (t, _) in self._outputs.items() if t is not None]
        self._residence = {name: Residence.DEVICE for name in numeric}

    def residence(self) -> Mapping[str, Residence]:
        return self._residence

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return self._execute(inputs, outputs, self._options, None)

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        options = cancellable_options(self._severity, cancel)
        return self._execute(inputs, outputs, options, cancel)

    def _execute(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        options: ort.RunOptions,
        cancel: CancelToken | None,
    ) -> dict[str, Any]:
        binding = self.session.io_binding()
        kind, index = self._ort
        for name, value in inputs.items():
            if isinstance(value, DeviceArray):
                binding.bind_input(
                    name, kind, index, value.dtype, list(value.shape), self._address(value, name)
                )
            else:  # a value kept in host memory (no numeric tensor): ORT copies it
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        results: dict[str, Any] = {}
        made = []
        try:
            for name, (dtype, shape) in self._outputs.items():
                given = (outputs or {}).get(name)
                if dtype is None:
                    binding.bind_output(name, "cpu")
                    continue
                if given is None and all(isinstance(d, int) for d in shape):
                    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    buffer = self.memory.allocate(nbytes, zeroed=False)  # the run writes it
                    made.append(buffer)
                    given = DeviceArray(buffer, self._device, dtype, tuple(shape))
                if given is None:
                    binding.bind_output(name, kind, index)  # ORT allocates: shape known after
                    continue
                address = self._address(given, name, dtype, usage="output")
                binding.bind_output(name, kind, index, given.dtype, list(given.shape), address)
                results[name] = given
            self.session.run_with_iobinding(binding, options)
        except Exception as exc:
            for buffer in made:
                self.memory.free(buffer)
            if isinstance(exc, CrossrtError):  # a buffer refused, the device out of memory
                raise
            raise run_failure(exc, cancel) from None
        if len(results) == len(self._outputs):  # every output in a buffer bound to it, in order
            return results
        produced = binding.get_outputs()
        for i, (name, (dtype, _)) in enumerate(self._outputs.items()):
            if name in results:
                continue
            value = produced[i]
            if dtype is None:
                results[name] = value.numpy()
                continue
            buffer = self.memory.adopt(value.data_ptr(), value.tensor_size_in_bytes(), value)
            results[name] = DeviceArray(buffer, self._device, dtype, tuple(value.shape()))
        return {name: results[name] for name in self._outputs}

    def _address(
        self,
        value: Any,
        name: str,
        dtype: np.dtype[Any] | None = None,
        usage: str = "input",
    ) -> int:
        """The device address of a :class:`DeviceArray` of this device, checked."""
        if not isinstance(value, DeviceArray):
            raise InvalidInputError(
                f"{usage} {name!r} must be a DeviceArray on {self._device}, not a "
                f"{type(value).__name__}",
                details={usage: name, "device": self._device},
            )
        buffer = self.memory.own(value.buffer, f"{usage} {name!r}")
        if dtype is not None and value.dtype != dtype:
            raise InvalidInputError(
                f"{usage} {name!r} is {dtype}, but the buffer given for it holds {value.dtype}",
                details={usage: name},
            )
        check_range(buffer.size, value.offset, value.nbytes, f"{usage} {name!r}")
        return buffer.pointer + value.offset

    def close(self) -> None:
        del self.session
