"""A compiled OpenVINO model staged on cores: runs through infer requests.

An ``InferRequest`` serves one call at a time, so the program keeps a pool of them: a call
takes an idle one (or makes one) and gives it back. Inputs are handed to OpenVINO as tensors
over the caller's memory (``shared_memory=True``: no copy), outputs are read from the
request's tensors, or written straight into the caller's buffers when given. ``bind`` keeps
one request with its tensors set once: a call is only ``infer()``.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import openvino as ov

from ...errors import DeadlineExceededError, ExecutionError, InvalidInputError
from ..base import CancelToken, Program


class OpenVinoProgram(Program):
    """One compiled model (``ov.CompiledModel``) and its pool of infer requests.

    Args:
        compiled: the compiled model.
        inputs: the model's input names, in OpenVINO's input order.
        outputs: the model's output names, in OpenVINO's output order.
    """

    def __init__(
        self, compiled: ov.CompiledModel, inputs: Sequence[str], outputs: Sequence[str]
    ) -> None:
        self._compiled: ov.CompiledModel | None = compiled
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._idle: queue.SimpleQueue[ov.InferRequest] = queue.SimpleQueue()

    def _request(self) -> ov.InferRequest:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            if self._compiled is None:
                raise ExecutionError("the openvino program was closed") from None
            return self._compiled.create_infer_request()

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        request = self._request()
        try:
            given = self._set(request, inputs, outputs)
            request.infer()
            return self._results(request, given)
        finally:
            self._idle.put(request)

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        request = self._request()
        try:
            given = self._set(request, inputs, outputs)
            request.start_async()
            cancel.on_cancel(request.cancel)
            try:
                request.wait()
            except RuntimeError as exc:
                if cancel.cancelled:
                    raise DeadlineExceededError(
                        "the run was cancelled: it took longer than the execution timeout"
                    ) from None
                raise ExecutionError(f"OpenVINO failed: {_first_line(exc)}") from None
            if cancel.cancelled:
                raise DeadlineExceededError("the run was cancelled at the execution timeout")
            return self._results(request, given)
        finally:
            self._idle.put(request)

    def bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Callable[[], dict[str, Any]]:
        request = self._request()  # the binding's own: never handed back to the pool
        given = self._set(request, inputs, outputs)

        def call() -> dict[str, Any]:
            request.infer()
            return self._results(request, given, copy=False)

        return call

    def close(self) -> None:
        self._compiled = None
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                return

    # -- tensors in and out ------------------------------------------------------------------

    def _set(
        self,
        request: ov.InferRequest,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None,
    ) -> dict[int, np.ndarray]:
        """Hand ``request`` the inputs (no copy) and the caller's output buffers it can
        write into; the latter by output index."""
        for index, name in enumerate(self._inputs):
            request.set_input_tensor(index, _tensor(name, inputs[name]))
        given: dict[int, np.ndarray] = {}
        for index, name in enumerate(self._outputs):
            buffer = (outputs or {}).get(name)
            if buffer is None:
                continue
            port = request.model_outputs[index]
            if port.get_partial_shape().is_static and tuple(port.get_shape()) == buffer.shape:
                request.set_output_tensor(index, ov.Tensor(buffer, shared_memory=True))
                given[index] = buffer
            else:
                given[index] = buffer  # shape known only after the run: copied into it
        return given

    def _results(
        self, request: ov.InferRequest, given: Mapping[int, np.ndarray], copy: bool = True
    ) -> dict[str, np.ndarray]:
        results: dict[str, np.ndarray] = {}
        for index, name in enumerate(self._outputs):
            data = request.get_output_tensor(index).data
            buffer = given.get(index)
            if buffer is not None:
                if not np.shares_memory(buffer, data):
                    if buffer.shape != data.shape or buffer.dtype != data.dtype:
                        raise ExecutionError(
                            f"output {name!r} is {data.dtype} {list(data.shape)}, the buffer "
                            f"given is {buffer.dtype} {list(buffer.shape)}"
                        )
                    buffer[...] = data
                results[name] = buffer
            else:
                # The request's memory is its own and is overwritten by its next call.
                results[name] = data.copy() if copy else data
        return results


def _tensor(name: str, value: Any) -> ov.Tensor:
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.kind in "OUS":
        raise InvalidInputError(
            f"input {name!r}: OpenVINO takes no string tensors; run the model on onnxruntime",
            details={"input": name},
        )
    return ov.Tensor(array, shared_memory=True)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
