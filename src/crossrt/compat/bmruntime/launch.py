"""The BMRuntime launches: ``bmrt_launch_tensor`` / ``_ex`` / ``_multi_cores`` (queued on
the caller's device memory, completed by ``bm_thread_sync``) and ``bmrt_launch_data``
(synchronous, on host memory); :func:`launch` and :func:`launch_data` also serve
multicore.py's thread-slot and core-list variants."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from ... import LoadedModel
from ...errors import InvalidArgumentError, InvalidInputError
from ...executables import Executable
from ...memory import Tensor as CrossrtTensor
from ...model import TensorSpec
from ..bmlib import Device, DeviceMemory
from . import envvars
from .contract import seed_call
from .device import bm_handle_t
from .runtime import Bmruntime, _Network
from .status import ERRORS, failed
from .storemode import batches_per_word, from_1n, stored_bytes, to_1n
from .types import (
    BM_STORE_1N,
    bm_dtype,
    bm_shape_t,
    bm_tensor_t,
    bmrt_shape_count,
    crossrt_dtype,
    shape_dims,
)

__all__ = [
    "bm_store_name",
    "bmrt_launch_data",
    "bmrt_launch_tensor",
    "bmrt_launch_tensor_ex",
    "bmrt_launch_tensor_multi_cores",
    "launch",
    "launch_data",
]


# -- launches --------------------------------------------------------------------------------


def _as_tensor(
    device: Device, t: bm_tensor_t, spec: TensorSpec, temps: list[DeviceMemory]
) -> CrossrtTensor:
    """An input as the run takes it: the caller's memory in BM_STORE_1N, else a 1N copy."""
    if not isinstance(t, bm_tensor_t) or t.device_mem is None:
        raise InvalidInputError(f"input {spec.name!r} has no device_mem; set it first")
    dt = crossrt_dtype(t.dtype)
    shape = t.shape.shape
    k = batches_per_word(t.st_mode, dt, f"input {spec.name!r}")
    if k == 1:
        return device.tensor(t.device_mem, dt, shape, name=spec.name)
    raw = np.empty(stored_bytes(shape, dt.itemsize, k), np.uint8)
    device.memcpy_d2s(raw, t.device_mem, raw.nbytes)
    data = to_1n(raw, dt.numpy, shape, k)
    temp = device.malloc(data.nbytes, name=f"{spec.name} in BM_STORE_1N")
    temps.append(temp)
    device.memcpy_s2d(temp, data)
    return device.tensor(temp, dt, shape, name=spec.name)


@seed_call
def bm_store_name(mode: int) -> str:
    """``BM_STORE_2N`` for 1..."""
    return {0: "BM_STORE_1N", 1: "BM_STORE_2N", 2: "BM_STORE_4N"}.get(int(mode), str(mode))


def _output_specs(exe: Executable, feed: Mapping[str, CrossrtTensor]) -> tuple[TensorSpec, ...]:
    """The outputs of the stage the inputs' shapes choose (or of the network)."""
    for stage in exe.stages:
        if all(tuple(feed[s.name].shape) == tuple(s.shape or ()) for s in stage.inputs):
            return tuple(stage.outputs)
    return tuple(exe.outputs)


_Layout = tuple[DeviceMemory, DeviceMemory, int, tuple[int, ...], Any]


def launch(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
    user_mem: bool,
    user_stmode: bool,
    cores: Sequence[int] = (),
    slot: int | None = None,
) -> None:
    """Queue one run of ``net_name`` (on ``cores`` of the device when given, in thread slot
    ``slot`` when given); raises the CrossrtError of what is wrong."""
    net = p_bmrt.network(net_name)
    exe = net.executable
    first = input_tensors[0] if input_num and input_tensors else None
    handle = p_bmrt.handle_of(first.device_mem if isinstance(first, bm_tensor_t) else None)
    model = p_bmrt.model(net_name, handle, cores, slot)
    device = handle.check()
    _check_counts(net_name, exe, input_tensors, input_num, output_tensors, output_num)
    outs = output_tensors[:output_num]
    temps: list[DeviceMemory] = []  # freed once the run is over
    made: list[DeviceMemory] = []  # output memory this launch allocated: the caller's to free
    try:
        feed = _feed(device, net_name, exe, input_tensors[:input_num], temps)
        specs = _output_specs(exe, feed)
        saving = envvars.enabled(envvars.SAVE_IO)
        if saving:
            envvars.save_io("input", (_tensor_bytes(feed[s.name]) for s in exe.inputs))
        if not all(s.is_static for s in specs):
            _check_dynamic_outputs(net, specs, output_tensors, user_mem, user_stmode)
            _run_now(handle, net, model, feed, outs, user_mem)
            _free(device, temps)
            if saving:
                envvars.save_io("output", _outputs_bytes(device, outs))
            return
        outputs, layouts, mems = _static_outputs(
            device, net_name, specs, output_tensors, user_mem, user_stmode, temps, made
        )
        future: Future[Any] = model.run_async(feed, outputs)
    except BaseException:
        _free(device, [*temps, *made])
        raise
    for spec, t, mem in zip(specs, output_tensors, mems, strict=False):
        t.dtype, t.shape = bm_dtype(spec.dtype), bm_shape_t.of(shape_dims(spec.shape))
        t.device_mem = mem
        if not user_stmode:
            t.st_mode = BM_STORE_1N
    done = _completion(device, future, layouts, mems, temps, saving, output_tensors, output_num)
    handle.launched(future, done)


