"""The compiled model: a graph of nodes, each bound to a driver and device kind, and its
``.crm`` header entries (what :meth:`Executable.save` writes; networks.py reads them back)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..drivers.base import ArtifactFile, CompileOptions
from ..errors import InvalidArgumentError
from ..model import TensorSpec
from .layout import SectionTable, container_chunks, write_file


@dataclass(frozen=True)
class ExecutableNode:
    """One piece of the executable that runs on one driver (a NEFF device or CPU node).

    Attributes:
        name: the node's name within the executable.
        driver: the driver that compiled it and will load it.
        driver_version: the engine version the artifact was made with.
        device_kind: the kind of device it runs on (``"cpu"``).
        inputs: tensor names it consumes.
        outputs: tensor names it produces.
        op_types: operator counts of the model nodes it covers.
        artifact: the driver's compiled artifact (opaque to the runtime): ``bytes`` when
            compiled, a read-only ``memoryview`` into the file's mmap (or the caller's buffer)
            when loaded from a ``.crm`` container, so loading copies nothing.
        cores: the fewest cores of its device the node needs.
        artifact_file: where ``artifact`` lies on disk when it was mapped from a ``.crm``
            file (drivers may map it themselves); ``None`` otherwise.
        target: what the artifact is tied to beyond the engine version, as the driver
            describes it (``Driver.describe_artifact``): ``{"cpu": "x86_64 avx avx2"}``.
    """

    name: str
    driver: str
    driver_version: str
    device_kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    op_types: dict[str, int]
    artifact: bytes | memoryview = field(repr=False)
    cores: int = 1
    artifact_file: ArtifactFile | None = field(default=None, repr=False, compare=False)
    target: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (without the artifact)."""
        return {
            "name": self.name,
            "driver": self.driver,
            "driver_version": self.driver_version,
            "device_kind": self.device_kind,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "op_types": dict(self.op_types),
            "artifact_bytes": self.artifact.nbytes
            if isinstance(self.artifact, memoryview)
            else len(self.artifact),
            "cores": self.cores,
            "target": dict(self.target),
        }

    def header(self, section: int) -> dict[str, Any]:
        """This node's entry in a ``.crm`` header, its artifact in section ``section``."""
        entry = self.describe()
        del entry["artifact_bytes"]  # the section table has the length
        if not self.target:  # left out when empty: such nodes are written as before
            del entry["target"]
        entry["section"] = section
        return entry


