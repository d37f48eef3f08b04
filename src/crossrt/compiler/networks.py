"""A ``.crm`` header's ``networks``, validated field by field and built into Executables.

Every value's type is checked before use, every section index against the table, and each
node's inputs against the tensors available when it runs. The header has passed the limits
of header.py already, so no list here is longer than a real container needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..drivers.registry import parse_device
from ..errors import CrossrtError
from ..model import TensorSpec
from .executable import Executable, ExecutableNode
from .header import (
    bad_field,
    corrupt,
    field,
    is_count,
    is_dict,
    is_list,
    is_name,
    is_names,
    is_nonempty_list,
    is_positive,
    is_str,
)
from .options import parse_options, parse_stages


def read_networks(
    header: dict[str, Any], sections: tuple[memoryview, ...]
) -> tuple[tuple[Executable, ...], dict[int, str]]:
    """The header's networks, in file order, their nodes' artifacts views of ``sections``.

    Returns:
        The networks, and who uses each section (``node 'x' of network 'y'``), for messages.

    Raises:
        InvalidContainerError: a field is missing, of the wrong type, or inconsistent; two
            networks share a name; a section is used by no node.
    """
    nets = field(header, "networks", "", "a non-empty list", is_nonempty_list)
    users: dict[int, str] = {}
    networks = tuple(_network(net, f"networks[{i}]", sections, users) for i, net in enumerate(nets))
    names = [n.name for n in networks]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise corrupt(f"two networks are called {dup!r}; network names must be unique")
    unused = sorted(set(range(len(sections))) - set(users))
    if unused:
        raise corrupt(f"section {unused[0]} is used by no node")
    return networks, users


def _network(
    net: Any, where: str, sections: tuple[memoryview, ...], users: dict[int, str]
) -> Executable:
    if not isinstance(net, dict):
        raise bad_field(where, "an object", net)
    name = field(net, "name", where, "a non-empty string", is_name)
    content_hash = field(net, "content_hash", where, "a string", is_str)
    device = field(net, "device", where, "a device such as 'cpu:0'", is_name)
    try:
        kind, _ = parse_device(device)
    except CrossrtError:
        raise bad_field(f"{where}.device", "a device such as 'cpu:0'", device) from None
    if field(net, "device_kind", where, "a string", is_str) != kind:
        raise corrupt(
            f"{where}.device_kind is {net['device_kind']!r}, device {device!r} is {kind!r}"
        )
    inputs = _specs(net, "inputs", where)
    outputs = _specs(net, "outputs", where)
    try:
        options = parse_options(**field(net, "options", where, "an object", is_dict))
    except CrossrtError as exc:
        raise corrupt(f"{where}.options: {exc.message}") from None
    cores_required = field(net, "cores_required", where, "an integer >= 1", is_positive)
    raw_stages = field(net, "stages", where, "a list", is_list)
    nodes = _nodes(net, where, name, inputs, outputs, sections, users)
    metadata = net.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad_field(f"{where}.metadata", "an object of strings", metadata)
    decision = net.get("decision")
    if decision is not None and not is_dict(decision):
        raise bad_field(f"{where}.decision", "an object", decision)
    base = Executable(
        name,
        content_hash,
        device,
        inputs,
        outputs,
        nodes,
        options,
        metadata=metadata,
        decision=decision,
    )
    stages = _stages(raw_stages, where, base, sections, users)
    if stages and net["nodes"] != raw_stages[0]["nodes"]:
        # Plain loaders run the network's nodes for the first stage's shapes.
        raise corrupt(f"{where}.nodes differ from {where}.stages[0].nodes; they must be equal")
    exe = dataclasses.replace(base, stages=stages)
    most = max(n.cores for e in (exe, *stages) for n in e.nodes)
    if cores_required != most:
        raise corrupt(f"{where}.cores_required is {cores_required}, but a node needs {most}")
    return exe


def _stages(
    raw_stages: list[Any],
    where: str,
    base: Executable,
    sections: tuple[memoryview, ...],
    users: dict[int, str],
) -> tuple[Executable, ...]:
    shapes = []
    for j, stage in enumerate(raw_stages):
        if not (is_dict(stage) and is_dict(stage.get("inputs")) and is_list(stage.get("nodes"))):
            raise bad_field(
                f"{where}.stages[{j}]",
                "an object with inputs (object), outputs (list), nodes (list)",
                stage,
            )
        shapes.append(stage["inputs"])
    try:
        parsed = parse_stages(base.name, base.inputs, shapes) if shapes else []
    except CrossrtError as exc:
        raise corrupt(f"{where}.stages: {exc.message}") from None
    stages = []
    for j, (stage, dims) in enumerate(zip(raw_stages, parsed, strict=True)):
        at = f"{where}.stages[{j}]"
        ins = tuple(dataclasses.replace(s, shape=dims[s.name]) for s in base.inputs)
        outs = _specs(stage, "outputs", at)
        if [s.name for s in outs] != [s.name for s in base.outputs]:
            raise corrupt(f"{at}.outputs name other tensors than {where}.outputs")
        nodes = _nodes(stage, at, base.name, ins, outs, sections, users)
        stages.append(dataclasses.replace(base, inputs=ins, outputs=outs, nodes=nodes))
    return tuple(stages)


def _nodes(
    net: dict[str, Any],
    where: str,
    name: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    sections: tuple[memoryview, ...],
    users: dict[int, str],
) -> tuple[ExecutableNode, ...]:
    raw_nodes = field(net, "nodes", where, "a non-empty list", is_nonempty_list)
    available = {s.name for s in inputs}
    nodes: list[ExecutableNode] = []
    for j, raw in enumerate(raw_nodes):
        node = _node(raw, f"{where}.nodes[{j}]", len(sections))
        if node.name in (n.name for n in nodes):
            raise corrupt(f"{where} has two nodes called {node.name!r}")
        missing = [t for t in node.inputs if t not in available]
        if missing:
            raise corrupt(
                f"{where}.nodes[{j}] reads {missing[0]!r}, which is neither a network input nor "
                "an output of an earlier node"
            )
        available.update(node.outputs)
        index = raw["section"]
        users.setdefault(index, f"node {node.name!r} of network {name!r}")
        nodes.append(dataclasses.replace(node, artifact=sections[index]))
    missing = [s.name for s in outputs if s.name not in available]
    if missing:
        raise corrupt(f"{where}: no node produces the network output {missing[0]!r}")
    return tuple(nodes)


def _node(raw: Any, where: str, sections: int) -> ExecutableNode:
    if not isinstance(raw, dict):
        raise bad_field(where, "an object", raw)
    index = field(raw, "section", where, f"a section index from 0 to {sections - 1}", is_count)
    if index >= sections:
        raise bad_field(f"{where}.section", f"a section index from 0 to {sections - 1}", index)
    op_types = field(raw, "op_types", where, "an object of operator counts", is_dict)
    if not all(is_count(v) for v in op_types.values()):
        raise bad_field(
            f"{where}.op_types", "an object of operator counts (integers >= 0)", op_types
        )
    target = raw.get("target", {})
    if not is_dict(target) or not all(is_str(v) for v in target.values()):
        raise bad_field(f"{where}.target", "an object of strings", target)
    return ExecutableNode(
        name=field(raw, "name", where, "a non-empty string", is_name),
        driver=field(raw, "driver", where, "a non-empty string", is_name),
        driver_version=field(raw, "driver_version", where, "a string", is_str),
        device_kind=field(raw, "device_kind", where, "a non-empty string", is_name),
        inputs=tuple(field(raw, "inputs", where, "a list of tensor names", is_names)),
        outputs=tuple(field(raw, "outputs", where, "a list of tensor names", is_names)),
        op_types=dict(op_types),
        artifact=b"",  # the caller puts the section's view here
        cores=field(raw, "cores", where, "an integer >= 1", is_positive),
        target=dict(target),
    )


def _specs(net: dict[str, Any], key: str, where: str) -> tuple[TensorSpec, ...]:
    specs = []
    for j, raw in enumerate(field(net, key, where, "a list of tensor specs", is_list)):
        try:
            specs.append(TensorSpec.from_dict(raw))
        except CrossrtError as exc:
            raise corrupt(f"{where}.{key}[{j}]: {exc.message}") from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise corrupt(f"{where}.{key} names a tensor twice")
    return tuple(specs)
