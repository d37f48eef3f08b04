"""Shape stages (Sophgo bmodel "stages"): one network compiled for several static input
shapes, the runtime picking the stage whose shapes match the inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx

from ..errors import InvalidOptionError
from ..model import Model
from .executable import Executable
from .options import Shapes, describe, parse_stages

# parse_stages and describe live with the other options (a .crm reader checks stages without
# this module's splitting code); re-exported for the callers that split and run stages.
__all__ = [
    "Shapes",
    "describe",
    "fixed_shapes",
    "parse_stages",
    "stage_model",
    "stage_shapes",
    "staged",
]


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


def fixed_shapes(
    model: Model,
    shapes: Mapping[str, Sequence[int]],
    stages: Any,
    load: Callable[[Any], Model],
) -> Model:
    """``compile(shapes=)``: a copy of ``model`` whose inputs have these static shapes (the
    inputs not named must be static already), checked as one stage is.

    Raises:
        InvalidOptionError: ``stages`` given too, an unknown input, a dynamic input left out,
            or a shape a stage could not have (rank, size, a static dim changed).
    """
    if stages is not None:
        raise InvalidOptionError(
            "give shapes= (one set of static input shapes) or stages= (several), not both"
        )
    if not isinstance(shapes, Mapping):
        raise InvalidOptionError(f"shapes={shapes!r}: give {{input name: shape}}")
    specs = {s.name: s for s in model.inputs}
    unknown = [n for n in shapes if n not in specs]
    if unknown:
        raise InvalidOptionError(
            f"shapes= names input {unknown[0]!r}, which model {model.name!r} lacks; its inputs "
            f"are {', '.join(f'{n} {s.shape_str()}' for n, s in specs.items())}"
        )
    stage: dict[str, Sequence[Any]] = dict(shapes)
    for name, spec in specs.items():
        if name in stage:
            continue
        if not spec.is_static:
            raise InvalidOptionError(
                f"shapes= leaves input {name!r} {spec.shape_str()} of model {model.name!r} "
                f"dynamic; give it a shape too (--shape {name}=DxD... on the command line)"
            )
        stage[name] = list(spec.shape or ())
    try:
        (parsed,) = parse_stages(model.name, model.inputs, [stage])
    except InvalidOptionError as exc:
        raise InvalidOptionError(
            exc.message.replace(f"stage 0 of {model.name!r}", "shapes="), details=exc.details
        ) from None
    return stage_model(model, parsed, load)


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
