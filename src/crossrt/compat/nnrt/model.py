"""``OH_NNModel_*``: a model built tensor by tensor and operation by operation, translated to
ONNX through :class:`crossrt.GraphBuilder` when it is finished.

Parameters are read when an operation is added (as NNRt's op builders do), so a parameter
tensor needs its type (SetTensorType) and its data (SetTensorData) first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...drivers import get_driver
from ...errors import CrossrtError
from ...model import GraphBuilder, Model
from .devices import device
from .graph import Ctx, ModelTensor, Operation
from .ops_api12 import API12_OPS, REFUSED
from .ops_basic import BASIC_OPS
from .ops_extra import EXTRA_OPS
from .ops_nn import LAYER_OPS
from .optypes import OH_NN_OperationType, OH_NN_TensorType
from .qdq import RAW_OPS, translate_quantized
from .quant import NN_QuantParam, check_quant
from .status import NNError, OH_NN_ReturnCode, forbidden, guarded, invalid
from .tensors import NN_TensorDesc, desc_of
from .types import indices, numpy_dtype

__all__ = [
    "OPS",
    "OH_NNModel",
    "OH_NNModel_AddOperation",
    "OH_NNModel_AddTensorToModel",
    "OH_NNModel_Construct",
    "OH_NNModel_Destroy",
    "OH_NNModel_Finish",
    "OH_NNModel_GetAvailableOperations",
    "OH_NNModel_SetTensorData",
    "OH_NNModel_SetTensorQuantParams",
    "OH_NNModel_SetTensorType",
    "OH_NNModel_SpecifyInputsAndOutputs",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS

OPS = {
    OH_NN_OperationType[f"OH_NN_OPS_{name}"]: spec
    for name, spec in {**BASIC_OPS, **LAYER_OPS, **EXTRA_OPS, **API12_OPS}.items()
}
"""Every operation this layer translates: (translator, inputs (min, max), outputs (min, max))."""


def _owner(tag: OH_NN_TensorType) -> tuple[str, str]:
    """The op (without OH_NN_OPS_) and attribute of a parameter tag: the longest op name the
    tag starts with (CONV2D_TRANSPOSE_STRIDES belongs to CONV2D_TRANSPOSE, not CONV2D)."""
    body = tag.name.removeprefix("OH_NN_")
    ops = [o.name.removeprefix("OH_NN_OPS_") for o in OH_NN_OperationType]
    op = max((o for o in ops if body.startswith(o + "_")), key=len)
    return op, body[len(op) + 1 :]


_PARAMS: dict[OH_NN_TensorType, tuple[str, str]] = {
    tag: _owner(tag) for tag in OH_NN_TensorType if tag is not OH_NN_TensorType.OH_NN_TENSOR
}


@dataclass(eq=False)
class OH_NNModel:  # the seed's name
    """A model under construction, then finished (``model`` holds the crossrt Model)."""

    tensors: list[ModelTensor] = field(default_factory=list)
    operations: list[Operation] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    model: Model | None = None
    alive: bool = True

    def names(self) -> list[str]:
        """ONNX names: a desc's own name where it is set and unique, else ``tensor_<i>``."""
        seen: dict[str, int] = {}
        for t in self.tensors:
            seen[t.desc.name] = seen.get(t.desc.name, 0) + 1
        return [
            t.desc.name if t.desc.name and seen[t.desc.name] == 1 else f"tensor_{i}"
            for i, t in enumerate(self.tensors)
        ]


def model_of(model: Any, *, open_: bool = False) -> OH_NNModel:
    """``model`` if live (and, with ``open_``, not finished), else the code the seed gives."""
    if not isinstance(model, OH_NNModel) or not model.alive:
        raise invalid(f"{model!r} is not a live OH_NNModel")
    if open_ and model.model is not None:
        raise forbidden("the model is finished (OH_NNModel_Finish); build a new one to change it")
    return model


def _index(model: OH_NNModel, index: Any) -> ModelTensor:
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise invalid(f"tensor index {index!r} is not a uint32")
    if not 0 <= index < len(model.tensors):
        raise invalid(f"tensor index {index} is out of range: the model has {len(model.tensors)}")
    return model.tensors[int(index)]


def OH_NNModel_Construct() -> OH_NNModel:
    """An empty model."""
    return OH_NNModel()


@guarded("void")
def OH_NNModel_Destroy(model: OH_NNModel) -> None:
    """Free the model (C: void; a bad handle is logged)."""
    model_of(model).alive = False


