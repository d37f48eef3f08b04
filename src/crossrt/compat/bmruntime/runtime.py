"""The BMRuntime C API (``bmruntime_interface.h``): ``bmrt_create`` / ``_ex`` / ``destroy``,
``bmrt_load_bmodel`` / ``_data`` (a ``.crm`` of one or several networks, each with stages),
network queries and ``bmrt_tensor*`` (the launches are launch.py's).

A runtime is a :class:`crossrt.Runtime`; each network of a loaded file is one
:class:`crossrt.LoadedModel` on each of the runtime's devices. ``bmrt_launch_tensor`` /
``_ex`` queue a run (``LoadedModel.run_async``) on tensors over the caller's device memory and
return at once; ``bm_thread_sync`` waits for it. A network whose output shapes cannot be
known before it runs (dynamic, without stages) runs before the launch returns, as the seed
says of networks the host must help.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import LoadedModel, Runtime, __version__
from ...errors import (
    CrossrtError,
    InvalidArgumentError,
    InvalidModelError,
    OperationForbiddenError,
)
from ...executables import (
    DimRange,
    Executable,
    declared_ranges,
    default_ranges,
    list_networks,
    load_executable,
    read_io_quantization,
)
from ...model import TensorSpec
from ...profiling import Profile
from ..bmlib import DeviceMemory
from . import envvars
from .contract import seed_call
from .device import bm_handle_t
from .status import ERRORS, failed, log
from .types import (
    BM_RUNTIME_AUTO,
    BM_RUNTIME_CHECK_MEM,
    BM_STORE_1N,
    bm_data_type_t,
    bm_dtype,
    bm_net_info_t,
    bm_shape_t,
    bm_stage_info_t,
    bm_tensor_t,
    bmrt_shape_count,
    crossrt_dtype,
    mem_info_t,
    shape_dims,
)

__all__ = [
    "Bmruntime",
    "bmrt_create",
    "bmrt_create_ex",
    "bmrt_destroy",
    "bmrt_get_bm_handle",
    "bmrt_get_network_info",
    "bmrt_get_network_name",
    "bmrt_get_network_names",
    "bmrt_get_network_number",
    "bmrt_get_stage_index",
    "bmrt_load_bmodel",
    "bmrt_load_bmodel_data",
    "bmrt_print_network_info",
    "bmrt_show_neuron_network",
    "bmrt_tensor",
    "bmrt_tensor_ex",
    "bmrt_tensor_with_device",
    "bmrt_trace",
]


@dataclass
class _Network:
    executable: Executable
    models: dict[str, LoadedModel]  # by device id: one load on each device of the runtime
    info: bm_net_info_t
    on_cores: dict[tuple[str, tuple[int, ...]], LoadedModel] = field(default_factory=dict)
    # by (device, cores, thread_idx): a load of its own per bmrt_*_multi_thread slot
    in_slots: dict[tuple[str, tuple[int, ...], int], LoadedModel] = field(default_factory=dict)
    memory: tuple[DeviceMemory, ...] = ()  # the caller's, for a bmrt_load_bmodel_with_mem

    @property
    def model(self) -> LoadedModel:
        """The load on the runtime's first device."""
        return next(iter(self.models.values()))


