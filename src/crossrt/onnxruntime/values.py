"""``OrtValue`` over a :class:`crossrt.Tensor`, and ONNX Runtime's type strings."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TypeProto

from .. import dtypes
from ..model import TensorSpec
from ..runtime.inputs import feed_as_tensor
from ..runtime.memory.tensor import Tensor
from ..runtime.memory.tensordesc import Placement
from .capi.onnxruntime_pybind11_state import invalid_argument

_ORT_ELEMENT = {"float32": "float", "float64": "double"}


def element_name(dtype: dtypes.DType) -> str:
    """ORT's name of an element type: ``float``, ``double``, ``int64``, ``string``..."""
    return _ORT_ELEMENT.get(dtype.name, dtype.name)


def type_string(proto: TypeProto) -> str:
    """ORT's spelling of an ONNX type: ``tensor(float)``, ``seq(map(int64,tensor(float)))``."""
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({element_name(dtypes.from_onnx(proto.tensor_type.elem_type))})"
    if kind == "sparse_tensor_type":
        return (
            f"sparse_tensor({element_name(dtypes.from_onnx(proto.sparse_tensor_type.elem_type))})"
        )
    if kind == "sequence_type":
        return f"seq({type_string(proto.sequence_type.elem_type)})"
    if kind == "map_type":
        key = element_name(dtypes.from_onnx(proto.map_type.key_type))
        return f"map({key},{type_string(proto.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_string(proto.optional_type.elem_type)})"
    return "unknown"


def spec_type(spec: TensorSpec) -> str:
    """ORT's type string of an input or output known only by its :class:`TensorSpec` (a
    ``.crm``, which keeps no ONNX types): exact for tensors."""
    if spec.kind == "tensor" and spec.dtype is not None:
        return f"tensor({element_name(spec.dtype)})"
    return spec.kind


class OrtValue:
    """ORT's ``OrtValue``: a :class:`crossrt.Tensor` (``.tensor``), in host memory (``cpu``)
    or on a device crossrt serves (``cuda``). Feed it to ``run`` or bind it; a CPU value made
    from a NumPy array shares that array's memory, as ORT's does."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    @classmethod
    def ortvalue_from_numpy(
        cls, numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0
    ) -> OrtValue:
        """A value holding ``numpy_obj``: its memory on ``cpu``, a copy on a device."""
        array = np.ascontiguousarray(numpy_obj)
        if device_type.lower() == "cpu":
            return cls(Tensor.from_buffer(array))
        value = cls.ortvalue_from_shape_and_type(array.shape, array.dtype, device_type, device_id)
        value.tensor.write(array)
        return value

    @classmethod
    def ortvalue_from_shape_and_type(
        cls,
        shape: Sequence[int],
        element_type: Any,
        device_type: str = "cpu",
        device_id: int = 0,
    ) -> OrtValue:
        """A value of that shape and element type (a NumPy type, or an ONNX type number),
        allocated on the device."""
        dtype = (
            dtypes.from_onnx(element_type)
            if isinstance(element_type, int)
            else dtypes.from_numpy(element_type)
        )
        kind = device_type.lower()
        if kind == "cpu":
            return cls(Tensor(list(shape), dtype, placement=Placement.HOST))
        return cls(Tensor(list(shape), dtype, device=f"{kind}:{device_id}"))

    def numpy(self) -> np.ndarray:
        """The elements: a view of host memory, a copy from a device."""
        return self.tensor.numpy()

    def shape(self) -> list[int]:
        """The dimensions."""
        return list(self.tensor.shape)

    def data_type(self) -> str:
        """ORT's type string: ``tensor(float)``."""
        return f"tensor({element_name(self.tensor.dtype)})"

    def element_type(self) -> int:
        """The ONNX element type number (1: float)."""
        return self.tensor.dtype.onnx

    def device_name(self) -> str:
        """``cpu`` for host memory, else the device's kind (``cuda``)."""
        if self.tensor.placement is not Placement.DEVICE:
            return "cpu"
        return self.tensor.device.partition(":")[0]

    def data_ptr(self) -> int:
        """The address of the first element (host memory's, or the device's)."""
        if self.tensor.placement is not Placement.DEVICE:
            return int(self.tensor.address)
        try:
            return int(self.tensor.__cuda_array_interface__["data"][0])
        except Exception as exc:
            raise invalid_argument(f"{self.tensor!r} has no address to hand out: {exc}") from None

    def is_tensor(self) -> bool:
        """Always: crossrt values are tensors."""
        return True

    def is_tensor_sequence(self) -> bool:
        """Never: crossrt values are tensors."""
        return False

    def is_sparse_tensor(self) -> bool:
        """Never: crossrt values are dense."""
        return False

    def has_value(self) -> bool:
        """Always: a tensor holds a value."""
        return True

    def tensor_size_in_bytes(self) -> int:
        """The bytes of its elements."""
        return int(self.tensor.byte_size)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` (same element count) into the value's memory."""
        self.tensor.write(np.ascontiguousarray(np_arr, dtype=self.tensor.dtype.numpy))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __repr__(self) -> str:
        return f"OrtValue({self.tensor!r})"


def host_array(address: int, element_type: Any, shape: Sequence[int]) -> np.ndarray:
    """The host memory at ``address`` as an array of ``element_type`` and ``shape``
    (``bind_input``/``bind_output`` with ``buffer_ptr``): no copy; the caller keeps it."""
    dtype = np.dtype(element_type)
    count = int(np.prod(shape)) if len(shape) else 1
    raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(int(address))
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(tuple(shape))


feed_as_tensor(OrtValue, lambda value: value.tensor)  # run() takes an OrtValue as its tensor
