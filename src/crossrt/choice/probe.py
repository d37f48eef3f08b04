"""The probe of ``device="auto"``: the inputs a candidate is measured on, how far its outputs
may differ from the reference's, and how the candidates are timed against each other."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from ..compiler.calibrate import INT8_TOLERANCE, METADATA_KEY, declared_tolerance
from ..drivers.base import CompileOptions
from ..dtypes import DType
from ..errors import InvalidOptionError
from ..model import Model, TensorSpec

TOLERANCES = {
    None: 1e-4,
    "fp32": 1e-4,
    "fp16": 1e-2,
    "bf16": 6e-2,
    "int8-dynamic": 1e-1,
    "int8": 1e-1,
}
"""Largest error allowed against the reference, relative to ``max(1, max |reference|)`` of each
output, by precision; a model's metadata ``crossrt.tolerance`` overrides it."""

_MIN_ROUNDS = 3
_MAX_ROUNDS = 1000
_DROP_RATIO = 3.0  # after the first rounds, a candidate this much slower than the best stops
_BLOCK_S = 0.02  # a candidate's block of runs in a round lasts about this long
_MAX_BLOCK = 2000
_PAUSE_S = 0.01  # before each block: the previous engine's threads stop spinning


PYTHON = {
    "auto": "device='auto'",
    "auto_options": "probe=, probe_shapes= and auto_seconds=",
    "auto_seconds": "auto_seconds={!r}",
    "device": "a device such as device='cpu'",
    "driver": "driver={!r}",
    "fallback": "fallback='cpu'",
    "probe": "the inputs to measure with as probe={{name: array}}",
    "probe_shapes": "probe_shapes {!r}",
    "probe_shapes_advice": "the shapes that will run as probe_shapes={{name: shape}}",
}
"""How ``auto``'s messages name its options in Python; a command line names them in its own
words (:func:`spelled_as`), so that its user reads flags, not keyword arguments."""

_SPELLING: ContextVar[Mapping[str, str]] = ContextVar("crossrt_auto_spelling", default=PYTHON)


