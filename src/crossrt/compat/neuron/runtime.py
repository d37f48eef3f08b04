"""``nrt.h``'s runtime and model API over crossrt: init and close, load and unload,
execution (waited for, or queued in the async execution mode), model and memory information,
versions and core counts.

The process has one Neuron runtime, as libnrt has: ``nrt_init`` makes a
:class:`crossrt.Runtime` on the cores ``NEURON_RT_VISIBLE_CORES`` / ``NEURON_RT_NUM_CORES``
reserve (exclusively, as the seed says; neither set: every core, shared), and ``nrt_close``
closes it. Core index 0 is the first core the process holds. A "NEFF" is a ``.crm``.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import Any

import numpy as np

from ... import LoadedModel, Runtime, __version__
from ...config import default_device
from ...executables import Executable, load_executable
from ...memory import TensorSet, allocator_for, reset_memory_log
from . import completion, recording
from .collectives import build_global, ranks_are_processes
from .env import apply_logging, init_settings, load_settings, warn_unread
from .profiling import timed
from .state import _model, _state, nrt_model_t
from .status import NRT_STATUS, NrtError, guarded, log
from .types import (
    dtype_code,
    nrt_framework_type_t,
    nrt_model_info_t,
    nrt_tensor_info_array_t,
    nrt_tensor_info_t,
    nrt_tensor_usage_t,
    nrt_version_t,
    nrt_vnc_memory_stats_t,
    versioned,
)

__all__ = [
    "nrt_close",
    "nrt_execute",
    "nrt_execute_repeat",
    "nrt_free_model_tensor_info",
    "nrt_get_model_info",
    "nrt_get_model_instance_count",
    "nrt_get_model_nc_count",
    "nrt_get_model_tensor_info",
    "nrt_get_model_vnc_count",
    "nrt_get_total_nc_count",
    "nrt_get_total_vnc_count",
    "nrt_get_version",
    "nrt_get_visible_nc_count",
    "nrt_get_visible_vnc_count",
    "nrt_get_vnc_memory_stats",
    "nrt_init",
    "nrt_load",
    "nrt_load_collectives",
    "nrt_model_t",
    "nrt_unload",
    "runtime",
]


def runtime() -> Runtime:
    """The crossrt Runtime ``nrt_init`` made (for code that mixes both APIs)."""
    return _state.require()


# -- init and close ----------------------------------------------------------------------------


@guarded()
def nrt_init(framework: int, fw_version: str = "", fal_version: str = "") -> NRT_STATUS:
    """Initialize the runtime: reserve the cores the ``NEURON_RT_*`` variables name, set up
    logging and the allocation log, the async execution mode
    (``NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS``) and an inspect session when the
    ``NEURON_RT_INSPECT_*`` variables ask for one. ``fw_version`` and ``fal_version`` are
    only recorded."""
    with _state.lock:
        if _state.runtime is not None:
            raise NrtError(NRT_STATUS.NRT_FAILURE, "nrt_init was called already; nrt_close first")
        try:
            kind = nrt_framework_type_t(framework)
        except ValueError:
            kind = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_INVALID
        if kind is nrt_framework_type_t.NRT_FRAMEWORK_TYPE_INVALID:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"framework {framework!r} is not valid; use NRT_FRAMEWORK_TYPE_NO_FW",
            )
        settings = init_settings()
        warn_unread()
        _state.runtime = Runtime(visible_cores=settings.visible_cores, num_cores=settings.num_cores)
        _state.log_handler = apply_logging(settings)
        reset_memory_log(settings.memlog_max_entries)
        _state.framework, _state.closed = kind, False
        _state.inflight = settings.async_inflight
    try:
        # Outside the lock: a family's start takes its own lock, then this one.
        for start in list(_state.on_init):
            start()
    except BaseException:
        _close()
        _state.closed = False  # as if nrt_init had never run
        raise
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_close() -> NRT_STATUS:
    """End the async queues and profiling sessions (an inspect session is written), unload
    every model, release the cores; later calls return NRT_CLOSED."""
    _close()
    return NRT_STATUS.NRT_SUCCESS


def _close() -> None:
    with _state.lock:
        _state.require()
    # Outside the lock: the async queues' workers take it to start each operation.
    for stop in list(_state.on_close):
        try:
            stop()
        except Exception:  # the cores are released whatever a family failed to finish
            log.exception("nrt_close: %s did not end cleanly; closing anyway", stop.__module__)
    with _state.lock:
        runtime = _state.require()  # another thread may have closed it meanwhile
        for model in list(_state.models):
            _unload(model)
        runtime.close()
        if _state.log_handler is not None:
            logging.getLogger("crossrt").removeHandler(_state.log_handler)
            _state.log_handler.close()
        _state.runtime, _state.log_handler, _state.closed = None, None, True
        _state.profiles.clear()
        _state.inflight = 0


# -- models ------------------------------------------------------------------------------------


@guarded("pair")
def nrt_load(
    neff_bytes: Any, size: int, start_nc: int = -1, nc_count: int = -1
) -> tuple[NRT_STATUS, nrt_model_t | None]:
    """Load the ``.crm`` in ``neff_bytes`` (any buffer; its first ``size`` bytes) on
    ``nc_count`` cores from ``start_nc``: one copy per core. -1 for ``start_nc``: the first
    core with fewest models; -1 for ``nc_count``: one core. The model's ``NEURON_RT_*``
    variables are read here."""
    return NRT_STATUS.NRT_SUCCESS, _load(neff_bytes, size, start_nc, nc_count)


@guarded("pair")
def nrt_load_collectives(
    neff_bytes: Any,
    size: int,
    start_nc: int,
    nc_count: int,
    g_device_id: int,
    g_device_count: int,
) -> tuple[NRT_STATUS, nrt_model_t | None]:
    """``nrt_load`` for rank ``g_device_id`` of a collective group of ``g_device_count``.

    When the ranks are processes (``NEURON_RT_ROOT_COMM_ID`` set, or an ``mpiexec`` job of
    ``g_device_count``), the model loads as ``nrt_load`` does and the global communicator is
    built first if none exists, as in libnrt (``collectives.py``). Otherwise the ranks are
    cores of this process: rank ``g_device_id`` goes to its own core (``start_nc`` -1: core
    ``g_device_id``)."""
    if not 0 <= g_device_id < g_device_count:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"g_device_id {g_device_id} is not a rank of a group of {g_device_count}",
        )
    if g_device_count > 1 and ranks_are_processes(g_device_count):
        build_global(0 if start_nc == -1 else start_nc, g_device_id, g_device_count)
        model = _load(neff_bytes, size, start_nc, nc_count)
        model.rank = (g_device_id, g_device_count)
        return NRT_STATUS.NRT_SUCCESS, model
    visible = len(_state.require().cores)
    if g_device_count > visible:
        raise NrtError(
            NRT_STATUS.NRT_LOAD_NOT_ENOUGH_NC,
            f"{g_device_count} ranks on one host need as many cores; {visible} are visible",
        )
    start = g_device_id if start_nc == -1 else start_nc
    model = _load(neff_bytes, size, start, nc_count)
    model.rank = (g_device_id, g_device_count)
    return NRT_STATUS.NRT_SUCCESS, model


def _load(neff_bytes: Any, size: int, start_nc: int, nc_count: int) -> nrt_model_t:
    with _state.lock:
        runtime = _state.require()
        data = memoryview(neff_bytes).cast("B")
        if not 0 <= size <= data.nbytes:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"size {size} is not within the {data.nbytes} bytes given",
            )
        settings = load_settings()
        exe = concrete(load_executable(bytes(data[:size]), validate_hash=settings.validate_hash))
        count = 1 if nc_count == -1 else nc_count
        visible = len(runtime.cores)
        if count < 1:
            raise NrtError(NRT_STATUS.NRT_INVALID, f"nc_count {nc_count}: use -1 or a count >= 1")
        start = _free_start(count, visible) if start_nc == -1 else start_nc
        if start < 0 or start + count > visible:
            raise NrtError(
                NRT_STATUS.NRT_LOAD_NOT_ENOUGH_NC,
                f"cores {start}..{start + count - 1} asked for; this process holds cores "
                f"0..{visible - 1} (NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES)",
            )
        loaded = runtime.load(
            exe,
            cores=list(range(start, start + count)),
            instances=count,
            cores_per_instance=1,
            exec_timeout=settings.exec_timeout,
            check_numerics=settings.check_numerics,
            # The async mode's in-flight limit is the model's queue: nrt_execute waits for
            # room past it, as libnrt's submitter waits on its in-flight semaphore.
            queue_depth=_state.inflight or None,
        )
        model = nrt_model_t(loaded, start, count)
        _state.models.append(model)
        recording.loaded(model)
        return model


def concrete(exe: Executable) -> Executable:
    """``exe`` as a NEFF is: every input and output of a concrete shape. A network of one
    stage is that stage; a dynamic one (or one of several stages) is NRT_INVALID, saying how
    to compile it with concrete shapes."""
    if len(exe.stages) == 1:
        exe = exe.stages[0]
    dynamic = [s for s in (*exe.inputs, *exe.outputs) if not s.is_static]
    if not dynamic and not exe.stages:
        return exe
    example = {
        s.name: [d if isinstance(d, int) else 1 for d in s.shape or (1,)] for s in exe.inputs
    }
    flags = " ".join(f"--shape {n}={'x'.join(map(str, d))}" for n, d in example.items())
    what = (
        f"{len(exe.stages)} shape stages"
        if exe.stages
        else "dynamic dimensions (" + ", ".join(f"{s.name} {s.shape_str()}" for s in dynamic) + ")"
    )
    raise NrtError(
        NRT_STATUS.NRT_INVALID,
        f"model {exe.name!r} has {what}; a NEFF has one concrete shape per tensor: compile it "
        f"with them, e.g. `crossrt compile model.onnx {flags}` or crossrt.compile(model, "
        f"shapes={example})",
    )


def _free_start(count: int, visible: int) -> int:
    """The first run of ``count`` cores with the fewest models on them."""
    use = [0] * visible
    for model in _state.models:
        for core in range(model.start_nc, model.start_nc + model.nc_count):
            use[core] += 1
    starts = range(max(visible - count + 1, 1))
    return min(starts, key=lambda s: (sum(use[s : s + count]), s))


@guarded()
def nrt_unload(model: nrt_model_t) -> NRT_STATUS:
    """Unload ``model``; the handle may not be used again (NRT_INVALID_HANDLE)."""
    with _state.lock:
        _state.require()
        _unload(_model(model))
        return NRT_STATUS.NRT_SUCCESS


def _unload(model: nrt_model_t) -> None:
    model.model.unload()
    _state.models.remove(model)


@guarded("pair")
def nrt_get_model_nc_count(model: nrt_model_t) -> tuple[NRT_STATUS, int | None]:
    """The number of cores ``model`` is staged on."""
    return NRT_STATUS.NRT_SUCCESS, _model(model).nc_count


nrt_get_model_vnc_count = nrt_get_model_nc_count
"""The current header's name for :func:`nrt_get_model_nc_count`."""


