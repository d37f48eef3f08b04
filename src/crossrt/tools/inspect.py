"""``crossrt inspect``: what a ``.crm`` container holds, without loading any driver, or what
an ONNX model is and which driver would run what (``inspect_model.py``).

For a container: the header (producer, format version, size, hash status), then per network
its device, options, shape stages, IO tensors and a node table in the manner of Neuron's
"NEFF Nodes" listing: one row per tensor each node reads or writes.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

from ..compiler import Container, Executable, ExecutableNode, read_container
from ..compiler.calibrate import describe as describe_error
from ..compiler.container import MAGIC
from ..compiler.stages import describe
from ..drivers import driver_statuses
from ..errors import CrossrtError, InvalidArgumentError
from ..model import TensorSpec
from . import flags, inspect_model
from .common import decision_lines, fail, human_bytes, printable, say


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt inspect",
        description="Show what a compiled-model container (.crm) holds: the producer, format "
        "version, size and hash status, then each network's device, options, shape stages, "
        "input and output tensors and its nodes (driver, device kind, tensors in and out). "
        "Nothing is loaded or run; the header and layout are validated, and the section "
        "hashes too unless CROSSRT_VALIDATE_HASH=0. For an ONNX model: its IR version, "
        "opsets, inputs and outputs, operator counts, and which driver runs which nodes on "
        "a device (and why no driver runs the others); nothing is compiled.",
        epilog="examples:\n  crossrt inspect model.crm --network det\n"
        "  crossrt inspect model.onnx --device cpu --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "file", help="a .crm container (from crossrt compile or Executable.save) or an ONNX model"
    )
    flags.add(p, "--network", "--device", "--driver", "--json")
    return p


def is_container(path: str) -> bool:
    """Whether ``path`` is read as a container: it starts with the container's magic, or it
    is named ``.crm`` (a damaged container is reported as one, not as a bad model)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        head = b""
    return head == MAGIC or path.endswith(".crm")


