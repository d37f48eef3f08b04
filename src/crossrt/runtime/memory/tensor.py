"""``Tensor``: memory with a dtype, a shape and a placement (nrt_tensor_t, NN_Tensor, bm_tensor_t).

A tensor views bytes held by a :class:`~.storage.Storage`: allocated by the runtime (on a
device, or in host or shared memory), or a caller's buffer attached without a copy. Slices
share the storage; it is released when its last tensor is freed or collected. Host-visible
tensors convert to NumPy (``numpy()``, ``__array_interface__``) and DLPack (``__dlpack__``)
without copies. See ``docs/memory.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import dtypes
from ...config import default_device
from ...dtypes import DType
from ...errors import InvalidArgumentError, OperationForbiddenError
from . import dlpack, shm
from .allocation import Allocation
from .allocator import allocator_for, host_allocator
from .storage import Storage, buffer_storage, byte_view
from .tensorbase import TensorBase
from .tensordesc import (
    Format,
    Placement,
    TensorDesc,
    as_dtype,
    as_shape,
    byte_index,
    fixed_size,
    owner_key,
)

_UINT8 = dtypes.from_name("uint8")
_KDLCPU = 1  # DLPack's DLDeviceType for host memory


class Tensor(TensorBase):
    """Memory with a dtype, shape, format and placement.

    ``Tensor(shape, dtype)`` allocates; the class methods create the other kinds. Tensors
    may be used from several threads for reading; writes to the same bytes need the caller's
    own ordering.

    Args:
        shape: sizes of the dimensions.
        dtype: a :class:`DType`, a name or a NumPy dtype.
        name: used in messages and the allocation log.
        format: the layout.
        placement: :class:`Placement`; DEVICE allocates on ``device``.
        device: for DEVICE placement, the device (default ``CROSSRT_DEFAULT_DEVICE``).
        owner: whom the memory is charged to: a :class:`LoadedModel` (its budget applies) or
            an owner key.
        size: bytes to allocate, at least the elements' size (``OH_NNTensor_CreateWithSize``).

    Raises:
        OutOfResourcesError: a budget or the device's memory would be exceeded.
    """

    __slots__ = ()

    def __init__(
        self,
        shape: Sequence[int] | int,
        dtype: Any = "float32",
        *,
        name: str = "",
        format: Format = Format.ND,
        placement: Placement = Placement.DEVICE,
        device: str | None = None,
        owner: Any = None,
        size: int | None = None,
    ) -> None:
        dt, dims = fixed_size(as_dtype(dtype)), as_shape(shape)
        needed = math.prod(dims) * dt.itemsize
        nbytes = needed if size is None else int(size)
        if nbytes < needed:
            raise InvalidArgumentError(
                f"tensor {name!r}: size={nbytes} is less than the {needed} bytes of {dt} "
                f"{list(dims)}; give size >= {needed} or leave it out"
            )
        where_to = placement if type(placement) is Placement else Placement(placement)
        storage, where = _allocate(nbytes, where_to, device, owner, name)
        self._setup(storage, dt, dims, name, format, where_to, where)

    @classmethod
    def _wrap(
        cls, storage: Storage | None, dtype: DType, shape: tuple[int, ...], **kw: Any
    ) -> Tensor:
        tensor = cls.__new__(cls)
        kw.setdefault("name", "")
        kw.setdefault("format", Format.ND)
        kw.setdefault("placement", Placement.HOST)
        kw.setdefault("device", "host")
        tensor._setup(storage, dtype, shape, **kw)
        return tensor

    # -- other ways to make one --------------------------------------------------------------

    @classmethod
    def from_desc(
        cls,
        desc: TensorDesc,
        *,
        placement: Placement = Placement.DEVICE,
        device: str | None = None,
        owner: Any = None,
        size: int | None = None,
    ) -> Tensor:
        """Allocate a tensor for a descriptor (``OH_NNTensor_Create`` / ``CreateWithSize``).

        A dynamic descriptor needs ``size``; its dynamic dimensions start at 0 (a run sets
        them when the tensor receives an output).
        """
        if desc.is_dynamic and size is None:
            raise InvalidArgumentError(
                f"tensor {desc.name!r} has dynamic shape {list(desc.shape)}; give size= (the "
                "most bytes it will hold) or a shape with every dimension set"
            )
        shape = [0 if d == -1 else d for d in desc.shape]
        return cls(
            shape,
            desc.dtype,
            name=desc.name,
            format=desc.format,
            placement=placement,
            device=device,
            owner=owner,
            size=size,
        )

    @classmethod
    def allocate(
        cls,
        nbytes: int,
        *,
        placement: Placement = Placement.DEVICE,
        device: str | None = None,
        name: str = "",
        owner: Any = None,
    ) -> Tensor:
        """``nbytes`` of raw memory, dtype uint8 (``nrt_tensor_allocate``); give it a dtype
        and shape later with :meth:`set_shape`."""
        dims = (byte_index(nbytes, "nbytes"),)
        tensor = cls(dims, _UINT8, name=name, placement=placement, device=device, owner=owner)
        tensor._described = False
        return tensor

    @classmethod
    def allocate_empty(cls, name: str = "", desc: TensorDesc | None = None) -> Tensor:
        """A tensor without memory (``nrt_tensor_allocate_empty``); see :meth:`attach_buffer`.

        With ``desc``, the tensor keeps that dtype and shape when a buffer is attached.
        """
        if desc is None:
            return cls._wrap(None, _UINT8, (0,), name=name, described=False)
        shape = tuple(0 if d == -1 else d for d in desc.shape)
        return cls._wrap(None, desc.dtype, shape, name=name or desc.name, format=desc.format)

    @classmethod
    def from_buffer(
        cls,
        buffer: Any,
        *,
        name: str = "",
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        format: Format = Format.ND,
        size: int | None = None,
    ) -> Tensor:
        """A tensor over a caller's memory, without copying it (``nrt_tensor_attach_buffer``).

        Args:
            buffer: a NumPy array, anything with the buffer protocol (bytearray, memoryview,
                mmap) or a host DLPack producer (torch, jax); it must be C-contiguous. The
                tensor keeps it alive; writes through either are seen by both.
            name: the tensor's name.
            dtype, shape: how to view the bytes; default the array's own (uint8 for raw
                buffers).
            format: the layout.
            size: use only the first ``size`` bytes.
        """
        tensor = cls._wrap(None, _UINT8, (0,), name=name, format=format, described=False)
        tensor._attach_caller_buffer(buffer, size, dtype, shape)
        return tensor

    @classmethod
    def shared(
        cls,
        shape: Sequence[int] | int,
        dtype: Any = "float32",
        *,
        name: str = "",
        format: Format = Format.ND,
        kind: str | None = None,
        keep_name: bool = False,
        owner: Any = None,
    ) -> Tensor:
        """A host tensor in a new shared-memory segment of its own.

        The segment lives until the tensor and all its slices are freed (or collected), or
        the process ends. ``tensor.fd``, ``tensor.offset`` and ``tensor.size`` describe it for
        :meth:`from_fd` in another process.

        Args:
            shape, dtype, name, format: as for :class:`Tensor`.
            kind: ``"memfd"`` (default where available) or ``"posix"``.
            keep_name: keep a POSIX name (``shm.segment_name``) for peers that open by name.
            owner: whom the bytes are charged to in the host allocator.
        """
        storage, dt, dims = shm.shared_storage(
            shape, dtype, name=name, kind=kind, keep_name=keep_name, owner=owner
        )
        return cls._wrap(storage, dt, dims, name=name, format=format, placement=Placement.HOST)

    @classmethod
    def from_fd(
        cls,
        fd: int,
        size: int,
        offset: int = 0,
        *,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        name: str = "",
        format: Format = Format.ND,
    ) -> Tensor:
        """A tensor over ``size`` bytes at ``offset`` of a shared-memory file
        (``OH_NNTensor_CreateWithFd``), mapped without a copy.

        The descriptor stays the caller's: freeing the tensor unmaps it but neither closes
        the descriptor nor frees the memory. Unlike NNRt, where the size counts from the start
        of the file, ``size`` here counts from ``offset``: the tensor's bytes are
        ``[offset, offset + size)``, matching ``tensor.offset`` and ``tensor.size``.

        Raises:
            InvalidArgumentError: ``fd`` is not an open file, or the range is beyond its end.
        """
        storage, dt, dims = shm.fd_storage(fd, size, offset, dtype, shape)
        return cls._wrap(storage, dt, dims, name=name, format=format, placement=Placement.HOST)

    @classmethod
    def from_allocation(
        cls,
        allocation: Allocation,
        dtype: Any,
        shape: Sequence[int] | int,
        *,
        offset: int = 0,
        name: str = "",
        format: Format = Format.ND,
        keepalive: Any = None,
    ) -> Tensor:
        """A DEVICE tensor over ``allocation``'s bytes from ``offset``, without a copy
        (``bmrt_tensor_with_device``).

        The allocation stays its owner's: freeing the tensor leaves it allocated, and the
        owner frees it when it is done (after the tensor). ``keepalive`` (the owner's handle
        of the memory) is kept referenced while the tensor lives.

        Raises:
            InvalidArgumentError: the elements do not fit in the allocation from ``offset``.
            OperationForbiddenError: the allocation was freed.
        """
        dt, dims = fixed_size(as_dtype(dtype)), as_shape(shape)
        at = byte_index(offset, "offset")
        nbytes = math.prod(dims) * dt.itemsize
        if allocation.freed:
            raise OperationForbiddenError(
                f"tensor {name!r}: allocation {allocation.name!r} was freed; allocate again"
            )
        if at + nbytes > allocation.nbytes:
            raise InvalidArgumentError(
                f"tensor {name!r}: {nbytes} bytes of {dt} {list(dims)} at offset {at} do not "
                f"fit in the {allocation.nbytes}-byte allocation; give a smaller shape or offset",
                details={"offset": at, "bytes": nbytes, "allocation_bytes": allocation.nbytes},
            )
        storage = Storage(
            allocation.nbytes,
            host=allocation.host,
            allocation=allocation,
            keepalive=keepalive,
            borrowed=True,
        )
        device = allocation.allocator.device.id
        return cls._wrap(
            storage,
            dt,
            dims,
            name=name,
            format=format,
            placement=Placement.DEVICE,
            device=device,
            offset=at,
            size=nbytes,
        )

    # -- attach, detach, free ----------------------------------------------------------------

    def attach_buffer(self, buffer: Any, size: int | None = None) -> None:
        """Make the tensor view ``buffer`` (no copy), releasing its previous memory.

        A tensor that has a dtype and shape (made with one, or from a descriptor) keeps them
        and needs a buffer at least that large; a raw one takes the buffer's.
        """
        self._check_usable()
        self._release()
        described = self._described
        self._attach_caller_buffer(
            buffer, size, self._dtype if described else None, self._shape if described else None
        )

    def detach(self) -> None:
        """Let go of the memory (freed if this was its last user); the tensor stays usable for
        :meth:`attach_buffer`."""
        self._check_usable()
        self._release()

    def free(self) -> None:
        """Let go of the memory and retire the tensor (``nrt_tensor_free``). Slices keep
        their memory. Safe to call twice."""
        if not self._freed:
            self._release()
            self._freed = True

    def _attach_caller_buffer(
        self, buffer: Any, size: int | None, dtype: Any, shape: Sequence[int] | None
    ) -> None:
        storage, dt, dims = buffer_storage(
            buffer, size, dtype, shape, f"buffer for tensor {self.name!r}"
        )
        self._describe(dt, dims)
        self._described = self._described or dtype is not None
        self.placement, self.device = Placement.HOST, "host"
        self._attach(storage)

    # -- bytes in and out --------------------------------------------------------------------

    def read(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Copy ``size`` bytes (default: as many as ``buf`` holds) from ``offset`` into
        ``buf`` (``nrt_tensor_read``)."""
        storage, at, dst = self._read_plan(buf, offset, size)
        storage.read_into(at, dst)

    def write(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Copy ``size`` bytes (default: all of ``buf``) into the tensor at ``offset``
        (``nrt_tensor_write``). Out of range: INVALID, and nothing is written."""
        storage, at, src = self._write_plan(buf, offset, size)
        storage.write_from(at, src)

    def _read_plan(
        self, buf: Any, offset: int, size: int | None, op: str = "read"
    ) -> tuple[Storage, int, np.ndarray]:
        storage = self._live(op)
        dst = byte_view(buf, writable=True, what=f"{op}: the buffer")
        n = _fits(self._span(op, offset, dst.size if size is None else size), dst, op)
        return storage, self._offset + offset, dst[:n]

    def _write_plan(
        self, buf: Any, offset: int, size: int | None, op: str = "write"
    ) -> tuple[Storage, int, np.ndarray]:
        storage = self._live(op)
        src = byte_view(buf, writable=False, what=f"{op}: the buffer")
        n = _fits(self._span(op, offset, src.size if size is None else size), src, op)
        storage.check_writable()
        return storage, self._offset + offset, src[:n]

    def copy_to(
        self, tensor: Tensor, src_offset: int = 0, dst_offset: int = 0, size: int | None = None
    ) -> None:
        """Copy ``size`` bytes (default: from ``src_offset`` to the end) into another tensor
        (``nrt_tensor_copy``); overlapping ranges of one memory are handled."""
        src = self._live("copy_to")
        dst = tensor._live("copy_to")
        n = self._size - byte_index(src_offset, "src_offset") if size is None else size
        self._span("copy_to (source)", src_offset, n)
        tensor._span("copy_to (destination)", dst_offset, n)
        src.copy(dst, n, tensor._offset + dst_offset, self._offset + src_offset)

    def memset(self, value: int, offset: int = 0, size: int | None = None) -> None:
        """Set ``size`` bytes (default: to the end) from ``offset`` to ``value`` (0-255)."""
        storage = self._live("memset")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise InvalidArgumentError(f"memset value {value!r} is not a byte; give 0 to 255")
        n = self._size - byte_index(offset, "offset") if size is None else size
        self._span("memset", offset, n)
        storage.fill(self._offset + offset, n, value)

    def slice(
        self,
        offset: int,
        size: int,
        name: str | None = None,
        *,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
    ) -> Tensor:
        """A tensor over ``size`` bytes from ``offset``, sharing this one's memory
        (``nrt_tensor_allocate_slice``): raw uint8 unless ``dtype``/``shape`` are given. The
        memory lives until the last of them is freed."""
        storage = self._live("slice")
        self._span("slice", offset, size)
        dt = _UINT8 if dtype is None else fixed_size(as_dtype(dtype))
        dims = (size // dt.itemsize,) if shape is None else as_shape(shape)
        if math.prod(dims) * dt.itemsize > size:
            raise InvalidArgumentError(f"slice of {size} bytes cannot hold {dt} {list(dims)}")
        return Tensor._wrap(
            storage,
            dt,
            dims,
            name=self.name if name is None else name,
            format=self.format,
            placement=self.placement,
            device=self.device,
            offset=self._offset + offset,
            size=size,
            described=dtype is not None,
        )

    # -- interchange ---------------------------------------------------------------------

    def __dlpack__(self, **kwargs: Any) -> Any:
        """Export as a DLPack capsule, for ``np.from_dlpack``, ``torch.from_dlpack``,
        ``cupy.from_dlpack``... without a copy: host tensors through NumPy, tensors in a GPU's
        memory over their device address (``dlpack.capsule``)."""
        device = self._device_address("__dlpack__")
        if device is not None:
            address, where = device
            return dlpack.capsule(address, self.shape, self._numpy_dtype(), where, self)
        passed = {k: v for k, v in kwargs.items() if v is not None}
        return self._host_array("__dlpack__").__dlpack__(**passed)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)`` for host tensors, ``(kDLCUDA, N)`` for those in ``cuda:N``'s
        memory."""
        device = self._device_address("__dlpack_device__")
        if device is not None:
            return device[1]
        self._host_array("__dlpack_device__")
        return (_KDLCPU, 0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of a tensor in a GPU's memory:
        ``torch.as_tensor(t, device="cuda")`` and ``cupy.asarray(t)`` view it without a copy.
        ``stream`` is ``None``: crossrt's copies and runs have finished when they return."""
        device = self._device_address("__cuda_array_interface__")
        if device is None or device[1][0] != dlpack.KDL_CUDA:
            raise AttributeError(
                f"tensor {self.name!r} is in {self.device} memory, not a GPU's: it has no "
                "CUDA array interface (use numpy() or __dlpack__)"
            )
        return {
            "shape": tuple(self.shape),
            "typestr": self._numpy_dtype().str,
            "data": (device[0], False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def _device_address(self, op: str) -> tuple[int, tuple[int, int]] | None:
        """``(address, DLPack device)`` of a tensor in device memory whose driver gives
        addresses other libraries use (a GPU's), else ``None``."""
        storage = self._live(op)
        allocation = storage.allocation
        if storage.host is not None or allocation is None:
            return None
        info = allocation.allocator.device
        where = dlpack.device_of(info.id)
        if where is None:
            return None
        address = allocation.allocator.hooks.address_of(info, allocation.handle)
        return None if address is None else (address + self._offset, where)

    def _numpy_dtype(self) -> np.dtype[Any]:
        numpy = self.dtype.numpy
        if numpy is None:
            raise InvalidArgumentError(f"tensor {self.name!r}: {self.dtype} has no array form")
        return np.dtype(numpy)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy's array interface (host tensors): ``np.asarray(tensor)`` is a view."""
        array = self._host_array("__array_interface__")
        self._pinned.append(array)  # the consumer holds this tensor, this keeps the bytes
        return dict(array.__array_interface__)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array


def _allocate(
    nbytes: int, placement: Placement, device: str | None, owner: Any, name: str
) -> tuple[Storage, str]:
    if placement is Placement.DEVICE:
        allocator = allocator_for(device or default_device())
    else:
        allocator = host_allocator()
    a = allocator.allocate(nbytes, owner=owner_key(owner), name=name)
    return Storage(nbytes, host=a.host, allocation=a), allocator.device.id


def _fits(size: int, buffer: np.ndarray, op: str) -> int:
    if size > buffer.size:
        raise InvalidArgumentError(
            f"{op}: size={size} but the buffer holds {buffer.size} bytes; give a size up to "
            f"{buffer.size} or a larger buffer"
        )
    return size


shared_tensor = Tensor.shared
"""A host tensor in a new shared-memory segment (:meth:`Tensor.shared`)."""

tensor_from_fd = Tensor.from_fd
"""A tensor over a shared-memory file descriptor (:meth:`Tensor.from_fd`)."""

# -- for the runtime's other rooms (binding.py binds outputs to tensors): a tensor's parts that
# users do not see, named here rather than reached by underscore from outside memory/.

wrap_storage = Tensor._wrap
"""``wrap_storage(storage, dtype, shape, **kw)``: a tensor over ``storage`` (an engine's result
adopted by the model), described as given; nothing is allocated or copied."""

host_view_of = Tensor._host_view
"""``host_view_of(tensor)``: the array over a host tensor's bytes as its dtype and shape (no
copy), ``None`` for one in device memory."""

live_storage = Tensor._live
"""``live_storage(tensor, op)``: the tensor's storage, or INVALID_HANDLE naming ``op`` when it
was freed or detached."""


def is_described(tensor: Tensor) -> bool:
    """Whether ``tensor`` was given a dtype and shape (raw memory from ``Tensor.allocate`` was
    not: a run sets them from the output it receives)."""
    return tensor._described