@guarded("pair")
def nrt_get_model_instance_count(model: nrt_model_t) -> tuple[NRT_STATUS, int | None]:
    """How many copies of ``model`` are staged: threads that may call nrt_execute at once."""
    return NRT_STATUS.NRT_SUCCESS, len(_model(model).model.instances)


@guarded("pair")
def nrt_get_model_info(
    model: nrt_model_t, info_size_in: int = nrt_model_info_t.SIZE
) -> tuple[NRT_STATUS, tuple[nrt_model_info_t, int] | None]:
    """``(info, info_size_out)``: where ``model`` runs (``vnc``: its first core), filled up
    to ``info_size_in`` bytes."""
    return NRT_STATUS.NRT_SUCCESS, versioned(nrt_model_info_t(_model(model).start_nc), info_size_in)


@guarded("pair")
def nrt_get_model_tensor_info(
    model: nrt_model_t,
) -> tuple[NRT_STATUS, nrt_tensor_info_array_t | None]:
    """The inputs, then the outputs, of ``model``: name, usage, bytes, dtype, shape."""
    infos = []
    for info in _model(model).model.tensors.info():
        shape = [d if isinstance(d, int) else 0 for d in info.shape or ()]
        usage = nrt_tensor_usage_t[f"NRT_TENSOR_USAGE_{info.usage.upper()}"]
        infos.append(
            nrt_tensor_info_t(
                info.name, usage, info.size or 0, dtype_code(info.dtype), shape, len(shape)
            )
        )
    return NRT_STATUS.NRT_SUCCESS, nrt_tensor_info_array_t(len(infos), infos)


