"""``crossrt container``: work on ``.crm`` files as Sophgo's ``model_tool`` works on bmodels.

- ``combine A.crm [NAME=]B.crm ... -o OUT.crm``: every network of every file in one container
  (``model_tool --combine``). Networks keep their names, or take ``NAME`` when the file holds
  one network; a name in two files is refused (a crossrt network holds its shape stages
  itself: they are compiled together, ``crossrt.compile(stages=...)``), as is the same file
  twice.
- ``extract FILE.crm [-o DIR] [--network NAME]``: one container per network, ``<name>.crm``
  (``model_tool --extract``).
- ``dump FILE START SIZE OUT``: ``SIZE`` bytes of ``FILE`` from ``START`` (decimal or ``0x``
  hex) into ``OUT`` (``model_tool --dump``).
- ``weights FILE.crm [--network NAME] [--json]``: each node's stored weights, with their
  dtype, shape and byte range in the file (``model_tool --weight``); an artifact whose weights
  a driver does not lay out for reading (OpenVINO's, the simulator's) is listed as opaque.

``crossrt inspect FILE.crm`` is ``model_tool --info``. Every file is validated before it is
read (the header, layout and section hashes) and every output is written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..compiler import Executable, read_container, save_executables
from ..drivers import get_driver
from ..errors import CrossrtError, InvalidArgumentError
from . import flags
from .common import fail, human_bytes, say


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt container",
        description="Combine, split, dump and list the weights of compiled-model containers "
        "(.crm), as Sophgo's model_tool does for bmodels. `crossrt inspect FILE` shows what a "
        "container holds.",
        epilog="examples:\n  crossrt container combine det.crm rec.crm -o ocr.crm\n"
        "  crossrt container extract ocr.crm -o nets/\n"
        "  crossrt container weights det.crm --json\n"
        "  crossrt container dump det.crm 0x1000 64 head.bin",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    combine = sub.add_parser("combine", help="every network of several .crm files in one")
    combine.add_argument(
        "files",
        nargs="+",
        metavar="[NAME=]FILE",
        help=".crm files to combine; NAME= renames the one network of that file",
    )
    combine.add_argument("-o", "--output", required=True, help="the combined .crm to write")
    extract = sub.add_parser("extract", help="one .crm per network: DIR/<network>.crm")
    extract.add_argument("file", help="a .crm container")
    extract.add_argument("-o", "--output", default=".", help="folder to write to (default: .)")
    flags.add(extract, "--network")
    dump = sub.add_parser("dump", help="SIZE bytes of FILE from START into OUT")
    dump.add_argument("file", help="any file (a .crm, most often)")
    dump.add_argument("start", help="the first byte, decimal or 0x hex")
    dump.add_argument("size", help="how many bytes, decimal or 0x hex")
    dump.add_argument("out", help="the file to write")
    weights = sub.add_parser("weights", help="each node's stored weights and where they lie")
    weights.add_argument("file", help="a .crm container")
    flags.add(weights, "--network", "--json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt container``."""
    args = parser().parse_args(argv)
    try:
        return _ACTIONS[args.action](args)
    except CrossrtError as exc:
        return fail("container", exc)


def combine(files: Sequence[str], output: str) -> list[str]:
    """Write every network of ``files`` into one container at ``output``; return the names.

    Raises:
        InvalidArgumentError: a file given twice, or a network name in two files.
        InvalidContainerError, ModelNotFoundError: a file that is not a valid container.
    """
    named = [_renamed(item) for item in files]
    resolved = [os.path.realpath(path) for _, path in named]
    if len(set(resolved)) != len(resolved):
        raise InvalidArgumentError("a file is given twice: give each container once")
    where: dict[str, str] = {}
    networks: dict[str, Executable] = {}
    for name, path in named:
        found = read_container(path).networks
        if name is not None:
            if len(found) != 1:
                raise InvalidArgumentError(
                    f"{name}={path}: {path} holds {len(found)} networks; NAME= renames the "
                    "network of a file that holds one (`crossrt container extract` first)"
                )
            found = (dataclasses.replace(found[0], name=name),)
        for exe in found:
            if exe.name in where:
                raise InvalidArgumentError(
                    f"network {exe.name!r} is in both {where[exe.name]} and {path}: a container "
                    "holds one network per name (a network's shape stages are compiled "
                    "together, crossrt.compile(stages=...)); rename one as NAME=FILE",
                    details={"network": exe.name},
                )
            where[exe.name] = path
            networks[exe.name] = exe
    save_executables(networks, output)
    return list(networks)


