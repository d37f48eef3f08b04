"""Online model composition, in the spirit of OH_NNModel_AddTensor / AddOperation / Finish."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes
from ..errors import InvalidArgumentError, InvalidModelError, OperationForbiddenError
from .model import Model
from .spec import Dim

# Domains whose operators onnx itself defines, so an unknown name can be refused at once.
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")

DEFAULT_OPSET = 21
"""ai.onnx opset a builder uses unless told otherwise: one every driver here runs."""


class GraphBuilder:
    """Build a model one operation at a time.

    Values are named by strings: :meth:`input`, :meth:`constant` and :meth:`op` return the
    names to pass on. Operations are ONNX operator types with their attributes, so every
    operator family (and every NNRt operation) can be expressed. :meth:`finish` validates
    the graph and returns a :class:`Model`; the builder is frozen afterwards.

    Example:
        >>> b = GraphBuilder("mlp")
        >>> x = b.input("x", "float32", [None, 4])
        >>> w = b.constant(np.ones((4, 2), np.float32))
        >>> b.output(b.op("Relu", [b.op("MatMul", [x, w])]))
        >>> model = b.finish()

    Args:
        name: the graph name.
        opset: the ai.onnx opset version.
        opsets: extra operator domains and their versions, e.g. ``{"com.microsoft": 1}``.
    """

    def __init__(
        self, name: str = "model", opset: int = DEFAULT_OPSET, opsets: dict[str, int] | None = None
    ) -> None:
        self.name = name
        self._opsets = {"": opset, **(opsets or {})}
        self._inputs: list[onnx.ValueInfoProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._nodes: list[onnx.NodeProto] = []
        self._outputs: list[tuple[str, int | None, Sequence[Dim] | None]] = []
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        self._counter = 0
        self._model: Model | None = None

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` has been called."""
        return self._model is not None

    def input(self, name: str, dtype: Any, shape: Sequence[Dim]) -> str:
        """Declare a graph input. ``None`` or a string in ``shape`` marks a dynamic dim."""
        self._check_open("add an input")
        elem = dtypes.from_name(dtype).onnx if isinstance(dtype, str) else _elem(dtype)
        self._claim(name)
        self._inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def constant(self, value: Any, name: str | None = None) -> str:
        """Add a constant tensor (a weight) from a NumPy array or scalar."""
        self._check_open("add a constant")
        name = name or self._fresh("const")
        try:
            tensor = numpy_helper.from_array(np.asarray(value), name)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise InvalidArgumentError(
                f"constant {name!r}: cannot store {type(value).__name__} as an ONNX tensor "
                f"({exc}); give a NumPy array of a numeric, bool or string dtype"
            ) from None
        self._claim(name)
        self._initializers.append(tensor)
        return name

    def op(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        *,
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        domain: str = "",
        **attributes: Any,
    ) -> Any:
        """Add an operation and return its output name (a tuple of names when several).

        Args:
            op_type: the ONNX operator type (``"Conv"``, ``"TopK"``...).
            inputs: names of its inputs; ``None`` leaves an optional input out.
            outputs: how many outputs, or their names.
            name: the node name (default: generated).
            domain: the operator domain (``""`` is ai.onnx).
            **attributes: the operator's attributes; NumPy arrays become tensor attributes.
        """
        self._check_open("add an operation")
        if domain not in self._opsets:
            raise InvalidArgumentError(
                f"operator domain {domain!r} is not imported; pass opsets={{{domain!r}: N}} "
                "to GraphBuilder"
            )
        if domain in _ONNX_DOMAINS and not onnx.defs.has(op_type, domain):
            raise InvalidArgumentError(
                f"unknown operator {op_type!r} in domain {domain or 'ai.onnx'!r}; check the "
                "spelling against the ONNX operator list"
            )
        if isinstance(outputs, int):
            out_names = [self._fresh(op_type.lower()) for _ in range(outputs)]
        else:
            out_names = list(outputs)
        taken = [n for n in out_names if n in self._names]
        if taken or len(set(out_names)) != len(out_names):
            raise InvalidArgumentError(
                f"{op_type}: output names {out_names} repeat or are already used in this graph"
            )
        node_name = name or self._fresh(op_type)
        if node_name in self._node_names:
            raise InvalidArgumentError(f"a node called {node_name!r} is already in this graph")
        node = helper.make_node(
            op_type,
            ["" if i is None else i for i in inputs],
            out_names,
            name=node_name,
            domain=domain,
        )
        for key, value in attributes.items():
            if isinstance(value, np.ndarray):
                value = numpy_helper.from_array(value)
            try:
                node.attribute.append(helper.make_attribute(key, value))
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"{op_type} node {node_name!r}: attribute {key}={value!r} cannot be "
                    f"encoded in ONNX ({exc}); give a number, string, list or NumPy array"
                ) from None
        for out in out_names:
            self._claim(out)
        self._node_names.add(node_name)
        self._nodes.append(node)
        return out_names[0] if len(out_names) == 1 else tuple(out_names)

    def output(self, value: str, dtype: Any = None, shape: Sequence[Dim] | None = None) -> None:
        """Mark a value as a graph output. Its type is inferred unless given."""
        self._check_open("add an output")
        elem = (
            None
            if dtype is None
            else dtypes.from_name(dtype).onnx
            if isinstance(dtype, str)
            else _elem(dtype)
        )
        self._outputs.append((value, elem, shape))

    def finish(self) -> Model:
        """Validate the graph and return the :class:`Model`; later edits are refused."""
        self._check_open("finish the graph again")
        if not self._outputs:
            raise InvalidModelError("the graph has no outputs; call output() before finish()")
        opsets = [helper.make_opsetid(d, v) for d, v in self._opsets.items()]
        draft = helper.make_model(
            helper.make_graph(self._nodes, self.name, self._inputs, [], self._initializers),
            opset_imports=opsets,
            producer_name="crossrt.GraphBuilder",
        )
        draft.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        try:
            inferred = onnx.shape_inference.infer_shapes(draft, strict_mode=True)
        except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
            raise InvalidModelError(f"the graph fails shape inference: {exc}") from None
        known = {v.name: v.type for v in (*inferred.graph.value_info, *self._inputs)}
        for init in self._initializers:
            known[init.name] = helper.make_tensor_type_proto(init.data_type, list(init.dims))
        for value, elem, shape in self._outputs:
            info = onnx.ValueInfoProto()
            info.name = value
            if value in known:
                info.type.CopyFrom(known[value])
            elif elem is None:
                raise InvalidModelError(
                    f"cannot infer the type of output {value!r}; give output(dtype=, shape=)"
                )
            if elem is not None:
                info.type.tensor_type.elem_type = elem
            if shape is not None:
                info.type.tensor_type.ClearField("shape")
                info.type.CopyFrom(
                    helper.make_tensor_type_proto(info.type.tensor_type.elem_type, list(shape))
                )
            draft.graph.output.append(info)
        self._model = Model(draft)
        return self._model

    def _check_open(self, action: str) -> None:
        if self._model is not None:
            raise OperationForbiddenError(
                f"cannot {action}: the graph of {self.name!r} is finished; start a new "
                "GraphBuilder to change it"
            )

    def _claim(self, name: str) -> None:
        if name in self._names:
            raise InvalidArgumentError(f"the name {name!r} is already used in this graph")
        self._names.add(name)

    def _fresh(self, stem: str) -> str:
        while True:
            self._counter += 1
            name = f"{stem}_{self._counter}"
            if name not in self._names and name not in self._node_names:
                return name


def _elem(dtype: Any) -> int:
    return dtypes.from_numpy(dtype).onnx
