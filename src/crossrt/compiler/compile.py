"""``compile_for_device``: placement, option checks and the driver's compile, giving an
Executable for a device named. The public ``crossrt.compile`` (``crossrt/choice/auto.py``) adds
``device="auto"`` over it."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..config import settings
from ..drivers.base import CompileOptions, DeviceInfo, Driver
from ..drivers.registry import available_drivers, parse_device, resolve_device
from ..errors import DeviceUnavailableError, InvalidOptionError, UnsupportedError
from ..model import Model, load_model
from . import calibrate
from .cache import shared_cache
from .executable import Executable, ExecutableNode
from .io_quant import io_quantization
from .options import parse_options
from .partition import assign, region_model, regions
from .stages import fixed_shapes, parse_stages, stage_model, staged

log = logging.getLogger("crossrt")

_LISTED = 10  # nodes named in an error before "and N more"


def compile_for_device(
    model: Any,
    device: str | None = None,
    *,
    driver: str | None = None,
    fallback: str | Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_version: int = 0,
    stages: Sequence[Mapping[str, Sequence[int]]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    **options: Any,
) -> Executable:
    """Compile a model for the device named (``crossrt.compile`` without ``device="auto"``).

    Placement is strict by default: if the driver cannot run every node, nothing is compiled
    and the error lists the nodes it cannot run. With ``fallback``, the nodes the target
    cannot run are placed on the fallback devices instead, in priority order.

    Args:
        model: a :class:`Model`, a path, serialized bytes or an ``onnx.ModelProto``.
        device: ``"cpu"``, ``"cpu:0"``...; default ``CROSSRT_DEFAULT_DEVICE`` or ``"cpu"``.
        driver: the driver to use; default the most preferred one serving the device.
        fallback: a device (or devices, in priority order) for nodes the target cannot run.
        cache_dir: a compiled-model cache directory (OH_NNCompilation_SetCache); default
            ``CROSSRT_CACHE_DIR``; no cache when both are unset. A hit returns the stored
            executable without compiling, or, for a model file seen before, even parsing it.
        cache_version: the cache version (NNRt's): a cached entry of an older version is
            rebuilt; one of a newer version is an error.
        stages: compile for these static input shapes instead (bmodel stages), one
            ``{input name: shape}`` per stage, e.g. ``[{"x": [1, 3, 224, 224]},
            {"x": [8, 3, 224, 224]}]``: a run then takes exactly one of those shapes.
        shapes: compile the model with these static input shapes (``{"x": [1, 2048]}``), as a
            NEFF has: the executable's inputs and outputs are concrete, and a run takes those
            shapes only. Inputs not named must be static already. Not with ``stages``.
        **options: ``performance_mode``, ``priority``, ``fp16``, ``precision``, ``portable``,
            ``extensions``; ``calibration`` with ``precision="int8"``: the samples to quantize
            from (``calibrate.py``: a list of ``{input: array}``, a dict of arrays whose first
            axis counts samples, or a folder of ``.npz``/``NAME.npy``).

    Returns:
        The :class:`Executable`.

    Raises:
        InvalidArgumentError: the cache holds the model at a newer ``cache_version``, or a bad
            ``cache_version`` (a cache directory that cannot be used is passed by, warned once).
        InvalidOptionError: an unknown option or a bad value, or a bad stage (an unknown
            input, a wrong rank, a static dim changed, a stage given twice).
        DeviceUnavailableError: no such device, or an option it cannot honour.
        UnsupportedError: the driver cannot run some nodes (listed by name and op type).
        CompileError: the engine failed to compile.
    """
    if shapes is not None:
        model = fixed_shapes(load_model(model), shapes, stages, load_model)
    model, options = calibrate.prepare(model, options)  # precision="int8": a QDQ model
    cache = shared_cache(cache_dir, cache_version)
    if cache is None:
        model = load_model(model)
    opts = parse_options(**options)
    drv, dev = resolve_device(device or settings().default_device, driver)
    drv.check_options(opts, dev)
    if stages is not None:
        return _compile_stages(model, stages, cache, drv, dev, opts, fallback)
    if cache is not None:
        # The cache loads (and validates) the model only on a miss.
        return cache.get_or_compile(
            model, drv, dev, opts, lambda m: build(m, drv, dev, opts, fallback), fallback
        )
    return build(model, drv, dev, opts, fallback)


def _compile_stages(
    source: Any,
    stages: Any,
    cache: Any,
    drv: Driver,
    dev: DeviceInfo,
    opts: CompileOptions,
    fallback: str | Sequence[str] | None,
) -> Executable:
    """Compile one single-stage executable per stage shape, joined in one executable."""
    model = load_model(source)
    exes = []
    for shapes in parse_stages(model.name, model.inputs, stages):
        part = stage_model(model, shapes, load_model)
        if cache is None:
            exes.append(build(part, drv, dev, opts, fallback))
        else:  # each stage is a model of its own content hash, so the cache keeps it apart
            exes.append(
                cache.get_or_compile(
                    part, drv, dev, opts, lambda m: build(m, drv, dev, opts, fallback), fallback
                )
            )
    exe = staged(model, exes)
    exe.check_savable()  # the stages together may hold more than a header can
    return exe


def build(
    model: Model,
    drv: Driver,
    dev: DeviceInfo,
    opts: CompileOptions,
    fallback: str | Sequence[str] | None = None,
) -> Executable:
    """Place and compile a loaded model whose device and options are already checked."""
    if fallback is None:
        _check_strict(model, drv, dev)
        candidates = [(drv, dev)]
        assignment = [0] * len(model.nodes)
    else:
        candidates = [(drv, dev), *_fallback_candidates(fallback, drv, dev)]
        assignment = assign(model, candidates)

    if all(a == 0 for a in assignment):
        parts = [
            (0, model, tuple(s.name for s in model.inputs), tuple(s.name for s in model.outputs))
        ]
    else:
        parts = [
            (r.candidate, region_model(model, r, f"{model.name}_{n}"), r.inputs, r.outputs)
            for n, r in enumerate(regions(model, assignment))
        ]
    nodes = []
    for n, (c, part, ins, outs) in enumerate(parts):
        part_drv, part_dev = candidates[c]
        part_opts = opts if c == 0 else _options_for(part_drv, part_dev, opts)
        artifact = part_drv.compile(part, part_dev, part_opts)
        nodes.append(
            ExecutableNode(
                name=f"{part_drv.name}_{n}",
                driver=part_drv.name,
                driver_version=part_drv.version,
                device_kind=part_dev.kind.value,
                inputs=ins,
                outputs=outs,
                op_types=dict(Counter(node.op_type for node in part.nodes)),
                artifact=artifact,
                target=part_drv.describe_artifact(artifact),
            )
        )
    exe = Executable(
        name=model.name,
        content_hash=model.content_hash,
        device=dev.id,
        inputs=tuple(model.inputs),
        outputs=tuple(model.outputs),
        nodes=tuple(nodes),
        options=opts,
        metadata={**{p.key: p.value for p in model.proto.metadata_props}, **io_quantization(model)},
    )
    log.info("compiled %r for %s: %s", model.name, dev.id, exe.placement_summary())
    exe.check_savable()  # placement regions may name more tensors than a header holds
    return exe


def _check_strict(model: Model, drv: Driver, dev: DeviceInfo) -> None:
    reasons = drv.unsupported_reasons(model, dev)
    refused = [
        {"name": node.name, "op_type": node.op_type, "reason": why}
        for node, why in zip(model.nodes, reasons, strict=True)
        if why is not None
    ]
    if refused:
        listed = "; ".join(
            f"{r['name']} ({r['op_type']}): {r['reason']}" for r in refused[:_LISTED]
        )
        more = f"; and {len(refused) - _LISTED} more" if len(refused) > _LISTED else ""
        raise UnsupportedError(
            f"driver {drv.name!r} on {dev.id} cannot run {len(refused)} of "
            f"{len(reasons)} nodes of {model.name!r}: {listed}{more}. Choose another device "
            'or driver, allow fallback="cpu", or change the model',
            details={"driver": drv.name, "device": dev.id, "nodes": refused},
        )


def _fallback_candidates(
    fallback: str | Sequence[str], target: Driver, target_device: DeviceInfo
) -> list[tuple[Driver, DeviceInfo]]:
    """Every (driver, device) the fallback devices name, in priority order, target excluded."""
    wanted = [fallback] if isinstance(fallback, str) else list(fallback)
    found: list[tuple[Driver, DeviceInfo]] = []
    for spec in wanted:
        kind, index = parse_device(spec)
        for drv in available_drivers():
            for info in drv.devices():
                info_kind, info_index = parse_device(info.id)
                if info_kind != kind or (index is not None and index != info_index):
                    continue
                if drv is target and info.id == target_device.id:
                    continue
                if all(d is not drv or i.id != info.id for d, i in found):
                    found.append((drv, info))
    if not found:
        raise DeviceUnavailableError(
            f"fallback {wanted} names no device another driver serves; run `crossrt ls`",
            details={"fallback": wanted},
        )
    return found


def _options_for(drv: Driver, dev: DeviceInfo, opts: CompileOptions) -> CompileOptions:
    """The options as they apply to a fallback node: what it cannot honour is dropped.

    A reduced precision is a permission, not a demand: a fallback node that cannot compute in
    it computes in the model's own precision (never a lower one than asked for)."""
    tries = [opts]
    if opts.precision is not None or opts.fp16:
        tries.append(replace(opts, precision=None, fp16=False))
    for tried in tries:
        try:
            drv.check_options(tried, dev)
        except (DeviceUnavailableError, InvalidOptionError) as exc:
            why = exc.message
            continue
        if tried is not opts:
            log.info("fallback node on %s computes in the model's precision: %s", drv.name, why)
        return tried
    log.warning("fallback node on %s uses default options: %s", drv.name, why)
    return CompileOptions()
