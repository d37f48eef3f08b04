"""``OH_NNCompilation_*``: build options, then Build, which compiles the finished model with
:func:`crossrt.compile` (through crossrt's compiled-model cache when SetCache was called),
or reads an offline model or a cache (a ``.crm``: crossrt's compiled container)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...compiler import compile_for_device as crossrt_compile
from ...drivers import PerformanceMode, Priority
from ...executables import CompileCache, Executable, load_executable
from ...model import Model
from .cache_names import model_name, named_entry, renamed, write_info
from .devices import device
from .model import model_of
from .status import NNError, OH_NN_ReturnCode, forbidden, guarded, invalid, log
from .types import OH_NN_PerformanceMode, OH_NN_Priority

__all__ = [
    "NNRT_KEYS",
    "OH_NNCompilation",
    "OH_NNCompilation_AddExtensionConfig",
    "OH_NNCompilation_Build",
    "OH_NNCompilation_Construct",
    "OH_NNCompilation_ConstructForCache",
    "OH_NNCompilation_ConstructWithOfflineModelBuffer",
    "OH_NNCompilation_ConstructWithOfflineModelFile",
    "OH_NNCompilation_Destroy",
    "OH_NNCompilation_EnableFloat16",
    "OH_NNCompilation_ExportCacheToBuffer",
    "OH_NNCompilation_ImportCacheFromBuffer",
    "OH_NNCompilation_SetCache",
    "OH_NNCompilation_SetDevice",
    "OH_NNCompilation_SetPerformanceMode",
    "OH_NNCompilation_SetPriority",
]

_OK = OH_NN_ReturnCode.OH_NN_SUCCESS
_NO_DEVICE = OH_NN_ReturnCode.OH_NN_UNAVALIDABLE_DEVICE  # the seed's code for "unsupported"
_UINT32_MAX = 2**32 - 1

NNRT_KEYS = frozenset(
    {"QuantBuffer", "ModelName", "isProfiling", "opLayout", "InputDims", "DynamicDims"}
    | {"NPU_FM_SHARED", "AIPP", "isExceedRamLimit"}
)
"""Extension keys NNRt itself reads: recorded, not passed to the driver."""

NO_EFFECT = {
    "QuantBuffer": "quantization parameters come from OH_NN_QuantParam on the tensors",
    "isProfiling": "profile with crossrt.profiling.Profile or `crossrt profile` instead",
    "opLayout": "crossrt's engines choose their own layouts",
    "InputDims": "give dynamic dimensions' ranges in the model (crossrt.dim_ranges)",
    "DynamicDims": "give dynamic dimensions' ranges in the model (crossrt.dim_ranges)",
    "NPU_FM_SHARED": "no NPU feature-map memory to share here",
    "AIPP": "no AIPP image preprocessing here: preprocess before the run",
    "isExceedRamLimit": "memory is bounded by the device's memory budget",
}
"""NNRt's own keys that change nothing here, and why: each is warned of once per process,
by name, when a Build finds it set (ModelName names the cache files)."""

_warned: set[str] = set()


@dataclass(eq=False)
class OH_NNCompilation:  # the seed's name
    """Build options and, after Build, the crossrt :class:`Executable`."""

    model: Model | None = None
    offline: Any = None  # a path, or the caller's buffer (kept, not copied)
    cache_buffer: Any = None  # ImportCacheFromBuffer's buffer (kept, not copied)
    device_id: int = 0
    device_set: bool = False  # SetDevice was called: an offline model must be for that device
    cache_dir: str | None = None
    cache_version: int = 0
    performance_mode: OH_NN_PerformanceMode = OH_NN_PerformanceMode.OH_NN_PERFORMANCE_NONE
    priority: OH_NN_Priority = OH_NN_Priority.OH_NN_PRIORITY_NONE
    fp16: bool = False
    extensions: dict[str, bytes] = field(default_factory=dict)
    exe: Executable | None = None
    alive: bool = True


def compilation_of(c: Any, *, open_: bool = False) -> OH_NNCompilation:
    """``c`` if live (and, with ``open_``, not built yet)."""
    if not isinstance(c, OH_NNCompilation) or not c.alive:
        raise invalid(f"{c!r} is not a live OH_NNCompilation")
    if open_ and c.exe is not None:
        raise forbidden("the compilation is built; options cannot change after Build")
    return c


@guarded("handle")
def OH_NNCompilation_Construct(model: Any) -> OH_NNCompilation | None:
    """A compilation of a finished model (the model may be destroyed after Build)."""
    handle = model_of(model)
    if handle.model is None:
        raise invalid("call OH_NNModel_Finish before OH_NNCompilation_Construct")
    return OH_NNCompilation(model=handle.model)


@guarded("handle")
def OH_NNCompilation_ConstructWithOfflineModelFile(modelPath: str) -> OH_NNCompilation | None:
    """A compilation of an offline model file: a ``.crm``."""
    if not isinstance(modelPath, str | os.PathLike) or not Path(modelPath).is_file():
        raise invalid(f"offline model {modelPath!r} is not a file")
    return OH_NNCompilation(offline=os.fspath(modelPath))


@guarded("handle")
def OH_NNCompilation_ConstructWithOfflineModelBuffer(
    modelBuffer: Any, modelSize: int
) -> OH_NNCompilation | None:
    """A compilation of an offline model in memory (kept, not copied: it must outlive the
    compilation)."""
    if modelBuffer is None or not isinstance(modelSize, int) or modelSize <= 0:
        raise invalid("give a buffer and its positive size")
    view = memoryview(modelBuffer).cast("B")
    if modelSize > view.nbytes:
        raise invalid(f"modelSize {modelSize} exceeds the buffer's {view.nbytes} bytes")
    return OH_NNCompilation(offline=view[:modelSize])


def OH_NNCompilation_ConstructForCache() -> OH_NNCompilation:
    """An empty compilation to restore from a cache (SetCache or ImportCacheFromBuffer,
    then Build)."""
    return OH_NNCompilation()


@guarded("pair")
def OH_NNCompilation_ExportCacheToBuffer(
    compilation: OH_NNCompilation, buffer: Any, length: int
) -> tuple[OH_NN_ReturnCode, int | None]:
    """Copy the built model (its ``.crm``) into ``buffer``; return its size (modelSize).
    Only after Build; a buffer too small is INVALID_PARAMETER."""
    c = compilation_of(compilation)
    if c.exe is None:
        raise forbidden("call OH_NNCompilation_Build before exporting its cache")
    data = c.exe.to_bytes()
    view = memoryview(buffer).cast("B")
    if view.readonly:
        raise invalid("the buffer is read-only")
    if not isinstance(length, int) or len(data) > min(length, view.nbytes):
        raise invalid(f"the cache takes {len(data)} bytes; the buffer holds {length}")
    view[: len(data)] = data
    return _OK, len(data)


@guarded()
def OH_NNCompilation_ImportCacheFromBuffer(
    compilation: OH_NNCompilation, buffer: Any, modelSize: int
) -> OH_NN_ReturnCode:
    """Restore from a cache in memory at Build (kept, not copied)."""
    c = compilation_of(compilation, open_=True)
    if buffer is None or not isinstance(modelSize, int) or modelSize <= 0:
        raise invalid("give a buffer and its positive size")
    view = memoryview(buffer).cast("B")
    if modelSize > view.nbytes:
        raise invalid(f"modelSize {modelSize} exceeds the buffer's {view.nbytes} bytes")
    c.cache_buffer = view[:modelSize]
    return _OK


@guarded()
def OH_NNCompilation_AddExtensionConfig(
    compilation: OH_NNCompilation, configName: str, configValue: Any, configValueSize: int
) -> OH_NN_ReturnCode:
    """Record a vendor key and value. NNRt's own keys stay here; any other goes to the
    driver, which refuses at Build a key it cannot use (INVALID_PARAMETER)."""
    c = compilation_of(compilation, open_=True)
    if not isinstance(configName, str) or not configName:
        raise invalid("configName must be a non-empty string")
    if configValue is None or not isinstance(configValueSize, int) or configValueSize <= 0:
        raise invalid("give a value and its positive size")
    value = bytes(memoryview(configValue).cast("B")[:configValueSize])
    if configName in c.extensions:
        raise invalid(f"extension {configName!r} was added already")
    c.extensions[configName] = value
    return _OK


@guarded()
def OH_NNCompilation_SetDevice(compilation: OH_NNCompilation, deviceID: int) -> OH_NN_ReturnCode:
    """Build for this device (0: the first)."""
    c = compilation_of(compilation, open_=True)
    device(deviceID)
    c.device_id = deviceID
    c.device_set = True
    return _OK


def _cache_dir(path: Any) -> str:
    if not isinstance(path, str | os.PathLike):
        raise invalid(f"cache path {path!r} is not a path")
    folder = Path(path)
    if not folder.is_dir() or not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
        raise NNError(
            OH_NN_ReturnCode.OH_NN_INVALID_PATH,
            f"cache directory {os.fspath(path)!r} does not exist or is not accessible; create it",
        )
    return os.fspath(folder)


@guarded()
def OH_NNCompilation_SetCache(
    compilation: OH_NNCompilation, cachePath: str, version: int
) -> OH_NN_ReturnCode:
    """Cache in ``cachePath`` (which must exist: else OH_NN_INVALID_PATH) at ``version``."""
    c = compilation_of(compilation, open_=True)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < _UINT32_MAX:
        raise invalid(f"cache version {version!r}: give 0 .. {_UINT32_MAX - 1}")
    c.cache_dir, c.cache_version = _cache_dir(cachePath), version
    return _OK


def _capabilities(c: OH_NNCompilation) -> Any:
    return device(c.device_id).capabilities


@guarded()
def OH_NNCompilation_SetPerformanceMode(
    compilation: OH_NNCompilation, performanceMode: int
) -> OH_NN_ReturnCode:
    """Record the performance mode; one the device does not honour is UNAVALIDABLE_DEVICE."""
    c = compilation_of(compilation, open_=True)
    try:
        mode = OH_NN_PerformanceMode(performanceMode)
    except ValueError:
        raise invalid(f"{performanceMode!r} is not an OH_NN_PerformanceMode") from None
    if int(mode) not in [int(m) for m in _capabilities(c).performance_modes]:
        raise NNError(_NO_DEVICE, f"device {c.device_id} does not support {mode.name}")
    c.performance_mode = mode
    return _OK


@guarded()
def OH_NNCompilation_SetPriority(compilation: OH_NNCompilation, priority: int) -> OH_NN_ReturnCode:
    """Record the priority; any but NONE on a device without priorities is
    UNAVALIDABLE_DEVICE."""
    c = compilation_of(compilation, open_=True)
    try:
        level = OH_NN_Priority(priority)
    except ValueError:
        raise invalid(f"{priority!r} is not an OH_NN_Priority") from None
    if level is not OH_NN_Priority.OH_NN_PRIORITY_NONE and not _capabilities(c).priority:
        raise NNError(_NO_DEVICE, f"device {c.device_id} has no priorities")
    c.priority = level
    return _OK


@guarded()
def OH_NNCompilation_EnableFloat16(
    compilation: OH_NNCompilation, enableFloat16: bool
) -> OH_NN_ReturnCode:
    """Record the float16 choice: ``compile(precision="fp16")`` at Build. On a device
    without float16 (the reference driver's) enabling it is UNAVALIDABLE_DEVICE, recorded
    all the same (Build then fails the same way unless another device is set)."""
    c = compilation_of(compilation, open_=True)
    if not isinstance(enableFloat16, bool):
        raise invalid(f"enableFloat16 {enableFloat16!r} is not a bool")
    c.fp16 = enableFloat16
    if enableFloat16 and not _capabilities(c).fp16:
        raise NNError(_NO_DEVICE, f"device {c.device_id} computes in float32 only")
    return _OK


@guarded()
def OH_NNCompilation_Build(compilation: OH_NNCompilation) -> OH_NN_ReturnCode:
    """Compile (or restore); every setter afterwards is OPERATION_FORBIDDEN."""
    c = compilation_of(compilation, open_=True)
    info = device(c.device_id)
    if c.fp16 and not info.capabilities.fp16:
        raise NNError(_NO_DEVICE, f"device {c.device_id} computes in float32 only")
    if c.cache_dir is not None:
        _cache_dir(c.cache_dir)  # it may have gone since SetCache
        _check_cache(c.cache_dir)
    name = model_name(c.extensions)
    _warn_no_effect(c.extensions)
    if c.model is not None:
        extensions = {k: v.decode("latin-1") for k, v in c.extensions.items() if k not in NNRT_KEYS}
        c.exe = crossrt_compile(
            c.model if name is None else renamed(c.model, name),
            info.id,
            driver=info.driver,
            cache_dir=c.cache_dir,
            cache_version=c.cache_version,
            performance_mode=int(c.performance_mode),
            priority=int(c.priority),
            precision="fp16" if c.fp16 else None,
            extensions=extensions,
        )
        if name is not None and c.cache_dir is not None:
            write_info(c.cache_dir, name, c.cache_version)
    else:
        c.exe = _as_set(c, _compiled(c, name))
    return _OK


def _warn_no_effect(extensions: dict[str, bytes]) -> None:
    """Warn once, by name, of each NNRt key set that changes nothing here."""
    for key in sorted(extensions.keys() & NO_EFFECT.keys() - _warned):
        log.warning("extension %s is recorded and has no effect here: %s", key, NO_EFFECT[key])
        _warned.add(key)


def _compiled(c: OH_NNCompilation, name: str | None) -> Executable:
    """The executable of an offline model or a cache: compiled already."""
    if c.offline is not None:
        return load_executable(c.offline if isinstance(c.offline, str) else bytes(c.offline))
    if c.cache_buffer is not None:
        return load_executable(bytes(c.cache_buffer), validate_hash=True)
    if c.cache_dir is not None and name is not None:
        return load_executable(named_entry(c.cache_dir, name, c.cache_version), validate_hash=True)
    if c.cache_dir is not None:
        return _restore(c.cache_dir, c.cache_version)
    raise invalid("a compilation for cache needs SetCache or ImportCacheFromBuffer first")


def _as_set(c: OH_NNCompilation, exe: Executable) -> Executable:
    """An offline model or cache entry with the compilation's settings: the performance mode
    and priority take effect (the driver reads them at load); a device or float16 that the
    compiled model cannot honour is refused by name, never ignored."""
    if c.device_set:
        info = device(c.device_id)
        drivers = sorted({n.driver for n in exe.nodes})
        if exe.device != info.id or info.driver not in drivers:
            raise invalid(
                f"OH_NNCompilation_SetDevice({c.device_id}) is {info.driver} on {info.id}, but "
                f"the compiled model is for {', '.join(drivers)} on {exe.device}: set the "
                "device it was compiled for, or compile it again for this one"
            )
    if c.fp16 and exe.options.precision != "fp16":
        raise forbidden(
            "OH_NNCompilation_EnableFloat16(true) cannot change a compiled model: it was "
            f"compiled at {exe.options.precision or 'its own precision'}; compile it again "
            "with float16 enabled"
        )
    changes: dict[str, Any] = {}
    if c.performance_mode != OH_NN_PerformanceMode.OH_NN_PERFORMANCE_NONE:
        changes["performance_mode"] = PerformanceMode(int(c.performance_mode))
    if c.priority != OH_NN_Priority.OH_NN_PRIORITY_NONE:
        changes["priority"] = Priority(int(c.priority))
    if not changes:
        return exe
    return dataclasses.replace(
        exe,
        options=dataclasses.replace(exe.options, **changes),
        stages=tuple(
            dataclasses.replace(s, options=dataclasses.replace(s.options, **changes))
            for s in exe.stages
        ),
    )


def _check_cache(folder: str) -> None:
    """An entry of the cache that does not read is OH_NN_INVALID_FILE, as NNRt's CRC
    check of its cache files."""
    bad = CompileCache(folder).verify()
    if bad:
        entry, why = bad[0]
        raise NNError(
            OH_NN_ReturnCode.OH_NN_INVALID_FILE,
            f"cache file {entry.path} is damaged ({why}); delete it or clear the cache",
        )


def _restore(folder: str, version: int) -> Executable:
    """The newest entry of the cache at ``version``: the seed's rules without a model to
    recompile (a newer version only: INVALID_PARAMETER; none: INVALID_FILE)."""
    entries = CompileCache(folder, version).entries()
    same = [e for e in entries if e.version == version]
    if not same:
        if any(e.version is not None and e.version > version for e in entries):
            raise invalid(f"the cache in {folder!r} is of a newer version than {version}")
        raise NNError(
            OH_NN_ReturnCode.OH_NN_INVALID_FILE,
            f"the cache in {folder!r} holds no model at version {version}",
        )
    return load_executable(same[-1].path, validate_hash=True)


@guarded("void")
def OH_NNCompilation_Destroy(compilation: OH_NNCompilation) -> None:
    """Free the compilation (C: void)."""
    compilation_of(compilation).alive = False