def _renamed(item: str) -> tuple[str | None, str]:
    """``NAME=FILE`` as ``(NAME, FILE)``; a plain ``FILE`` (or one that exists, ``=`` and
    all) as ``(None, FILE)``."""
    name, sep, path = item.partition("=")
    if not sep or os.path.exists(item) or not name:
        return None, item
    return name, path


def extract(file: str, folder: str, network: str | None = None) -> list[Path]:
    """Write each network of ``file`` (or only ``network``) to ``folder/<name>.crm``."""
    container = read_container(file)
    chosen = [container.network(network)] if network is not None else container.networks
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for exe in chosen:
        path = out / f"{_file_name(exe.name)}.crm"
        exe.save(path)
        written.append(path)
    return written


def dump(file: str, start: int, size: int, out: str) -> None:
    """Copy ``size`` bytes of ``file`` from ``start`` into ``out``.

    Raises:
        InvalidArgumentError: a negative start or size, or a range past the end of the file.
    """
    total = os.path.getsize(file)
    if start < 0 or size < 0 or start + size > total:
        raise InvalidArgumentError(
            f"bytes [{start}, {start + size}) are not inside {file} ({total} bytes): give a "
            "START and SIZE within the file",
            details={"size": total},
        )
    with open(file, "rb") as f:
        f.seek(start)
        data = f.read(size)
    tmp = f"{out}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)


def weights(file: str, network: str | None = None) -> list[dict[str, Any]]:
    """Per network and node: its stored weights (name, dtype, shape, bytes and file range)."""
    container = read_container(file)
    chosen = [container.network(network)] if network is not None else container.networks
    rows = []
    for exe in chosen:
        for node in (n for stage in (exe, *exe.stages) for n in stage.nodes):
            base = node.artifact_file.offset if node.artifact_file is not None else None
            listed = get_driver(node.driver).artifact_weights(node.artifact)
            row: dict[str, Any] = {
                "network": exe.name,
                "node": node.name,
                "driver": node.driver,
                "artifact_bytes": len(memoryview(node.artifact)),
                "weights": None,
            }
            if listed is not None:
                row["weights"] = [
                    {**w, "file_offset": None if base is None else base + w["offset"]}
                    for w in listed
                ]
            rows.append(row)
    return rows


def _file_name(name: str) -> str:
    """A network name as a file name: anything but letters, digits, ``.``, ``_`` and ``-``
    becomes ``_`` (a name may hold ``/`` or start with ``..``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".")
    return cleaned or "network"


def _number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise InvalidArgumentError(f"{text!r} is not a number: give decimal or 0x hex") from None


def _run_combine(args: argparse.Namespace) -> int:
    names = combine(args.files, args.output)
    say(f"wrote {args.output}: {len(names)} networks ({', '.join(names)})")
    return 0


def _run_extract(args: argparse.Namespace) -> int:
    for path in extract(args.file, args.output, args.network):
        say(f"wrote {path}")
    return 0


def _run_dump(args: argparse.Namespace) -> int:
    start, size = _number(args.start), _number(args.size)
    dump(args.file, start, size, args.out)
    say(f"wrote {args.out}: {size} bytes of {args.file} from {start:#x}")
    return 0


def _run_weights(args: argparse.Namespace) -> int:
    rows = weights(args.file, args.network)
    if args.json:
        print(json.dumps({"file": args.file, "nodes": rows}, indent=2))
        return 0
    for row in rows:
        size = human_bytes(row["artifact_bytes"])
        say(f"network {row['network']!r} node {row['node']} ({row['driver']}, artifact {size})")
        if row["weights"] is None:
            say(f"  the {row['driver']} artifact is opaque: its weights are not listed")
            continue
        for w in row["weights"]:
            start = w["file_offset"] if w["file_offset"] is not None else w["offset"]
            say(
                f"  {w['name']}: {w['dtype']} {w['shape']} "
                f"[{start:#x}, {start + w['bytes']:#x})"
                + (
                    f" + {human_bytes(w['prepacked_bytes'])} pre-packed"
                    if w["prepacked_bytes"]
                    else ""
                )
            )
    return 0


_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "combine": _run_combine,
    "extract": _run_extract,
    "dump": _run_dump,
    "weights": _run_weights,
}