class Bmruntime:
    """What ``bmrt_create`` returns (``void *p_bmrt``): a crossrt Runtime and its networks."""

    def __init__(self, handles: Sequence[bm_handle_t]) -> None:
        self.handles = list(handles)
        self.runtime = Runtime()
        self.networks: dict[str, _Network] = {}
        self.flags = int(BM_RUNTIME_AUTO)  # bmrt_set_flags
        self.slots: dict[int, mem_info_t] = {}  # bmrt_pre_alloc_mem_multi_thread
        self.profiles: list[Profile] = []  # BMRUNTIME_ENABLE_PROFILE: written at destroy
        self._lock = threading.Lock()

    @property
    def handle(self) -> bm_handle_t:
        """The first handle: where inputs and outputs lie."""
        return self.handles[0]

    def network(self, name: str) -> _Network:
        """The loaded network ``name``."""
        if self.runtime.closed:
            raise InvalidArgumentError("the bmruntime was destroyed; create another")
        net = self.networks.get(name)
        if net is None:
            raise InvalidArgumentError(
                f"no network {name!r} is loaded; loaded: {sorted(self.networks)}",
                details={"network": name},
            )
        freed = [mem for mem in net.memory if mem.freed]
        if freed:
            raise InvalidArgumentError(
                f"network {name!r} was loaded with bmrt_load_bmodel_with_mem into {freed[0]!r}, "
                "which was freed since; keep that memory until bmrt_destroy",
                details={"network": name},
            )
        return net

    def handle_of(self, mem: DeviceMemory | None) -> bm_handle_t:
        """The handle of the device ``mem`` lies on (the first handle for None)."""
        if mem is None:
            return self.handle
        for handle in self.handles:
            if handle.device.id == mem.device:
                return handle
        raise InvalidArgumentError(
            f"{mem!r} lies on none of this runtime's devices "
            f"{[h.device.id for h in self.handles]}; copy it to one of them"
        )

    def model(
        self, name: str, handle: bm_handle_t, cores: Sequence[int] = (), slot: int | None = None
    ) -> LoadedModel:
        """Network ``name`` on the handle's device; on these core indices of it when given;
        a load of its own for thread slot ``slot`` (each loaded at the first call for that
        list and slot, unloaded with the runtime)."""
        net = self.network(name)
        device = handle.check().id
        if not cores and slot is None:
            return net.models[device]
        chosen = tuple(cores)
        with self._lock:
            if slot is None:
                model = net.on_cores.get((device, chosen))
            else:
                model = net.in_slots.get((device, chosen, slot))
            if model is None:
                model = self.runtime.load(net.executable, device, cores=list(chosen) or None)
                if slot is None:
                    net.on_cores[(device, chosen)] = model
                else:
                    net.in_slots[(device, chosen, slot)] = model
        return model

    def load(self, source: Any, memory: Sequence[DeviceMemory] = ()) -> None:
        """Load every network of a ``.crm`` (path or bytes); none if one fails. ``memory``:
        the caller's device memory the networks live in (``bmrt_load_bmodel_with_mem``),
        checked at each launch. With BM_RUNTIME_CHECK_MEM every section's SHA-256 is
        checked, whatever ``CROSSRT_VALIDATE_HASH`` says."""
        names = list_networks(source)
        check = True if self.flags & BM_RUNTIME_CHECK_MEM else None
        exes = [load_executable(source, name, validate_hash=check) for name in names]
        with self._lock:
            clash = [n for n in names if n in self.networks]
            if clash:
                raise OperationForbiddenError(
                    f"network {clash[0]!r} is loaded already; a runtime holds each network "
                    "name once: load the other bmodel into another runtime",
                    details={"network": clash[0]},
                )
            devices = [h.check().id for h in self.handles]
            loaded: list[dict[str, LoadedModel]] = []
            try:
                for exe in exes:
                    loaded.append({})
                    for device in devices:
                        loaded[-1][device] = self.runtime.load(exe, device)
            except BaseException:
                for models in loaded:
                    for model in models.values():
                        model.unload()
                raise
            for exe, models in zip(exes, loaded, strict=True):
                self.networks[exe.name] = _Network(
                    exe, models, _net_info(exe), memory=tuple(memory)
                )
            if envvars.enabled(envvars.PROFILE):
                these = [m for models in loaded for m in models.values()]
                self.profiles.append(self.runtime.profile(envvars.profile_path(), these).start())


def _stage_list(exe: Executable) -> list[Executable]:
    return list(exe.stages) or [exe]


def _bytes(spec: TensorSpec, bounds: Mapping[str, int] | None = None) -> int:
    """The most bytes ``spec`` can hold: a dynamic dimension takes its symbol's bound from
    ``bounds``; 0 when one has none (or the rank or type is unknown)."""
    if spec.dtype is None or spec.shape is None:
        return 0
    dims = [d if isinstance(d, int) else (bounds or {}).get(str(d), -1) for d in spec.shape]
    if any(d < 0 for d in dims):
        return 0
    return math.prod(dims) * max(1, spec.dtype.itemsize)


