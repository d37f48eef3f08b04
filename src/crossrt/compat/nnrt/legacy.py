"""NNRt's API-9 (v1) path, deprecated since API 11 but still in the SDK: ``OH_NNModel_AddTensor``
and the bind-then-run executor (``OH_NNExecutor_SetInput`` / ``SetOutput`` / ``Run``, and the
per-index ``OH_NN_Memory`` of ``Allocate*Memory`` / ``Set*WithMemory`` / ``Destroy*Memory``).

It is the API-11 machinery underneath: ``AddTensor`` is AddTensorToModel + SetTensorType +
SetTensorQuantParams, ``OH_NN_Memory`` is a shared-memory :class:`crossrt.Tensor` (as an
NN_Tensor's), and ``Run`` is one run of the executor's :class:`crossrt.LoadedModel` with the
bound inputs, its results copied into the bound output buffers. Bindings persist across runs
(as NNRt's do), so an app may set new input data and run again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...memory import Tensor
from .executor import OH_NNExecutor, executor_of
from .model import OH_NNModel_AddTensorToModel, model_of
from .optypes import OH_NN_TensorType
from .quant import NN_QuantParam, check_quant
from .status import NNError, OH_NN_ReturnCode, guarded, invalid
from .tensors import NN_TensorDesc
from .types import OH_NN_DataType, OH_NN_Format, numpy_dtype

__all__ = [
    "OH_NNExecutor_AllocateInputMemory",
    "OH_NNExecutor_AllocateOutputMemory",
    "OH_NNExecutor_DestroyInputMemory",
    "OH_NNExecutor_DestroyOutputMemory",
    "OH_NNExecutor_Run",
    "OH_NNExecutor_SetInput",
    "OH_NNExecutor_SetInputWithMemory",
    "OH_NNExecutor_SetOutput",
    "OH_NNExecutor_SetOutputWithMemory",
    "OH_NNModel_AddTensor",
    "OH_NN_Memory",
    "OH_NN_QuantParam",
    "OH_NN_Tensor",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS


@dataclass
class OH_NN_QuantParam:  # the seed's name (API 9)
    """``OH_NN_QuantParam{quantCount, numBits, scale, zeroPoint}``."""

    quantCount: int = 0
    numBits: list[int] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    zeroPoint: list[int] = field(default_factory=list)


@dataclass
class OH_NN_Tensor:  # the seed's name (API 9)
    """``OH_NN_Tensor{dataType, dimensionCount, dimensions, quantParam, type}``;
    ``dimensionCount`` -1 means ``len(dimensions)``."""

    dataType: int = OH_NN_DataType.OH_NN_UNKNOWN
    dimensionCount: int = -1
    dimensions: list[int] | None = None
    quantParam: OH_NN_QuantParam | None = None
    type: int = OH_NN_TensorType.OH_NN_TENSOR


@dataclass(eq=False)
class OH_NN_Memory:  # the seed's name (API 9)
    """``OH_NN_Memory{data, length}``: ``data`` is a writable uint8 NumPy view of
    ``length`` bytes of shared memory (C's ``void *const``)."""

    data: np.ndarray
    length: int
    tensor: Tensor = field(repr=False)
    executor: Any = field(repr=False, default=None)
    index: int = 0
    is_input: bool = True
    alive: bool = True


def _dims(tensor: Any) -> tuple[np.dtype[Any], list[int]]:
    """The dtype and dims of an OH_NN_Tensor (INVALID_PARAMETER when malformed)."""
    if not isinstance(tensor, OH_NN_Tensor):
        raise invalid(f"{tensor!r} is not an OH_NN_Tensor")
    dims = list(tensor.dimensions or [])
    count = len(dims) if tensor.dimensionCount == -1 else tensor.dimensionCount
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(dims):
        raise invalid(f"dimensionCount {count!r} but {len(dims)} dimensions")
    dims = dims[:count]
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or not -1 <= d < 2**31:
            raise invalid(f"dimension {d!r} is not an int32 >= -1")
    return numpy_dtype(tensor.dataType), [int(d) for d in dims]


@guarded()
def OH_NNModel_AddTensor(model: Any, tensor: OH_NN_Tensor) -> OH_NN_ReturnCode:
    """Append a tensor described by an ``OH_NN_Tensor`` (API 9): its data type, dims, type
    tag and quantization parameters at once. Its index is the count of tensors before it."""
    handle = model_of(model, open_=True)
    dtype, dims = _dims(tensor)
    try:
        tag = OH_NN_TensorType(tensor.type)
    except ValueError:
        raise invalid(f"tensor type {tensor.type!r} is not an OH_NN_TensorType") from None
    quant = None
    q = tensor.quantParam
    if q is not None:
        if not isinstance(q, OH_NN_QuantParam) or q.quantCount <= 0:
            raise invalid("quantParam needs quantCount > 0 (or pass None)")
        n = q.quantCount
        if min(len(q.scale), len(q.zeroPoint), len(q.numBits)) < n:
            raise invalid(f"quantCount {n}: scale, zeroPoint and numBits need {n} entries each")
        quant = NN_QuantParam(list(q.scale[:n]), list(q.zeroPoint[:n]), list(q.numBits[:n]))
        check_quant(quant, dtype, dims, f"tensor {len(handle.tensors)}")
    desc = NN_TensorDesc("", OH_NN_DataType(tensor.dataType), dims, OH_NN_Format.OH_NN_FORMAT_NONE)
    code = OH_NNModel_AddTensorToModel(handle, desc)
    if code != _OK:
        raise NNError(code, "the tensor was refused (see the log above)")
    added = handle.tensors[-1]
    added.type, added.quant = tag, quant
    return _OK


# -- the v1 executor: bind per index, then Run --------------------------------------------------


def _state(e: OH_NNExecutor) -> dict[str, dict[int, Any]]:
    """The executor's API-9 bindings: index -> array (or a bound memory) per side."""
    return e.v1


def _index(specs: Any, index: Any, what: str) -> Any:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs):
        raise invalid(f"{what} index {index!r}: the model has {len(specs)}")
    return specs[index]


