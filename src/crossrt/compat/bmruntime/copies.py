"""BMLIB's other copies: strided (``bm_memcpy_d2d_stride``), gathered from and scattered to
several host buffers (``bm_memcpy_s2d_gather`` / ``bm_memcpy_d2s_scatter``), and between two
devices (``bm_memcpy_p2p``, ``bm_memcpy_c2c``).

Every argument is checked before a byte moves, where libbmlib copies the pieces of a gather
that fit and only logs the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArgumentError, OperationForbiddenError
from ...memory import byte_index, byte_view
from ..bmlib import Device, DeviceMemory
from .contract import seed_call
from .device import bm_handle_t, call
from .status import bm_status_t
from .strided import StridedCopy

__all__ = [
    "bm_memcpy_c2c",
    "bm_memcpy_d2d_stride",
    "bm_memcpy_d2s_scatter",
    "bm_memcpy_p2p",
    "bm_memcpy_s2d_gather",
]


@seed_call
def bm_memcpy_d2d_stride(
    handle: bm_handle_t,
    dst: DeviceMemory,
    dst_stride: int,
    src: DeviceMemory,
    src_stride: int,
    count: int,
    format_size: int,
) -> bm_status_t:
    """Copy ``count`` elements of ``format_size`` bytes (1, 2 or 4) from every
    ``src_stride``-th element of ``src`` to every ``dst_stride``-th element of ``dst``;
    strides count elements. As the seed says, ``dst_stride`` is 1 except for
    ``dst_stride == 4, src_stride == 1, format_size == 1`` (bytes spread into 32-bit words),
    and each memory holds ``count * stride * format_size`` bytes; else BM_ERR_PARAM."""

    def strided() -> None:
        device = handle.check()
        n = byte_index(count, "count")
        if format_size not in (1, 2, 4):
            raise InvalidArgumentError(
                f"format_size={format_size!r}: give the element size, 1, 2 or 4 bytes"
            )
        for name, stride in (("dst_stride", dst_stride), ("src_stride", src_stride)):
            if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
                raise InvalidArgumentError(f"{name}={stride!r}: give a stride >= 1 element")
        if dst_stride != 1 and (dst_stride, src_stride, format_size) != (4, 1, 1):
            raise InvalidArgumentError(
                f"dst_stride={dst_stride} with src_stride={src_stride}, format_size="
                f"{format_size}: dst_stride must be 1, except dst_stride=4 with src_stride=1 "
                "and format_size=1 (bmlib's rule)"
            )
        for name, mem, stride in (("dst", dst, dst_stride), ("src", src, src_stride)):
            # bmlib's own bound, a little above the last element's end
            device.check_range(mem, 0, n * stride * format_size, f"bm_memcpy_d2d_stride {name}")
        copy = StridedCopy.of(dst, 0, [dst_stride], src, 0, [src_stride], [n], format_size)
        copy.run(device, "bm_memcpy_d2d_stride")

    return call("bm_memcpy_d2d_stride", strided)


@seed_call
def bm_memcpy_s2d_gather(
    handle: bm_handle_t, dst: DeviceMemory, argc: int, *args: Any
) -> bm_status_t:
    """Copy host buffers one after the other into ``dst``: ``args`` is ``src0, len0, src1,
    len1...`` (C's ``void *src, unsigned long long len`` varargs) and ``argc`` counts them,
    two per buffer, as in C. Together they must fit in ``dst``."""

    def gather() -> None:
        device = handle.check()
        for data, n, offset in _pieces(device, dst, argc, args, False, "bm_memcpy_s2d_gather"):
            device.memcpy_s2d(dst, data, n, offset)

    return call("bm_memcpy_s2d_gather", gather)


@seed_call
def bm_memcpy_d2s_scatter(
    handle: bm_handle_t, src: DeviceMemory, argc: int, *args: Any
) -> bm_status_t:
    """Copy ``src`` piece by piece into host buffers: ``args`` is ``dst0, len0, dst1,
    len1...`` and ``argc`` counts them, two per buffer. Together they must fit in ``src``."""

    def scatter() -> None:
        device = handle.check()
        for data, n, offset in _pieces(device, src, argc, args, True, "bm_memcpy_d2s_scatter"):
            device.memcpy_d2s(data, src, n, offset)

    return call("bm_memcpy_d2s_scatter", scatter)


@seed_call
def bm_memcpy_p2p(
    handle_src: bm_handle_t, src: DeviceMemory, handle_dst: bm_handle_t, dst: DeviceMemory
) -> bm_status_t:
    """Copy ``dst``'s size of bytes from ``src`` on one device to ``dst`` on another (two
    PCIe cards). The same device on both sides is BM_ERR_FAILURE, as in libbmlib: use
    ``bm_memcpy_d2d_byte``."""

    def copy() -> None:
        source, target = handle_src.check(), handle_dst.check()
        if source.id == target.id:
            raise OperationForbiddenError(
                f"bm_memcpy_p2p: both handles are device {source.id}; p2p copies between two "
                "devices, use bm_memcpy_d2d_byte within one"
            )
        source.memcpy_to(target, dst, src, _size(dst))

    return call("bm_memcpy_p2p", copy)


@seed_call
def bm_memcpy_c2c(
    src_handle: bm_handle_t,
    dst_handle: bm_handle_t,
    src: DeviceMemory,
    dst: DeviceMemory,
    force_dst_cdma: bool,
) -> bm_status_t:
    """Copy all of ``src`` to the start of ``dst`` between two chips of one card: here two
    devices with a direct link (``DeviceInfo.links``, ``crossrt ls --topology``), or one
    device. Devices not linked are BM_ERR_FAILURE, as chips of two cards are in libbmlib:
    use ``bm_memcpy_p2p``. ``force_dst_cdma`` (which chip's DMA engine moves the bytes)
    changes nothing here."""

    def copy() -> None:
        source, target = src_handle.check(), dst_handle.check()
        if source.id != target.id and target.id not in source.info.links:
            raise OperationForbiddenError(
                f"bm_memcpy_c2c: {source.id} and {target.id} have no direct link (its links: "
                f"{list(source.info.links)}); copy between them with bm_memcpy_p2p"
            )
        source.memcpy_to(target, dst, src, _size(src))

    return call("bm_memcpy_c2c", copy)


def _size(mem: DeviceMemory) -> int:
    if not isinstance(mem, DeviceMemory):
        raise InvalidArgumentError(
            f"expected a bm_device_mem_t from bm_malloc_device_byte, got {type(mem).__name__}"
        )
    return mem.size


def _pieces(
    device: Device, mem: DeviceMemory, argc: int, args: Sequence[Any], writable: bool, what: str
) -> list[tuple[Any, int, int]]:
    """``(buffer, length, offset in mem)`` of C-style varargs ``buffer, length, ...``, every
    buffer checked to hold its length (and to be writable for a scatter) and all of them to
    fit in ``mem``, before any copies."""
    if isinstance(argc, bool) or not isinstance(argc, int) or argc != len(args) or argc % 2:
        raise InvalidArgumentError(
            f"argc={argc!r} with {len(args)} arguments: give a buffer and a length for each "
            "piece, and argc = 2 x pieces"
        )
    pieces, offset = [], 0
    for i in range(0, argc, 2):
        n = byte_index(args[i + 1], f"length of piece {i // 2}")
        view = byte_view(args[i], writable=writable, what=f"piece {i // 2}")
        if view.size < n:
            raise InvalidArgumentError(
                f"the buffer of piece {i // 2} holds {view.size} bytes, fewer than its length {n}"
            )
        pieces.append((args[i], n, offset))
        offset += n
    device.check_range(mem, 0, offset, what)
    return pieces