def _ranges(exe: Executable) -> dict[str, tuple[DimRange, ...]]:
    """The declared input ranges; none (logged) when the declaration is invalid, which only
    leaves max_*_bytes 0: the network still loads and runs."""
    try:
        return declared_ranges(exe)
    except InvalidModelError as exc:
        log.warning("network %r: no max_*_bytes bounds: %s", exe.name, exc)
        return default_ranges(exe.inputs)


def _dim_bounds(exe: Executable) -> dict[str, int]:
    """The largest value of each symbolic input dimension (``"N"``) that the network declares
    (``crossrt.dim_ranges`` metadata, runtime/shapes.py): outputs that share the symbol are
    bounded by it. A symbol several inputs bound takes the smallest bound, as it is one
    value; an unbounded range (max null) bounds nothing."""
    bounds: dict[str, int] = {}
    ranges = _ranges(exe)
    for spec in exe.inputs:
        for dim, (_, high) in zip(spec.shape or (), ranges.get(spec.name, ()), strict=False):
            if isinstance(dim, str) and high is not None:
                bounds[dim] = min(high, bounds.get(dim, high))
    return bounds


def _input_bytes(exe: Executable, bounds: Mapping[str, int]) -> list[int]:
    """Each input's most bytes: its declared range per axis, else its symbol's bound."""
    ranges = _ranges(exe)
    sizes = []
    for spec in exe.inputs:
        axes = ranges.get(spec.name, ())
        dims = [
            d if isinstance(d, int) else (axes[i][1] if i < len(axes) else None)
            for i, d in enumerate(spec.shape or ())
        ]
        shape = tuple(
            d if d is not None else bounds.get(str(s), -1)
            for d, s in zip(dims, spec.shape or (), strict=True)
        )
        sizes.append(_bytes(TensorSpec(spec.name, spec.dtype, shape)))
    return sizes


def _net_info(exe: Executable) -> bm_net_info_t:
    stages = _stage_list(exe)
    n_in, n_out = len(exe.inputs), len(exe.outputs)
    # The scales and zero points of quantized inputs and outputs (compiler/io_quant.py).
    q_in, q_out = read_io_quantization(exe.metadata)
    ins = [q_in.get(s.name, (1.0, 0)) for s in exe.inputs]
    outs = [q_out.get(s.name, (1.0, 0)) for s in exe.outputs]
    dynamic = not all(s.is_static for s in (*exe.inputs, *exe.outputs)) and not exe.stages
    bounds = _dim_bounds(exe) if dynamic else {}
    return bm_net_info_t(
        name=exe.name,
        is_dynamic=dynamic,
        input_num=n_in,
        input_names=[s.name for s in exe.inputs],
        input_dtypes=[bm_dtype(s.dtype) for s in exe.inputs],
        input_scales=[scale for scale, _ in ins],
        output_num=n_out,
        output_names=[s.name for s in exe.outputs],
        output_dtypes=[bm_dtype(s.dtype) for s in exe.outputs],
        output_scales=[scale for scale, _ in outs],
        stage_num=len(stages),
        stages=[
            bm_stage_info_t(
                [bm_shape_t.of(shape_dims(s.shape)) for s in st.inputs],
                [bm_shape_t.of(shape_dims(s.shape)) for s in st.outputs],
            )
            for st in stages
        ],
        # A dynamic network without stages: the bounds it declares, 0 where it has none.
        max_input_bytes=_input_bytes(exe, bounds)
        if dynamic
        else [max(_bytes(st.inputs[i]) for st in stages) for i in range(n_in)],
        max_output_bytes=[_bytes(s, bounds) for s in exe.outputs]
        if dynamic
        else [max(_bytes(st.outputs[i]) for st in stages) for i in range(n_out)],
        input_zero_point=[zero for _, zero in ins],
        output_zero_point=[zero for _, zero in outs],
        input_loc_devices=[0] * n_in,
        output_loc_devices=[0] * n_out,
        core_num=exe.cores_required,
    )


