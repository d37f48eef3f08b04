"""The multi-device copies of a runtime from ``bmrt_create_ex``: ``bmrt_memcpy_s2d_parallel``,
``bmrt_memcpy_d2s_parallel``, ``bmrt_memcpy_d2d_byte_parallel`` and
``bmrt_memcpy_d2d_stride_ex_parallel``.

The arrays are cut into groups by ``tensor_num``: the first ``tensor_num[0]`` entries go to the
runtime's first device, the next ``tensor_num[1]`` to its second, and so on. Each device's
copies run in order in a thread of their own, the devices in parallel. Every copy is checked
(its memory on its group's device, in range) before a byte moves: a bad one fails the call with
nothing copied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import InvalidArgumentError
from ...memory import byte_view
from ..bmlib import Device, DeviceMemory
from .contract import seed_call
from .runtime import Bmruntime
from .status import ERRORS, failed
from .strided import StridedCopy
from .types import bm_shape_t, bm_tensor_t, bmrt_data_type_size

__all__ = [
    "bmrt_memcpy_d2d_byte_parallel",
    "bmrt_memcpy_d2d_stride_ex_parallel",
    "bmrt_memcpy_d2s_parallel",
    "bmrt_memcpy_s2d_parallel",
]

_Plan = list[list[Callable[[], None]]]  # per device, its copies in order


@seed_call
def bmrt_memcpy_s2d_parallel(
    p_bmrt: Bmruntime,
    tensors: Sequence[bm_tensor_t],
    datas: Sequence[Any],
    tensor_num: Sequence[int],
    device_num: int,
) -> bool:
    """Copy each host buffer ``datas[i]`` into all of ``tensors[i].device_mem`` (its size, as
    ``bm_memcpy_s2d``)."""

    def plan(device: Device, i: int) -> Callable[[], None]:
        mem = _mem(device, tensors[i], f"tensors[{i}]")
        _holds(byte_view(datas[i], writable=False, what=f"datas[{i}]").size, mem.size, i)
        return lambda: device.memcpy_s2d(mem, datas[i], mem.size)

    return _copy(p_bmrt, "bmrt_memcpy_s2d_parallel", tensor_num, device_num, plan)


@seed_call
def bmrt_memcpy_d2s_parallel(
    p_bmrt: Bmruntime,
    datas: Sequence[Any],
    tensors: Sequence[bm_tensor_t],
    tensor_num: Sequence[int],
    device_num: int,
) -> bool:
    """Copy all of each ``tensors[i].device_mem`` into the writable host buffer ``datas[i]``."""

    def plan(device: Device, i: int) -> Callable[[], None]:
        mem = _mem(device, tensors[i], f"tensors[{i}]")
        _holds(byte_view(datas[i], writable=True, what=f"datas[{i}]").size, mem.size, i)
        return lambda: device.memcpy_d2s(datas[i], mem, mem.size)

    return _copy(p_bmrt, "bmrt_memcpy_d2s_parallel", tensor_num, device_num, plan)


@seed_call
def bmrt_memcpy_d2d_byte_parallel(
    p_bmrt: Bmruntime,
    dst_tensors: Sequence[bm_tensor_t],
    dst_offsets: Sequence[int],
    src_tensors: Sequence[bm_tensor_t],
    src_offsets: Sequence[int],
    sizes: Sequence[int],
    tensor_num: Sequence[int],
    device_num: int,
) -> bool:
    """Copy ``sizes[i]`` bytes from ``src_tensors[i]`` at byte ``src_offsets[i]`` to
    ``dst_tensors[i]`` at byte ``dst_offsets[i]``, both on the group's device."""

    def plan(device: Device, i: int) -> Callable[[], None]:
        dst = _mem(device, dst_tensors[i], f"dst_tensors[{i}]")
        src = _mem(device, src_tensors[i], f"src_tensors[{i}]")
        device.check_range(dst, dst_offsets[i], sizes[i], f"dst_tensors[{i}]")
        device.check_range(src, src_offsets[i], sizes[i], f"src_tensors[{i}]")
        return lambda: device.memcpy_d2d(dst, src, sizes[i], dst_offsets[i], src_offsets[i])

    return _copy(p_bmrt, "bmrt_memcpy_d2d_byte_parallel", tensor_num, device_num, plan)


