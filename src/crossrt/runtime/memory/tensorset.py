"""Many tensors at once: ``TensorSet`` (nrt_tensor_set_t) and batched reads and writes
(``nrt_tensor_read_batch`` / ``write_batch``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from ... import dtypes
from ...errors import CrossrtError, InvalidArgumentError, StatusCode, UnsupportedError
from . import dlpack
from .allocator import allocator_for
from .storage import Storage, as_array
from .tensor import Tensor
from .tensordesc import Placement


class TensorNotFoundError(CrossrtError, KeyError):
    """A :class:`TensorSet` has no tensor of that name."""

    default_code = StatusCode.NOT_FOUND


class TensorSet(MutableMapping[str, Tensor]):
    """Named tensors: the inputs or outputs of a run (``nrt_tensor_set_t``).

    A mapping of name to :class:`Tensor`. Arrays and buffers added are attached as tensors
    without a copy. Passed as ``outputs=`` to :meth:`LoadedModel.run`, outputs it lacks are
    allocated by the runtime and added.

    Args:
        tensors: initial ``{name: tensor or array}``, or ``(name, tensor)`` pairs.
    """

    def __init__(
        self, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None
    ) -> None:
        self._tensors: dict[str, Tensor] = {}
        items = tensors.items() if isinstance(tensors, Mapping) else (tensors or ())
        for name, tensor in items:
            self.add(name, tensor)

    def add(self, name: str, tensor: Any) -> Tensor:
        """Add, or replace, the tensor called ``name`` (``nrt_add_tensor_to_tensor_set``).

        Args:
            name: the model input or output it is for.
            tensor: a :class:`Tensor`, or a buffer to attach (NumPy array, DLPack, ...).

        Returns:
            The tensor stored.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a tensor set needs a non-empty name, not {name!r}")
        stored = tensor if isinstance(tensor, Tensor) else Tensor.from_buffer(tensor, name=name)
        self._tensors[name] = stored
        return stored

    def remove(self, name: str) -> Tensor:
        """Take the tensor called ``name`` out of the set and return it."""
        tensor = self[name]
        del self._tensors[name]
        return tensor

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise TensorNotFoundError(
                f"no tensor {name!r} in the set; it holds {', '.join(self._tensors) or 'none'}",
                details={"tensor": name},
            ) from None

    def __setitem__(self, name: str, tensor: Any) -> None:
        self.add(name, tensor)

    def __delitem__(self, name: str) -> None:
        self.remove(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"TensorSet({', '.join(map(repr, self._tensors.values()))})"


BatchOp = tuple[Tensor, int, int | None, Any]
"""One operation of :func:`read_batch` / :func:`write_batch`: ``(tensor, offset, size,
buffer)``; ``size`` ``None`` means as many bytes as the buffer holds."""


def read_batch(ops: Iterable[BatchOp]) -> None:
    """Many reads in one call (``nrt_tensor_read_batch``): every op is checked before any
    byte moves."""
    plans = [t._read_plan(buf, off, n, f"read op {i}") for i, (t, off, n, buf) in enumerate(ops)]
    for storage, at, dst in plans:
        storage.read_into(at, dst)


def write_batch(ops: Iterable[BatchOp]) -> None:
    """Many writes in one call (``nrt_tensor_write_batch``): every op is checked before any
    byte is written, so a bad op leaves every tensor unchanged."""
    plans = [t._write_plan(buf, off, n, f"write op {i}") for i, (t, off, n, buf) in enumerate(ops)]
    for storage, at, src in plans:
        storage.write_from(at, src)


def from_dlpack(obj: Any, *, name: str = "") -> Tensor:
    """A tensor over a DLPack producer's memory, without a copy: a NumPy, torch or jax array
    on the CPU, or a torch tensor or cupy array in a GPU's memory (then a tensor on
    ``cuda:N``, which keeps ``obj`` alive).

    Raises:
        InvalidArgumentError: no DLPack producer, or memory NumPy cannot view.
        UnsupportedError: GPU memory without the CUDA array interface, or not C-contiguous.
        DeviceUnavailableError: no driver serves the producer's GPU.
    """
    if not hasattr(obj, "__dlpack__"):
        raise InvalidArgumentError(
            f"a {type(obj).__name__} does not implement __dlpack__; pass a NumPy, torch or jax "
            "array (or use Tensor.from_buffer for other buffers)"
        )
    index = dlpack.cuda_device_of(obj)
    if index is not None:
        return _from_gpu(obj, index, name)
    return Tensor.from_buffer(as_array(obj, f"DLPack object {type(obj).__name__}"), name=name)


def _from_gpu(obj: Any, index: int, name: str) -> Tensor:
    """A tensor on ``cuda:index`` over a GPU array's memory, through its CUDA array
    interface (the address, shape and type DLPack would give, without parsing a capsule)."""
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        raise UnsupportedError(
            f"a {type(obj).__name__} in GPU memory without __cuda_array_interface__: pass a "
            "torch tensor or a cupy array, or copy it to the host first"
        )
    dtype = np.dtype(interface["typestr"])
    shape = tuple(int(d) for d in interface["shape"])
    strides = interface.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise UnsupportedError(
            f"the {type(obj).__name__} is not C-contiguous (strides {tuple(strides)}); make "
            "it contiguous first (.contiguous() in torch, cupy.ascontiguousarray)"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    allocator = allocator_for(f"cuda:{index}")
    address = int(interface["data"][0])
    handle = allocator.hooks.wrap_address(allocator.device, address, nbytes, obj)
    allocation = allocator.adopt(handle, nbytes, name=name, from_driver=True)
    return Tensor._wrap(
        Storage(nbytes, allocation=allocation),
        dtypes.from_numpy(dtype),
        shape,
        name=name,
        placement=Placement.DEVICE,
        device=allocator.device.id,
    )


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