# -- lifecycle and loading -------------------------------------------------------------------


@seed_call
def bmrt_create(bm_handle: bm_handle_t) -> Bmruntime | None:
    """A runtime on the handle's device (None, logged, when it cannot be made)."""
    return bmrt_create_ex([bm_handle], 1)


@seed_call
def bmrt_create_ex(bm_handles: Sequence[bm_handle_t], num_handles: int) -> Bmruntime | None:
    """A runtime over several devices: each network is loaded on each of them, and a launch
    runs on the device its inputs lie on (``bmrt_tensor_ex`` allocates there)."""
    try:
        handles = list(bm_handles[:num_handles])
        if not handles or len(handles) != num_handles:
            raise InvalidArgumentError(f"num_handles={num_handles}: give that many handles")
        for h in handles:
            h.check()
        if os.environ.get(envvars.LOG_VERSION) is not None:
            log.info("bmrt_create: crossrt %s (BMRuntime compatibility layer)", __version__)
        envvars.warn_unread()
        return Bmruntime(handles)
    except CrossrtError as exc:
        failed("bmrt_create", exc)
        return None


@seed_call
def bmrt_destroy(p_bmrt: Bmruntime) -> None:
    """Unload every network and close the runtime (writing its BMRUNTIME_ENABLE_PROFILE
    traces first)."""
    for profile in p_bmrt.profiles:
        try:
            profile.stop()
        except (CrossrtError, OSError) as exc:
            log.warning("%s: could not write %s: %s", envvars.PROFILE, profile.path, exc)
    p_bmrt.profiles.clear()
    p_bmrt.runtime.close()
    p_bmrt.networks.clear()


@seed_call
def bmrt_get_bm_handle(p_bmrt: Bmruntime) -> bm_handle_t:
    """The handle the runtime was created with."""
    return p_bmrt.handle


@seed_call
def bmrt_load_bmodel(p_bmrt: Bmruntime, bmodel_path: str | os.PathLike[str]) -> bool:
    """Load every network of a ``.crm`` file; False (nothing loaded) when one fails."""
    try:
        p_bmrt.load(os.fspath(bmodel_path))
    except ERRORS as exc:
        failed("bmrt_load_bmodel", exc)
        return False
    return True


@seed_call
def bmrt_load_bmodel_data(p_bmrt: Bmruntime, bmodel_data: Any, size: int) -> bool:
    """:func:`bmrt_load_bmodel` from the first ``size`` bytes of a buffer (copied: the
    caller may reuse it)."""
    try:
        data = bytes(memoryview(bmodel_data).cast("B")[:size])
        if len(data) != size:
            raise InvalidArgumentError(f"size {size} is more than the buffer's {len(data)} bytes")
        p_bmrt.load(data)
    except ERRORS as exc:
        failed("bmrt_load_bmodel_data", exc)
        return False
    return True


# -- queries ---------------------------------------------------------------------------------


@seed_call
def bmrt_get_network_number(p_bmrt: Bmruntime) -> int:
    """How many networks are loaded."""
    return len(p_bmrt.networks)


@seed_call
def bmrt_get_network_names(p_bmrt: Bmruntime) -> list[str]:
    """The loaded networks' names, in load order (the C out-array, returned)."""
    return list(p_bmrt.networks)


@seed_call
def bmrt_get_network_info(p_bmrt: Bmruntime, net_name: str) -> bm_net_info_t | None:
    """The network's ``bm_net_info_t``; None when it is not loaded."""
    net = p_bmrt.networks.get(net_name)
    return None if net is None else net.info


@seed_call
def bmrt_get_network_name(p_bmrt: Bmruntime, index: int) -> str | None:
    """The name of the ``index``-th loaded network; None when there is none."""
    names = list(p_bmrt.networks)
    return names[index] if 0 <= index < len(names) else None