def collect(container: Container, path: str, network: str | None = None) -> dict[str, Any]:
    """The container as one JSON-friendly document (its header, filtered to ``network``)."""
    header = dict(container.header)
    if network is not None:
        container.network(network)  # refuses an unknown name, listing the known ones
        header["networks"] = [n for n in header["networks"] if n["name"] == network]
    return {
        "file": path,
        "size": container.size,
        "format_version": container.format_version,
        "producer": container.producer,
        "hashes": {
            "header": "verified",
            "sections": "verified" if container.hashes_checked else "not checked",
        },
        "header": header,
        "placement": {
            exe.name: exe.placement for exe in container.networks if network in (None, exe.name)
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt inspect``."""
    args = parser().parse_args(argv)
    if not is_container(args.file):
        return _inspect_model(args)
    if args.device or args.driver:
        return fail(
            "inspect",
            InvalidArgumentError(
                f"{args.file!r} is compiled: its device and drivers are in the file; --device "
                "and --driver apply to an ONNX model"
            ),
        )
    try:
        container = read_container(args.file)
        info = collect(container, args.file, args.network)
    except CrossrtError as exc:
        return fail("inspect", exc)
    if args.json:
        print(json.dumps(info, indent=2))  # JSON escapes every control character itself
        return 0
    networks = [n for n in container.networks if args.network in (None, n.name)]
    say(*_summary(container, args.file))
    for exe in networks:
        say("", *_network(container, exe))
    return 0


def _inspect_model(args: argparse.Namespace) -> int:
    if args.network is not None:
        return fail(
            "inspect",
            InvalidArgumentError(
                f"--network selects a network of a .crm container; {args.file!r} is an ONNX "
                "model (one network): leave --network out"
            ),
        )
    try:
        doc = inspect_model.collect(args.file, args.device, args.driver)
    except CrossrtError as exc:
        return fail("inspect", exc)
    if args.json:
        print(json.dumps(doc, indent=2))  # JSON escapes every control character itself
    else:
        say(*inspect_model.lines(doc))
    return 0


def _summary(container: Container, path: str) -> list[str]:
    producer = container.producer
    sections = container.sections
    checked = (
        "SHA-256 verified"
        if container.hashes_checked
        else "SHA-256 not checked (CROSSRT_VALIDATE_HASH=0)"
    )
    names = ", ".join(container.names)
    return [
        f"CONTAINER {path}",
        f"  producer        {producer['name']} {producer['version']}",
        f"  format version  {container.format_version}",
        f"  file size       {human_bytes(container.size)} ({container.size} bytes)",
        "  header          SHA-256 verified",
        f"  sections        {len(sections)}, {sum(len(s) for s in sections)} bytes, {checked}",
        f"  networks        {len(container.networks)}: {names}",
    ]


def _quantization(exe: Executable) -> list[str]:
    q = exe.quantization
    if q is None:
        return []
    return [
        f"  quantization    {q.get('method')}: {q.get('calibration_samples')} calibration "
        f"samples, error {describe_error(q)} (tolerance {q.get('tolerance')})"
    ]


def _network(container: Container, exe: Executable) -> list[str]:
    entry = next(n for n in container.header["networks"] if n["name"] == exe.name)
    opts = exe.options.to_dict()
    lines = [
        f"NETWORK {exe.name}",
        f"  device          {exe.device} ({exe.device_kind}), {exe.cores_required} core(s) "
        "required",
        f"  content hash    {exe.content_hash}",
        "  options         " + " ".join(f"{k}={v}" for k, v in opts.items()),
        f"  stages          {_stages(entry['stages'])}",
        f"  placement       {exe.placement_summary()}",
        *_quantization(exe),
        "",
        "  INPUTS",
        *(f"    {printable(s.name):<24} {s.describe()}" for s in exe.inputs),
        "  OUTPUTS",
        *(f"    {printable(s.name):<24} {s.describe()}" for s in exe.outputs),
        "",
        "  NODES",
    ]
    installed = {s.name: s for s in driver_statuses()}
    for index, (node, raw) in enumerate(zip(exe.nodes, entry["nodes"], strict=True)):
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(node.op_types.items()))
        lines += [
            f"    {index}  {node.name}: driver {node.driver} {node.driver_version} "
            f"({_driver_state(node, installed)}), {node.device_kind}, {node.cores} core(s), "
            f"artifact {human_bytes(len(node.artifact))} (section {raw['section']})",
            f"       operators: {ops or 'none'}",
            *(f"       {key}: {value}" for key, value in node.target.items()),
        ]
    lines += ["", "  TENSORS BY NODE", *_table(exe)]
    if exe.decision is not None:
        lines += ["", "  DEVICE='AUTO' DECISION", *decision_lines(exe.decision)]
    return lines


def _stages(stages: list[Any]) -> str:
    if not stages:
        return "none (one stage: any shape the dynamic axes allow)"
    return f"{len(stages)}: " + "; ".join(describe(stage["inputs"]) for stage in stages)


def _driver_state(node: ExecutableNode, installed: dict[str, Any]) -> str:
    status = installed.get(node.driver)
    if status is None:
        return "not registered here"
    if status.driver is None:
        return "unavailable here"
    try:
        version = status.driver.version
    except CrossrtError:
        return "unavailable here"
    return "installed" if version == node.driver_version else f"installed {version}: recompile"


_COLUMNS = ("NODE", "EXECUTOR", "DEVICE", "NAME", "TENSOR", "SIZE", "TYPE", "FORMAT", "SHAPE")


def _table(exe: Executable) -> list[str]:
    specs = {s.name: s for s in (*exe.inputs, *exe.outputs)}
    rows = [(*_COLUMNS, "DTYPE")]
    for index, node in enumerate(exe.nodes):
        for usage, names in (("IN", node.inputs), ("OUT", node.outputs)):
            for name in names:
                spec = specs.get(name)  # a tensor between two nodes has no recorded spec
                rows.append(
                    (
                        str(index),
                        node.driver,
                        node.device_kind,
                        node.name,
                        name,
                        _size(spec),
                        usage,
                        "ND",
                        spec.shape_str() if spec else "?",
                        str(spec.dtype or spec.kind) if spec else "?",
                    )
                )
    shown = [tuple(map(printable, row)) for row in rows]  # escaped before measuring widths
    widths = [max(len(row[i]) for row in shown) for i in range(len(shown[0]))]
    return [
        "    " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in shown
    ]


def _size(spec: TensorSpec | None) -> str:
    if spec is None or spec.dtype is None or not spec.is_static or not spec.dtype.itemsize:
        return "?"
    dims = [d for d in spec.shape or () if isinstance(d, int)]
    return str(math.prod(dims) * spec.dtype.itemsize)
