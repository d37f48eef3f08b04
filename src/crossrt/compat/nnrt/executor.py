"""``OH_NNExecutor_*``: a built compilation loaded on this layer's :class:`crossrt.Runtime`
(one per process, made at the first executor), run synchronously or asynchronously."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import LoadedModel, Runtime
from ...errors import ClosedError, InvalidHandleError
from .compilation import compilation_of
from .status import OH_NN_ReturnCode, forbidden, guarded, invalid, log, status_of
from .tensors import NN_Tensor, NN_TensorDesc, tensor_of
from .types import OH_NN_Format, nn_dtype

__all__ = [
    "OH_NNExecutor",
    "OH_NNExecutor_Construct",
    "OH_NNExecutor_CreateInputTensorDesc",
    "OH_NNExecutor_CreateOutputTensorDesc",
    "OH_NNExecutor_Destroy",
    "OH_NNExecutor_GetInputCount",
    "OH_NNExecutor_GetInputDimRange",
    "OH_NNExecutor_GetOutputCount",
    "OH_NNExecutor_GetOutputShape",
    "OH_NNExecutor_RunAsync",
    "OH_NNExecutor_RunSync",
    "OH_NNExecutor_SetOnRunDone",
    "OH_NNExecutor_SetOnServiceDied",
    "runtime",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS
DIM_MAX = 2**31 - 1
"""GetInputDimRange's maximum for a dimension with no declared bound."""

_lock = threading.Lock()
_runtime: list[Runtime] = []


def runtime() -> Runtime:
    """The Runtime executors load onto (made on first use; a closed one is replaced)."""
    with _lock:
        if not _runtime or _runtime[0].closed:
            _runtime[:] = [Runtime()]
        return _runtime[0]


@dataclass(eq=False)
class OH_NNExecutor:  # the seed's name
    """A loaded model, its callbacks, and the output shapes of its last run."""

    model: LoadedModel
    on_run_done: Callable[..., Any] | None = None
    on_service_died: Callable[..., Any] | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    alive: bool = True
    v1: dict[str, dict[int, Any]] = field(
        default_factory=lambda: {"inputs": {}, "outputs": {}}
    )  # API 9's per-index bindings (legacy.py)


def executor_of(e: Any) -> OH_NNExecutor:
    """``e`` if it is a live executor."""
    if not isinstance(e, OH_NNExecutor) or not e.alive:
        raise invalid(f"{e!r} is not a live OH_NNExecutor")
    return e


@guarded("handle")
def OH_NNExecutor_Construct(compilation: Any) -> OH_NNExecutor | None:
    """An executor of a built compilation (which may be destroyed afterwards)."""
    c = compilation_of(compilation)
    if c.exe is None:
        raise forbidden("call OH_NNCompilation_Build before OH_NNExecutor_Construct")
    return OH_NNExecutor(runtime().load(c.exe))


@guarded("void")
def OH_NNExecutor_Destroy(executor: OH_NNExecutor) -> None:
    """Unload the model (C: void)."""
    e = executor_of(executor)
    e.alive = False
    e.model.unload()


@guarded("pair")
def OH_NNExecutor_GetInputCount(executor: OH_NNExecutor) -> tuple[OH_NN_ReturnCode, int | None]:
    """How many inputs."""
    return _OK, len(executor_of(executor).model.inputs)


@guarded("pair")
def OH_NNExecutor_GetOutputCount(executor: OH_NNExecutor) -> tuple[OH_NN_ReturnCode, int | None]:
    """How many outputs."""
    return _OK, len(executor_of(executor).model.outputs)


def _desc(spec: Any) -> NN_TensorDesc:
    shape = [d if isinstance(d, int) else -1 for d in spec.shape or ()]
    return NN_TensorDesc(spec.name, nn_dtype(spec.dtype), shape, OH_NN_Format.OH_NN_FORMAT_NONE)


def _spec(specs: Any, index: Any, what: str) -> Any:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs):
        raise invalid(f"{what} index {index!r}: the model has {len(specs)}")
    return specs[index]


@guarded("handle")
def OH_NNExecutor_CreateInputTensorDesc(executor: OH_NNExecutor, index: int) -> Any:
    """A new descriptor of input ``index`` (the caller destroys it)."""
    return _desc(_spec(executor_of(executor).model.inputs, index, "input"))


@guarded("handle")
def OH_NNExecutor_CreateOutputTensorDesc(executor: OH_NNExecutor, index: int) -> Any:
    """A new descriptor of output ``index`` (the caller destroys it)."""
    return _desc(_spec(executor_of(executor).model.outputs, index, "output"))


@guarded("pair")
def OH_NNExecutor_GetInputDimRange(
    executor: OH_NNExecutor, index: int
) -> tuple[OH_NN_ReturnCode, tuple[list[int], list[int]] | None]:
    """``(minInputDims, maxInputDims)`` of input ``index``; a dim without a declared
    bound has max :data:`DIM_MAX`."""
    e = executor_of(executor)
    spec = _spec(e.model.inputs, index, "input")
    ranges = e.model.tensors.dim_ranges()[spec.name]
    mins = [int(lo) for lo, _ in ranges]
    maxs = [DIM_MAX if hi is None else int(hi) for _, hi in ranges]
    return _OK, (mins, maxs)


