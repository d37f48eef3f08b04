"""A ``.crm`` container's JSON header: written, and validated field by field.

Nothing from the file is trusted: every value's type is checked before use, every offset and
length against the container's size, every section index against the table, and each node's
inputs against the tensors available when it runs. A failure names the field by its path in
the header (``networks[0].nodes[1].section``) and what it should be.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..drivers.registry import parse_device
from ..errors import CrossrtError, InvalidArgumentError, InvalidContainerError
from ..host import host_cpus
from ..model import TensorSpec
from .executable import Executable, ExecutableNode
from .options import parse_options
from .stages import parse_stages

MAGIC = b"CROSSRTM"
FORMAT_VERSION = 3
"""The version this crossrt writes; it reads every version from 1 (docs/container.md)."""
ALIGN = 64
PRELUDE_SIZE = 64

_MISSING = object()
_HEX = frozenset("0123456789abcdef")


def align(offset: int) -> int:
    """``offset`` rounded up to the next multiple of 64."""
    return -(-offset // ALIGN) * ALIGN


def corrupt(why: str) -> InvalidContainerError:
    """The error for a container that fails validation, saying why and what to do."""
    return InvalidContainerError(
        f"not a valid .crm container: {why}; re-create it with `crossrt compile` or Executable.save"
    )


def network_header(
    name: str,
    exe: Executable,
    nodes: list[dict[str, Any]],
    stages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One entry of the header's ``networks``, given its ``nodes`` and ``stages`` entries."""
    return {
        "name": name,
        "content_hash": exe.content_hash,
        "device": exe.device,
        "device_kind": exe.device_kind,
        "inputs": [s.to_dict() for s in exe.inputs],
        "outputs": [s.to_dict() for s in exe.outputs],
        "options": exe.options.to_dict(),
        "cores_required": exe.cores_required,
        "stages": stages or [],
        "nodes": nodes,
        "metadata": dict(exe.metadata),
    }