@seed_call
def bmrt_get_stage_index(
    p_bmrt: Bmruntime, net_name: str, input_tensors: Sequence[bm_tensor_t]
) -> int:
    """The stage whose input shapes the tensors' shapes equal; -1 when none does."""
    net = p_bmrt.networks.get(net_name)
    if net is None:
        return -1
    for i, stage in enumerate(net.info.stages):
        shapes = [t.shape.shape for t in input_tensors]
        if shapes == [s.shape for s in stage.input_shapes]:
            return i
    return -1


@seed_call
def bmrt_show_neuron_network(p_bmrt: Bmruntime) -> None:
    """Print the loaded networks' names."""
    for name in p_bmrt.networks:
        print(name)


@seed_call
def bmrt_print_network_info(net_info: bm_net_info_t) -> None:
    """Print a network's inputs, outputs and stages (a debugging aid)."""
    kind = "dynamic" if net_info.is_dynamic else "static"
    print(f"net: [{net_info.name}] {kind}, {net_info.stage_num} stage(s)")
    for i, stage in enumerate(net_info.stages):
        for usage, names, dts, shapes in (
            ("input", net_info.input_names, net_info.input_dtypes, stage.input_shapes),
            ("output", net_info.output_names, net_info.output_dtypes, stage.output_shapes),
        ):
            for name, dt, shape in zip(names, dts, shapes, strict=True):
                print(f"  stage[{i}] {usage}: {name}, {list(shape.shape)}, {dt.name}")


@seed_call
def bmrt_trace(p_bmrt: Bmruntime) -> None:
    """Print the runtime's devices, networks and device memory (a debugging aid)."""
    print(f"bmruntime on {[h.device.id for h in p_bmrt.handles]}")
    for name, net in p_bmrt.networks.items():
        model = net.model
        print(f"  net {name!r}: loaded={model.loaded}, cores={model.cores}")
    print(f"  device memory: {p_bmrt.handle.device.stats()}")


# -- tensors ---------------------------------------------------------------------------------


@seed_call
def bmrt_tensor(
    tensor: bm_tensor_t, p_bmrt: Bmruntime, dtype: bm_data_type_t, shape: bm_shape_t
) -> None:
    """Fill ``tensor`` with new device memory for ``shape`` of ``dtype`` (store mode 1N);
    the caller frees it with ``bm_free_device``. On failure (logged) it gets no memory."""
    bmrt_tensor_ex(tensor, p_bmrt, 0, dtype, shape)


@seed_call
def bmrt_tensor_ex(
    tensor: bm_tensor_t, p_bmrt: Bmruntime, devid: int, dtype: bm_data_type_t, shape: bm_shape_t
) -> None:
    """:func:`bmrt_tensor` on the ``devid``-th device of a runtime from ``bmrt_create_ex``."""
    if not 0 <= devid < len(p_bmrt.handles):
        tensor.device_mem = None
        failed(
            "bmrt_tensor_ex",
            InvalidArgumentError(f"devid {devid}: the runtime has {len(p_bmrt.handles)} devices"),
        )
        return
    tensor.dtype, tensor.shape, tensor.st_mode = bm_data_type_t(dtype), shape, BM_STORE_1N
    tensor.device_mem = None
    try:
        size = bmrt_shape_count(shape) * max(1, crossrt_dtype(dtype).itemsize)
        tensor.device_mem = p_bmrt.handles[devid].check().malloc(size)
    except CrossrtError as exc:
        failed("bmrt_tensor_ex", exc)


@seed_call
def bmrt_tensor_with_device(
    tensor: bm_tensor_t, device_mem: DeviceMemory, dtype: bm_data_type_t, shape: bm_shape_t
) -> None:
    """Fill ``tensor`` over existing device memory (store mode 1N)."""
    tensor.dtype, tensor.shape, tensor.st_mode = bm_data_type_t(dtype), shape, BM_STORE_1N
    tensor.device_mem = device_mem
