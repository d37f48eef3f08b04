"""DLPack capsules over device memory, for tensors the host cannot address (a GPU's).

Host tensors export through NumPy's own ``__dlpack__``. A tensor in a GPU's memory has no
NumPy array to lend: :func:`capsule` builds the ``DLManagedTensor`` the DLPack ABI defines
(dlpack.h: data, device, ndim, dtype, shape, strides, byte_offset; a manager context and a
deleter) over its address, keeping the tensor alive until the consumer (``torch.from_dlpack``,
``cupy.from_dlpack``) calls the deleter, or until the capsule is dropped unconsumed. The
structures follow dlpack.h 0.8 field for field; ``tests/runtime/test_dlpack.py`` checks the
layout by handing a host capsule to ``np.from_dlpack``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import UnsupportedError

KDL_CPU = 1
KDL_CUDA = 2
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool
_NAME = b"dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

# Every capsule made and not yet deleted: its structure, its shape array and what it keeps
# alive, by the structure's address (the deleter receives that address).
_LIVE: dict[int, tuple[_Managed, Any, Any]] = {}
# Reentrant, and what a deleted entry held is let go only after the lock is released: dropping
# the tensor it kept alive may run a collection that deletes another capsule.
_LOCK = threading.RLock()


def _delete_managed(managed: Any) -> None:
    address = ctypes.cast(managed, ctypes.c_void_p).value or 0
    with _LOCK:
        entry = _LIVE.pop(address, None)
    del entry  # outside the lock


_delete = _DELETER(_delete_managed)  # the deleter a consumer calls when it is done


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Private prototypes of the capsule functions (ctypes.pythonapi's own are shared: setting
# their argtypes here would change them for every other user in the process).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _capsule_dies(capsule: int) -> None:
    # A consumer renames the capsule "used_dltensor" and owns the deleter from then on; a
    # capsule still named "dltensor" when it dies was never consumed: delete it here.
    if _capsule_is_valid(capsule, _NAME):
        address = _capsule_pointer(capsule, _NAME)
        with _LOCK:
            entry = _LIVE.pop(address, None)
        del entry  # outside the lock


_drop_unconsumed = _DESTRUCTOR(_capsule_dies)


def capsule(
    address: int,
    shape: Sequence[int],
    dtype: np.dtype[Any],
    device: tuple[int, int],
    keep: Any,
) -> Any:
    """A DLPack capsule over ``address`` (C-contiguous ``shape`` of ``dtype``) on ``device``
    (``(KDL_CUDA, 0)``), keeping ``keep`` alive until the consumer is done with it.

    Raises:
        UnsupportedError: an element type DLPack has no code for.
    """
    code = _CODES.get(dtype.kind)
    if code is None:
        raise UnsupportedError(f"DLPack has no element type for {dtype}")
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = _Managed()
    managed.dl_tensor = _Tensor(
        data=address,
        device=_Device(*device),
        ndim=len(shape),
        dtype=_DataType(code, dtype.itemsize * 8, 1),
        shape=dims,
        strides=None,  # C-contiguous
        byte_offset=0,
    )
    managed.manager_ctx = None
    managed.deleter = _delete
    where = ctypes.addressof(managed)
    with _LOCK:
        _LIVE[where] = (managed, dims, keep)
    return _capsule_new(where, _NAME, _drop_unconsumed)


def live() -> int:
    """How many capsules are held by a consumer or not yet consumed (for tests)."""
    return len(_LIVE)


def device_of(device_id: str) -> tuple[int, int] | None:
    """DLPack's ``(device type, index)`` of a crossrt device id whose buffers have addresses
    other libraries use: ``cuda:N`` -> ``(kDLCUDA, N)``; ``None`` for others."""
    kind, _, index = device_id.partition(":")
    return (KDL_CUDA, int(index or 0)) if kind == "cuda" else None


def cuda_device_of(obj: Any) -> int | None:
    """The CUDA device index of a DLPack producer's memory, or ``None`` when it lies
    elsewhere (the host)."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None:
        return None
    kind, index = probe()
    return int(index) if int(kind) == KDL_CUDA else None