def stage_header(stage: Executable, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry of a network's ``stages``: its input shapes, outputs and ``nodes``."""
    return {
        "inputs": {s.name: list(s.shape or ()) for s in stage.inputs},
        "outputs": [s.to_dict() for s in stage.outputs],
        "nodes": nodes,
    }


def node_header(node: ExecutableNode) -> dict[str, Any]:
    """One entry of a network's ``nodes``, less its ``section``."""
    header: dict[str, Any] = {
        "name": node.name,
        "driver": node.driver,
        "driver_version": node.driver_version,
        "device_kind": node.device_kind,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "op_types": dict(node.op_types),
        "cores": node.cores,
    }
    if node.target:  # left out when empty: such nodes are written as before
        header["target"] = dict(node.target)
    return header


def dump_header(header: dict[str, Any]) -> bytes:
    """The header as compact UTF-8 JSON (strict: no NaN, str keys only)."""
    try:
        text = json.dumps(header, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"the executables cannot be written: {exc}; compile options (extensions) must hold "
            "only JSON values (str, finite numbers, bool, None, lists, dicts with str keys)"
        ) from None
    return text.encode("utf-8")


def sections_digest(digests: list[bytes]) -> str:
    """``sections_sha256`` (formats 2 and 3): the SHA-256 of the sections' digests, in table
    order, so that no section byte is hashed twice."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


CHUNK = 16 << 20
"""Format 3 hashes sections in chunks of this many bytes (the last one shorter)."""


def section_digests(sections: Sequence[bytes | memoryview], fmt: int) -> list[bytes]:
    """Each section's digest, its ``sha256`` in the section table.

    Formats 1 and 2: the SHA-256 of its bytes. Format 3: the SHA-256 of the concatenated
    SHA-256 digests of its :data:`CHUNK`-byte chunks, in order (the last one shorter; an empty
    section has no chunk), so that a large section is hashed on every usable core at once:
    hashlib lets go of the GIL.
    """
    if fmt < 3:
        return [hashlib.sha256(data).digest() for data in sections]
    views = [memoryview(data).cast("B") for data in sections]
    chunks = [
        (i, view[at : at + CHUNK])
        for i, view in enumerate(views)
        for at in range(0, len(view), CHUNK)
    ]
    workers = min(len(chunks), host_cpus().limit)
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="crossrt-sha256") as pool:
            found = list(pool.map(lambda chunk: hashlib.sha256(chunk[1]).digest(), chunks))
    else:
        found = [hashlib.sha256(chunk).digest() for _, chunk in chunks]
    parts: list[list[bytes]] = [[] for _ in views]
    for (i, _), digest in zip(chunks, found, strict=True):
        parts[i].append(digest)
    return [hashlib.sha256(b"".join(p)).digest() for p in parts]


def parse_header(
    text: memoryview, fmt: int, view: memoryview, check_hashes: bool
) -> tuple[dict[str, Any], tuple[Executable, ...], tuple[memoryview, ...]]:
    """Decode and validate the header; build the networks on views into ``view``.

    Args:
        text: the header bytes (their SHA-256 already checked).
        fmt: the format version the prelude states.
        view: the whole container.
        check_hashes: verify each section's SHA-256 and ``sections_sha256`` (each section
            byte is hashed once, except in format 1).

    Returns:
        The header, the networks in file order, and each section's bytes.

    Raises:
        InvalidContainerError: a field is missing, of the wrong type, or inconsistent.
    """
    header = _decode(text)
    if _get(header, "format_version", "", "an integer", _is_int) != fmt:
        raise corrupt(
            f"header field format_version is {header['format_version']}, the prelude {fmt}"
        )
    producer = _get(header, "producer", "", "an object", _is_dict)
    for key in ("name", "version"):
        _get(producer, key, "producer", "a string", _is_str)
    entries = _get(header, "sections", "", "a non-empty list", _is_nonempty_list)
    digest = _get(header, "sections_sha256", "", "a SHA-256 (64 lowercase hex digits)", _is_sha)
    sections = _sections(entries, view, PRELUDE_SIZE + len(text))
    nets = _get(header, "networks", "", "a non-empty list", _is_nonempty_list)
    users: dict[int, str] = {}
    networks = tuple(_network(net, f"networks[{i}]", sections, users) for i, net in enumerate(nets))
    names = [n.name for n in networks]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise corrupt(f"two networks are called {dup!r}; network names must be unique")
    unused = sorted(set(range(len(sections))) - set(users))
    if unused:
        raise corrupt(f"section {unused[0]} is used by no node")
    if check_hashes:
        digests = section_digests(sections, fmt)
        for i, (entry, data, found) in enumerate(zip(entries, sections, digests, strict=True)):
            if found.hex() != entry["sha256"]:
                raise corrupt(
                    f"section {i} ({users[i]}, {len(data)} bytes at offset {entry['offset']}) "
                    "fails its SHA-256 check: its bytes were modified"
                )
        if fmt == 1:  # format 1 hashed the sections' bytes a second time, concatenated
            whole = hashlib.sha256()
            for data in sections:
                whole.update(data)
            expected = whole.hexdigest()
        else:
            expected = sections_digest(digests)
        if expected != digest:
            raise corrupt("sections_sha256 does not match the sections")
    return header, networks, sections


def _decode(text: memoryview) -> dict[str, Any]:
    try:
        doc = json.loads(
            bytes(text).decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError as exc:
        raise corrupt(f"the header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise corrupt("the header's JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, a duplicate key, NaN, an overlong integer
        raise corrupt(f"the header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise corrupt(f"the header is a JSON {type(doc).__name__}, not an object")
    return doc


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _sections(entries: list[Any], view: memoryview, header_end: int) -> tuple[memoryview, ...]:
    size = len(view)
    end = header_end  # where what precedes the next section ends
    found = []
    for i, entry in enumerate(entries):
        where = f"sections[{i}]"
        if not isinstance(entry, dict):
            raise _bad(where, "an object", entry)
        offset = _get(entry, "offset", where, "an integer >= 0", _is_count)
        length = _get(entry, "length", where, "an integer >= 0", _is_count)
        _get(entry, "sha256", where, "a SHA-256 (64 lowercase hex digits)", _is_sha)
        if offset % ALIGN:
            raise corrupt(f"{where}.offset {offset} is not a multiple of {ALIGN}")
        if offset < end:
            what = "the header" if i == 0 else f"section {i - 1}"
            raise corrupt(f"{where} at offset {offset} overlaps {what}, which ends at {end}")
        if offset + length > size:
            raise corrupt(
                f"it is truncated: {where} ends at byte {offset + length}, the container has "
                f"{size} bytes"
            )
        # Padding must be zero, so that every byte of the file is checked by something.
        if offset > end and view[end:offset] != bytes(offset - end):
            raise corrupt(f"the padding before {where} (bytes {end} to {offset}) is not zero")
        found.append(view[offset : offset + length])
        end = offset + length
    if end != size:
        raise corrupt(f"{size - end} bytes follow the last section, which ends at byte {end}")
    return tuple(found)


def _network(
    net: Any, where: str, sections: tuple[memoryview, ...], users: dict[int, str]
) -> Executable:
    if not isinstance(net, dict):
        raise _bad(where, "an object", net)
    name = _get(net, "name", where, "a non-empty string", _is_name)
    content_hash = _get(net, "content_hash", where, "a string", _is_str)
    device = _get(net, "device", where, "a device such as 'cpu:0'", _is_name)
    try:
        kind, _ = parse_device(device)
    except CrossrtError:
        raise _bad(f"{where}.device", "a device such as 'cpu:0'", device) from None
    if _get(net, "device_kind", where, "a string", _is_str) != kind:
        raise corrupt(
            f"{where}.device_kind is {net['device_kind']!r}, device {device!r} is {kind!r}"
        )
    inputs = _specs(net, "inputs", where)
    outputs = _specs(net, "outputs", where)
    try:
        options = parse_options(**_get(net, "options", where, "an object", _is_dict))
    except CrossrtError as exc:
        raise corrupt(f"{where}.options: {exc.message}") from None
    cores_required = _get(net, "cores_required", where, "an integer >= 1", _is_positive)
    raw_stages = _get(net, "stages", where, "a list", _is_list)
    nodes = _nodes(net, where, name, inputs, outputs, sections, users)
    metadata = net.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _bad(f"{where}.metadata", "an object of strings", metadata)
    base = Executable(
        name, content_hash, device, inputs, outputs, nodes, options, metadata=metadata
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
        if not (_is_dict(stage) and _is_dict(stage.get("inputs")) and _is_list(stage.get("nodes"))):
            raise _bad(
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
    raw_nodes = _get(net, "nodes", where, "a non-empty list", _is_nonempty_list)
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
        raise _bad(where, "an object", raw)
    index = _get(raw, "section", where, f"a section index from 0 to {sections - 1}", _is_count)
    if index >= sections:
        raise _bad(f"{where}.section", f"a section index from 0 to {sections - 1}", index)
    op_types = _get(raw, "op_types", where, "an object of operator counts", _is_dict)
    if not all(_is_count(v) for v in op_types.values()):
        raise _bad(f"{where}.op_types", "an object of operator counts (integers >= 0)", op_types)
    target = raw.get("target", {})
    if not _is_dict(target) or not all(_is_str(v) for v in target.values()):
        raise _bad(f"{where}.target", "an object of strings", target)
    return ExecutableNode(
        name=_get(raw, "name", where, "a non-empty string", _is_name),
        driver=_get(raw, "driver", where, "a non-empty string", _is_name),
        driver_version=_get(raw, "driver_version", where, "a string", _is_str),
        device_kind=_get(raw, "device_kind", where, "a non-empty string", _is_name),
        inputs=tuple(_get(raw, "inputs", where, "a list of tensor names", _is_names)),
        outputs=tuple(_get(raw, "outputs", where, "a list of tensor names", _is_names)),
        op_types=dict(op_types),
        artifact=b"",  # the caller puts the section's view here
        cores=_get(raw, "cores", where, "an integer >= 1", _is_positive),
        target=dict(target),
    )


def _specs(net: dict[str, Any], key: str, where: str) -> tuple[TensorSpec, ...]:
    specs = []
    for j, raw in enumerate(_get(net, key, where, "a list of tensor specs", _is_list)):
        try:
            specs.append(TensorSpec.from_dict(raw))
        except CrossrtError as exc:
            raise corrupt(f"{where}.{key}[{j}]: {exc.message}") from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise corrupt(f"{where}.{key} names a tensor twice")
    return tuple(specs)


def _get(
    obj: dict[str, Any], key: str, where: str, expected: str, ok: Callable[[Any], bool]
) -> Any:
    path = f"{where}.{key}" if where else key
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise corrupt(f"header field {path} is missing; it should be {expected}")
    if not ok(value):
        raise _bad(path, expected, value)
    return value


def _bad(path: str, expected: str, value: Any) -> InvalidContainerError:
    # Only scalars are shown: a nested value from a file could be huge.
    scalar = value is None or isinstance(value, str | int | float)
    shown = repr(value)[:60] if scalar else f"a {type(value).__name__}"
    return corrupt(f"header field {path} should be {expected}, not {shown}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _is_positive(v: Any) -> bool:
    return _is_int(v) and v >= 1


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _is_names(v: Any) -> bool:
    return isinstance(v, list) and all(_is_name(t) for t in v)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


def _is_list(v: Any) -> bool:
    return isinstance(v, list)


def _is_nonempty_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v)


def _is_sha(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX
