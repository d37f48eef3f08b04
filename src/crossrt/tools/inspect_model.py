"""``crossrt inspect model.onnx``: what an ONNX model is and which driver would run what.

The model's IR version, opsets, inputs and outputs (with their full ONNX types: a scikit-learn
classifier's probabilities are a sequence of maps), operator types with counts, then the
placement on a device, as drivers answer "which of these nodes can you run?": how many nodes
each driver runs, whether a strict compile succeeds, the groups of nodes ``compile(...,
fallback=)`` onto that device would make, and why no driver runs the nodes that are left.
Nothing is compiled or run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from .. import dtypes
from ..compiler.partition import regions
from ..config import settings
from ..drivers import available_drivers
from ..drivers.base import DeviceInfo, Driver
from ..drivers.registry import resolve_device
from ..model import Model, TensorSpec, load_model
from ..model.spec import spec_from_value_info
from .common import human_bytes, printable

_LISTED = 10  # nodes a text line names before "and N more"


def collect(path: str, device: str | None = None, driver: str | None = None) -> dict[str, Any]:
    """The model and its placement as one JSON-friendly document.

    Raises:
        CrossrtError: the file is not a valid ONNX model, or no driver serves ``device``.
    """
    model = load_model(path)
    proto = model.proto
    weights = {t.name for t in proto.graph.initializer}
    inputs = [v for v in proto.graph.input if v.name not in weights]
    return {
        "file": path,
        "kind": "onnx",
        "size": Path(path).stat().st_size,
        "name": model.name,
        "ir_version": proto.ir_version,
        "opsets": {domain or "ai.onnx": version for domain, version in model.opsets.items()},
        "producer": {"name": proto.producer_name, "version": proto.producer_version},
        "inputs": [_value(v) for v in inputs],
        "outputs": [_value(v) for v in proto.graph.output],
        "nodes": len(model.nodes),
        "op_types": dict(sorted(Counter(_op(n) for n in model.nodes).items())),
        "placement": placement(model, device or settings().default_device, driver),
    }


def placement(model: Model, device: str, driver: str | None = None) -> dict[str, Any]:
    """Which driver runs which node on ``device``: the target driver (``driver``, else the
    preferred one), then every other driver of that device, each node on the first that
    runs it."""
    target, info = resolve_device(device, driver)
    candidates: list[tuple[Driver, DeviceInfo]] = [(target, info)]
    candidates += [
        (d, i)
        for d in available_drivers()
        if d is not target
        for i in d.devices()
        if i.id == info.id
    ]
    answers = [d.unsupported_reasons(model, i) for d, i in candidates]
    nodes = model.nodes
    assignment = [
        next((c for c, reasons in enumerate(answers) if reasons[n] is None), -1)
        for n in range(len(nodes))
    ]
    groups = []
    for region in regions(model, assignment) if nodes else []:
        chosen = candidates[region.candidate] if region.candidate >= 0 else None
        groups.append(
            {
                "driver": chosen[0].name if chosen else None,
                "nodes": [nodes[n].name for n in region.nodes],
                "op_types": dict(Counter(_op(nodes[n]) for n in region.nodes)),
            }
        )
    return {
        "device": info.id,
        "drivers": {
            d.name: sum(r is None for r in reasons)
            for (d, _), reasons in zip(candidates, answers, strict=True)
        },
        "strict": target.name if all(a == 0 for a in assignment) else None,
        "target": target.name,
        "target_refuses": [
            _refusal(nodes[n], {target.name: why})
            for n, why in enumerate(answers[0])
            if why is not None
        ],
        "groups": groups,
        "unsupported": [
            _refusal(
                nodes[n],
                {d.name: reasons[n] for (d, _), reasons in zip(candidates, answers, strict=True)},
            )
            for n, a in enumerate(assignment)
            if a < 0
        ],
    }


def lines(doc: dict[str, Any]) -> list[str]:
    """The document as the text ``crossrt inspect`` prints (through
    :func:`~crossrt.tools.common.say`, which escapes what a terminal would act on)."""
    producer = " ".join(p for p in doc["producer"].values() if p) or "not recorded"
    opsets = ", ".join(f"{domain} {version}" for domain, version in doc["opsets"].items())
    out = [
        f"MODEL {doc['file']}",
        f"  name            {doc['name']}",
        f"  file size       {human_bytes(doc['size'])} ({doc['size']} bytes)",
        f"  producer        {producer}",
        f"  IR version      {doc['ir_version']}",
        f"  opsets          {opsets}",
        f"  nodes           {doc['nodes']}",
        "",
        "  INPUTS",
        *(f"    {printable(v['name']):<24} {v['type']}" for v in doc["inputs"]),
        "  OUTPUTS",
        *(f"    {printable(v['name']):<24} {v['type']}" for v in doc["outputs"]),
        "",
        "  OPERATORS",
        *(f"    {op:<32} x{count}" for op, count in doc["op_types"].items()),
        "",
        *_placement_lines(doc["placement"], doc["nodes"]),
    ]
    return out


def _placement_lines(place: dict[str, Any], total: int) -> list[str]:
    out = [f"  PLACEMENT on {place['device']}"]
    out += [
        f"    {name:<16} runs {count} of {total} node{'s' * (total != 1)}"
        for name, count in place["drivers"].items()
    ]
    if place["strict"]:
        out.append(f"    {'strict':<16} {place['strict']} runs every node: compiles as it is")
    else:
        refused = place["target_refuses"]
        then = (
            "no compile succeeds: no driver runs the nodes listed last"
            if place["unsupported"]
            else "compile with fallback to place them as below"
        )
        out.append(
            f"    {'strict':<16} fails: {place['target']} cannot run {len(refused)} "
            f"node{'s' * (len(refused) != 1)}; {then}"
        )
        out += [f"      {_node_line(r)}" for r in refused[:_LISTED]]
        if len(refused) > _LISTED:
            out.append(f"      and {len(refused) - _LISTED} more")
    out.append("    groups (each node on the first driver above that runs it):")
    for index, group in enumerate(place["groups"]):
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(group["op_types"].items()))
        count = len(group["nodes"])
        who = group["driver"] or "NO DRIVER"
        out.append(f"      {index}  {who:<14} {count} node{'s' * (count != 1)}: {ops}")
    if place["unsupported"]:
        out.append("  NOT RUN BY ANY DRIVER")
        out += [f"    {_node_line(r)}" for r in place["unsupported"]]
    return out


def _node_line(refusal: dict[str, Any]) -> str:
    why = "; ".join(f"{name}: {reason}" for name, reason in refusal["reasons"].items())
    return f"{refusal['name']} ({refusal['op_type']}): {why}"


def _refusal(node: onnx.NodeProto, reasons: dict[str, str | None]) -> dict[str, Any]:
    return {"name": node.name, "op_type": _op(node), "reasons": reasons}


def _op(node: onnx.NodeProto) -> str:
    """``MatMul``, or ``ai.onnx.ml.ZipMap`` for an operator outside the default domain."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return f"{domain}.{node.op_type}" if domain else node.op_type