@guarded()
def OH_NNModel_AddTensorToModel(model: OH_NNModel, tensorDesc: NN_TensorDesc) -> OH_NN_ReturnCode:
    """Append a tensor (a copy of the desc); its index is the count of tensors before it.
    An empty shape is a scalar; -1 dims are dynamic."""
    handle = model_of(model, open_=True)
    desc = desc_of(tensorDesc).copy()
    numpy_dtype(desc.data_type)
    handle.tensors.append(ModelTensor(desc))
    return _OK


@guarded()
def OH_NNModel_SetTensorData(
    model: OH_NNModel, index: int, dataBuffer: Any, length: int | None = None
) -> OH_NN_ReturnCode:
    """Give a tensor constant data: the first ``length`` bytes of ``dataBuffer`` (any
    buffer), exactly the tensor's byte size. Not allowed on model inputs or outputs."""
    handle = model_of(model, open_=True)
    tensor = _index(handle, index)
    if index in handle.inputs or index in handle.outputs:
        raise invalid(f"tensor {index} is a model input or output: it cannot hold data")
    if dataBuffer is None:
        raise invalid("dataBuffer is NULL")
    raw = np.ascontiguousarray(dataBuffer).reshape(-1).view(np.uint8)
    size = raw.nbytes if length is None else length
    if not 0 < size <= raw.nbytes:
        raise invalid(f"length {size}: the buffer holds {raw.nbytes} bytes")
    desc = tensor.desc
    if any(d < 0 for d in desc.shape):
        raise invalid(f"tensor {index} has a dynamic shape {desc.shape}: data needs a static one")
    dtype = numpy_dtype(desc.data_type)
    need = int(np.prod(desc.shape, dtype=np.int64)) * dtype.itemsize
    if size != need:
        raise invalid(f"tensor {index} takes {need} bytes ({desc.shape} of {dtype}), not {size}")
    tensor.data = raw[:size].copy().view(dtype).reshape(desc.shape)
    return _OK


@guarded()
def OH_NNModel_SetTensorQuantParams(
    model: OH_NNModel, index: int, quantParam: NN_QuantParam
) -> OH_NN_ReturnCode:
    """Attach quantization parameters to a tensor."""
    tensor = _index(model_of(model, open_=True), index)
    if not isinstance(quantParam, NN_QuantParam) or not quantParam.alive:
        raise invalid(f"{quantParam!r} is not a live NN_QuantParam")
    if not quantParam.scales:
        raise invalid("the quantization parameters have no scales")
    quant = NN_QuantParam(
        list(quantParam.scales), list(quantParam.zero_points), list(quantParam.num_bits)
    )
    check_quant(quant, numpy_dtype(tensor.desc.data_type), tensor.desc.shape, f"tensor {index}")
    tensor.quant = quant
    return _OK


@guarded()
def OH_NNModel_SetTensorType(model: OH_NNModel, index: int, tensorType: int) -> OH_NN_ReturnCode:
    """Mark a tensor as data (OH_NN_TENSOR) or as an operation's parameter."""
    tensor = _index(model_of(model, open_=True), index)
    try:
        tensor.type = OH_NN_TensorType(tensorType)
    except ValueError:
        raise invalid(f"tensor type {tensorType!r} is not an OH_NN_TensorType") from None
    return _OK


@guarded()
def OH_NNModel_AddOperation(
    model: OH_NNModel, op: int, paramIndices: Any, inputIndices: Any, outputIndices: Any
) -> OH_NN_ReturnCode:
    """Add an operation. Its parameters must be tensors typed with this operation's
    parameter tags and holding data; omitted ones take their defaults. The input and
    output counts are checked. An operation type this layer does not translate is
    OH_NN_UNSUPPORTED."""
    handle = model_of(model, open_=True)
    try:
        kind = OH_NN_OperationType(op)
    except ValueError:
        raise invalid(f"operation type {op!r} is not an OH_NN_OperationType") from None
    if kind not in OPS:
        why = REFUSED.get(kind.name.removeprefix("OH_NN_OPS_"), "no translation yet")
        raise NNError(OH_NN_ReturnCode.OH_NN_UNSUPPORTED, f"{kind.name} is not translated: {why}")
    _, (in_lo, in_hi), (out_lo, out_hi) = OPS[kind]
    params, ins, outs = (
        indices(paramIndices, "paramIndices"),
        indices(inputIndices, "inputIndices"),
        indices(outputIndices, "outputIndices"),
    )
    short = kind.name.removeprefix("OH_NN_OPS_")
    if not in_lo <= len(ins) <= in_hi or not out_lo <= len(outs) <= out_hi:
        raise invalid(
            f"{kind.name} takes {in_lo}..{in_hi} inputs and {out_lo}..{out_hi} outputs, "
            f"not {len(ins)} and {len(outs)}"
        )
    values: dict[str, np.ndarray] = {}
    for i in params:
        tensor = _index(handle, i)
        owner = _PARAMS.get(tensor.type)
        if owner is None or owner[0] != short:
            raise invalid(f"tensor {i} ({tensor.type.name}) is not a parameter of {kind.name}")
        if tensor.data is None:
            raise invalid(f"parameter tensor {i} ({tensor.type.name}) has no data")
        values[owner[1]] = tensor.data
    for i in ins + outs:
        tensor = _index(handle, i)
        if tensor.type is not OH_NN_TensorType.OH_NN_TENSOR:
            raise invalid(f"tensor {i} is a parameter ({tensor.type.name}), not data")
    name = f"op{len(handle.operations)}_{short}"
    handle.operations.append(Operation(kind, values, ins, outs, name))
    return _OK


