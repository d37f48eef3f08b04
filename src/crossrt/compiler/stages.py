"""Shape stages (Sophgo bmodel "stages"): one network compiled for several static input
shapes, the runtime picking the stage whose shapes match the inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx

from ..errors import InvalidOptionError
from ..model import Model, TensorSpec
from .executable import Executable

Shapes = dict[str, tuple[int, ...]]


def parse_stages(name: str, inputs: Sequence[TensorSpec], stages: Any) -> list[Shapes]:
    """Check ``stages`` (a list of ``{input name: shape}``) against model ``name``'s inputs.

    Every stage must give every input a shape of the input's rank, of positive sizes, equal
    to the model's static dimensions; no two stages may be the same.

    Raises:
        InvalidOptionError: a stage that breaks one of those rules, saying which and why.
    """
    if isinstance(stages, Mapping) or not isinstance(stages, Sequence) or not stages:
        raise InvalidOptionError(
            f"stages={stages!r}: give a non-empty list of {{input name: shape}}, e.g. "
            "[{'x': [1, 3, 224, 224]}, {'x': [8, 3, 224, 224]}]"
        )
    specs = {s.name: s for s in inputs}
    parsed: list[Shapes] = []
    for i, stage in enumerate(stages):
        where = f"stage {i} of {name!r}"
        if not isinstance(stage, Mapping):
            raise InvalidOptionError(
                f"{where} is a {type(stage).__name__}; give {{input name: shape}}"
            )
        unknown = sorted(set(stage) - set(specs), key=str)
        missing = [n for n in specs if n not in stage]
        if unknown or missing:
            what = f"names unknown input {unknown[0]!r}" if unknown else f"lacks {missing[0]!r}"
            raise InvalidOptionError(
                f"{where} {what}; a stage gives a shape to every input: "
                f"{', '.join(specs) or 'none'}",
                details={"stage": i, "inputs": list(specs)},
            )
        shapes = {n: _shape(where, specs[n], stage[n]) for n in specs}
        if shapes in parsed:
            raise InvalidOptionError(
                f"{where} repeats stage {parsed.index(shapes)} ({describe(shapes)}); give each "
                "shape once",
                details={"stage": i},
            )
        parsed.append(shapes)
    return parsed


def _shape(where: str, spec: TensorSpec, given: Any) -> tuple[int, ...]:
    declared = spec.shape_str()
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise InvalidOptionError(f"{where}: input {spec.name!r} shape {given!r}: give a list")
    dims = tuple(given)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise InvalidOptionError(
            f"{where}: input {spec.name!r} shape {list(dims)}: give whole numbers >= 1"
        )
    if spec.shape is not None and len(dims) != len(spec.shape):
        raise InvalidOptionError(
            f"{where}: input {spec.name!r} shape {list(dims)} has rank {len(dims)}, the model's "
            f"input {declared} has rank {len(spec.shape)}; give {len(spec.shape)} dims"
        )
    for axis, (d, fixed) in enumerate(zip(dims, spec.shape or (), strict=False)):
        if isinstance(fixed, int) and d != fixed:
            raise InvalidOptionError(
                f"{where}: input {spec.name!r} shape {list(dims)} sets dim {axis} to {d}, but "
                f"the model fixes it to {fixed} ({declared}); change only the dynamic dims"
            )
    return dims


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


def describe(shapes: Mapping[str, Sequence[int]]) -> str:
    """``x [1,3,224,224], y [1,10]``: a stage as messages print it."""
    return ", ".join(f"{n} [{','.join(map(str, s))}]" for n, s in shapes.items()) or "no inputs"
