"""``nrt.h``'s runtime and model API over crossrt: init and close, load and unload,
execution, profiling, versions and core counts.

The process has one Neuron runtime, as libnrt has: ``nrt_init`` makes a
:class:`crossrt.Runtime` on the cores ``NEURON_RT_VISIBLE_CORES`` / ``NEURON_RT_NUM_CORES``
reserve (exclusively, as the seed says; neither set: every core, shared), and ``nrt_close``
closes it. Core index 0 is the first core the process holds. A "NEFF" is a ``.crm``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import __version__
from ...compiler.container import load_executable
from ...errors import ExecutionError, StatusCode
from ...runtime.loaded import LoadedModel
from ...runtime.memory.memlog import reset_memory_log
from ...runtime.memory.tensorset import TensorSet
from ...runtime.profiler import Profile
from ...runtime.runtime import Runtime
from .env import apply_logging, init_settings, load_settings
from .status import NRT_STATUS, NrtError, guarded
from .types import (
    dtype_code,
    nrt_framework_type_t,
    nrt_tensor_info_array_t,
    nrt_tensor_info_t,
    nrt_tensor_usage_t,
    nrt_version_t,
)

__all__ = [
    "nrt_close",
    "nrt_execute",
    "nrt_execute_repeat",
    "nrt_free_model_tensor_info",
    "nrt_get_model_instance_count",
    "nrt_get_model_nc_count",
    "nrt_get_model_tensor_info",
    "nrt_get_model_vnc_count",
    "nrt_get_total_nc_count",
    "nrt_get_total_vnc_count",
    "nrt_get_version",
    "nrt_get_visible_nc_count",
    "nrt_get_visible_vnc_count",
    "nrt_init",
    "nrt_load",
    "nrt_load_collectives",
    "nrt_model_t",
    "nrt_profile_start",
    "nrt_profile_stop",
    "nrt_unload",
    "runtime",
]


@dataclass(eq=False)
class nrt_model_t:
    """A loaded model: the crossrt :class:`LoadedModel` and the cores it was staged on.

    Attributes:
        model: the crossrt model (its whole API is there: ``run_async``, ``stats``...).
        start_nc: the first core (an index among the process's cores).
        nc_count: how many cores, one copy of the model on each.
        rank: for ``nrt_load_collectives``, ``(g_device_id, g_device_count)``.
    """

    model: LoadedModel
    start_nc: int
    nc_count: int
    rank: tuple[int, int] | None = None


class _State:
    """The process's runtime, as libnrt keeps it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runtime: Runtime | None = None
        self.closed = False
        self.framework = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_INVALID
        self.log_handler: Any = None
        self.models: list[nrt_model_t] = []
        # File name -> (model, its Profile): the runtime's, with each API call marked in it.
        self.profiles: dict[str, tuple[nrt_model_t, Profile]] = {}

    def require(self) -> Runtime:
        """The runtime, or the status the seed gives before ``nrt_init`` or after
        ``nrt_close``."""
        runtime = self.runtime
        if runtime is not None:
            return runtime
        if self.closed:
            raise NrtError(NRT_STATUS.NRT_CLOSED, "nrt_close() was called; call nrt_init again")
        raise NrtError(NRT_STATUS.NRT_UNINITIALIZED, "call nrt_init first")


_state = _State()


def runtime() -> Runtime:
    """The crossrt Runtime ``nrt_init`` made (for code that mixes both APIs)."""
    return _state.require()


# -- init and close ----------------------------------------------------------------------------


@guarded()
def nrt_init(framework: int, fw_version: str = "", fal_version: str = "") -> NRT_STATUS:
    """Initialize the runtime: reserve the cores the ``NEURON_RT_*`` variables name, set up
    logging and the allocation log. ``fw_version`` and ``fal_version`` are only recorded."""
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
        _state.runtime = Runtime(visible_cores=settings.visible_cores, num_cores=settings.num_cores)
        _state.log_handler = apply_logging(settings)
        reset_memory_log(settings.memlog_max_entries)
        _state.framework, _state.closed = kind, False
        return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_close() -> NRT_STATUS:
    """Unload every model, release the cores; later calls return NRT_CLOSED."""
    with _state.lock:
        runtime = _state.require()
        for model in list(_state.models):
            _unload(model)
        runtime.close()
        if _state.log_handler is not None:
            import logging

            logging.getLogger("crossrt").removeHandler(_state.log_handler)
            _state.log_handler.close()
        _state.runtime, _state.log_handler, _state.closed = None, None, True
        _state.profiles.clear()
        return NRT_STATUS.NRT_SUCCESS


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
    """``nrt_load`` for one rank of a collective group on this host: rank ``g_device_id``
    of ``g_device_count`` goes to its own core (``start_nc`` -1: core ``g_device_id``)."""
    if not 0 <= g_device_id < g_device_count:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"g_device_id {g_device_id} is not a rank of a group of {g_device_count}",
        )
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
        exe = load_executable(bytes(data[:size]), validate_hash=settings.validate_hash)
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
        )
        model = nrt_model_t(loaded, start, count)
        _state.models.append(model)
        return model


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