def _input_shape(e: OH_NNExecutor, index: int, tensor: Any) -> tuple[np.dtype[Any], list[int]]:
    """The dtype and shape an OH_NN_Tensor gives input ``index``, checked against the model."""
    spec = _index(e.model.inputs, index, "input")
    dtype, dims = _dims(tensor)
    want = np.dtype(getattr(spec.dtype, "numpy", spec.dtype))
    if dtype != want:
        raise invalid(f"input {index} ({spec.name}) is {want}, not {dtype}")
    declared = list(spec.shape or ())
    if len(dims) != len(declared) or any(
        d < 0 or (isinstance(s, int) and s >= 0 and s != d)
        for d, s in zip(dims, declared, strict=True)
    ):
        raise invalid(f"input {index} ({spec.name}) has shape {declared}, not {dims}")
    return dtype, dims


def _bytes(buffer: Any, length: Any, what: str) -> np.ndarray:
    if buffer is None:
        raise invalid(f"{what} is NULL")
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise invalid(f"length {length!r}: give a positive byte count")
    try:
        raw = np.frombuffer(memoryview(buffer).cast("B"), np.uint8)
    except (TypeError, ValueError):
        raise invalid(f"{what} is not a contiguous buffer") from None
    if length > raw.nbytes:
        raise invalid(f"length {length}: {what} holds {raw.nbytes} bytes")
    return raw[:length]


@guarded()
def OH_NNExecutor_SetInput(
    executor: OH_NNExecutor, inputIndex: int, tensor: OH_NN_Tensor, dataBuffer: Any, length: int
) -> OH_NN_ReturnCode:
    """Copy ``length`` bytes of ``dataBuffer`` as input ``inputIndex``, of the dims and type
    ``tensor`` gives (a dynamic input takes any dims within its rank)."""
    e = executor_of(executor)
    dtype, dims = _input_shape(e, inputIndex, tensor)
    need = math.prod(dims) * dtype.itemsize
    raw = _bytes(dataBuffer, length, "dataBuffer")
    if length != need:
        raise invalid(f"input {inputIndex} of {dims} {dtype} takes {need} bytes, not {length}")
    _state(e)["inputs"][inputIndex] = raw.copy().view(dtype).reshape(dims)
    return _OK


@guarded()
def OH_NNExecutor_SetOutput(
    executor: OH_NNExecutor, outputIndex: int, dataBuffer: Any, length: int
) -> OH_NN_ReturnCode:
    """Bind ``dataBuffer`` (a writable buffer of ``length`` bytes) as output ``outputIndex``:
    Run writes the result there (a result longer than ``length`` fails the Run)."""
    e = executor_of(executor)
    _index(e.model.outputs, outputIndex, "output")
    raw = _bytes(dataBuffer, length, "dataBuffer")
    if not raw.flags.writeable:
        raise invalid("dataBuffer is read-only; give a bytearray or a writable array")
    _state(e)["outputs"][outputIndex] = raw
    return _OK


@guarded()
def OH_NNExecutor_Run(executor: OH_NNExecutor) -> OH_NN_ReturnCode:
    """Run with the bound inputs; each result is copied into its output's buffer and its
    shape is then what GetOutputShape gives."""
    e = executor_of(executor)
    state = _state(e)
    ins, outs = e.model.inputs, e.model.outputs
    missing = [f"input {i}" for i in range(len(ins)) if i not in state["inputs"]]
    missing += [f"output {i}" for i in range(len(outs)) if i not in state["outputs"]]
    if missing:
        raise invalid(f"{', '.join(missing)} not set; call SetInput/SetOutput (or *WithMemory)")
    feed = {}
    for i, spec in enumerate(ins):
        value = state["inputs"][i]
        feed[spec.name] = value() if callable(value) else value
    results = e.model.run(feed)
    for i, spec in enumerate(outs):
        arr = np.ascontiguousarray(results[spec.name])
        target = state["outputs"][i]
        if arr.nbytes > target.nbytes:
            raise invalid(
                f"output {i} ({spec.name}) is {arr.nbytes} bytes; its buffer holds {target.nbytes}"
            )
        target[: arr.nbytes] = arr.reshape(-1).view(np.uint8)
        e.shapes[spec.name] = tuple(arr.shape)
    return _OK


