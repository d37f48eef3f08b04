"""Shape stages (Sophgo bmodel "stages"): one network compiled for several static input
shapes, the runtime picking the stage whose shapes match the inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import onnx

from ..model import Model
from .executable import Executable
from .options import Shapes, describe, parse_stages

# parse_stages and describe live with the other options (a .crm reader checks stages without
# this module's splitting code); re-exported for the callers that split and run stages.
__all__ = ["Shapes", "describe", "parse_stages", "stage_model", "stage_shapes", "staged"]


def stage_model(model: Model, shapes: Shapes, load: Callable[[Any], Model]) -> Model:
    """A copy of ``model`` whose inputs have the static ``shapes``, validated again by
    ``load`` so that shape inference fixes the intermediate shapes too."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for value in proto.graph.input:
        if value.name in shapes:
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for d in shapes[value.name]:
                shape.dim.add().dim_value = d
    # Declared dynamic output dims would stay dynamic: make them unknown, let inference fix
    # them, then write what it found into the copy's outputs.
    for value in proto.graph.output:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.Clear()
    part = load(proto)
    types = part.value_types()  # read before part.outputs is cached
    for value in part.proto.graph.output:
        if value.name in types:
            value.type.CopyFrom(types[value.name])
    return part


def staged(parent: Model, exes: Sequence[Executable]) -> Executable:
    """One executable of the stages' executables: the model's dynamic inputs and outputs,
    the first stage's nodes (what plain loading tools see), and every stage."""
    first = exes[0]
    # Stages are named and hashed as the model they came from: they are not models of their own.
    stages = tuple(
        dataclasses.replace(e, name=parent.name, content_hash=parent.content_hash) for e in exes
    )
    return dataclasses.replace(
        stages[0],
        inputs=tuple(parent.inputs),
        outputs=tuple(parent.outputs),
        nodes=first.nodes,
        stages=stages,
    )


def stage_shapes(exe: Executable) -> Shapes:
    """A stage's input shapes (each static)."""
    return {s.name: tuple(d for d in s.shape or () if isinstance(d, int)) for s in exe.inputs}
