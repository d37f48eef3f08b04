"""Heterogeneous placement: split a graph into maximal regions, each run by one driver.

Each node goes to the first candidate (driver, device) that supports it: the target first,
then the fallbacks in priority order. Nodes are then ordered topologically, preferring to
continue with the current candidate, and runs of equal assignment become the regions — the
device nodes and CPU nodes of a Neuron NEFF. Each region becomes a standalone ONNX model whose
inputs are the values it reads from the graph or from earlier regions, and whose outputs are
the values later regions or the graph's outputs need.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from ..drivers.base import DeviceInfo, Driver
from ..errors import UnsupportedError
from ..model import Model

_LISTED = 10  # nodes named in an error before "and N more"


@dataclass(frozen=True)
class Region:
    """A connected run of nodes assigned to one candidate.

    Attributes:
        candidate: index into the candidate list (0 is the target).
        nodes: indices into ``model.nodes``, in execution order.
        inputs: value names the region reads from outside itself.
        outputs: value names it produces that later regions or the graph need.
    """

    candidate: int
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def assign(model: Model, candidates: Sequence[tuple[Driver, DeviceInfo]]) -> list[int]:
    """For each node, the index of the first candidate that supports it.

    Raises:
        UnsupportedError: some node no candidate can run; lists them with each reason.
    """
    answers = [drv.unsupported_reasons(model, dev) for drv, dev in candidates]
    assignment: list[int] = []
    refused = []
    for index, node in enumerate(model.nodes):
        chosen = next((c for c, reasons in enumerate(answers) if reasons[index] is None), -1)
        if chosen < 0:
            why = "; ".join(
                f"{drv.name}: {answers[c][index]}" for c, (drv, _) in enumerate(candidates)
            )
            refused.append({"name": node.name, "op_type": node.op_type, "reason": why})
        assignment.append(chosen)
    if refused:
        listed = "; ".join(
            f"{r['name']} ({r['op_type']}): {r['reason']}" for r in refused[:_LISTED]
        )
        more = f"; and {len(refused) - _LISTED} more" if len(refused) > _LISTED else ""
        names = ", ".join(f"{d.name} on {v.id}" for d, v in candidates)
        raise UnsupportedError(
            f"no candidate ({names}) can run {len(refused)} nodes of {model.name!r}: "
            f"{listed}{more}",
            details={"nodes": refused, "candidates": [d.name for d, _ in candidates]},
        )
    return assignment


def regions(model: Model, assignment: Sequence[int]) -> list[Region]:
    """Group the nodes into as few ordered regions of equal assignment as a greedy pass finds."""
    nodes = model.nodes
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer[out] = i
    reads = [_reads(node) for node in nodes]
    waiting = [len({producer[v] for v in r if v in producer} - {i}) for i, r in enumerate(reads)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, r in enumerate(reads):
        for src in {producer[v] for v in r if v in producer} - {i}:
            users[src].append(i)

    order: list[int] = []
    ready = [i for i, w in enumerate(waiting) if w == 0]
    current = assignment[ready[0]] if ready else 0
    while ready:
        same = [i for i in ready if assignment[i] == current]
        pick = min(same) if same else min(ready)
        current = assignment[pick]
        ready.remove(pick)
        order.append(pick)
        for user in users[pick]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)

    runs: list[list[int]] = []
    for i in order:
        if runs and assignment[runs[-1][0]] == assignment[i]:
            runs[-1].append(i)
        else:
            runs.append([i])

    graph_outputs = {o.name for o in model.proto.graph.output}
    weights = {t.name for t in model.proto.graph.initializer}
    # A Constant read across a boundary is copied into the reading region, like a weight: no
    # transfer, and its engine sees the value (shape inference inside a Scan or Loop body
    # needs it: ONNX Runtime refuses a body whose outputs it cannot give a rank).
    constants = {
        n.output[0]: i for i, n in enumerate(nodes) if n.op_type == "Constant" and not n.input
    }
    runs = [
        sorted({constants[v] for i in run for v in reads[i] if v in constants} - set(run)) + run
        for run in runs
    ]
    result = []
    for position, run in enumerate(runs):
        inside = {out for i in run for out in nodes[i].output if out}
        needed_later = graph_outputs | {
            v
            for later in runs[position + 1 :]
            for i in later
            for v in reads[i]
            if v not in constants
        }
        ins = _ordered(v for i in run for v in reads[i] if v not in inside and v not in weights)
        outs = _ordered(out for i in run for out in nodes[i].output if out in needed_later)
        if not outs and all(i in constants.values() for i in run):
            continue  # constants every reader has copied
        result.append(Region(assignment[run[-1]], tuple(run), tuple(ins), tuple(outs)))
    return result


def region_model(model: Model, region: Region, name: str) -> Model:
    """The standalone ONNX model of one region (weights it uses copied in)."""
    proto = model.proto
    types = model.value_types()
    weights = {t.name: t for t in proto.graph.initializer}

    def info(value: str) -> onnx.ValueInfoProto:
        vtype = types.get(value)
        if vtype is None or not vtype.WhichOneof("value"):
            raise UnsupportedError(
                f"cannot split {model.name!r} at value {value!r}: its type is unknown (shape "
                "inference could not type it); compile without fallback or annotate the model",
                details={"value": value},
            )
        vi = onnx.ValueInfoProto()
        vi.name = value
        vi.type.CopyFrom(vtype)
        return vi

    nodes = [proto.graph.node[i] for i in region.nodes]
    used_weights = [
        weights[v] for v in _ordered(v for n in nodes for v in _reads(n)) if v in weights
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [info(v) for v in region.inputs],
        [info(v) for v in region.outputs],
        used_weights,
    )
    sub = helper.make_model(graph, opset_imports=list(proto.opset_import))
    sub.ir_version = proto.ir_version
    sub.functions.extend(proto.functions)
    return Model(sub, validate=False)


def _reads(node: onnx.NodeProto) -> list[str]:
    """The values a node reads, including those its subgraphs take from the outer scope."""
    values = [v for v in node.input if v]
    for attr in node.attribute:
        for graph in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            values += _outer_names(graph)
    return values


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names = []
    for node in graph.node:
        for v in _reads(node):
            if v not in defined:
                names.append(v)
        defined.update(node.output)
    return names


def _ordered(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)
