"""Strided copies between two blocks of one device's memory (``bm_memcpy_d2d_stride``,
``bmrt_memcpy_d2d_stride_ex_parallel``), through the device's own copies.

Element ``i`` (an index into ``shape``) is read at ``src_offset + sum(i * src_strides) *
itemsize`` and written at the same place of ``dst``; strides count elements. The bytes of
``dst`` between the elements written keep their values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import InvalidArgumentError
from ...memory import byte_index
from ..bmlib import Device, DeviceMemory

__all__ = ["StridedCopy"]


@dataclass(frozen=True)
class StridedCopy:
    """One strided copy, checked when made (:meth:`check`) and done by :meth:`run`."""

    dst: DeviceMemory
    dst_offset: int
    dst_strides: tuple[int, ...]
    src: DeviceMemory
    src_offset: int
    src_strides: tuple[int, ...]
    shape: tuple[int, ...]
    itemsize: int

    @classmethod
    def of(
        cls,
        dst: DeviceMemory,
        dst_offset: int,
        dst_strides: Sequence[int],
        src: DeviceMemory,
        src_offset: int,
        src_strides: Sequence[int],
        shape: Sequence[int],
        itemsize: int,
    ) -> StridedCopy:
        """The copy, its numbers checked (whole, >= 0; one stride per dim; destination
        strides >= 1 where a dim has several elements, as several writes to one place would
        leave it undefined)."""
        dims = tuple(byte_index(d, "shape dim") for d in shape)
        if len(dst_strides) != len(dims) or len(src_strides) != len(dims):
            raise InvalidArgumentError(
                f"{len(dims)} dims, {len(dst_strides)} destination and {len(src_strides)} "
                "source strides: give one stride per dim of the shape"
            )
        d_strides = tuple(byte_index(s, "destination stride") for s in dst_strides)
        s_strides = tuple(byte_index(s, "source stride") for s in src_strides)
        if any(s == 0 for s, d in zip(d_strides, dims, strict=True) if d > 1):
            raise InvalidArgumentError(
                "a destination stride of 0 writes several elements to one place; give "
                "destination strides >= 1"
            )
        if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
            raise InvalidArgumentError(f"itemsize={itemsize!r}: give the element size in bytes")
        return cls(
            dst, byte_index(dst_offset, "dst_offset"), d_strides,
            src, byte_index(src_offset, "src_offset"), s_strides, dims, itemsize,
        )  # fmt: skip

    def spans(self) -> tuple[int, int]:
        """Bytes from the first element to the end of the last: (destination, source)."""
        return _extent(self.shape, self.dst_strides, self.itemsize), _extent(
            self.shape, self.src_strides, self.itemsize
        )

    def check(self, device: Device, what: str) -> None:
        """Raise as :meth:`run` would on ``device`` (memory not its own, freed, or too small),
        moving nothing."""
        d_span, s_span = self.spans()
        device.check_range(self.dst, self.dst_offset, d_span, f"{what} destination")
        device.check_range(self.src, self.src_offset, s_span, f"{what} source")

    def run(self, device: Device, what: str) -> None:
        """Copy, through host memory as a DMA engine walking both layouts would: the source
        span read, and, when the destination's elements have gaps between them, its span too
        so that the bytes in the gaps are kept."""
        self.check(device, what)
        if not math.prod(self.shape):
            return
        d_span, s_span = self.spans()
        source, target = np.empty(s_span, np.uint8), np.empty(d_span, np.uint8)
        device.memcpy_d2s(source, self.src, s_span, self.src_offset)
        if not _dense(self.shape, self.dst_strides):
            device.memcpy_d2s(target, self.dst, d_span, self.dst_offset)
        element = np.dtype((np.void, self.itemsize))  # each span is whole elements
        as_strided = np.lib.stride_tricks.as_strided
        size = self.itemsize
        read = as_strided(source.view(element), self.shape, [s * size for s in self.src_strides])
        write = as_strided(target.view(element), self.shape, [s * size for s in self.dst_strides])
        write[...] = read
        device.memcpy_s2d(self.dst, target, d_span, self.dst_offset)


def _dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether the elements lie one after the other in C order, with no gaps."""
    step = 1
    for d, s in zip(reversed(shape), reversed(strides), strict=True):
        if d > 1 and s != step:
            return False
        step *= d
    return True


def _extent(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    if not math.prod(shape):
        return 0
    return (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1) * itemsize