def _check_counts(
    net_name: str,
    exe: Executable,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
) -> None:
    """The counts given match the network's and the arrays hold that many tensors."""
    if input_num != len(exe.inputs) or output_num != len(exe.outputs):
        raise InvalidArgumentError(
            f"network {net_name!r} has {len(exe.inputs)} inputs and {len(exe.outputs)} outputs;"
            f" got input_num={input_num}, output_num={output_num}"
        )
    if len(input_tensors) < input_num or len(output_tensors) < output_num:
        raise InvalidArgumentError("fewer tensors in the arrays than input_num / output_num")


def _feed(
    device: Device,
    net_name: str,
    exe: Executable,
    input_tensors: Sequence[bm_tensor_t],
    temps: list[DeviceMemory],
) -> dict[str, CrossrtTensor]:
    """The run's inputs by name, once the device may read the caller's memory."""
    for t in input_tensors:
        if isinstance(t, bm_tensor_t) and t.device_mem is not None:
            device.before_device_access(t.device_mem, f"running {net_name!r} on it")
    return {
        spec.name: _as_tensor(device, t, spec, temps)
        for spec, t in zip(exe.inputs, input_tensors, strict=False)
    }


def _check_dynamic_outputs(
    net: _Network,
    specs: Sequence[TensorSpec],
    output_tensors: Sequence[bm_tensor_t],
    user_mem: bool,
    user_stmode: bool,
) -> None:
    """A dynamic network's outputs: refused before the run, not after it."""
    exe = net.executable
    for spec, t in zip(specs, output_tensors, strict=False):
        if user_stmode:  # the layout is checked; the shape comes after the run
            batches_per_word(t.st_mode, crossrt_dtype(bm_dtype(spec.dtype)), spec.name)
            if t.st_mode != BM_STORE_1N:
                raise InvalidArgumentError(
                    f"output {spec.name!r}: a dynamic network's outputs are stored "
                    "BM_STORE_1N; give user_stmode=false"
                )
    if user_mem:
        for spec, t in zip(exe.outputs, output_tensors, strict=False):
            if t.device_mem is None:
                _user_mem(t, spec, 0, net.info.max_output_bytes[exe.outputs.index(spec)])


def _static_outputs(
    device: Device,
    net_name: str,
    specs: Sequence[TensorSpec],
    output_tensors: Sequence[bm_tensor_t],
    user_mem: bool,
    user_stmode: bool,
    temps: list[DeviceMemory],
    made: list[DeviceMemory],
) -> tuple[dict[str, CrossrtTensor], list[_Layout], list[DeviceMemory]]:
    """The run's outputs by name, the store-mode layouts the sync applies, and the memory each
    output ends in (the caller's with ``user_mem``, else allocated here and added to ``made``)."""
    outputs: dict[str, CrossrtTensor] = {}
    layouts: list[_Layout] = []
    mems: list[DeviceMemory] = []
    for spec, t in zip(specs, output_tensors, strict=False):
        dims = tuple(shape_dims(spec.shape))
        dtype = crossrt_dtype(bm_dtype(spec.dtype))
        mode = t.st_mode if user_stmode else BM_STORE_1N
        k = batches_per_word(mode, dtype, f"output {spec.name!r}")
        size = stored_bytes(dims, max(1, dtype.itemsize), k)
        if user_mem:
            mem = _user_mem(t, spec, size)
        else:
            mem = device.malloc(size)
            made.append(mem)
        device.before_device_access(mem, f"running {net_name!r} into it")
        mems.append(mem)
        target = mem
        if k > 1:  # the run writes 1N into a temporary; the sync lays it out
            target = device.malloc(math.prod(dims) * dtype.itemsize)
            temps.append(target)
            layouts.append((target, mem, k, dims, dtype.numpy))
        outputs[spec.name] = device.tensor(target, dtype, dims, name=spec.name)
    return outputs, layouts, mems


