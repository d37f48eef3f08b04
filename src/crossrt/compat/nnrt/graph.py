"""What an operation translator sees: the model's tensors, the operation, and helpers over
the :class:`crossrt.GraphBuilder` the model is translated into."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import helper

from ...model import GraphBuilder
from .optypes import OH_NN_OperationType, OH_NN_TensorType
from .quant import NN_QuantParam
from .status import invalid
from .tensors import NN_TensorDesc
from .types import numpy_dtype

__all__ = ["Ctx", "ModelTensor", "Operation", "Translator"]


@dataclass(eq=False)
class ModelTensor:
    """A tensor added to an OH_NNModel: its desc, what it is, and its data if constant."""

    desc: NN_TensorDesc
    type: OH_NN_TensorType = OH_NN_TensorType.OH_NN_TENSOR
    data: np.ndarray | None = None
    quant: NN_QuantParam | None = None
    real: np.ndarray | None = None
    """A quantized constant's real values, for a translator that needs a constant
    (:meth:`Ctx.const`); its ``data`` stays in the graph as integers + DequantizeLinear."""


@dataclass(eq=False)
class Operation:
    """One AddOperation: the op type, its parameters (read when it was added), its input
    and output tensor indices."""

    type: OH_NN_OperationType
    params: dict[str, np.ndarray]
    inputs: list[int]
    outputs: list[int]
    name: str = field(default="")


class Ctx:
    """One operation's translation context."""

    def __init__(
        self,
        b: GraphBuilder,
        tensors: Sequence[ModelTensor],
        value: Callable[[int], str],
        op: Operation,
    ) -> None:
        self.b = b
        self.tensors = tensors
        self._value = value
        self.op = op
        self._nodes = 0

    # -- inputs ----------------------------------------------------------------------------

    def has(self, k: int) -> bool:
        """Whether the operation has an input ``k``."""
        return len(self.op.inputs) > k

    def x(self, k: int) -> str:
        """The ONNX value of input ``k``."""
        return self._value(self.op.inputs[k])

    def tensor(self, k: int) -> ModelTensor:
        """The model tensor of input ``k``."""
        return self.tensors[self.op.inputs[k]]

    def const(self, k: int) -> np.ndarray:
        """The data of input ``k``, which must be a constant (SetTensorData)."""
        data = self.tensor(k).data
        if data is None:
            data = self.tensor(k).real
        if data is None:
            raise invalid(
                f"{self.op.name}: input {k} must be constant; give it data with "
                "OH_NNModel_SetTensorData"
            )
        return data

    def shape(self, k: int) -> list[int]:
        """The declared shape of input ``k`` (-1: dynamic)."""
        return list(self.tensor(k).desc.shape)

    def static_shape(self, k: int) -> list[int]:
        """The declared shape of input ``k``, which must be static."""
        dims = self.shape(k)
        if any(d < 0 for d in dims):
            raise invalid(f"{self.op.name}: input {k} needs a static shape, not {dims}")
        return dims

    def out_dtype(self, j: int = 0) -> np.dtype[Any]:
        """The declared dtype of output ``j``."""
        return numpy_dtype(self.tensors[self.op.outputs[j]].desc.data_type)

    def out_desc(self, j: int = 0) -> NN_TensorDesc:
        """The descriptor of output ``j``."""
        return self.tensors[self.op.outputs[j]].desc

    # -- parameters ------------------------------------------------------------------------

    def p(self, attr: str) -> np.ndarray | None:
        """The parameter ``OH_NN_<OP>_<attr>``, or None when not given."""
        return self.op.params.get(attr)

    def pi(self, attr: str, default: int) -> int:
        """An int parameter."""
        v = self.p(attr)
        return default if v is None else int(v.reshape(-1)[0])

    def pf(self, attr: str, default: float) -> float:
        """A float parameter."""
        v = self.p(attr)
        return default if v is None else float(v.reshape(-1)[0])

    def pb(self, attr: str, default: bool) -> bool:
        """A bool parameter."""
        v = self.p(attr)
        return default if v is None else bool(v.reshape(-1)[0])

    def plist(self, attr: str, default: Sequence[int] | None = None) -> list[int] | None:
        """An int-array parameter."""
        v = self.p(attr)
        return (
            None
            if v is None and default is None
            else (list(default or []) if v is None else [int(i) for i in v.reshape(-1)])
        )

    # -- building ----------------------------------------------------------------------------

    def op_(
        self, op_type: str, inputs: Sequence[str | None], outputs: int = 1, **attrs: Any
    ) -> Any:
        """Add an ONNX node, named after the operation (GetAvailableOperations maps a
        driver's per-node answer back to the operation by that name)."""
        self._nodes += 1
        name = f"{self.op.name}/{self._nodes}"
        return self.b.op(op_type, inputs, outputs=outputs, name=name, **attrs)

    def i64(self, values: Any) -> str:
        """An int64 constant."""
        return self.b.constant(np.asarray(values, dtype=np.int64))

    def scalar(self, value: Any, dtype: Any) -> str:
        """A scalar constant of ``dtype``."""
        return self.b.constant(np.asarray(value, dtype=dtype))

    def cast(self, value: str, j: int = 0) -> str:
        """``value`` cast to output ``j``'s declared dtype (ops whose ONNX type is fixed)."""
        to = helper.np_dtype_to_tensor_dtype(self.out_dtype(j))
        return str(self.op_("Cast", [value], to=int(to)))

    def as_i64(self, k: int) -> str:
        """Input ``k`` as int64 (ONNX shape and index inputs): folded when constant."""
        data = self.tensor(k).data
        if data is not None:
            return self.i64(data.reshape(-1) if data.ndim else data)
        return str(self.op_("Cast", [self.x(k)], to=7))

    def fuse(self, value: str, attr: str = "ACTIVATIONTYPE") -> str:
        """Apply the fused activation (OH_NN_FuseType) of parameter ``attr``."""
        kind = self.pi(attr, 0)
        if kind == 0:
            return value
        if kind == 1:
            return str(self.op_("Relu", [value]))
        if kind == 2:
            dt = self.out_dtype()
            return str(self.op_("Clip", [value, self.scalar(0, dt), self.scalar(6, dt)]))
        raise invalid(f"{self.op.name}: activation type {kind} is not an OH_NN_FuseType")

    def nchw(self, value: str) -> str:
        """NHWC -> NCHW (NNRt's convolutions and pools take NHWC; ONNX's NCHW)."""
        return str(self.op_("Transpose", [value], perm=[0, 3, 1, 2]))

    def nhwc(self, value: str) -> str:
        """NCHW -> NHWC."""
        return str(self.op_("Transpose", [value], perm=[0, 2, 3, 1]))


Translator = Callable[[Ctx], list[str]]
"""Translates one operation; returns the ONNX values of its outputs, in order."""