@seed_call
def bmrt_memcpy_d2d_stride_ex_parallel(
    p_bmrt: Bmruntime,
    dst_tensors: Sequence[bm_tensor_t],
    dst_offsets: Sequence[int],
    dst_strides: Sequence[bm_shape_t],
    src_tensors: Sequence[bm_tensor_t],
    src_offsets: Sequence[int],
    src_strides: Sequence[bm_shape_t],
    shapes: Sequence[bm_shape_t],
    tensor_num: Sequence[int],
    device_num: int,
) -> bool:
    """Copy a ``shapes[i]`` block (up to 4 dims, as bmruntime) of elements of the tensors'
    type from ``src_tensors[i]`` at byte ``src_offsets[i]``, walking ``src_strides[i]``
    (elements per step of each dim, its first ``shapes[i].num_dims`` dims), to
    ``dst_tensors[i]`` at ``dst_offsets[i]`` walking ``dst_strides[i]``. Both tensors' types
    must have the same size."""

    def plan(device: Device, i: int) -> Callable[[], None]:
        dst = _mem(device, dst_tensors[i], f"dst_tensors[{i}]")
        src = _mem(device, src_tensors[i], f"src_tensors[{i}]")
        shape = shapes[i].shape
        if len(shape) > 4:
            raise InvalidArgumentError(
                f"shapes[{i}] has {len(shape)} dims; bmruntime's strided copy takes up to 4"
            )
        itemsize = bmrt_data_type_size(src_tensors[i].dtype)
        if (dst_size := bmrt_data_type_size(dst_tensors[i].dtype)) != itemsize:
            raise InvalidArgumentError(
                f"dst_tensors[{i}] has {dst_size}-byte elements, src_tensors[{i}] "
                f"{itemsize}-byte ones; give tensors of the same type"
            )
        n = len(shape)
        copy = StridedCopy.of(
            dst, dst_offsets[i], dst_strides[i].dims[:n],
            src, src_offsets[i], src_strides[i].dims[:n], shape, itemsize,
        )  # fmt: skip
        copy.check(device, f"copy {i}")
        return lambda: copy.run(device, f"copy {i}")

    return _copy(p_bmrt, "bmrt_memcpy_d2d_stride_ex_parallel", tensor_num, device_num, plan)


def _copy(
    p_bmrt: Bmruntime,
    what: str,
    tensor_num: Sequence[int],
    device_num: int,
    plan: Callable[[Device, int], Callable[[], None]],
) -> bool:
    """Check every copy, then run each device's in order, the devices in parallel."""
    try:
        plans: _Plan = []
        first = 0
        for d, count in enumerate(_counts(p_bmrt, tensor_num, device_num)):
            device = p_bmrt.handles[d].check()
            plans.append([plan(device, i) for i in range(first, first + count)])
            first += count
        _run(plans)
    except IndexError as exc:
        failed(what, InvalidArgumentError(f"an array is shorter than tensor_num says: {exc}"))
        return False
    except ERRORS as exc:
        failed(what, exc)
        return False
    return True


def _counts(p_bmrt: Bmruntime, tensor_num: Sequence[int], device_num: int) -> list[int]:
    devices = len(p_bmrt.handles)
    if isinstance(device_num, bool) or not isinstance(device_num, int):
        raise InvalidArgumentError(f"device_num={device_num!r}: give a number of devices")
    if not 1 <= device_num <= devices:
        raise InvalidArgumentError(
            f"device_num={device_num}: the runtime has {devices} device(s) (bmrt_create_ex "
            "makes one over several); give 1 to that"
        )
    counts = list(tensor_num[:device_num])
    if len(counts) != device_num:
        raise InvalidArgumentError(f"tensor_num has {len(counts)} entries, not device_num")
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"tensor_num holds {count!r}; give counts >= 0")
    return counts


def _mem(device: Device, tensor: bm_tensor_t, what: str) -> DeviceMemory:
    mem = tensor.device_mem if isinstance(tensor, bm_tensor_t) else None
    if mem is None:
        raise InvalidArgumentError(f"{what} has no device_mem; give tensors with memory")
    device.check_range(mem, 0, 0, what)  # this group's device, not freed
    return mem


def _holds(buffer_bytes: int, needed: int, i: int) -> None:
    if buffer_bytes < needed:
        raise InvalidArgumentError(
            f"datas[{i}] holds {buffer_bytes} bytes; tensors[{i}].device_mem is {needed}"
        )


def _run(plans: _Plan) -> None:
    """Each device's copies in order, in a thread per device; the first error is raised
    once every device is done."""

    def run(copies: list[Callable[[], None]]) -> None:
        for copy in copies:
            copy()

    busy = [copies for copies in plans if copies]
    if len(busy) <= 1:
        for copies in busy:
            run(copies)
        return
    with ThreadPoolExecutor(len(busy), thread_name_prefix="bmrt-copy") as pool:
        futures = [pool.submit(run, copies) for copies in busy]
    for future in futures:
        future.result()
