"""What a tensor is, apart from how it is made and used: its state, its descriptor, its
host view and the checks every operation runs (:class:`TensorBase`, the base of ``Tensor``)."""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...dtypes import DType
from ...errors import InvalidArgumentError, InvalidHandleError, UnsupportedError
from .allocation import host_empty
from .storage import Storage
from .tensordesc import Format, Placement, TensorDesc, as_dtype, as_shape, byte_index, fixed_size


class TensorBase:
    """A view of ``size`` bytes from ``offset`` of a :class:`~.storage.Storage`, with a dtype,
    shape, format, placement and device; see :class:`~.tensor.Tensor`."""

    __slots__ = (
        "__weakref__",
        "_described",
        "_dtype",
        "_freed",
        "_holder",
        "_offset",
        "_pinned",
        "_shape",
        "_size",
        "_storage",
        "_view",
        "device",
        "format",
        "name",
        "placement",
    )

    def _setup(
        self,
        storage: Storage | None,
        dtype: DType,
        shape: tuple[int, ...],
        name: str,
        format: Format,
        placement: Placement,
        device: str,
        offset: int = 0,
        size: int | None = None,
        described: bool = True,
    ) -> None:
        self.name, self.format, self.placement, self.device = (
            name,
            format if type(format) is Format else Format(format),  # an Enum call costs 0.2 µs
            placement,
            device,
        )
        self._described, self._freed = described, False
        self._describe(dtype, shape)
        self._pinned: list[Any] = []
        self._attach(storage, offset, size)

    def _describe(self, dtype: DType, shape: tuple[int, ...]) -> None:
        self._dtype, self._shape = dtype, shape
        self._view: np.ndarray | None = None  # the host view numpy() hands out, made on demand

    def _attach(self, storage: Storage | None, offset: int = 0, size: int | None = None) -> None:
        self._storage, self._offset, self._view = storage, offset, None
        self._size = 0 if storage is None else (storage.nbytes - offset if size is None else size)
        if storage is None:
            self._holder: list[Storage] | weakref.finalize[Any, Any] | None = None
            return
        storage.acquire()
        if storage.on_release is None:
            # Plain memory: __del__ lets go of it (a weakref.finalize costs as much as the
            # rest of a small tensor's allocation). The list makes letting go happen once,
            # even when two threads free the tensor at the same time: list.pop is atomic.
            self._holder = [storage]
        else:
            # A mapping or segment is also closed (a named one unlinked) at interpreter exit.
            self._holder = weakref.finalize(self, storage.release)

    def _release(self) -> None:
        holder = self._holder
        if isinstance(holder, list):
            _let_go(holder)
        elif holder is not None:
            holder()
        self._storage, self._holder, self._size, self._offset = None, None, 0, 0
        self._view = None

    def __del__(self) -> None:
        holder = getattr(self, "_holder", None)  # unset when the constructor raised
        if isinstance(holder, list):
            _let_go(holder)

    # -- what it is --------------------------------------------------------------------------

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions."""
        return self._shape

    @property
    def desc(self) -> TensorDesc:
        """Name, dtype, shape and format as a :class:`TensorDesc`."""
        return TensorDesc(self.name, self._dtype, self._shape, self.format)

    @property
    def element_count(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def byte_size(self) -> int:
        """Bytes of the elements (``element_count * itemsize``); at most :attr:`size`."""
        return self.element_count * self._dtype.itemsize

    @property
    def size(self) -> int:
        """Bytes of memory the tensor views (``nrt_tensor_get_size``, ``OH_NNTensor_GetSize``);
        0 when it has none."""
        return self._size

    @property
    def offset(self) -> int:
        """Where the tensor's bytes begin in its memory: in the shared-memory file for a
        shared tensor (``OH_NNTensor_GetOffset``), else in its allocation (slices)."""
        storage = self._storage
        return self._offset + (storage.fd_offset if storage is not None else 0)

    @property
    def fd(self) -> int | None:
        """The shared-memory file descriptor (``OH_NNTensor_GetFd``); ``None`` when the tensor
        is not in shared memory."""
        return None if self._storage is None else self._storage.fd

    @property
    def is_host(self) -> bool:
        """Whether the host can address the bytes (NumPy views and DLPack without copies)."""
        return self._storage is not None and self._storage.host is not None

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` was called."""
        return self._freed

    def set_shape(self, shape: Sequence[int], dtype: Any = None) -> None:
        """Give the same bytes another shape (and dtype) in place (bmruntime ``Reshape``).

        Raises:
            InvalidArgumentError: the new shape needs more bytes than :attr:`size`.
        """
        dt = self._dtype if dtype is None else fixed_size(as_dtype(dtype))
        dims = as_shape(shape)
        needed = math.prod(dims) * dt.itemsize
        if needed > self._size and self._storage is not None:
            raise InvalidArgumentError(
                f"tensor {self.name!r}: {dt} {list(dims)} needs {needed} bytes but the tensor "
                f"holds {self._size}; allocate a larger tensor",
                details={"tensor": self.name, "needed": needed, "size": self._size},
            )
        self._describe(dt, dims)
        self._described = True

    def numpy(self) -> np.ndarray:
        """The elements as a NumPy array: a view of the memory when the host can address it,
        else a copy."""
        view = self._view
        if view is not None:
            return view.view()  # a new array object: reshaping it leaves the cached one alone
        storage = self._live("numpy")
        if storage.host is not None:
            raw = storage.host[self._offset : self._offset + self.byte_size]
            self._view = raw.view(self._dtype.numpy).reshape(self._shape)
            return self._view.view()
        out = host_empty(self._shape, self._dtype.numpy, f"a host copy of tensor {self.name!r}")
        storage.read_into(self._offset, out.reshape(-1).view(np.uint8))
        return out

    def _host_view(self) -> np.ndarray | None:
        """The cached host view engines bind (never handed to callers, so never reshaped);
        ``None`` when the host cannot address the memory or there is none."""
        view = self._view
        if view is None and self._storage is not None and self._storage.host is not None:
            self.numpy()  # fills the cache
            view = self._view
        return view

    @property
    def address(self) -> int:
        """The host address of the first byte (``nrt_tensor_get_va``); host tensors only."""
        return int(self._host_array("address").ctypes.data)

    def __repr__(self) -> str:
        if self._freed:
            return f"Tensor({self.name!r}, freed)"
        dims = ",".join(map(str, self._shape))
        where = self.device if self.placement is Placement.DEVICE else self.placement.name
        return f"Tensor({self.name!r}, {self._dtype} [{dims}], {where}, {self._size} bytes)"

    # -- checks --------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._freed:
            raise InvalidHandleError(
                f"tensor {self.name!r} was freed; create a new tensor",
                details={"tensor": self.name},
            )

    def _live(self, op: str) -> Storage:
        self._check_usable()
        if self._storage is None:
            raise InvalidHandleError(
                f"tensor {self.name!r} has no memory ({op}); attach a buffer with "
                "attach_buffer() or allocate a tensor",
                details={"tensor": self.name},
            )
        return self._storage

    def _host_array(self, op: str) -> np.ndarray:
        storage = self._live(op)
        if storage.host is None:
            raise UnsupportedError(
                f"tensor {self.name!r} is in {self.device} memory, which the host cannot "
                f"address ({op}); use numpy() or read() for a copy",
                details={"tensor": self.name, "device": self.device},
            )
        return self.numpy()

    def _span(self, op: str, offset: Any, size: Any) -> int:
        at, n = byte_index(offset, "offset"), byte_index(size, "size")
        if at + n > self._size:
            raise InvalidArgumentError(
                f"tensor {self.name!r}: {op} of {n} bytes at offset {at} is out of range: the "
                f"tensor holds {self._size} bytes; keep offset + size <= {self._size}",
                details={"tensor": self.name, "offset": at, "size": n, "tensor_size": self._size},
            )
        return n


def _let_go(holder: list[Storage]) -> None:
    try:
        storage = holder.pop()
    except IndexError:  # another thread let go first
        return
    try:
        storage.release()
    except Exception:  # at interpreter exit the modules it needs may be gone
        if sys is not None and not sys.is_finalizing():
            raise