def _value(info: onnx.ValueInfoProto) -> dict[str, Any]:
    spec = spec_from_value_info(info)
    return {**spec.to_dict(), "type": type_str(info.type, spec)}


def type_str(vtype: onnx.TypeProto, spec: TensorSpec | None = None) -> str:
    """``float32 [?,64]``, ``seq(map(int64, float32))``, ``optional(int64 [3])``."""
    which = vtype.WhichOneof("value")
    if which == "tensor_type":
        holder = onnx.ValueInfoProto(name="", type=vtype)
        return (spec or spec_from_value_info(holder)).describe()
    if which == "sequence_type":
        return f"seq({type_str(vtype.sequence_type.elem_type)})"
    if which == "map_type":
        key = _elem_name(vtype.map_type.key_type)
        return f"map({key}, {_scalar_str(vtype.map_type.value_type)})"
    if which == "optional_type":
        return f"optional({type_str(vtype.optional_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse {_elem_name(vtype.sparse_tensor_type.elem_type)}"
    return "unknown"


def _scalar_str(vtype: onnx.TypeProto) -> str:
    # A map's values are tensors of rank 0 (ZipMap's float): the element type says it all.
    if vtype.WhichOneof("value") == "tensor_type" and not vtype.tensor_type.shape.dim:
        return _elem_name(vtype.tensor_type.elem_type)
    return type_str(vtype)


def _elem_name(elem_type: int) -> str:
    try:
        return dtypes.from_onnx(elem_type).name
    except ValueError:
        return f"type {elem_type}"