def _allocate(e: OH_NNExecutor, index: int, length: int, is_input: bool) -> OH_NN_Memory:
    specs = e.model.inputs if is_input else e.model.outputs
    _index(specs, index, "input" if is_input else "output")
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise invalid(f"length {length!r}: give a positive byte count")
    raw = Tensor.shared((length,), "uint8", name=f"{'in' if is_input else 'out'}{index}")
    return OH_NN_Memory(raw.numpy(), length, raw, e, index, is_input)


@guarded("handle")
def OH_NNExecutor_AllocateInputMemory(
    executor: OH_NNExecutor, inputIndex: int, length: int
) -> OH_NN_Memory | None:
    """``length`` bytes of shared memory for input ``inputIndex``."""
    return _allocate(executor_of(executor), inputIndex, length, True)


@guarded("handle")
def OH_NNExecutor_AllocateOutputMemory(
    executor: OH_NNExecutor, outputIndex: int, length: int
) -> OH_NN_Memory | None:
    """``length`` bytes of shared memory for output ``outputIndex``."""
    return _allocate(executor_of(executor), outputIndex, length, False)


def _memory(e: OH_NNExecutor, index: Any, memory: Any, is_input: bool) -> OH_NN_Memory:
    if not isinstance(memory, OH_NN_Memory) or not memory.alive:
        raise invalid(f"{memory!r} is not a live OH_NN_Memory")
    if memory.executor is not e or memory.index != index or memory.is_input != is_input:
        kind = "input" if is_input else "output"
        raise invalid(f"the memory was not allocated by this executor for {kind} {index!r}")
    return memory


def _destroy(executor: Any, index: Any, memory: Any, is_input: bool) -> None:
    e = executor_of(executor)
    mem = _memory(e, index, memory, is_input)
    bound = _state(e)["inputs" if is_input else "outputs"]
    held = bound.get(index)
    if held is mem.data or (isinstance(held, _MemoryInput) and held.memory is mem):
        del bound[index]  # a Run must not read freed memory
    mem.alive = False
    mem.tensor.free()


@guarded("void")
def OH_NNExecutor_DestroyInputMemory(
    executor: OH_NNExecutor, inputIndex: int, memory: OH_NN_Memory
) -> None:
    """Free input memory (C: void; takes the memory itself for C's ``OH_NN_Memory**``)."""
    _destroy(executor, inputIndex, memory, True)


@guarded("void")
def OH_NNExecutor_DestroyOutputMemory(
    executor: OH_NNExecutor, outputIndex: int, memory: OH_NN_Memory
) -> None:
    """Free output memory (C: void)."""
    _destroy(executor, outputIndex, memory, False)


@dataclass(eq=False)
class _MemoryInput:
    """A bound input memory, read at Run (the app fills it after binding)."""

    memory: OH_NN_Memory
    dtype: np.dtype[Any]
    dims: list[int]

    def __call__(self) -> np.ndarray:
        need = math.prod(self.dims) * self.dtype.itemsize
        return self.memory.data[:need].view(self.dtype).reshape(self.dims)


@guarded()
def OH_NNExecutor_SetInputWithMemory(
    executor: OH_NNExecutor, inputIndex: int, tensor: OH_NN_Tensor, memory: OH_NN_Memory
) -> OH_NN_ReturnCode:
    """Bind allocated memory as input ``inputIndex`` (no copy: Run reads it as it is then)."""
    e = executor_of(executor)
    dtype, dims = _input_shape(e, inputIndex, tensor)
    mem = _memory(e, inputIndex, memory, True)
    need = math.prod(dims) * dtype.itemsize
    if need > mem.length:
        raise invalid(f"input {inputIndex} of {dims} {dtype} takes {need} bytes, not {mem.length}")
    _state(e)["inputs"][inputIndex] = _MemoryInput(mem, dtype, dims)
    return _OK


@guarded()
def OH_NNExecutor_SetOutputWithMemory(
    executor: OH_NNExecutor, outputIndex: int, memory: OH_NN_Memory
) -> OH_NN_ReturnCode:
    """Bind allocated memory as output ``outputIndex``."""
    e = executor_of(executor)
    mem = _memory(e, outputIndex, memory, False)
    _state(e)["outputs"][outputIndex] = mem.data
    return _OK