def _completion(
    device: Device,
    future: Future[Any],
    layouts: Sequence[_Layout],
    mems: Sequence[DeviceMemory],
    temps: Sequence[DeviceMemory],
    saving: bool,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
) -> Callable[[], None]:
    """What ``bm_thread_sync`` does once the run is over: lay the outputs out in their store
    modes, save them when asked, free the temporaries, mark the outputs written."""

    def done() -> None:
        try:
            if future.exception() is None:
                for temp, mem, k, dims, numpy_type in layouts:
                    data = np.empty(dims, numpy_type)
                    device.memcpy_d2s(data, temp)
                    device.memcpy_s2d(mem, from_1n(data, k))
                if saving:
                    envvars.save_io("output", _outputs_bytes(device, output_tensors[:output_num]))
        finally:
            _free(device, temps)
            for mem in mems:
                device.device_wrote(mem)

    return done


def _tensor_bytes(tensor: CrossrtTensor) -> bytes:
    buf = bytearray(tensor.byte_size)
    tensor.read(buf, 0, len(buf))
    return bytes(buf)


def _outputs_bytes(device: Device, tensors: Sequence[bm_tensor_t]) -> list[bytes]:
    """The bytes of each output as stored (its shape's, in its store mode's layout)."""
    chunks = []
    for t in tensors:
        if t.device_mem is None:
            continue
        dtype = crossrt_dtype(t.dtype)
        k = batches_per_word(t.st_mode, dtype, "output")
        buf = bytearray(stored_bytes(tuple(t.shape.shape), max(1, dtype.itemsize), k))
        device.memcpy_d2s(buf, t.device_mem, len(buf))
        chunks.append(bytes(buf))
    return chunks


def _free(device: Device, mems: Sequence[DeviceMemory]) -> None:
    for mem in mems:
        device.free(mem)


def _user_mem(
    t: bm_tensor_t, spec: TensorSpec, size: int, bound: int | None = None
) -> DeviceMemory:
    mem = t.device_mem
    if mem is None:
        if bound == 0:  # a dynamic network's output with no declared bound
            raise InvalidArgumentError(
                f"output {spec.name!r}: user_mem is true but its device_mem is not set, and "
                "its size has no bound (max_output_bytes is 0: the network is dynamic and "
                "declares no range for the dimensions it depends on); declare the inputs' "
                "ranges in the model's 'crossrt.dim_ranges' metadata (docs/memory.md), "
                "compile it with stages, or pass user_mem=false",
                details={"output": spec.name},
            )
        raise InvalidArgumentError(
            f"output {spec.name!r}: user_mem is true but its device_mem is not set; allocate "
            f"max_output_bytes with bm_malloc_device_byte, or pass user_mem=false"
        )
    if mem.size < size:
        raise InvalidArgumentError(
            f"output {spec.name!r} needs {size} bytes; its device_mem holds {mem.size}"
        )
    return mem


def _run_now(
    handle: bm_handle_t,
    net: _Network,
    model: LoadedModel,
    feed: Mapping[str, CrossrtTensor],
    output_tensors: Sequence[bm_tensor_t],
    user_mem: bool,
) -> None:
    """A run whose output shapes are known only after it: done before the launch returns."""
    device = handle.device
    result = model.run(dict(feed), outputs={s.name: None for s in net.executable.outputs})
    for spec, t in zip(net.executable.outputs, output_tensors, strict=True):
        value = result[spec.name]
        array = value if isinstance(value, np.ndarray) else None
        shape = tuple(value.shape)
        dtype = bm_dtype(spec.dtype)
        size = math.prod(shape) * max(1, crossrt_dtype(dtype).itemsize)
        mem = _user_mem(t, spec, size) if user_mem else device.malloc(size)
        if array is not None:
            device.memcpy_s2d(mem, np.ascontiguousarray(array), size)
        else:
            assert isinstance(value, CrossrtTensor)
            value.copy_to(device.tensor(mem, crossrt_dtype(dtype), shape))
            value.free()
        t.dtype, t.shape, t.device_mem, t.st_mode = dtype, bm_shape_t.of(shape), mem, BM_STORE_1N


@seed_call
def bmrt_launch_tensor(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
) -> bool:
    """Launch ``net_name`` on the inputs; fills ``output_tensors`` with new device memory
    (the caller frees it). Asynchronous: call ``bm_thread_sync`` before reading outputs."""
    return bmrt_launch_tensor_ex(
        p_bmrt, net_name, input_tensors, input_num, output_tensors, output_num, False, False
    )


