"""The probe of ``device="auto"``: the inputs a candidate is measured on, how far its outputs
may differ from the reference's, and how the candidates are timed against each other."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..drivers.base import CompileOptions
from ..dtypes import DType
from ..errors import InvalidOptionError
from ..model import Model, TensorSpec

TOLERANCES = {None: 1e-4, "fp32": 1e-4, "fp16": 1e-2, "bf16": 6e-2, "int8-dynamic": 1e-1}
"""Largest error allowed against the reference, relative to ``max(1, max |reference|)`` of each
output, by precision; a model's metadata ``crossrt.tolerance`` overrides it."""

_MIN_ROUNDS = 3
_MAX_ROUNDS = 1000
_DROP_RATIO = 3.0  # after the first rounds, a candidate this much slower than the best stops
_BLOCK_S = 0.02  # a candidate's block of runs in a round lasts about this long
_MAX_BLOCK = 2000
_PAUSE_S = 0.01  # before each block: the previous engine's threads stop spinning


def tolerance(model: Model, opts: CompileOptions) -> float:
    """The error allowed against the reference: the model's metadata ``crossrt.tolerance``,
    else :data:`TOLERANCES` of the precision allowed.

    Raises:
        InvalidOptionError: a ``crossrt.tolerance`` that is not a number >= 0.
    """
    given = {p.key: p.value for p in model.proto.metadata_props}.get("crossrt.tolerance")
    if given is not None:
        try:
            value = float(given)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise InvalidOptionError(
                f"model {model.name!r} metadata crossrt.tolerance={given!r}: give a number >= 0"
            )
        return value
    return TOLERANCES[opts.precision]


def probe_inputs(
    model: Model,
    probe: Mapping[str, Any] | None,
    stages: Any,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, np.ndarray]:
    """The given probe inputs, or seeded random ones of the shapes given, of the first stage,
    or of the model's input shapes (a dynamic dimension 1)."""
    if probe is not None:
        if not isinstance(probe, Mapping):
            raise InvalidOptionError("probe= takes {input name: array}")
        return {str(k): np.asarray(v) for k, v in probe.items()}
    first = dict(stages[0]) if stages else {}
    names = {spec.name for spec in model.inputs}
    for name, shape in (shapes or {}).items():
        dims = tuple(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else ()
        if (
            name not in names
            or not dims
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
        ):
            raise InvalidOptionError(
                f"probe_shapes {name!r}: {shape!r}; give an input of the model "
                f"({', '.join(sorted(names))}) and a shape of positive integers",
                details={"option": "probe_shapes"},
            )
        first[name] = dims
    rng = np.random.default_rng(0)
    return {spec.name: _random(spec, first.get(spec.name), rng) for spec in model.inputs}


def _random(spec: TensorSpec, staged: Sequence[int] | None, rng: np.random.Generator) -> Any:
    if spec.dtype is None or (spec.shape is None and staged is None):
        raise InvalidOptionError(
            f"input {spec.name!r} is {spec.describe()}: device='auto' cannot make a probe "
            "for it; give probe={name: array}"
        )
    shape = (
        tuple(staged)
        if staged is not None
        else tuple(d if isinstance(d, int) else 1 for d in spec.shape or ())
    )
    return random_tensor(spec.dtype, shape, rng)


def random_tensor(dtype: DType, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """A stand-in input of ``dtype`` and ``shape``: standard normal floats; zeros otherwise,
    as integer inputs are often indices (token ids, positions), and zeros are valid for any
    table."""
    numpy = dtype.numpy
    if numpy.kind == "f":
        return rng.standard_normal(tuple(shape)).astype(numpy)
    return np.zeros(tuple(shape), numpy)


def time_candidates(
    timed: list[tuple[dict[str, Any], Any]], inputs: dict[str, Any], seconds: float
) -> None:
    """Time the candidates in alternating blocks; fill each row's median and run count.

    Each round runs a block of about ``_BLOCK_S`` per candidate, in an order rotated every
    round, after a pause of ``_PAUSE_S``. The pause and the block's first run, not counted
    when the block has several, keep one engine from paying for another: ONNX Runtime's
    threads spin for a while after a run and took a core from whatever ran next (OpenVINO
    measured 1.5x slower than alone on 2 cores when the candidates simply alternated).

    Each row also gets ``relative``: over the rounds, the median of its block's median
    against the fastest block of the same round. Blocks of one round run within moments of
    each other, so a machine whose speed drifts (a shared VM: ResNet-50 on ONNX Runtime went
    from 29 to 42 ms and back within a minute here) slows them alike; the choice follows
    ``relative``, the absolute medians are reported.
    """
    for _, loaded in timed:  # first runs allocate and tune; not counted
        loaded.run(inputs)
    estimate = []
    for _, loaded in timed:
        started = time.perf_counter()
        loaded.run(inputs)
        estimate.append(max(time.perf_counter() - started, 1e-7))
    runs: list[list[float]] = [[] for _ in timed]
    relative: list[list[float]] = [[] for _ in timed]
    active = list(range(len(timed)))
    deadline = time.perf_counter() + seconds
    for round_ in range(_MAX_ROUNDS):
        shift = round_ % len(active)
        this_round: dict[int, float] = {}
        for i in active[shift:] + active[:shift]:
            block = 1 if estimate[i] >= _BLOCK_S else 1 + math.ceil(_BLOCK_S / estimate[i])
            time.sleep(_PAUSE_S)
            times = []
            for _ in range(min(block, _MAX_BLOCK)):
                started = time.perf_counter()
                timed[i][1].run(inputs)
                times.append(time.perf_counter() - started)
            counted = times[1:] if len(times) > 1 else times
            runs[i].extend(counted)
            this_round[i] = statistics.median(counted)
        fastest = min(this_round.values())
        for i, took in this_round.items():
            relative[i].append(took / fastest if fastest > 0 else 1.0)
        if round_ + 1 < _MIN_ROUNDS:
            continue
        if time.perf_counter() > deadline:
            break
        best = min(statistics.median(runs[i]) for i in active)
        active = [i for i in active if statistics.median(runs[i]) <= _DROP_RATIO * best]
    for (row, loaded), times, ratios in zip(timed, runs, relative, strict=True):
        row.update(
            status="ok",
            median_ms=statistics.median(times) * 1e3,
            runs=len(times),
            relative=round(statistics.median(ratios), 4),
        )
        loaded.unload()