@guarded()
def nrt_free_model_tensor_info(tensor_info: nrt_tensor_info_array_t) -> NRT_STATUS:
    """Release what :func:`nrt_get_model_tensor_info` returned."""
    if not isinstance(tensor_info, nrt_tensor_info_array_t):
        raise NrtError(NRT_STATUS.NRT_INVALID, "not an nrt_tensor_info_array_t")
    tensor_info.tensor_array.clear()
    tensor_info.tensor_count = 0
    return NRT_STATUS.NRT_SUCCESS


# -- execution ---------------------------------------------------------------------------------


@guarded()
def nrt_execute(model: nrt_model_t, input_set: TensorSet, output_set: TensorSet) -> NRT_STATUS:
    """Run ``model`` once: inputs from ``input_set``, outputs written into the tensors of
    ``output_set`` (one it lacks is allocated and added). An execution that produced NaN
    while numerical error checks are on returns NRT_EXEC_COMPLETED_WITH_NUM_ERR, its outputs
    written. Each tensor of ``output_set`` counts one more completion.

    In the async execution mode (``NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`` > 0) it
    queues the run and returns (after waiting for room when that many are in flight); a bad
    input is still refused at once. The run's status goes to the callback
    (``nrt_register_async_exec_callback``)."""
    handle = _model(model)
    if _state.inflight:
        return timed(
            handle, "nrt_execute", partial(completion.submit, handle, input_set, output_set)
        )
    status = timed(handle, "nrt_execute", lambda: handle.model.run(input_set, outputs=output_set))
    completion.written(output_set)
    return status