def _model(model: Any) -> nrt_model_t:
    if not isinstance(model, nrt_model_t):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{model!r} is not an nrt_model_t")
    if model not in _state.models:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, "the model was unloaded")
    return model


@guarded("pair")
def nrt_get_model_nc_count(model: nrt_model_t) -> tuple[NRT_STATUS, int | None]:
    """The number of cores ``model`` is staged on."""
    return NRT_STATUS.NRT_SUCCESS, _model(model).nc_count


nrt_get_model_vnc_count = nrt_get_model_nc_count
"""The current header's name for :func:`nrt_get_model_nc_count`."""


@guarded("pair")
def nrt_get_model_instance_count(model: nrt_model_t) -> tuple[NRT_STATUS, int | None]:
    """How many copies of ``model`` are staged: threads that may call nrt_execute at once."""
    return NRT_STATUS.NRT_SUCCESS, _model(model).model.instance_count


@guarded("pair")
def nrt_get_model_tensor_info(
    model: nrt_model_t,
) -> tuple[NRT_STATUS, nrt_tensor_info_array_t | None]:
    """The inputs, then the outputs, of ``model``: name, usage, bytes, dtype, shape."""
    infos = []
    for info in _model(model).model.tensor_info():
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
    written."""
    handle = _model(model)
    return _timed(handle, "nrt_execute", lambda: handle.model.run(input_set, outputs=output_set))


@guarded()
def nrt_execute_repeat(
    model: nrt_model_t, input_set: TensorSet, output_set: TensorSet, repeat_count: int
) -> NRT_STATUS:
    """Run ``model`` ``repeat_count`` times, each run's outputs the next run's inputs of the
    same name; the last run's outputs go to ``output_set``."""
    handle = _model(model)
    if repeat_count < 1:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"repeat_count {repeat_count}: give 1 or more")

    def run() -> None:
        results = handle.model.run_repeat(input_set, repeat_count, _feedback(handle.model))
        for name, value in results.items():
            if name in output_set:
                output_set[name].write(np.ascontiguousarray(value))
            else:
                output_set.add(name, np.ascontiguousarray(value))

    return _timed(handle, "nrt_execute_repeat", run)


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


def _timed(model: nrt_model_t, what: str, run: Callable[[], Any]) -> NRT_STATUS:
    started = time.perf_counter_ns()
    status = NRT_STATUS.NRT_SUCCESS
    try:
        run()
    except ExecutionError as exc:
        if exc.code is not StatusCode.EXEC_COMPLETED_WITH_NUM_ERR:
            raise
        status = NRT_STATUS.NRT_EXEC_COMPLETED_WITH_NUM_ERR  # the outputs are written
    finally:
        _record(model, what, started, time.perf_counter_ns())
    return status


# -- profiling ---------------------------------------------------------------------------------


@guarded()
def nrt_profile_start(model: nrt_model_t, filename: str) -> NRT_STATUS:
    """Record ``model``'s executions until :func:`nrt_profile_stop` with the same file: a
    :class:`crossrt.Profile` (each request's phases, docs/observability.md) with every
    ``nrt_execute`` call, tensor-set copies included, marked on a track of its own."""
    handle = _model(model)
    with _state.lock:
        profile = Profile(handle.model, os.fspath(filename)).start()
        _state.profiles[os.fspath(filename)] = (handle, profile)
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_profile_stop(filename: str) -> NRT_STATUS:
    """Write the executions recorded since :func:`nrt_profile_start` to ``filename`` as a
    Chrome trace (``chrome://tracing``, Perfetto), truncating the file."""
    with _state.lock:
        found = _state.profiles.pop(os.fspath(filename), None)
    if found is None:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"no profile was started for {filename!r}")
    found[1].stop()  # writes the file, whole or not at all
    return NRT_STATUS.NRT_SUCCESS


def _record(model: nrt_model_t, what: str, started: int, ended: int) -> None:
    with _state.lock:
        profiles = [p for m, p in _state.profiles.values() if m is model]
    for profile in profiles:
        profile.mark(
            what, started, ended, "nrt API", start_nc=model.start_nc, nc_count=model.nc_count
        )


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