@contextmanager
def spelled_as(words: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``auto``'s messages name its options with ``words`` (keys of
    :data:`PYTHON`; a ``{}`` in a word is the value given)."""
    token = _SPELLING.set({**PYTHON, **words})
    try:
        yield
    finally:
        _SPELLING.reset(token)


def spelled(option: str, value: Any = None) -> str:
    """How the current caller names ``option`` (with ``value``), for a message."""
    return _SPELLING.get().get(option, PYTHON[option]).format(value)


def tolerance(model: Model, opts: CompileOptions) -> float:
    """The error allowed against the reference: the model's metadata ``crossrt.tolerance``,
    else :data:`TOLERANCES` of the precision allowed; for a model ``precision="int8"``
    quantized, int8's (:data:`~crossrt.compiler.calibrate.INT8_TOLERANCE`): engines round
    int8 their own way, and OpenVINO differed from ONNX Runtime by 0.005 on a small convnet,
    over fp32's 1e-4, so ``auto`` never weighed it at int8.

    Raises:
        InvalidOptionError: a ``crossrt.tolerance`` that is not a number >= 0.
    """
    declared = declared_tolerance(model)
    if declared is not None:
        return declared
    if any(p.key == METADATA_KEY for p in model.proto.metadata_props):
        return INT8_TOLERANCE
    return TOLERANCES[opts.precision]


PROBE_SHAPES_KEY = "crossrt.probe_shapes"
"""The model metadata that gives the shapes to measure ``auto`` with where an input's dimensions
are dynamic: ``"x=1x1x64x256,mask=1x256"`` (the CLI's ``--probe-shape`` form, comma-separated)."""


def probe_inputs(
    model: Model,
    probe: Mapping[str, Any] | None,
    stages: Any,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, np.ndarray]:
    """The given probe inputs, or seeded random ones of the shapes given (``probe_shapes``),
    of the first stage, of the model's metadata :data:`PROBE_SHAPES_KEY`, or of the model's
    input shapes (a dynamic dimension 1: a guess, :func:`guessed_inputs`)."""
    if probe is not None:
        if not isinstance(probe, Mapping):
            raise InvalidOptionError("probe= takes {input name: array}")
        return {str(k): np.asarray(v) for k, v in probe.items()}
    first: dict[str, Any] = metadata_shapes(model)  # what the caller gives comes first
    first.update(dict(stages[0]) if stages else {})
    names = {spec.name for spec in model.inputs}
    for name, shape in (shapes or {}).items():
        dims = tuple(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else ()
        if (
            name not in names
            or not dims
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
        ):
            raise InvalidOptionError(
                f"{spelled('probe_shapes', name)}: {shape!r}; give an input of the model "
                f"({', '.join(sorted(names))}) and a shape of positive integers",
                details={"option": "probe_shapes"},
            )
        first[name] = dims
    rng = np.random.default_rng(0)
    return {spec.name: _random(spec, first.get(spec.name), rng) for spec in model.inputs}


def guessed_inputs(
    model: Model,
    probe: Mapping[str, Any] | None,
    stages: Any,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[str]:
    """The inputs whose probe shape is a guess: a dynamic dimension set to 1 because neither
    ``probe``, ``probe_shapes``, the model's metadata nor ``stages`` gave it."""
    if probe is not None:
        return []
    given = set(shapes or {}) | set(metadata_shapes(model)) | set(stages[0] if stages else {})
    return [
        spec.name
        for spec in model.inputs
        if spec.name not in given and any(not isinstance(d, int) for d in spec.shape or ())
    ]


def metadata_shapes(model: Model) -> dict[str, tuple[int, ...]]:
    """The shapes of the model's metadata :data:`PROBE_SHAPES_KEY` (``{}`` when absent).

    Raises:
        InvalidOptionError: a value not of the form ``NAME=DxD,...`` naming the model's inputs.
    """
    text = {p.key: p.value for p in model.proto.metadata_props}.get(PROBE_SHAPES_KEY)
    if text is None:
        return {}
    names = {spec.name for spec in model.inputs}
    found: dict[str, tuple[int, ...]] = {}
    for item in text.replace(";", ",").split(","):
        name, _, dims = item.strip().partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if name not in names or not shape or min(shape) < 1:
            raise InvalidOptionError(
                f"model {model.name!r} metadata {PROBE_SHAPES_KEY}={text[:200]!r}: give "
                f"NAME=DxD,... of its inputs ({', '.join(sorted(names))}) and positive sizes",
                details={"option": PROBE_SHAPES_KEY},
            )
        found[name] = shape
    return found


def _random(spec: TensorSpec, staged: Sequence[int] | None, rng: np.random.Generator) -> Any:
    if spec.dtype is None or (spec.shape is None and staged is None):
        raise InvalidOptionError(
            f"input {spec.name!r} is {spec.describe()}: {spelled('auto')} cannot make a probe "
            f"for it; give {spelled('probe')}",
            details={"option": "probe"},
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

    Each row but the first (the default: the candidate a compile without ``auto`` would
    take) also gets ``vs_default``, the median over the rounds of its block's median against
    the default's block of the same round, and ``spread``, the interquartile range of those
    ratios: the noise a win must exceed (:func:`beats_default`).
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
    against: list[list[float]] = [[] for _ in timed]  # each round's block against the default
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
            default = this_round.get(0)
            if default:
                against[i].append(took / default)
        if round_ + 1 < _MIN_ROUNDS:
            continue
        if time.perf_counter() > deadline:
            break
        best = min(statistics.median(runs[i]) for i in active)
        active = [i for i in active if statistics.median(runs[i]) <= _DROP_RATIO * best]
    for i, ((row, loaded), times, ratios) in enumerate(zip(timed, runs, relative, strict=True)):
        row.update(
            status="ok",
            median_ms=statistics.median(times) * 1e3,
            runs=len(times),
            relative=round(statistics.median(ratios), 4),
        )
        if i and against[i]:
            row.update(vs_default=round(statistics.median(against[i]), 4))
            row.update(spread=round(_spread(against[i]), 4), rounds=len(against[i]))
        loaded.unload()


def beats_default(row: Mapping[str, Any]) -> bool:
    """Whether a timed candidate is faster than the default by more than the measured noise:
    its median ratio against the default is below 1 by more than the interquartile range of
    the ratios over the rounds. A 2-5 % "win" within the rounds' own spread flipped decisions
    from one compile to the next on real models; the default stays unless the win is real."""
    ratio, spread = row.get("vs_default"), row.get("spread")
    if not isinstance(ratio, int | float) or not isinstance(spread, int | float):
        return False
    return 1.0 - ratio > spread


def _spread(ratios: Sequence[float]) -> float:
    """The interquartile range (0 for fewer than two rounds)."""
    if len(ratios) < 2:
        return 0.0
    low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return high - low