@guarded()
def nrt_execute_repeat(
    model: nrt_model_t, input_set: TensorSet, output_set: TensorSet, repeat_count: int
) -> NRT_STATUS:
    """Run ``model`` ``repeat_count`` times, each run's outputs the next run's inputs of the
    same name; the last run's outputs go to ``output_set``. It waits for its run in the async
    execution mode too."""
    handle = _model(model)
    if repeat_count < 1:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"repeat_count {repeat_count}: give 1 or more")

    def run() -> None:
        completion.settle(input_set, output_set)
        results = handle.model.request(input_set).repeat(repeat_count, _feedback(handle.model))
        for name, value in results.items():
            if name in output_set:
                output_set[name].write(np.ascontiguousarray(value))
            else:
                output_set.add(name, np.ascontiguousarray(value))

    status = timed(handle, "nrt_execute_repeat", run)
    completion.written(output_set)
    return status


def _feedback(model: LoadedModel) -> dict[str, str]:
    """Which output feeds which input from one run to the next. A "specially compiled NEFF"
    has its state outputs in its inputs' places: an ONNX graph cannot name an output as an
    input, so the i-th output feeds the i-th input when the two have the same type and
    shape, for a model with as many outputs as inputs."""
    ins, outs = model.inputs, model.outputs
    if len(ins) != len(outs):
        return {}
    return {
        o.name: i.name
        for i, o in zip(ins, outs, strict=True)
        if (i.dtype, i.shape) == (o.dtype, o.shape)
    }


# -- versions and counts -----------------------------------------------------------------------


@guarded("pair")
def nrt_get_version(size: int | None = None) -> tuple[NRT_STATUS, nrt_version_t | None]:
    """crossrt's version as an ``nrt_version_t`` (``size`` is accepted for the C shape)."""
    parts = [int(p) if p.isdigit() else 0 for p in __version__.split(".")[:4]]
    parts += [0] * (4 - len(parts))
    major, minor, patch, maintenance = parts[:4]
    version = nrt_version_t(major, minor, patch, maintenance, f"crossrt {__version__}", "")
    return NRT_STATUS.NRT_SUCCESS, version


@guarded("pair")
def nrt_get_total_nc_count() -> tuple[NRT_STATUS, int | None]:
    """Every core of the machine, whatever the variables say; callable before nrt_init."""
    return NRT_STATUS.NRT_SUCCESS, os.cpu_count() or 1


@guarded("pair")
def nrt_get_visible_nc_count() -> tuple[NRT_STATUS, int | None]:
    """The cores this process holds after ``nrt_init`` read the variables."""
    return NRT_STATUS.NRT_SUCCESS, len(_state.require().cores)


nrt_get_total_vnc_count = nrt_get_total_nc_count
nrt_get_visible_vnc_count = nrt_get_visible_nc_count


@guarded("pair")
def nrt_get_vnc_memory_stats(
    vnc: int, stats_size_in: int = nrt_vnc_memory_stats_t.SIZE
) -> tuple[NRT_STATUS, tuple[nrt_vnc_memory_stats_t, int] | None]:
    """``(stats, stats_size_out)``: the memory of NeuronCore ``vnc``'s device from
    :meth:`crossrt.Runtime.memory_stats` (its DEVICE tensors' device, crossrt's default
    device: every core of it shares that memory). The struct is filled up to
    ``stats_size_in`` bytes, as libnrt does for a caller built with an older header."""
    runtime = _state.require()
    _state.require_nc(vnc)
    device = allocator_for(default_device()).device.id
    stats = runtime.memory_stats()[device]
    full = nrt_vnc_memory_stats_t(bytes_used=stats.bytes_in_use, bytes_limit=stats.limit_bytes)
    return NRT_STATUS.NRT_SUCCESS, versioned(full, stats_size_in)
