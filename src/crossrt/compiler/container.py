"""The offline container (``.crm``): compiled networks in one mmap-friendly file.

Layout (docs/container.md has every field and rule)::

    magic "CROSSRTM" | format version u32 | flags u32 | header length u64 | SHA-256(header)
    | zero padding to 64 | JSON header | zero padding | sections, each at a page (4096;
    a reader accepts any multiple of 64)

Loading never executes anything from the file (JSON only, no pickle) and validates every
offset, length, index and header field before it is used. A section is handed to its driver
as a ``memoryview`` into the mmap (or the caller's buffer): loading copies no artifact bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import mmap
import os
import secrets
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..config import settings
from ..drivers.base import ArtifactFile
from ..drivers.registry import driver_names, driver_status
from ..errors import (
    DeviceUnavailableError,
    InvalidArgumentError,
    ModelNotFoundError,
    StatusCode,
    UnsupportedError,
)
from .container_header import (
    FORMAT_VERSION,
    MAGIC,
    PRELUDE_SIZE,
    corrupt,
    dump_header,
    network_header,
    node_header,
    parse_header,
    section_digests,
    sections_digest,
    stage_header,
)
from .executable import Executable

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "Container",
    "executables_to_bytes",
    "list_networks",
    "load_executable",
    "read_container",
    "save_executables",
]

Source = str | os.PathLike[str] | bytes | bytearray | memoryview
Executables = Iterable[Executable] | Mapping[str, Executable]

# magic, format version, flags, header length, SHA-256 of the header, 8 reserved zero bytes.
_PRELUDE = struct.Struct("<8sIIQ32s8x")
_SECTION_ALIGN = 4096  # see _page
_FLAGS = 0  # no flag is defined yet; a reader refuses bits it does not know


# What to install for the drivers that ship with crossrt; others name their entry point.
@dataclass(frozen=True)
class Container:
    """A validated ``.crm`` container, as :func:`read_container` returns it.

    Attributes:
        format_version: the file's format version.
        producer: who wrote it: ``{"name": "crossrt", "version": ...}``.
        header: the whole JSON header, validated.
        networks: the networks, in file order (drivers not checked).
        sections: each section's bytes, a view into the file or buffer.
        size: the container's size in bytes.
        hashes_checked: whether the section hashes were verified (the header's always is).
    """

    format_version: int
    producer: dict[str, str]
    header: dict[str, Any]
    networks: tuple[Executable, ...]
    sections: tuple[memoryview, ...]
    size: int
    hashes_checked: bool

    @property
    def names(self) -> list[str]:
        """The networks' names, in file order."""
        return [n.name for n in self.networks]

    def network(self, name: str | None = None) -> Executable:
        """The network called ``name``; the only one when ``name`` is ``None``.

        Raises:
            InvalidArgumentError: no such network, or several and no name given.
        """
        if name is None and len(self.networks) == 1:
            return self.networks[0]
        for exe in self.networks:
            if exe.name == name:
                return exe
        names = ", ".join(map(repr, self.names))
        what = "holds several networks" if name is None else f"has no network {name!r}"
        raise InvalidArgumentError(
            f"the container {what}; choose one with network=NAME (--network NAME): {names}",
            details={"network": name, "networks": self.names},
        )


# -- writing -----------------------------------------------------------------------------------


def executables_to_bytes(executables: Executables) -> bytes:
    """Several executables as the bytes of one ``.crm`` container.

    Args:
        executables: executables (each stored under its own name), or a mapping of network
            name to executable (to store several with the same model name).

    Raises:
        InvalidArgumentError: no executables, duplicate names, or options JSON cannot hold.
    """
    return b"".join(_chunks(executables))


def save_executables(executables: Executables, path: str | os.PathLike[str]) -> None:
    """Write several executables to one ``.crm`` file, atomically (temp file + rename).

    Args:
        executables: as for :func:`executables_to_bytes`.
        path: the file to write; replaced if it exists.

    Raises:
        InvalidArgumentError: as for :func:`executables_to_bytes`, or the file cannot be
            written.
    """
    chunks = _chunks(executables)
    target = Path(os.fspath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 lets the umask decide the mode, as for any file the user writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the parent may be a file: nothing to clean then
            tmp.unlink(missing_ok=True)
        raise InvalidArgumentError(
            f"cannot write the container {str(target)!r}: {exc.strerror or exc}; check that the "
            "directory exists, is writable and has space",
            details={"path": str(target)},
        ) from None


def _chunks(executables: Executables) -> list[bytes | memoryview]:
    named = _named(executables)
    sections: list[bytes | memoryview] = []
    digests: list[bytes] = []
    entries: list[dict[str, Any]] = []
    where: dict[tuple[str, int], int] = {}  # (sha256, length) -> index: identical ones shared
    networks: list[dict[str, Any]] = []

    def serialize(exe: Executable) -> list[dict[str, Any]]:
        nodes = []
        for node in exe.nodes:
            art = node.artifact
            data = art if isinstance(art, bytes) else memoryview(art).cast("B")
            (sha,) = section_digests([data], FORMAT_VERSION)
            key = (sha.hex(), len(data))
            if key not in where:
                where[key] = len(sections)
                sections.append(data)
                digests.append(sha)
                entries.append({"offset": 0, "length": key[1], "sha256": key[0]})
            nodes.append({**node_header(node), "section": where[key]})
        return nodes

    for name, exe in named:
        stages = [stage_header(stage, serialize(stage)) for stage in exe.stages]
        networks.append(network_header(name, exe, serialize(exe), stages))
    header: dict[str, Any] = {
        "producer": {"name": "crossrt", "version": _crossrt_version()},
        "format_version": FORMAT_VERSION,
        "networks": networks,
        "sections": entries,
        "sections_sha256": sections_digest(digests),
    }
    # Offsets are absolute, so they depend on the header's length, which depends on them:
    # grow the data start until the header fits before it (it only grows, so this ends).
    start = 0
    while True:
        offset = start
        for entry in entries:
            entry["offset"] = offset
            offset = _page(offset + entry["length"])
        text = dump_header(header)
        if _page(PRELUDE_SIZE + len(text)) <= start:
            break
        start = _page(PRELUDE_SIZE + len(text))
    prelude = _PRELUDE.pack(MAGIC, FORMAT_VERSION, _FLAGS, len(text), hashlib.sha256(text).digest())
    chunks: list[bytes | memoryview] = [prelude, text]
    end = PRELUDE_SIZE + len(text)
    for entry, data in zip(entries, sections, strict=True):
        chunks += [bytes(entry["offset"] - end), data]
        end = entry["offset"] + entry["length"]
    return chunks


def _page(offset: int) -> int:
    """``offset`` rounded up to a page: sections start there so that the alignment an artifact
    gives its parts holds in the file too (ONNX Runtime maps a pre-packed weight only at a
    file offset that is a multiple of 256, and copies it into every session otherwise)."""
    return -(-offset // _SECTION_ALIGN) * _SECTION_ALIGN


def _named(executables: Executables) -> list[tuple[str, Executable]]:
    if isinstance(executables, Mapping):
        named = list(executables.items())
    else:
        named = [(getattr(exe, "name", ""), exe) for exe in executables]
    if not named:
        raise InvalidArgumentError("no executables to write; give at least one")
    seen: set[str] = set()
    for name, exe in named:
        if not isinstance(exe, Executable):
            raise InvalidArgumentError(
                f"cannot write a {type(exe).__name__} to a container; give crossrt Executables "
                "(from crossrt.compile)"
            )
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"network name {name!r}: give a non-empty string")
        if name in seen:
            raise InvalidArgumentError(
                f"two networks are called {name!r}; a container chooses networks by name, so "
                "pass a dict of distinct names to executables, e.g. {'det': exe1, 'rec': exe2}",
                details={"network": name},
            )
        seen.add(name)
    return named


def _crossrt_version() -> str:
    try:
        return version("crossrt")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0+source"


# -- reading -----------------------------------------------------------------------------------


def read_container(source: Source, validate_hash: bool | None = None) -> Container:
    """Open and validate a container without loading any driver.

    Args:
        source: a path (read through a read-only mmap) or the container's bytes (a
            ``bytes``, ``bytearray`` or ``memoryview``, used in place, never copied).
        validate_hash: check every section's SHA-256; default ``CROSSRT_VALIDATE_HASH`` (on).
            The header's SHA-256 is always checked.

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidContainerError: the container is truncated, corrupt or malformed.
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) it was written in a newer format.
    """
    check = settings().validate_hash if validate_hash is None else bool(validate_hash)
    view, file = _open(source)
    if len(view) < PRELUDE_SIZE:
        raise corrupt(f"it is truncated: {len(view)} bytes, less than the 64-byte prelude")
    magic, fmt, flags, length, digest = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise corrupt(
            f"it does not start with {MAGIC!r} (found {bytes(magic)!r}), so it is not a crossrt "
            "container; an ONNX model is loaded with crossrt.compile or crossrt.load_model"
        )
    if fmt > FORMAT_VERSION or flags & ~_FLAGS:
        what = f"format version {fmt}" if fmt > FORMAT_VERSION else f"flags {flags:#x}"
        raise UnsupportedError(
            f"the container uses {what}; this crossrt ({_crossrt_version()}) reads format "
            f"versions 1 to {FORMAT_VERSION} with no flags; upgrade crossrt to load it",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"format_version": fmt, "supported": FORMAT_VERSION, "flags": flags},
        )
    if fmt < 1:
        raise corrupt(f"its prelude is damaged: format version {fmt} (versions start at 1)")
    if any(view[56:64]):
        raise corrupt("its prelude is damaged: the reserved bytes 56 to 63 are not zero")
    if length > len(view) - PRELUDE_SIZE:
        raise corrupt(
            f"it is truncated: the header needs {length} bytes after the prelude, the "
            f"container has {len(view) - PRELUDE_SIZE}"
        )
    text = view[PRELUDE_SIZE : PRELUDE_SIZE + length]
    if hashlib.sha256(text).digest() != digest:
        raise corrupt("the header's SHA-256 does not match (the header bytes were modified)")
    header, networks, sections = parse_header(text, fmt, view, check)
    if file is not None:
        entries = header["sections"]
        offsets = {id(data): e["offset"] for data, e in zip(sections, entries, strict=True)}
        networks = tuple(_located(exe, *file, offsets) for exe in networks)
    return Container(fmt, header["producer"], header, networks, sections, len(view), check)


def _located(
    exe: Executable, path: str, identity: tuple[int, int, int, int], offsets: dict[int, int]
) -> Executable:
    """``exe`` with each node's :class:`ArtifactFile`: its section's place in the file."""
    nodes = tuple(
        dataclasses.replace(n, artifact_file=ArtifactFile(path, offsets[id(n.artifact)], identity))
        for n in exe.nodes
    )
    stages = tuple(_located(stage, path, identity, offsets) for stage in exe.stages)
    return dataclasses.replace(exe, nodes=nodes, stages=stages)


def load_executable(
    source: Source,
    network: str | None = None,
    *,
    validate_hash: bool | None = None,
    check_drivers: bool = True,
) -> Executable:
    """Load one network of a ``.crm`` container, ready for :meth:`Runtime.load`.

    Args:
        source: a path or the container's bytes (see :func:`read_container`).
        network: which network; may be left out when the container holds exactly one.
        validate_hash: check every section's SHA-256; default ``CROSSRT_VALIDATE_HASH`` (on).
        check_drivers: check that each node's driver is installed, available and of the
            engine version the node was compiled with.

    Raises:
        InvalidArgumentError: no network of that name, or several and no name given.
        InvalidContainerError, UnsupportedError, ModelNotFoundError: as for
            :func:`read_container`.
        DeviceUnavailableError: (DRIVER_UNAVAILABLE) a node's driver is not installed or
            cannot load.
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) a node was compiled with another engine
            version than the one installed.
    """
    exe = read_container(source, validate_hash).network(network)
    if check_drivers:
        for node in exe.nodes:
            _check_driver(exe.name, node.name, node.driver, node.driver_version)
    return exe


def list_networks(source: Source) -> list[str]:
    """The names of the networks in a container (its layout and header checked, not hashes)."""
    return read_container(source, validate_hash=False).names


def _check_driver(network: str, node: str, driver: str, compiled: str) -> None:
    status = driver_status(driver)  # imports that driver only, not every registered one
    install = (
        status.install_hint
        if status is not None
        else f"install the package that registers the {driver!r} crossrt.drivers entry point"
    )
    if status is None or status.driver is None:
        why = (
            f"is unavailable ({status.reason})"
            if status is not None
            else f"is not registered (registered: {', '.join(driver_names()) or 'none'})"
        )
        raise DeviceUnavailableError(
            f"node {node!r} of network {network!r} needs driver {driver!r}, which {why}; "
            f"{install}, then check `crossrt ls`",
            code=StatusCode.DRIVER_UNAVAILABLE,
            details={"driver": driver, "network": network, "node": node},
        )
    installed = status.driver.version
    if installed != compiled:
        raise UnsupportedError(
            f"node {node!r} of network {network!r} was compiled with driver {driver!r} "
            f"version {compiled}, but version {installed} is installed; recompile with "
            f"`crossrt compile` (or install {driver} {compiled})",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"driver": driver, "compiled": compiled, "installed": installed},
        )


