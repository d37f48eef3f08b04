"""``OH_NNTensorDesc_*`` and ``OH_NNTensor_*``.

Every NN_Tensor is backed by shared memory with a file descriptor, as NNRt's are: its own
segment (:meth:`crossrt.Tensor.shared`) or, for ``CreateWithFd``, a range of another's
(:meth:`crossrt.Tensor.from_fd`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...memory import Tensor
from .devices import device
from .status import NNError, OH_NN_ReturnCode, guarded, invalid
from .types import OH_NN_DataType, OH_NN_Format, crossrt_format, numpy_dtype

__all__ = [
    "NN_Tensor",
    "NN_TensorDesc",
    "OH_NNTensorDesc_Create",
    "OH_NNTensorDesc_Destroy",
    "OH_NNTensorDesc_GetByteSize",
    "OH_NNTensorDesc_GetDataType",
    "OH_NNTensorDesc_GetElementCount",
    "OH_NNTensorDesc_GetFormat",
    "OH_NNTensorDesc_GetName",
    "OH_NNTensorDesc_GetShape",
    "OH_NNTensorDesc_SetDataType",
    "OH_NNTensorDesc_SetFormat",
    "OH_NNTensorDesc_SetName",
    "OH_NNTensorDesc_SetShape",
    "OH_NNTensor_Create",
    "OH_NNTensor_CreateWithFd",
    "OH_NNTensor_CreateWithSize",
    "OH_NNTensor_Destroy",
    "OH_NNTensor_GetDataBuffer",
    "OH_NNTensor_GetFd",
    "OH_NNTensor_GetOffset",
    "OH_NNTensor_GetSize",
    "OH_NNTensor_GetTensorDesc",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS


@dataclass(eq=False)
class NN_TensorDesc:
    """A tensor descriptor: name, data type, shape (-1: a dynamic dim) and format."""

    name: str = ""
    data_type: OH_NN_DataType = OH_NN_DataType.OH_NN_UNKNOWN
    shape: list[int] = field(default_factory=list)
    format: OH_NN_Format = OH_NN_Format.OH_NN_FORMAT_NONE
    alive: bool = True

    def copy(self) -> NN_TensorDesc:
        """A copy (tensor constructors copy the desc they are given)."""
        return NN_TensorDesc(self.name, self.data_type, list(self.shape), self.format)

    @property
    def dynamic(self) -> bool:
        """Whether a dimension is unknown (-1)."""
        return any(d < 0 for d in self.shape)

    def byte_size(self) -> int:
        """Bytes of a static shape."""
        return math.prod(self.shape) * numpy_dtype(self.data_type).itemsize


@dataclass(eq=False)
class NN_Tensor:
    """A descriptor and the shared memory that holds its data.

    Attributes:
        desc: its own copy of the descriptor (``OH_NNTensor_GetTensorDesc``).
        tensor: the crossrt :class:`Tensor` over the memory.
        device_id: the device it was made for.
    """

    desc: NN_TensorDesc
    tensor: Tensor
    device_id: int
    alive: bool = True


def desc_of(desc: Any) -> NN_TensorDesc:
    """``desc`` if it is a live NN_TensorDesc, else INVALID_PARAMETER."""
    if not isinstance(desc, NN_TensorDesc) or not desc.alive:
        raise invalid(f"{desc!r} is not a live NN_TensorDesc")
    return desc


def tensor_of(tensor: Any) -> NN_Tensor:
    """``tensor`` if it is a live NN_Tensor, else INVALID_PARAMETER."""
    if not isinstance(tensor, NN_Tensor) or not tensor.alive:
        raise invalid(f"{tensor!r} is not a live NN_Tensor")
    return tensor


# -- descriptors -------------------------------------------------------------------------------


def OH_NNTensorDesc_Create() -> NN_TensorDesc:
    """A new descriptor: no name, UNKNOWN type, no shape, format NONE."""
    return NN_TensorDesc()


@guarded()
def OH_NNTensorDesc_Destroy(tensorDesc: NN_TensorDesc) -> OH_NN_ReturnCode:
    """Free a descriptor; using it afterwards is INVALID_PARAMETER."""
    desc_of(tensorDesc).alive = False
    return _OK


@guarded()
def OH_NNTensorDesc_SetName(tensorDesc: NN_TensorDesc, name: str) -> OH_NN_ReturnCode:
    """Set the name (None is INVALID_PARAMETER, as C's NULL)."""
    if not isinstance(name, str):
        raise invalid(f"name {name!r} is not a string")
    desc_of(tensorDesc).name = name
    return _OK


@guarded("pair")
def OH_NNTensorDesc_GetName(tensorDesc: NN_TensorDesc) -> tuple[OH_NN_ReturnCode, str | None]:
    """The name."""
    return _OK, desc_of(tensorDesc).name


@guarded()
def OH_NNTensorDesc_SetDataType(tensorDesc: NN_TensorDesc, dataType: int) -> OH_NN_ReturnCode:
    """Set the data type (a value outside OH_NN_DataType is INVALID_PARAMETER)."""
    desc = desc_of(tensorDesc)
    try:
        desc.data_type = OH_NN_DataType(dataType)
    except ValueError:
        raise invalid(f"data type {dataType!r} is not an OH_NN_DataType") from None
    return _OK


@guarded("pair")
def OH_NNTensorDesc_GetDataType(
    tensorDesc: NN_TensorDesc,
) -> tuple[OH_NN_ReturnCode, OH_NN_DataType | None]:
    """The data type."""
    return _OK, desc_of(tensorDesc).data_type


@guarded()
def OH_NNTensorDesc_SetShape(
    tensorDesc: NN_TensorDesc, shape: Any, shapeLength: int | None = None
) -> OH_NN_ReturnCode:
    """Set the shape: the first ``shapeLength`` dims of ``shape`` (default all). A length
    of 0 is INVALID_PARAMETER; -1 marks a dynamic dim, any other dim must be positive."""
    desc = desc_of(tensorDesc)
    if shape is None:
        raise invalid("shape is NULL")
    dims = list(shape)
    length = len(dims) if shapeLength is None else shapeLength
    if not 0 < length <= len(dims):
        raise invalid(f"shapeLength {length}: give 1 to {len(dims)} (the dims given)")
    dims = dims[:length]
    if not all(isinstance(d, int | np.integer) and (d > 0 or d == -1) for d in dims):
        raise invalid(f"shape {dims}: each dim must be positive or -1 (dynamic)")
    desc.shape = [int(d) for d in dims]
    return _OK


@guarded("pair")
def OH_NNTensorDesc_GetShape(
    tensorDesc: NN_TensorDesc,
) -> tuple[OH_NN_ReturnCode, list[int] | None]:
    """The shape (``shapeLength`` is its length); no shape yet is INVALID_PARAMETER."""
    desc = desc_of(tensorDesc)
    if not desc.shape:
        raise invalid("the descriptor has no shape; call OH_NNTensorDesc_SetShape")
    return _OK, list(desc.shape)


@guarded()
def OH_NNTensorDesc_SetFormat(tensorDesc: NN_TensorDesc, format: int) -> OH_NN_ReturnCode:
    """Set the format (NONE, NCHW, NHWC or ND)."""
    desc = desc_of(tensorDesc)
    try:
        desc.format = OH_NN_Format(format)
    except ValueError:
        raise invalid(f"format {format!r} is not an OH_NN_Format") from None
    return _OK


@guarded("pair")
def OH_NNTensorDesc_GetFormat(
    tensorDesc: NN_TensorDesc,
) -> tuple[OH_NN_ReturnCode, OH_NN_Format | None]:
    """The format."""
    return _OK, desc_of(tensorDesc).format


def _count(desc: NN_TensorDesc) -> int:
    if not desc.shape:
        raise invalid("the descriptor has no shape; call OH_NNTensorDesc_SetShape")
    if desc.dynamic:
        raise NNError(
            OH_NN_ReturnCode.OH_NN_DYNAMIC_SHAPE,
            f"shape {desc.shape} is dynamic: the count is known once every dim is set",
        )
    return math.prod(desc.shape)


@guarded("pair")
def OH_NNTensorDesc_GetElementCount(
    tensorDesc: NN_TensorDesc,
) -> tuple[OH_NN_ReturnCode, int | None]:
    """The element count; a dynamic shape is OH_NN_DYNAMIC_SHAPE with 0."""
    try:
        return _OK, _count(desc_of(tensorDesc))
    except NNError as exc:
        if exc.nn_code is OH_NN_ReturnCode.OH_NN_DYNAMIC_SHAPE:
            return exc.nn_code, 0
        raise


@guarded("pair")
def OH_NNTensorDesc_GetByteSize(tensorDesc: NN_TensorDesc) -> tuple[OH_NN_ReturnCode, int | None]:
    """Bytes of the elements; a dynamic shape is OH_NN_DYNAMIC_SHAPE with 0, an UNKNOWN
    data type INVALID_PARAMETER."""
    desc = desc_of(tensorDesc)
    try:
        count = _count(desc)
    except NNError as exc:
        if exc.nn_code is OH_NN_ReturnCode.OH_NN_DYNAMIC_SHAPE:
            return exc.nn_code, 0
        raise
    return _OK, count * numpy_dtype(desc.data_type).itemsize


# -- tensors -----------------------------------------------------------------------------------


def _shared(desc: NN_TensorDesc, size: int) -> Tensor:
    raw = Tensor.shared((size,), "uint8", name=desc.name, format=crossrt_format(desc.format))
    _view(raw, desc)
    return raw


def _view(raw: Tensor, desc: NN_TensorDesc) -> None:
    # Dynamic dims start at 0: the run that fills an output sets them.
    raw.set_shape([max(d, 0) for d in desc.shape], numpy_dtype(desc.data_type))


def _checked(deviceID: int, tensorDesc: Any) -> NN_TensorDesc:
    device(deviceID)
    desc = desc_of(tensorDesc).copy()
    if not desc.shape:
        raise invalid("the descriptor has no shape; call OH_NNTensorDesc_SetShape")
    numpy_dtype(desc.data_type)
    return desc


@guarded("handle")
def OH_NNTensor_Create(deviceID: int, tensorDesc: NN_TensorDesc) -> NN_Tensor | None:
    """A tensor with shared memory of the descriptor's byte size (a copy of the desc is
    kept); a dynamic shape fails (use CreateWithSize)."""
    desc = _checked(deviceID, tensorDesc)
    if desc.dynamic:
        raise invalid(f"shape {desc.shape} is dynamic; use OH_NNTensor_CreateWithSize")
    return NN_Tensor(desc, _shared(desc, desc.byte_size()), deviceID)


@guarded("handle")
def OH_NNTensor_CreateWithSize(
    deviceID: int, tensorDesc: NN_TensorDesc, size: int
) -> NN_Tensor | None:
    """A tensor with ``size`` bytes of shared memory, at least the descriptor's byte size
    (not checked for a dynamic shape)."""
    desc = _checked(deviceID, tensorDesc)
    if not isinstance(size, int) or size <= 0:
        raise invalid(f"size {size!r}: give a positive byte count")
    if not desc.dynamic and size < desc.byte_size():
        raise invalid(f"size {size} is less than the desc's {desc.byte_size()} bytes")
    return NN_Tensor(desc, _shared(desc, size), deviceID)


@guarded("handle")
def OH_NNTensor_CreateWithFd(
    deviceID: int, tensorDesc: NN_TensorDesc, fd: int, size: int, offset: int
) -> NN_Tensor | None:
    """A tensor over existing shared memory: its data is ``[offset, size)`` of ``fd`` (NNRt's
    meaning: ``size`` counts from the start of the file). Destroying it leaves the memory
    and the fd alone."""
    desc = _checked(deviceID, tensorDesc)
    for what, value in (("fd", fd), ("size", size), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(f"{what} {value!r} is not valid")
    if size <= offset:
        raise invalid(f"size {size} must exceed offset {offset}: the data is [offset, size)")
    if not desc.dynamic and size - offset < desc.byte_size():
        raise invalid(
            f"[{offset}, {size}) holds {size - offset} bytes; the desc needs {desc.byte_size()}"
        )
    raw = Tensor.from_fd(fd, size - offset, offset, name=desc.name)
    _view(raw, desc)
    return NN_Tensor(desc, raw, deviceID)


@guarded()
def OH_NNTensor_Destroy(tensor: NN_Tensor) -> OH_NN_ReturnCode:
    """Free the tensor: its own memory, or only its mapping of a CreateWithFd range."""
    handle = tensor_of(tensor)
    handle.alive = False
    handle.tensor.free()
    return _OK


def OH_NNTensor_GetTensorDesc(tensor: NN_Tensor) -> NN_TensorDesc | None:
    """The tensor's own descriptor (do not destroy it); None for a bad handle."""
    if not isinstance(tensor, NN_Tensor) or not tensor.alive:
        return None
    return tensor.desc


def OH_NNTensor_GetDataBuffer(tensor: NN_Tensor) -> np.ndarray | None:
    """The data, read and write, as a NumPy array over the shared memory (C's ``void*``;
    ``memoryview(...)`` gives its bytes); None for a bad handle."""
    if not isinstance(tensor, NN_Tensor) or not tensor.alive:
        return None
    return tensor.tensor.numpy()


@guarded("pair")
def OH_NNTensor_GetFd(tensor: NN_Tensor) -> tuple[OH_NN_ReturnCode, int | None]:
    """The shared memory's file descriptor."""
    return _OK, tensor_of(tensor).tensor.fd


@guarded("pair")
def OH_NNTensor_GetSize(tensor: NN_Tensor) -> tuple[OH_NN_ReturnCode, int | None]:
    """NNRt's size: the end of the data in the fd (``offset`` + bytes), so that
    ``CreateWithFd(fd, size, offset)`` views the same bytes."""
    t = tensor_of(tensor).tensor
    return _OK, t.offset + t.size


@guarded("pair")
def OH_NNTensor_GetOffset(tensor: NN_Tensor) -> tuple[OH_NN_ReturnCode, int | None]:
    """Where the data starts in the fd."""
    return _OK, tensor_of(tensor).tensor.offset