@guarded("pair")
def OH_NNExecutor_GetOutputShape(
    executor: OH_NNExecutor, outputIndex: int
) -> tuple[OH_NN_ReturnCode, list[int] | None]:
    """The shape of output ``outputIndex`` after the last run (static ones at any time;
    dynamic ones before a run: OPERATION_FORBIDDEN)."""
    e = executor_of(executor)
    spec = _spec(e.model.outputs, outputIndex, "output")
    if spec.name in e.shapes:
        return _OK, list(e.shapes[spec.name])
    shape = e.model.tensors.output_shapes()[spec.name]
    return _OK, list(shape or ())


@guarded()
def OH_NNExecutor_SetOnRunDone(executor: OH_NNExecutor, onRunDone: Any) -> OH_NN_ReturnCode:
    """``onRunDone(userData, errCode, outputTensor, outputCount)`` after each RunAsync."""
    if not callable(onRunDone):
        raise invalid("onRunDone must be callable")
    executor_of(executor).on_run_done = onRunDone
    return _OK


@guarded()
def OH_NNExecutor_SetOnServiceDied(executor: OH_NNExecutor, onServiceDied: Any) -> OH_NN_ReturnCode:
    """``onServiceDied(userData)`` when the runtime goes away under a RunAsync (the model
    must then be built and loaded again)."""
    if not callable(onServiceDied):
        raise invalid("onServiceDied must be callable")
    executor_of(executor).on_service_died = onServiceDied
    return _OK


def _io(
    e: OH_NNExecutor, inputs: Any, n_in: Any, outputs: Any, n_out: Any
) -> tuple[dict[str, Any], list[NN_Tensor]]:
    ins, outs = e.model.inputs, e.model.outputs
    if inputs is None or outputs is None:
        raise invalid("inputTensor and outputTensor must not be NULL")
    if n_in != len(ins) or n_out != len(outs) or len(inputs) < n_in or len(outputs) < n_out:
        raise invalid(
            f"the model takes {len(ins)} inputs and {len(outs)} outputs, not {n_in} and {n_out}"
        )
    feed = {spec.name: tensor_of(t).tensor for spec, t in zip(ins, inputs, strict=False)}
    return feed, [tensor_of(t) for t in list(outputs)[:n_out]]


def _store(e: OH_NNExecutor, out: NN_Tensor, name: str, value: Any) -> None:
    """Write one result into an output tensor and record its shape."""
    arr = np.asarray(value)
    if out.tensor.shape != arr.shape:
        out.tensor.set_shape(arr.shape)
    np.copyto(out.tensor.numpy(), arr, casting="no")
    out.desc.shape = list(arr.shape)
    e.shapes[name] = tuple(arr.shape)


@guarded()
def OH_NNExecutor_RunSync(
    executor: OH_NNExecutor,
    inputTensor: Any,
    inputCount: int,
    outputTensor: Any,
    outputCount: int,
) -> OH_NN_ReturnCode:
    """Run once, the outputs written into ``outputTensor``'s shared memory."""
    e = executor_of(executor)
    feed, outs = _io(e, inputTensor, inputCount, outputTensor, outputCount)
    names = [s.name for s in e.model.outputs]
    e.model.run(feed, outputs={n: o.tensor for n, o in zip(names, outs, strict=True)})
    for name, out in zip(names, outs, strict=True):
        out.desc.shape = list(out.tensor.shape)
        e.shapes[name] = tuple(out.tensor.shape)
    return _OK


@guarded()
def OH_NNExecutor_RunAsync(
    executor: OH_NNExecutor,
    inputTensor: Any,
    inputCount: int,
    outputTensor: Any,
    outputCount: int,
    timeout: int,
    userData: Any,
) -> OH_NN_ReturnCode:
    """Queue one run and return; ``onRunDone`` gets its code and outputs. A run not done
    within ``timeout`` ms (0: no limit) is stopped and reports OH_NN_TIMEOUT with no
    outputs: results reach the output tensors only when the run succeeded."""
    e = executor_of(executor)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise invalid(f"timeout {timeout!r}: give milliseconds >= 0")
    feed, outs = _io(e, inputTensor, inputCount, outputTensor, outputCount)
    names = [s.name for s in e.model.outputs]
    deadline = time.monotonic() + timeout / 1000 if timeout else None

    def done(result: Any, user_data: Any) -> None:
        code, given = _OK, list(outputTensor)[:outputCount]
        if isinstance(result, BaseException):
            code, given = status_of(result), []
            log.error("OH_NNExecutor_RunAsync: %s (%s)", result, code.name)
            if isinstance(result, ClosedError | InvalidHandleError) and e.on_service_died:
                e.on_service_died(user_data)
        else:
            try:
                for name, out in zip(names, outs, strict=True):
                    _store(e, out, name, result[name])
            except Exception as exc:  # an output that does not fit its tensor
                code, given = status_of(exc), []
                log.error("OH_NNExecutor_RunAsync: %s (%s)", exc, code.name)
        if e.on_run_done is not None:
            e.on_run_done(user_data, code, given, len(given))

    e.model.run_async(feed, deadline=deadline, callback=done, user_data=userData)
    return _OK