@dataclass(frozen=True)
class Executable:
    """A model compiled for a device: what :meth:`Runtime.load` stages.

    Attributes:
        name: the model's name.
        content_hash: the source model's content hash.
        device: the device it was compiled for (``"cpu:0"``).
        inputs: the model inputs.
        outputs: the model outputs.
        nodes: the executable's nodes, in execution order (one for now).
        options: the compile options it was built with.
        stages: for a model compiled for several static input shapes (``stages=`` of
            :func:`crossrt.compile`), one single-stage executable per shape, with static
            inputs; the run picks the one whose shapes match. Then ``inputs`` and ``outputs``
            are the model's (dynamic) ones and ``nodes`` the first stage's. Empty otherwise.
        metadata: the source model's metadata (ONNX ``metadata_props``), kept so that what
            the runtime reads from it (``crossrt.dim_ranges``) needs no driver's artifact.
        decision: for ``compile(device="auto")``, why this driver and device were chosen:
            the candidates, each one's measured latency and error against the reference,
            the probe shapes and the tolerance (plain JSON; ``None`` for a named device).
    """

    name: str
    content_hash: str
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    nodes: tuple[ExecutableNode, ...]
    options: CompileOptions
    stages: tuple[Executable, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict, compare=False)
    decision: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def device_kind(self) -> str:
        """The kind of device (``"cpu"``) the executable was compiled for."""
        return self.device.partition(":")[0]

    @property
    def placement(self) -> list[dict[str, Any]]:
        """Where each node runs: node, driver, device kind, operator types and count.

        A value to print or compare, never a surprise: a strict compile gives one entry, a
        compile with ``fallback`` one per region.
        """
        why: dict[str, Any] = {}
        if self.decision is not None:
            why["chosen_by"] = str(self.decision.get("why", ""))
        if self.quantization is not None:
            why["quantization"] = self.quantization
        return [
            {
                "node": n.name,
                "driver": n.driver,
                "device_kind": n.device_kind,
                "op_types": dict(n.op_types),
                "operators": sum(n.op_types.values()),
                **why,
            }
            for n in self.nodes
        ]

    @property
    def quantization(self) -> dict[str, Any] | None:
        """For ``compile(precision="int8", calibration=...)``: how the model was quantized and
        the error measured on the held-back samples (``compiler/calibrate.py``); else None."""
        text = self.metadata.get("crossrt.quantization")
        if text is None:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def placement_summary(self) -> str:
        """``onnxruntime 2 nodes (12 operators), reference 1 node (1 operator)``."""
        totals: dict[str, list[int]] = {}
        for entry in self.placement:
            count = totals.setdefault(entry["driver"], [0, 0])
            count[0] += 1
            count[1] += entry["operators"]
        return ", ".join(
            f"{driver} {n} node{'s' * (n != 1)} ({ops} operator{'s' * (ops != 1)})"
            for driver, (n, ops) in totals.items()
        )

    @property
    def cores_required(self) -> int:
        """The fewest cores a load needs: the most any one node needs."""
        return max((n.cores for exe in (self, *self.stages) for n in exe.nodes), default=1)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this executable to a ``.crm`` container file (see docs/container.md).

        The write is atomic: a temporary file in the same directory is renamed over ``path``,
        so a reader (or an mmap of the old file) never sees a half-written container.

        Raises:
            InvalidArgumentError: the file cannot be written, the options hold a value JSON
                cannot represent, or the executable holds more than a container may
                (docs/container.md, Limits).
        """
        save_executables([self], path)

    def to_bytes(self) -> bytes:
        """This executable as the bytes of a ``.crm`` container (what :meth:`save` writes)."""
        return executables_to_bytes([self])

    def check_savable(self) -> None:
        """Raise what :meth:`save` would raise when this executable's header breaks a
        container limit (docs/container.md, Limits), without hashing or copying its
        artifacts: ``compile`` calls it, so a model that compiles can be saved, cached and
        served.

        Raises:
            InvalidArgumentError: naming the field and the limit, as :meth:`save`.
        """
        try:
            container_chunks([self.header(self.name or "model", _Unhashed())], _Unhashed())
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"{self.name!r} compiled for {self.device} could not be saved, cached or "
                f"served: {exc.message}",
                details=exc.details,
            ) from None

    def header(self, name: str, sections: SectionTable) -> dict[str, Any]:
        """This executable's entry in a ``.crm`` header's ``networks``, stored as ``name``,
        its artifacts added to ``sections``."""

        def nodes(exe: Executable) -> list[dict[str, Any]]:
            return [n.header(sections.add(n.artifact)) for n in exe.nodes]

        return {
            "name": name,
            "content_hash": self.content_hash,
            "device": self.device,
            "device_kind": self.device_kind,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "options": self.options.to_dict(),
            "cores_required": self.cores_required,
            "stages": [
                {
                    "inputs": {s.name: list(s.shape or ()) for s in stage.inputs},
                    "outputs": [s.to_dict() for s in stage.outputs],
                    "nodes": nodes(stage),
                }
                for stage in self.stages
            ],
            "nodes": nodes(self),
            "metadata": dict(self.metadata),
            **({} if self.decision is None else {"decision": dict(self.decision)}),
            **({} if self.quantization is None else {"quantization": self.quantization}),
        }

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description of everything but the artifacts."""
        return {
            "name": self.name,
            "content_hash": self.content_hash,
            "device": self.device,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "nodes": [n.describe() for n in self.nodes],
            "options": self.options.to_dict(),
            "cores_required": self.cores_required,
            "stages": [
                {s.name: list(s.shape or ()) for s in stage.inputs} for stage in self.stages
            ],
            **({} if self.decision is None else {"decision": dict(self.decision)}),
            **({} if self.quantization is None else {"quantization": self.quantization}),
        }


Executables = Iterable[Executable] | Mapping[str, Executable]


def executables_to_bytes(executables: Executables) -> bytes:
    """Several executables as the bytes of one ``.crm`` container.

    Args:
        executables: executables (each stored under its own name), or a mapping of network
            name to executable (to store several with the same model name).

    Raises:
        InvalidArgumentError: no executables, duplicate names, options JSON cannot hold, or
            more than a container holds (docs/container.md, Limits).
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
    write_file(_chunks(executables), path)


class _Unhashed(SectionTable):
    """A section table that stands each artifact in as a section of its length, unhashed:
    enough to encode the header a container would have."""

    def add(self, artifact: bytes | memoryview) -> int:
        self.sections.append(artifact)
        self.digests.append(bytes(32))
        return len(self.sections) - 1


def _chunks(executables: Executables) -> list[bytes | memoryview]:
    sections = SectionTable()
    networks = [exe.header(name, sections) for name, exe in _named(executables)]
    return container_chunks(networks, sections)


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
