"""Launches on chosen cores and in thread slots: ``bmrt_launch_data_multi_cores``,
``bmrt_launch_tensor_multi_thread`` / ``bmrt_launch_data_multi_thread``, the pre-allocations
(``bmrt_pre_alloc_neuron_multi_cores``, ``bmrt_pre_alloc_mem_multi_thread``), and
``get_bmodel_api_info_c`` / ``bmrt_free_api_info``, which crossrt cannot provide.

A network on a core list is its own crossrt load on those cores of the device
(``Runtime.load(cores=...)``), made at the first launch there or at the pre-allocation, as
bmruntime allocates the compute memory then. A thread slot (``thread_idx``) is a load of its
own too, so launches in different slots never wait for one another's instance: what
bmruntime gets from giving each slot its own neuron memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArgumentError, UnsupportedError
from ..bmlib import DeviceMemory
from .contract import seed_call
from .launch import core_tuple, launch, launch_data
from .runtime import Bmruntime
from .status import ERRORS, failed
from .types import bm_shape_t, bm_tensor_t, mem_info_t, memory_t

__all__ = [
    "bmrt_free_api_info",
    "bmrt_launch_data_multi_cores",
    "bmrt_launch_data_multi_thread",
    "bmrt_launch_tensor_multi_thread",
    "bmrt_pre_alloc_mem_multi_thread",
    "bmrt_pre_alloc_neuron_multi_cores",
    "get_bmodel_api_info_c",
]


@seed_call
def bmrt_launch_data_multi_cores(
    p_bmrt: Bmruntime,
    net_name: str,
    input_datas: Sequence[Any],
    input_shapes: Sequence[bm_shape_t],
    input_num: int,
    output_datas: list[Any],
    output_shapes: Sequence[bm_shape_t],
    output_num: int,
    user_mem: bool,
    core_list: Sequence[int] | None,
    core_num: int,
) -> bool:
    """:func:`~crossrt.compat.bmruntime.bmrt_launch_data` (synchronous, host memory) on the
    cores ``core_list[:core_num]`` of the runtime's first device; ``core_num`` 0 (and
    ``core_list`` None): the cores the network was loaded on."""
    try:
        launch_data(
            p_bmrt, net_name, input_datas, input_shapes, input_num,
            output_datas, output_shapes, output_num, user_mem, core_tuple(core_list, core_num),
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_data_multi_cores", exc)
        return False
    return True


@seed_call
def bmrt_launch_tensor_multi_thread(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
    thread_idx: int,
    user_mem: bool,
    user_stmode: bool,
    core_list: Sequence[int] | None,
    core_num: int,
) -> bool:
    """:func:`~crossrt.compat.bmruntime.bmrt_launch_tensor_multi_cores` in thread slot
    ``thread_idx``, which :func:`bmrt_pre_alloc_mem_multi_thread` must have prepared;
    asynchronous: ``bm_thread_sync`` completes it."""
    try:
        slot = _slot(p_bmrt, thread_idx)
        launch(
            p_bmrt, net_name, input_tensors, input_num, output_tensors, output_num,
            user_mem, user_stmode, core_tuple(core_list, core_num), slot,
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_tensor_multi_thread", exc)
        return False
    return True


@seed_call
def bmrt_launch_data_multi_thread(
    p_bmrt: Bmruntime,
    net_name: str,
    input_datas: Sequence[Any],
    input_shapes: Sequence[bm_shape_t],
    input_num: int,
    output_datas: list[Any],
    output_shapes: Sequence[bm_shape_t],
    output_num: int,
    thread_idx: int,
    user_mem: bool,
    core_list: Sequence[int] | None,
    core_num: int,
) -> bool:
    """:func:`bmrt_launch_data_multi_cores` in thread slot ``thread_idx``, which
    :func:`bmrt_pre_alloc_mem_multi_thread` must have prepared (synchronous)."""
    try:
        slot = _slot(p_bmrt, thread_idx)
        launch_data(
            p_bmrt, net_name, input_datas, input_shapes, input_num,
            output_datas, output_shapes, output_num, user_mem,
            core_tuple(core_list, core_num), slot,
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_data_multi_thread", exc)
        return False
    return True


@seed_call
def bmrt_pre_alloc_neuron_multi_cores(
    p_bmrt: Bmruntime,
    net_name: str,
    stage_idx: int,
    core_list: Sequence[int] | None,
    core_num: int,
) -> bool:
    """Load ``net_name`` on the cores ``core_list[:core_num]`` of each of the runtime's
    devices now rather than at its first launch there. Every stage is loaded with the
    network, so ``stage_idx`` only has to be one of its stages."""
    try:
        net = p_bmrt.network(net_name)
        stages = net.info.stage_num
        if isinstance(stage_idx, bool) or not isinstance(stage_idx, int):
            raise InvalidArgumentError(f"stage_idx={stage_idx!r}: give a stage index")
        if not 0 <= stage_idx < stages:
            raise InvalidArgumentError(
                f"stage_idx={stage_idx}: network {net_name!r} has {stages} stage(s), 0 to "
                f"{stages - 1}"
            )
        cores = core_tuple(core_list, core_num)
        for handle in p_bmrt.handles:
            p_bmrt.model(net_name, handle, cores)
    except ERRORS as exc:
        failed("bmrt_pre_alloc_neuron_multi_cores", exc)
        return False
    return True


@seed_call
def bmrt_pre_alloc_mem_multi_thread(
    p_bmrt: Bmruntime, thread_idx: int, mem_info: mem_info_t
) -> bool:
    """Prepare thread slot ``thread_idx`` for the ``_multi_thread`` launches, with the
    caller's ``neuron_mem`` and ``io_mem`` of ``mem_info`` (sizes from
    ``bmrt_get_bmodel_info``: 0 here, so no memory is needed; memory given must lie on the
    runtime's first device and hold its size). Preparing a slot again replaces its memory."""
    try:
        if isinstance(thread_idx, bool) or not isinstance(thread_idx, int) or thread_idx < 0:
            raise InvalidArgumentError(f"thread_idx={thread_idx!r}: give a slot number >= 0")
        if not isinstance(mem_info, mem_info_t):
            raise InvalidArgumentError(f"mem_info: expected a mem_info_t, got {type(mem_info)}")
        device = p_bmrt.handle.check()
        if p_bmrt.runtime.closed:
            raise InvalidArgumentError("the bmruntime was destroyed; create another")
        for name in ("neuron_mem", "io_mem"):
            memory = getattr(mem_info, name)
            if isinstance(memory, memory_t) and memory.size:
                if not isinstance(memory.addr, DeviceMemory):
                    raise InvalidArgumentError(
                        f"mem_info.{name}.size is {memory.size} but it has no addr; allocate it "
                        "with bm_malloc_device_byte, or give size 0"
                    )
                device.check_range(memory.addr, 0, memory.size, f"mem_info.{name}")
        p_bmrt.slots[thread_idx] = mem_info
    except ERRORS as exc:
        failed("bmrt_pre_alloc_mem_multi_thread", exc)
        return False
    return True


