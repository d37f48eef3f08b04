"""The ranges a model's dynamic input dimensions may take (``OH_NNExecutor_GetInputDimRange``).

ONNX has no standard annotation for dimension ranges, so crossrt reads one from the model's
``metadata_props``: the key ``crossrt.dim_ranges`` holds JSON with, per input, one
``[min, max]`` pair per dimension (``max`` ``null`` for unbounded)::

    {"images": [[1, 32], [3, 3], [224, 1024], [224, 1024]]}

Inputs it does not list, and models without it, get ``(d, d)`` for a static dimension ``d``
and ``(1, None)`` for a dynamic one. Ranges are reported, not enforced: the engine checks the
shapes it can run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..compiler import Executable
from ..errors import InvalidModelError
from ..model import TensorSpec

RANGES_KEY = "crossrt.dim_ranges"
DimRange = tuple[int, int | None]


def default_ranges(specs: Sequence[TensorSpec]) -> dict[str, tuple[DimRange, ...]]:
    """``(d, d)`` for static dimensions and ``(1, None)`` for dynamic ones; inputs of unknown
    rank get ``()``."""
    return {
        s.name: tuple((d, d) if isinstance(d, int) else (1, None) for d in s.shape or ())
        for s in specs
    }


def declared_ranges(executable: Executable) -> dict[str, tuple[DimRange, ...]]:
    """The input dimension ranges of ``executable``: declared ones over the defaults.

    The declaration is the source model's metadata, kept in the executable at compile time.

    Raises:
        InvalidModelError: the declaration is not valid JSON of the documented form, names
            an unknown input, or contradicts a static dimension.
    """
    ranges = default_ranges(executable.inputs)
    text = executable.metadata.get(RANGES_KEY)
    if text is None:
        return ranges
    try:
        declared = json.loads(text)
    except ValueError as exc:
        raise _bad(executable, f"it is not JSON ({exc})") from None
    if not isinstance(declared, dict):
        raise _bad(executable, "it must be an object of input name -> list of [min, max]")
    specs = {s.name: s for s in executable.inputs}
    for name, dims in declared.items():
        spec = specs.get(name)
        if spec is None:
            raise _bad(executable, f"it names {name!r}, which is not an input")
        ranges[name] = _parse(executable, spec, dims)
    return ranges


def _parse(executable: Executable, spec: TensorSpec, dims: Any) -> tuple[DimRange, ...]:
    shape = spec.shape or ()
    if not isinstance(dims, list) or len(dims) != len(shape):
        raise _bad(executable, f"{spec.name!r} needs one [min, max] per dimension ({len(shape)})")
    out: list[DimRange] = []
    for axis, (pair, dim) in enumerate(zip(dims, shape, strict=True)):
        low, high = pair if isinstance(pair, list) and len(pair) == 2 else (-1, -1)
        if not _is_size(low) or not (high is None or (_is_size(high) and high >= low)):
            raise _bad(
                executable,
                f"{spec.name!r} dimension {axis}: {pair!r} is not [min, max] with "
                "0 <= min <= max (max null for unbounded)",
            )
        if isinstance(dim, int) and (low, high) != (dim, dim):
            raise _bad(executable, f"{spec.name!r} dimension {axis} is static ({dim})")
        out.append((int(low), None if high is None else int(high)))
    return tuple(out)


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(executable: Executable, why: str) -> InvalidModelError:
    return InvalidModelError(
        f"model {executable.name!r}: metadata {RANGES_KEY!r} is invalid: {why}; see "
        "docs/memory.md for the form",
        details={"model": executable.name, "key": RANGES_KEY},
    )
