"""Compile options, and the ``stages=`` shapes: parsed and validated before any driver sees
them (and again when a ``.crm`` is read)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..drivers.base import CompileOptions, PerformanceMode, Priority
from ..errors import InvalidOptionError
from ..model import TensorSpec
from ..model.limits import MAX_STAGES

KNOWN_OPTIONS = {
    "performance_mode": "NONE, LOW, MEDIUM, HIGH or EXTREME (OH_NN_PerformanceMode)",
    "priority": "NONE, LOW, MEDIUM or HIGH (OH_NN_Priority)",
    "fp16": "True to allow reduced-precision arithmetic (the same as precision='fp16')",
    "precision": "None (the model's own), 'fp32', 'bf16', 'fp16', 'int8-dynamic' or 'int8' "
    "(static, with calibration=)",
    "portable": "True to compile for any device of the kind, not only this one (slower loads)",
    "extensions": "a dict of driver-specific settings",
}

PRECISIONS = ("fp32", "bf16", "fp16", "int8-dynamic", "int8")
"""The precisions ``compile(precision=...)`` names; the default (``None``) is the model's own."""

_E = TypeVar("_E", bound=enum.IntEnum)

Shapes = dict[str, tuple[int, ...]]
"""One shape stage: each input's static shape."""


def parse_options(**options: Any) -> CompileOptions:
    """Turn ``compile(**options)`` into :class:`CompileOptions`, refusing unknown names.

    Raises:
        InvalidOptionError: an unknown option (the message lists the known ones), or a bad
            value (the message says what the option takes).
    """
    unknown = sorted(set(options) - set(KNOWN_OPTIONS))
    if unknown:
        known = "; ".join(f"{k}: {v}" for k, v in KNOWN_OPTIONS.items())
        raise InvalidOptionError(
            f"unknown compile option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; known options are {known}",
            details={"unknown": unknown, "known": list(KNOWN_OPTIONS)},
        )
    fp16 = options.get("fp16", False)
    if not isinstance(fp16, bool):
        raise _bad("fp16", fp16)
    precision = options.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise _bad("precision", precision)
    if fp16 and precision not in (None, "fp16"):
        raise InvalidOptionError(
            f"fp16=True asks for precision 'fp16', and precision={precision!r} for another; "
            "give one of them",
            details={"option": "precision"},
        )
    portable = options.get("portable", False)
    if not isinstance(portable, bool):
        raise _bad("portable", portable)
    extensions = options.get("extensions")
    if extensions is None:
        extensions = {}
    if not isinstance(extensions, Mapping) or not all(isinstance(k, str) for k in extensions):
        raise _bad("extensions", extensions)
    return CompileOptions(
        performance_mode=_enum(PerformanceMode, "performance_mode", options),
        priority=_enum(Priority, "priority", options),
        fp16=fp16,
        portable=portable,
        extensions=dict(extensions),
        precision="fp16" if fp16 else precision,
    )


def _enum(cls: type[_E], key: str, options: Mapping[str, Any]) -> _E:
    value = options.get(key, cls(0))
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and value.upper() in cls.__members__:
        return cls[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    raise _bad(key, value)


def _bad(key: str, value: Any) -> InvalidOptionError:
    return InvalidOptionError(
        f"compile option {key}={value!r} is not valid; {key} takes {KNOWN_OPTIONS[key]}",
        details={"option": key},
    )


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
    if len(stages) > MAX_STAGES:
        raise InvalidOptionError(
            f"stages: {len(stages):,} given, more than the {MAX_STAGES} a compiled model holds "
            "(docs/container.md, Limits); compile the shapes used most, and let a stage of "
            "dynamic shape (no stages=) serve the rest",
            details={"stages": len(stages), "limit": MAX_STAGES},
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


def describe(shapes: Mapping[str, Sequence[int]]) -> str:
    """``x [1,3,224,224], y [1,10]``: a stage as messages print it."""
    return ", ".join(f"{n} [{','.join(map(str, s))}]" for n, s in shapes.items()) or "no inputs"