def _slot(p_bmrt: Bmruntime, thread_idx: int) -> int:
    """``thread_idx``, once it is a slot :func:`bmrt_pre_alloc_mem_multi_thread` prepared
    whose memory is still there."""
    mem_info = p_bmrt.slots.get(thread_idx) if isinstance(thread_idx, int) else None
    if mem_info is None:
        raise InvalidArgumentError(
            f"thread_idx={thread_idx!r} has no memory; call bmrt_pre_alloc_mem_multi_thread("
            "p_bmrt, thread_idx, mem_info) before launching in that slot",
            details={"thread_idx": thread_idx},
        )
    for name in ("neuron_mem", "io_mem"):
        addr = getattr(getattr(mem_info, name), "addr", None)
        if isinstance(addr, DeviceMemory) and addr.freed:
            raise InvalidArgumentError(
                f"thread slot {thread_idx}: its mem_info.{name} was freed; prepare the slot "
                "again with bmrt_pre_alloc_mem_multi_thread"
            )
    return thread_idx


@seed_call
def get_bmodel_api_info_c(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
    user_mem: bool,
    user_stmode: bool,
) -> None:
    """Not supported: returns None (C's NULL), logged as BM_NOT_SUPPORTED. The api_info of
    bmruntime is the chip's command stream and device addresses for ``bm_send_api``; crossrt
    hands whole runs to its drivers and has neither. Launch with
    ``bmrt_launch_tensor_ex``, which is what api_info + ``bm_send_api`` amounts to."""
    failed(
        "get_bmodel_api_info_c",
        UnsupportedError(
            f"network {net_name!r}: crossrt has no command stream or device addresses to "
            "return (its drivers run whole networks); launch it with bmrt_launch_tensor_ex "
            "instead of get_bmodel_api_info_c + bm_send_api"
        ),
    )


@seed_call
def bmrt_free_api_info(api_info: Any) -> None:
    """Free what :func:`get_bmodel_api_info_c` returned: always None, so nothing to free
    (as ``free(NULL)``); anything else is logged and left alone."""
    if api_info is not None:
        failed(
            "bmrt_free_api_info",
            InvalidArgumentError(
                f"{type(api_info).__name__} is not from get_bmodel_api_info_c (which returns "
                "None here); nothing was freed"
            ),
        )