@guarded()
def OH_NNModel_SpecifyInputsAndOutputs(
    model: OH_NNModel, inputIndices: Any, outputIndices: Any
) -> OH_NN_ReturnCode:
    """Name the model's inputs and outputs (data tensors without constant data)."""
    handle = model_of(model, open_=True)
    ins, outs = indices(inputIndices, "inputIndices"), indices(outputIndices, "outputIndices")
    if not ins or not outs:
        raise invalid("a model needs at least one input and one output")
    for i in ins + outs:
        tensor = _index(handle, i)
        if tensor.data is not None or tensor.type is not OH_NN_TensorType.OH_NN_TENSOR:
            raise invalid(f"tensor {i} is a constant or a parameter: not an input or output")
    handle.inputs, handle.outputs = ins, outs
    return _OK


@guarded()
def OH_NNModel_Finish(model: OH_NNModel) -> OH_NN_ReturnCode:
    """Freeze the model and translate it to ONNX; later edits are OPERATION_FORBIDDEN."""
    handle = model_of(model, open_=True)
    if not handle.inputs or not handle.outputs:
        raise invalid("call OH_NNModel_SpecifyInputsAndOutputs before OH_NNModel_Finish")
    if not handle.operations:
        raise invalid("the model has no operations")
    try:
        handle.model = _translate(handle)
    except NNError:
        raise
    except (CrossrtError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise invalid(f"the model does not translate: {exc}") from None
    return _OK


def _translate(handle: OH_NNModel) -> Model:
    names = handle.names()
    b = GraphBuilder("nnrt_model")
    bound: dict[int, str] = {}
    for i in handle.inputs:
        desc = handle.tensors[i].desc
        dims = [None if d < 0 else d for d in desc.shape]
        bound[i] = b.input(names[i], numpy_dtype(desc.data_type), dims)

    def value(i: int) -> str:
        if i not in bound:
            data = handle.tensors[i].data
            if data is None:
                raise invalid(f"tensor {i} is read before an operation produces it")
            bound[i] = b.constant(data, name=names[i])
        return bound[i]

    for op in handle.operations:
        translate = OPS[op.type][0]
        if op.type.name in RAW_OPS or not any(
            handle.tensors[i].quant for i in op.inputs + op.outputs
        ):
            results = translate(Ctx(b, handle.tensors, value, op))
        else:
            results = translate_quantized(b, handle.tensors, value, op, translate)
        for i, result in zip(op.outputs, results, strict=True):
            bound[i] = result
    for i in handle.outputs:
        v = value(i)
        if v != names[i]:
            v = b.op("Identity", [v], outputs=[names[i]], name=f"output_{i}")
        b.output(v)
    return b.finish()


@guarded("pair")
def OH_NNModel_GetAvailableOperations(
    model: OH_NNModel, deviceID: int
) -> tuple[OH_NN_ReturnCode, list[bool] | None]:
    """Per operation, whether the device runs it (every ONNX node it became)."""
    handle = model_of(model)
    if handle.model is None:
        raise forbidden("call OH_NNModel_Finish first")
    info = device(deviceID)
    flags = get_driver(info.driver).supported_nodes(handle.model, info)
    nodes = handle.model.proto.graph.node
    ok = {op.name: True for op in handle.operations}
    for node, flag in zip(nodes, flags, strict=True):
        owner = node.name.split("/", 1)[0]
        if owner in ok and not flag:
            ok[owner] = False
    return _OK, [ok[op.name] for op in handle.operations]
