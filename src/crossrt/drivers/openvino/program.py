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

import ml_dtypes
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
        # How each output's bytes are viewed as NumPy (None: as they come), looked up once:
        # asking a tensor its type costs 0.5 µs a call.
        self._views = tuple(
            _VIEWED.get(port.get_element_type().get_type_name()) for port in compiled.outputs
        )
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
        given: dict[int, np.ndarray] = {}
        try:
            given, held = self._set(request, inputs, outputs)
            request.infer()
            del held  # the arrays the request read
            return self._results(request, given)
        finally:
            self._release(request, given)

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        request = self._request()
        given: dict[int, np.ndarray] = {}
        try:
            given, held = self._set(request, inputs, outputs)
            request.start_async()
            cancel.on_cancel(request.cancel)
            try:
                request.wait()
            except RuntimeError as exc:
                if cancel.cancelled:
                    raise DeadlineExceededError(
                        "the run was cancelled: it took longer than the execution timeout"
                    ) from None
                raise ExecutionError(f"OpenVINO failed: {first_line(exc)}") from None
            if cancel.cancelled:
                raise DeadlineExceededError("the run was cancelled at the execution timeout")
            del held
            return self._results(request, given)
        finally:
            self._release(request, given)

    def bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Callable[[], dict[str, Any]]:
        request = self._request()  # the binding's own: never handed back to the pool
        given, held = self._set(request, inputs, outputs)

        def call(_held: list[np.ndarray] = held) -> dict[str, Any]:
            # _held: kept with the call, as the request's tensors view these arrays
            request.infer()
            return self._results(request, given, copy=False)

        return call

    def _release(self, request: ov.InferRequest, given: Mapping[int, np.ndarray]) -> None:
        """Back to the pool, unless an output tensor views a caller's buffer: the next call
        would write there."""
        if not given:
            self._idle.put(request)

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
    ) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
        """Hand ``request`` the inputs (no copy) and the caller's output buffers it can
        write into. Returns those buffers by output index, and the arrays the request's
        tensors view: OpenVINO keeps no reference to them, so the caller must, until the
        request has run."""
        held = []
        for index, name in enumerate(self._inputs):
            array = _array(name, inputs[name])
            held.append(array)
            request.set_input_tensor(index, _ov_tensor(array))
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
        return given, held

    def _results(
        self, request: ov.InferRequest, given: Mapping[int, np.ndarray], copy: bool = True
    ) -> dict[str, np.ndarray]:
        results: dict[str, np.ndarray] = {}
        for index, name in enumerate(self._outputs):
            data = _numpy(request.get_output_tensor(index), self._views[index])
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


# Types NumPy knows only through ml_dtypes: OpenVINO's Python binding hands their bytes over as
# another type of the same size (bf16 as float16, float8 as uint8). Viewed back here.
_VIEWED = {
    "bf16": (ml_dtypes.bfloat16, np.uint16),
    "f8e4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
    "f8e5m2": (ml_dtypes.float8_e5m2, np.uint8),
    "f8e8m0": (ml_dtypes.float8_e8m0fnu, np.uint8),
}
_INT64_CHAR = np.dtype(np.int64).char  # "l" where long is 64 bits, else "q"
_OV_TYPES = {
    np.dtype(ml_dtypes.bfloat16): ov.Type.bf16,
    np.dtype(ml_dtypes.float8_e4m3fn): ov.Type.f8e4m3,
    np.dtype(ml_dtypes.float8_e5m2): ov.Type.f8e5m2,
    np.dtype(ml_dtypes.float8_e8m0fnu): ov.Type.f8e8m0,
}


def _ov_tensor(array: np.ndarray) -> ov.Tensor:
    """A tensor over ``array``'s memory; a copy for the types the binding cannot view."""
    ov_type = _OV_TYPES.get(array.dtype)
    if ov_type is None:
        return ov.Tensor(array, shared_memory=True)
    tensor = ov.Tensor(ov_type, list(array.shape))
    raw = _VIEWED[ov_type.get_type_name()][1]
    tensor.data.view(raw)[...] = array.view(raw)
    return tensor


def _numpy(tensor: ov.Tensor, viewed: tuple[Any, Any] | None) -> np.ndarray:
    """The tensor's data as NumPy shows the model's type (``viewed``: its entry in
    :data:`_VIEWED`, or None)."""
    if viewed is None:
        data: np.ndarray = tensor.data
        return data
    return np.asarray(tensor.data.view(viewed[1]).view(viewed[0]))


def _array(name: str, value: Any) -> np.ndarray:
    """``value`` as memory OpenVINO can view."""
    array = np.asarray(value)
    if array.dtype.char == "q" and _INT64_CHAR != "q":
        array = array.view(np.int64)  # long long: the binding knows int64 only as long
    if not (array.flags.c_contiguous and array.flags.writeable):
        # OpenVINO shares only writable, contiguous memory (it never writes an input).
        array = np.array(array, order="C")
    if array.dtype.kind in "OUS":
        raise InvalidInputError(
            f"input {name!r}: OpenVINO takes no string tensors; run the model on onnxruntime",
            details={"input": name},
        )
    return array


def first_line(exc: BaseException | str) -> str:
    """The line of an OpenVINO error that says what is wrong (its first lines name source
    files and failed checks)."""
    lines = [line.strip(" -") for line in str(exc).splitlines() if line.strip()]
    noise = ("Exception from src/", "Check '", "FrontEnd API failed", "Model wasn't", "Summary:")
    useful = [line for line in lines if not line.startswith(noise)]
    fallback = exc if isinstance(exc, str) else type(exc).__name__
    return ((useful or lines or [fallback])[0])[:300]