def _open(source: Source) -> tuple[memoryview, tuple[str, tuple[int, int, int, int]] | None]:
    """The container's bytes, and for a file its absolute path and identity when mapped."""
    if isinstance(source, bytes | bytearray | memoryview):
        try:
            view = memoryview(source)
            if not view.c_contiguous:
                raise TypeError("it is not C-contiguous")
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
        except (TypeError, ValueError) as exc:  # also a released memoryview
            raise InvalidArgumentError(
                f"cannot read a container from this buffer ({exc}); pass bytes, a bytearray "
                "or a contiguous memoryview"
            ) from None
        return view, None
    if not isinstance(source, str | os.PathLike):
        raise InvalidArgumentError(
            f"cannot read a container from a {type(source).__name__}; give a path, bytes, "
            "bytearray or memoryview"
        )
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            if stat.st_size == 0:
                return memoryview(b""), None  # mmap refuses empty files; the caller reports it
            # The view keeps the mapping alive; the mapping keeps its own descriptor.
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            return view, (os.path.abspath(path), ArtifactFile.identity_of(stat))
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"no container at {path!r}; check the path (write one with crossrt compile "
            "--output or Executable.save)",
            details={"path": path},
        ) from None
    except (OSError, ValueError) as exc:  # a directory, no permission, a path with a NUL
        raise InvalidArgumentError(
            f"cannot read the container {path!r}: {getattr(exc, 'strerror', None) or exc}; "
            "give a readable .crm file",
            details={"path": path},
        ) from None