@seed_call
def bmrt_launch_tensor_ex(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
    user_mem: bool,
    user_stmode: bool,
) -> bool:
    """:func:`bmrt_launch_tensor`; with ``user_mem`` the outputs go into the device memory
    already in ``output_tensors``; with ``user_stmode`` they are stored in their ``st_mode``
    (laid out when ``bm_thread_sync`` sees the run end), else in BM_STORE_1N."""
    try:
        launch(
            p_bmrt, net_name, input_tensors, input_num, output_tensors, output_num,
            user_mem, user_stmode,
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_tensor", exc)
        return False
    return True


@seed_call
def bmrt_launch_data(
    p_bmrt: Bmruntime,
    net_name: str,
    input_datas: Sequence[Any],
    input_shapes: Sequence[bm_shape_t],
    input_num: int,
    output_datas: list[Any],
    output_shapes: Sequence[bm_shape_t],
    output_num: int,
    user_mem: bool,
) -> bool:
    """Run ``net_name`` on host buffers and return when it is done (synchronous).

    ``input_datas[i]`` is any buffer of ``input_shapes[i]`` elements of the input's type.
    With ``user_mem`` each ``output_datas[i]`` is a writable buffer large enough for its
    output; without, ``output_datas[i]`` is set to a new NumPy array. ``output_shapes[i]``
    is set to each output's shape.
    """
    try:
        launch_data(
            p_bmrt, net_name, input_datas, input_shapes, input_num,
            output_datas, output_shapes, output_num, user_mem,
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_data", exc)
        return False
    return True


def launch_data(
    p_bmrt: Bmruntime,
    net_name: str,
    input_datas: Sequence[Any],
    input_shapes: Sequence[bm_shape_t],
    input_num: int,
    output_datas: list[Any],
    output_shapes: Sequence[bm_shape_t],
    output_num: int,
    user_mem: bool,
    cores: Sequence[int] = (),
    slot: int | None = None,
) -> None:
    """:func:`bmrt_launch_data` (on ``cores`` of the runtime's first device when given, in
    thread slot ``slot`` when given); raises the CrossrtError of what is wrong."""
    exe = p_bmrt.network(net_name).executable
    if input_num != len(exe.inputs) or output_num != len(exe.outputs):
        raise InvalidArgumentError(
            f"network {net_name!r} has {len(exe.inputs)} inputs and {len(exe.outputs)} "
            f"outputs; got input_num={input_num}, output_num={output_num}"
        )
    model = p_bmrt.model(net_name, p_bmrt.handle, cores, slot)
    feed = {}
    for spec, data, shape in zip(exe.inputs, input_datas, input_shapes, strict=False):
        assert spec.dtype is not None
        count = bmrt_shape_count(shape)
        array = np.frombuffer(data, dtype=spec.dtype.numpy, count=count)
        feed[spec.name] = array.reshape(shape.shape)
    result = model.run(feed)
    if envvars.enabled(envvars.SAVE_IO):
        envvars.save_io("input", (feed[s.name].tobytes() for s in exe.inputs))
        envvars.save_io("output", (np.asarray(result[s.name]).tobytes() for s in exe.outputs))
    for i, spec in enumerate(exe.outputs):
        value = np.ascontiguousarray(result[spec.name])
        if user_mem:
            out = np.frombuffer(output_datas[i], dtype=np.uint8)
            if out.nbytes < value.nbytes:
                raise InvalidArgumentError(
                    f"output {spec.name!r} needs {value.nbytes} bytes; output_datas[{i}] "
                    f"holds {out.nbytes}"
                )
            out[: value.nbytes] = value.reshape(-1).view(np.uint8)
        else:
            output_datas[i] = value
        shape = output_shapes[i]
        shape.num_dims, shape.dims = value.ndim, bm_shape_t.of(value.shape).dims


def core_tuple(core_list: Sequence[int] | None, core_num: int) -> tuple[int, ...]:
    """``core_list[:core_num]``; () for core_num 0 (the cores the network was loaded on)."""
    if isinstance(core_num, bool) or not isinstance(core_num, int) or core_num < 0:
        raise InvalidArgumentError(f"core_num={core_num!r}: give a count of cores >= 0")
    cores = tuple(core_list[:core_num]) if core_list is not None else ()
    if len(cores) != core_num:
        raise InvalidArgumentError(f"core_num={core_num} but core_list has {len(cores)}")
    return cores


@seed_call
def bmrt_launch_tensor_multi_cores(
    p_bmrt: Bmruntime,
    net_name: str,
    input_tensors: Sequence[bm_tensor_t],
    input_num: int,
    output_tensors: Sequence[bm_tensor_t],
    output_num: int,
    user_mem: bool,
    user_stmode: bool,
    core_list: Sequence[int] | None,
    core_num: int,
) -> bool:
    """:func:`bmrt_launch_tensor_ex` on the device's cores ``core_list[:core_num]`` (0: the
    cores the network was loaded on). The first launch on a core list loads the network
    there (as bmruntime allocates its compute memory then); ``bm_thread_sync`` completes it."""
    try:
        cores = core_tuple(core_list, core_num)
        launch(
            p_bmrt, net_name, input_tensors, input_num, output_tensors, output_num,
            user_mem, user_stmode, cores,
        )  # fmt: skip
    except ERRORS as exc:
        failed("bmrt_launch_tensor_multi_cores", exc)
        return False
    return True
