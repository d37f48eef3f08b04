"""``compile``: placement, option checks and the driver's compile, giving an Executable."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ..config import settings
from ..drivers.registry import resolve_device
from ..errors import UnsupportedError
from ..model import load_model
from .executable import Executable, ExecutableNode
from .options import parse_options

log = logging.getLogger("crossrt")

_LISTED = 10  # nodes named in an error before "and N more"


def compile(
    model: Any, device: str | None = None, *, driver: str | None = None, **options: Any
) -> Executable:
    """Compile a model for a device.

    Placement is strict: if the driver cannot run every node, nothing is compiled and the
    error lists the nodes it cannot run.

    Args:
        model: a :class:`Model`, a path, serialized bytes or an ``onnx.ModelProto``.
        device: ``"cpu"``, ``"cpu:0"``...; default ``CROSSRT_DEFAULT_DEVICE`` or ``"cpu"``.
        driver: the driver to use; default the most preferred one serving the device.
        **options: ``performance_mode``, ``priority``, ``fp16``, ``extensions``.

    Returns:
        The :class:`Executable`.

    Raises:
        InvalidOptionError: an unknown option or a bad value.
        DeviceUnavailableError: no such device, or an option it cannot honour.
        UnsupportedError: the driver cannot run some nodes (listed by name and op type).
        CompileError: the engine failed to compile.
    """
    model = load_model(model)
    opts = parse_options(**options)
    drv, dev = resolve_device(device or settings().default_device, driver)
    drv.check_options(opts, dev)

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
            "or driver, or change the model",
            details={"driver": drv.name, "device": dev.id, "nodes": refused},
        )

    artifact = drv.compile(model, dev, opts)
    op_types = dict(Counter(n.op_type for n in model.nodes))
    node = ExecutableNode(
        name=f"{drv.name}_0",
        driver=drv.name,
        driver_version=drv.version,
        device_kind=dev.kind.value,
        inputs=tuple(s.name for s in model.inputs),
        outputs=tuple(s.name for s in model.outputs),
        op_types=op_types,
        artifact=artifact,
    )
    log.info(
        "compiled %r for %s: 1 node on driver %s (%d operators)",
        model.name,
        dev.id,
        drv.name,
        len(model.nodes),
    )
    return Executable(
        name=model.name,
        content_hash=model.content_hash,
        device=dev.id,
        inputs=tuple(model.inputs),
        outputs=tuple(model.outputs),
        nodes=(node,),
        options=opts,
    )
