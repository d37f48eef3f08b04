"""The compiled model: a graph of nodes, each bound to a driver and device kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..drivers.base import CompileOptions
from ..model import TensorSpec


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
        artifact: the driver's compiled artifact (opaque to the runtime).
    """

    name: str
    driver: str
    driver_version: str
    device_kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    op_types: dict[str, int]
    artifact: bytes = field(repr=False)

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
            "artifact_bytes": len(self.artifact),
        }


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
    """

    name: str
    content_hash: str
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    nodes: tuple[ExecutableNode, ...]
    options: CompileOptions

    @property
    def device_kind(self) -> str:
        """The kind of device (``"cpu"``) the executable was compiled for."""
        return self.device.partition(":")[0]

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
        }
