"""Store modes (``bm_store_mode_t``): BM_STORE_2N puts the same element of 2 batches in one
32-bit word (16-bit types), BM_STORE_4N of 4 batches (8-bit types); the batch is padded to a
multiple of 2 or 4. crossrt's engines take BM_STORE_1N, so a launch converts through host
memory: inputs before the run, outputs when a sync sees it end."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ... import dtypes
from ...errors import InvalidArgumentError
from .types import BM_STORE_1N, BM_STORE_2N, BM_STORE_4N

__all__ = ["batches_per_word", "from_1n", "stored_bytes", "to_1n"]


def batches_per_word(mode: int, dtype: dtypes.DType, what: str) -> int:
    """1, 2 or 4: how many batches share a 32-bit word in ``mode`` for ``dtype``."""
    if mode == BM_STORE_1N:
        return 1
    if mode == BM_STORE_2N and dtype.itemsize == 2:
        return 2
    if mode == BM_STORE_4N and dtype.itemsize == 1 and dtype.bits == 8:
        return 4
    raise InvalidArgumentError(
        f"{what}: store mode {mode!r} does not fit {dtype.name}; BM_STORE_2N is for 16-bit "
        "types, BM_STORE_4N for int8 and uint8, BM_STORE_1N for every type"
    )


def stored_bytes(shape: Sequence[int], itemsize: int, k: int) -> int:
    """Bytes of a tensor stored with ``k`` batches per word (the batch padded to k)."""
    batch = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if shape else 1
    return -(-batch // k) * k * rest * itemsize


def from_1n(data: np.ndarray, k: int) -> np.ndarray:
    """``data`` (batch first) laid out with ``k`` batches per word, as bytes."""
    flat = data.reshape(data.shape[0] if data.ndim else 1, -1)
    padded = -(-flat.shape[0] // k) * k
    if padded != flat.shape[0]:
        flat = np.concatenate([flat, np.zeros((padded - flat.shape[0], flat.shape[1]), flat.dtype)])
    words = flat.reshape(padded // k, k, flat.shape[1]).transpose(0, 2, 1)
    return np.ascontiguousarray(words).view(np.uint8).reshape(-1)


def to_1n(raw: np.ndarray, dtype: np.dtype, shape: Sequence[int], k: int) -> np.ndarray:
    """The ``shape`` tensor of ``dtype`` stored in ``raw`` bytes with ``k`` batches per word."""
    batch = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if shape else 1
    padded = -(-batch // k) * k
    words = raw[: padded * rest * np.dtype(dtype).itemsize].view(dtype)
    flat = words.reshape(padded // k, rest, k).transpose(0, 2, 1).reshape(padded, rest)
    return np.ascontiguousarray(flat[:batch]).reshape(tuple(shape))
