"""``IOBinding``: inputs and outputs bound by name, run with ``run_with_iobinding``.

Bound values are the arrays and :class:`crossrt.Tensor` objects of ``model.run(inputs,
outputs)``: an output bound to memory is written there, one bound without is allocated by
the runtime. A binding of every output runs as one :meth:`LoadedModel.request`, made again
when a binding changes: run again with the same objects (ORT's reason to bind), it skips the
runtime's checks and runs the engine's own binding (``docs/memory.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..runtime.memory.tensor import Tensor
from .capi.onnxruntime_pybind11_state import invalid_argument, not_implemented, translated
from .values import OrtValue, host_array

if TYPE_CHECKING:
    from ..runtime import LoadedModel
    from ..runtime.request import Request
    from .options import RunOptions


class Session(Protocol):
    """What a binding needs of an :class:`InferenceSession`."""

    _output_names: list[str]

    @property
    def model(self) -> LoadedModel: ...


class IOBinding:
    """ORT's ``IOBinding`` of a session (``session.io_binding()``)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}  # name -> array or Tensor, None: allocated
        self._results: list[OrtValue] = []
        self._request: Request | None = None  # of every output bound, made at its first run

    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        """Bind an array in host memory to input ``name``."""
        self._inputs[name] = arr_on_cpu
        self._request = None

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Any,
        buffer_ptr: int,
    ) -> None:
        """Bind the memory at ``buffer_ptr`` to input ``name`` (host memory: ``cpu``)."""
        self._inputs[name] = _memory(name, device_type, element_type, shape, buffer_ptr)
        self._request = None

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an :class:`OrtValue` (its tensor) to input ``name``."""
        self._inputs[name] = ortvalue.tensor
        self._request = None

    def bind_output(
        self,
        name: str,
        device_type: str = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Any = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind output ``name``: to the memory at ``buffer_ptr`` (host memory), or without
        memory, for the runtime to allocate on each run (``get_outputs`` then has it)."""
        if buffer_ptr is None:
            self._outputs[name] = None
            self._request = None
            return
        if element_type is None or shape is None:
            raise invalid_argument(
                f"bind_output({name!r}, buffer_ptr=...): give element_type and shape with it"
            )
        self._outputs[name] = _memory(name, device_type, element_type, shape, buffer_ptr)
        self._request = None

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind output ``name`` to an :class:`OrtValue` (its tensor), written by each run."""
        self._outputs[name] = ortvalue.tensor
        self._request = None

    def clear_binding_inputs(self) -> None:
        """Forget the bound inputs."""
        self._inputs = {}
        self._request = None

    def clear_binding_outputs(self) -> None:
        """Forget the bound outputs."""
        self._outputs = {}
        self._request = None

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: crossrt copies inputs before a run returns."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: a run returns with its outputs written."""

    def get_outputs(self) -> list[OrtValue]:
        """The bound outputs of the last run, in the order they were bound."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies, in host memory, of :meth:`get_outputs`."""
        return [np.array(value.numpy()) for value in self._results]

    def _run(self, run_options: RunOptions | None) -> None:
        names = list(self._outputs)
        if not names:
            raise invalid_argument(
                "no output is bound; bind_output() at least one before run_with_iobinding"
            )
        session = self._session
        # Every output bound: a bound request, which runs again without checking the same
        # objects again; otherwise those outputs only, checked each run.
        every = len(names) == len(session._output_names) and set(names) == set(
            session._output_names
        )
        cancel = None if run_options is None else run_options._token
        try:
            if every and cancel is None:
                if self._request is None:
                    request = session.model.request(outputs=self._outputs)
                    for name, value in self._inputs.items():  # checked as it runs
                        request.set_input(name, value)
                    self._request = request
                result = self._request.run()
            else:
                result = session.model.run(
                    self._inputs,
                    self._outputs,
                    cancel=cancel,
                    output_names=None if every else names,
                )
        except Exception as exc:
            raise translated(exc) from None
        self._results = [_value(result[n]) for n in names]


def _value(result: Any) -> OrtValue:
    if isinstance(result, Tensor):
        return OrtValue(result)
    return OrtValue(Tensor.from_buffer(np.ascontiguousarray(result)))


def _memory(name: str, device_type: str, element_type: Any, shape: Any, address: int) -> Any:
    if str(device_type).lower() != "cpu":
        raise not_implemented(
            f"binding {name!r} to {device_type} memory by address: bind an OrtValue made on the "
            "device instead (OrtValue.ortvalue_from_numpy(x, 'cuda', 0), bind_ortvalue_input)"
        )
    return host_array(address, element_type, list(shape))
