"""The offline container (``.crm``): compiled networks in one mmap-friendly file.

Loading never executes anything from the file (JSON only, no pickle) and validates every
offset, length, index and header field before it is used (layout.py: the bytes; header.py:
the JSON and its limits; networks.py: the networks). A section is handed to its driver as a
``memoryview`` into the mmap (or the caller's buffer): loading copies no artifact bytes.
Writing is the Executable's (executable.py), re-exported here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..config import settings
from ..drivers.base import ArtifactFile
from ..drivers.registry import driver_names, driver_status
from ..errors import (
    DeviceUnavailableError,
    InvalidArgumentError,
    StatusCode,
    UnsupportedError,
)
from .executable import Executable, executables_to_bytes, save_executables
from .layout import FORMAT_VERSION, MAGIC, Source, check_hashes, read_layout
from .networks import read_networks

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
        InvalidArgumentError: the path or buffer cannot be read.
        InvalidContainerError: the container is truncated, corrupt, malformed or over a limit
            (docs/container.md, Limits).
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) it is in another format version: a
            newer one (upgrade crossrt) or an older one (compile the model again).
    """
    check = settings().validate_hash if validate_hash is None else bool(validate_hash)
    layout = read_layout(source)
    networks, users = read_networks(layout.header, layout.sections)
    if check:
        check_hashes(layout, users)
    if layout.file is not None:
        entries = layout.header["sections"]
        offsets = {id(data): e["offset"] for data, e in zip(layout.sections, entries, strict=True)}
        networks = tuple(_located(exe, *layout.file, offsets) for exe in networks)
    header = layout.header
    return Container(
        FORMAT_VERSION, header["producer"], header, networks, layout.sections, layout.size, check
    )


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

    A path is mapped, and stays mapped while a model loaded from it lives (ONNX Runtime maps
    its weights from the file too): a file truncated or rewritten in place meanwhile (``cp
    new.crm model.crm``) can kill the process with SIGBUS. Replace such a file by renaming a
    new one over it (``mv``, :meth:`Executable.save`), or load from bytes or a private copy
    (docs/container.md, "Writing").

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
