"""``device="auto"``: compile a model for every engine that can run it, measure each one on
the model's real input shapes, and keep the fastest whose outputs match the reference.

The choice never lowers precision below what was allowed: every candidate is compiled with the
options given, or, where a driver does not compute in the reduced ``precision`` allowed, in the
model's own precision (a reduced precision is a permission, not a demand: with
``precision="bf16"`` onnxruntime's fp32 competes with OpenVINO's bf16, and on a CPU whose bf16 is
slow the fp32 engine wins). Before
a candidate is timed, its outputs on the probe input are compared with the reference's (the
``reference`` driver, NumPy in float32; the most preferred candidate at the model's own
precision when the reference cannot run the model): one that differs by more than the
tolerance is never chosen. Candidates are timed in alternating blocks, so that a noisy machine
slows all of them alike, for a bounded time, each block after a pause that keeps one engine's
spinning threads from slowing the next (:func:`_time`).

With a compile cache, the decision is stored under what it depends on (the model, the options,
the fallback, the probe shapes, every candidate's engine version and device fingerprint, the
host's usable cores): the next compile of the same model on the same machine reads it and
compiles (or takes from the cache) the chosen target without measuring again.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..compiler import Executable
from ..compiler import compile as compile_for_device
from ..compiler.cache import shared_cache
from ..compiler.cache_keys import fallback_material, fingerprint
from ..compiler.options import parse_options
from ..config import settings
from ..drivers.base import CompileOptions, DeviceInfo, Driver
from ..drivers.registry import available_drivers
from ..errors import CrossrtError, InvalidOptionError, UnsupportedError
from ..host import cpu_model, usable_cores
from ..model import Model, TensorSpec, load_model
from .runtime import Runtime

AUTO = "auto"
"""The device name that asks :func:`compile` to choose the driver and device."""

DEFAULT_SECONDS = 2.0
"""How long the candidates are timed, all together, unless ``auto_seconds`` says otherwise."""

NOT_CANDIDATES = {
    "reference": "the numerical oracle the candidates are checked against, not a fast engine",
    "sim": "a simulated accelerator: its speed is not a real device's",
}
"""Drivers ``auto`` never chooses, and why."""

TOLERANCES = {None: 1e-4, "fp32": 1e-4, "fp16": 1e-2, "bf16": 6e-2, "int8-dynamic": 1e-1}
"""Largest error allowed against the reference, relative to ``max(1, max |reference|)`` of each
output, by precision; a model's metadata ``crossrt.tolerance`` overrides it."""

_MIN_ROUNDS = 3
_MAX_ROUNDS = 1000
_DROP_RATIO = 3.0  # after the first rounds, a candidate this much slower than the best stops
_BLOCK_S = 0.02  # a candidate's block of runs in a round lasts about this long
_MAX_BLOCK = 2000
_PAUSE_S = 0.01  # before each block: the previous engine's threads stop spinning
_REFERENCE_TIMEOUT_S = 60.0


def compile(
    model: Any,
    device: str | None = None,
    *,
    driver: str | None = None,
    fallback: str | Sequence[str] | None = None,
    cache_dir: Any = None,
    cache_version: int = 0,
    stages: Sequence[Mapping[str, Sequence[int]]] | None = None,
    probe: Mapping[str, Any] | None = None,
    probe_shapes: Mapping[str, Sequence[int]] | None = None,
    auto_seconds: float | None = None,
    **options: Any,
) -> Executable:
    """Compile a model for a device, or for the fastest one with ``device="auto"``.

    Takes what :func:`crossrt.compiler.compile` takes (its documentation has every argument),
    plus:

    Args:
        device: ``"auto"`` (or ``CROSSRT_DEFAULT_DEVICE=auto``): compile for every driver
            and device that can run the model with these options (``fallback`` allowed),
            measure each on the probe input, and keep the fastest whose outputs match the
            reference within the tolerance (:data:`TOLERANCES`, or the model's metadata
            ``crossrt.tolerance``). A progress line goes to stderr; the decision, with every
            candidate's latency and error, is :attr:`Executable.decision`, shown by
            ``crossrt inspect``, and stored in the compile cache, so that it is measured once
            per model, options and machine.
        probe: for ``"auto"``, the inputs to measure with (``{name: array}``); default
            seeded random values of the model's input shapes (a dynamic dimension is 1, or
            the first shape of ``stages``).
        probe_shapes: for ``"auto"``, the shapes of seeded random probe inputs
            (``{name: (1, 3, 48, 320)}``), for inputs whose dynamic dimensions would
            otherwise be 1; unlike ``probe=``, the decision is still cached.
        auto_seconds: for ``"auto"``, how long to time the candidates, all together
            (default 2 s; each candidate runs at least 3 times).

    Raises:
        UnsupportedError: with ``"auto"``, no candidate can run the model with these options
            and outputs within the tolerance (the message lists each one's reason).
        InvalidOptionError: ``driver`` with ``"auto"``, or ``probe``/``auto_seconds``
            without it.
    """
    if (device or settings().default_device) != AUTO:
        if probe is not None or probe_shapes is not None or auto_seconds is not None:
            raise InvalidOptionError(
                "probe=, probe_shapes= and auto_seconds= apply to device='auto' only; drop "
                "them, or compile "
                "with device='auto'"
            )
        return compile_for_device(
            model,
            device,
            driver=driver,
            fallback=fallback,
            cache_dir=cache_dir,
            cache_version=cache_version,
            stages=stages,
            **options,
        )
    if driver is not None:
        raise InvalidOptionError(
            f"device='auto' chooses the driver; drop driver={driver!r}, or name a device "
            "such as 'cpu' with it",
            details={"option": "driver"},
        )
    seconds = DEFAULT_SECONDS if auto_seconds is None else auto_seconds
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        raise InvalidOptionError(
            f"auto_seconds={auto_seconds!r}: give a number of seconds > 0",
            details={"option": "auto_seconds"},
        )
    chooser = _Chooser(
        load_model(model),
        options,
        fallback,
        dict(cache_dir=cache_dir, cache_version=cache_version, stages=stages),
    )
    return chooser.choose(probe, float(seconds), probe_shapes)


class _Chooser:
    """One ``device="auto"`` compile: the candidates, the probe, the measurement."""

    def __init__(
        self,
        model: Model,
        options: dict[str, Any],
        fallback: str | Sequence[str] | None,
        compile_args: dict[str, Any],
    ) -> None:
        self.model = model
        self.options = options
        self.opts = parse_options(**options)
        self.fallback = fallback
        self.compile_args = compile_args
        self.cache = shared_cache(compile_args["cache_dir"], compile_args["cache_version"])
        self.candidates, self.rows = _candidates(self.opts)
        self._own_precision = {
            k: v for k, v in options.items() if k not in ("precision", "fp16")
        }  # the options at the model's own precision
        self.tolerance = _tolerance(model, self.opts)

    def compile_for(self, drv: Driver, dev: DeviceInfo, own: bool = False) -> Executable:
        """Compile for ``drv`` on ``dev``, with the options given or, ``own``, at the model's
        own precision."""
        options = self._own_precision if own else self.options
        return compile_for_device(
            self.model,
            dev.id,
            driver=drv.name,
            fallback=self.fallback,
            **self.compile_args,
            **options,
        )

    def choose(
        self,
        probe: Mapping[str, Any] | None,
        seconds: float,
        shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> Executable:
        inputs = _probe_inputs(self.model, probe, self.compile_args["stages"], shapes)
        material = {
            "model": self.model.content_hash,
            "options": self.opts.to_dict(),
            "fallback": fallback_material(self.fallback),
            "stages": _plain(self.compile_args["stages"]),
            "probe": {n: [str(a.dtype), list(a.shape)] for n, a in inputs.items()},
            "probe_values": probe is not None,
            "candidates": [
                [d.name, d.version, fingerprint(i), own] for d, i, own in self.candidates
            ],
            "host_cores": len(usable_cores()),
        }
        if self.cache is not None and probe is None:
            known = self.cache.decision(material)
            chosen = self._chosen(known)
            if known is not None and chosen is not None:
                exe = self.compile_for(*chosen)
                _say(f"{_choice_line(known)} (decided before, from the compile cache)")
                return replace(exe, decision={**known, "cached": True})
        decision, exe = self._measure(inputs, seconds)
        if self.cache is not None and probe is None:
            self.cache.remember_decision(material, decision)
        return replace(exe, decision=decision)

    def _chosen(self, known: Mapping[str, Any] | None) -> tuple[Driver, DeviceInfo, bool] | None:
        if known is None or not isinstance(known.get("chosen"), dict):
            return None
        want = (known["chosen"].get("driver"), known["chosen"].get("device"))
        return next((c for c in self.candidates if (c[0].name, c[1].id) == want), None)

    def _measure(
        self, inputs: dict[str, np.ndarray], seconds: float
    ) -> tuple[dict[str, Any], Executable]:
        rows = list(self.rows)
        compiled: list[tuple[dict[str, Any], Executable]] = []
        for drv, dev, own in self.candidates:
            row: dict[str, Any] = {"driver": drv.name, "device": dev.id}
            if own:
                row["precision"] = "model's own"
            rows.append(row)
            _say(f"compiling for {drv.name} on {dev.id}")
            try:
                exe = self.compile_for(drv, dev, own)
            except CrossrtError as exc:
                row.update(status="cannot run", why=_short(exc.message))
                continue
            row["placement"] = exe.placement_summary()
            compiled.append((row, exe))
        if not compiled:
            raise _none_can(self.model, rows)
        expected, reference = self._reference(inputs, compiled)
        with Runtime() as rt:
            timed = []
            for row, exe in compiled:
                try:
                    loaded = rt.load(exe)
                    got = loaded.run(inputs)
                except CrossrtError as exc:
                    row.update(status="failed", why=_short(exc.message))
                    continue
                error, scale = _error(got, expected)
                row["max_abs_error"] = error
                if error > self.tolerance * scale:
                    row.update(
                        status="differs",
                        why=f"max abs error {error:.3g} against the reference is over the "
                        f"tolerance {self.tolerance:g} x {scale:.3g}",
                    )
                    loaded.unload()
                    continue
                timed.append((row, loaded))
            if not timed:
                raise _none_can(self.model, rows)
            shapes = ", ".join(f"{n} {list(a.shape)}" for n, a in inputs.items())
            _say(f"timing {len(timed)} candidate(s) on {shapes or 'no inputs'} for {seconds:g} s")
            _time(timed, inputs, seconds)
        best = min(
            (r for r, _ in timed if r.get("status") == "ok"),
            key=lambda r: (r["relative"], r["median_ms"]),
        )
        others = [
            f"{r['driver']} {r['device']} {r['median_ms']:.3f} ms"
            for r, _ in timed
            if r is not best
        ]
        why = (
            f"fastest of {len(timed)} candidate(s) whose outputs match {reference} within "
            f"{self.tolerance:g}: {best['median_ms']:.3f} ms"
            + (f" (vs {', '.join(others)})" if others else "")
            + (
                f"; it computes in the model's own precision ({self.opts.precision} was "
                "allowed, not required)"
                if "precision" in best
                else ""
            )
        )
        decision = {
            "chosen": {
                "driver": best["driver"],
                "device": best["device"],
                "precision": self.opts.precision if "precision" not in best else None,
            },
            "why": why,
            "reference": reference,
            "tolerance": self.tolerance,
            "precision": self.opts.precision,
            "probe": {n: list(a.shape) for n, a in inputs.items()},
            "seconds": seconds,
            "host": " ".join(cpu_model()).strip(),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "candidates": rows,
        }
        _say(_choice_line(decision))
        exe = next(e for r, e in compiled if r is best)
        return decision, exe

    def _reference(
        self, inputs: dict[str, np.ndarray], compiled: list[tuple[dict[str, Any], Executable]]
    ) -> tuple[dict[str, np.ndarray], str]:
        """The outputs to check every candidate against, and what computed them."""
        try:
            exe = compile_for_device(self.model, "cpu", driver="reference")
            with Runtime() as rt:
                return rt.load(exe, exec_timeout=_REFERENCE_TIMEOUT_S).run(inputs), "reference"
        except CrossrtError as exc:
            why = _short(exc.message)
        # The most preferred candidate in the model's own precision stands in.
        first = compiled[0][1]
        drv = next(d for d in available_drivers() if d.name == first.nodes[0].driver)
        dev = next(i for d, i, _ in self.candidates if d is drv)
        try:
            exe = self.compile_for(drv, dev, own=True)
            with Runtime() as rt:
                return rt.load(exe).run(inputs), f"{drv.name} {dev.id} ({why})"
        except CrossrtError as exc:
            raise UnsupportedError(
                f"device='auto' found no reference to check {self.model.name!r} against: the "
                f"reference driver: {why}; {drv.name}: {_short(exc.message)}. When the model "
                "needs particular input values or shapes, give them as probe={name: array}; "
                "or name a device"
            ) from None


def _candidates(
    opts: CompileOptions,
) -> tuple[list[tuple[Driver, DeviceInfo, bool]], list[dict[str, Any]]]:
    """Every (driver, device, at the model's own precision) ``auto`` measures, and a row for
    each one it passes by."""
    found: list[tuple[Driver, DeviceInfo, bool]] = []
    own = replace(opts, precision=None, fp16=False)
    rows: list[dict[str, Any]] = []
    for drv in available_drivers():
        seen: set[str] = set()
        for dev in drv.devices():
            if dev.name in seen or dev.status != "available":
                continue  # identical devices measure alike: the first of them stands for all
            seen.add(dev.name)
            if drv.name in NOT_CANDIDATES:
                row = {"driver": drv.name, "device": dev.id, "status": "not measured"}
                rows.append({**row, "why": NOT_CANDIDATES[drv.name]})
                continue
            try:
                drv.check_options(opts, dev)
                found.append((drv, dev, False))
                continue
            except CrossrtError as exc:
                refusal = exc
            if opts.precision not in (None, "fp32"):  # a permission: its own precision competes
                try:
                    drv.check_options(own, dev)
                    found.append((drv, dev, True))
                    continue
                except CrossrtError as exc:
                    refusal = exc
            row = {"driver": drv.name, "device": dev.id, "status": "refused"}
            rows.append({**row, "why": _short(refusal.message)})
    return found, rows


def _tolerance(model: Model, opts: CompileOptions) -> float:
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


def _probe_inputs(
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
    dtype = spec.dtype.numpy
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    # Integer inputs are often indices (token ids, positions): zeros are valid for any table.
    return np.zeros(shape, dtype)


def _error(got: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple[float, float]:
    """The largest absolute difference over the outputs, and the scale it is judged at."""
    worst, scale = 0.0, 1.0
    for name, want in expected.items():
        a = np.asarray(got[name])
        b = np.asarray(want)
        if a.shape != b.shape:
            return float("inf"), 1.0
        if a.size == 0:
            continue
        if b.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                return float("inf"), 1.0
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same_nan = np.isnan(a64) == np.isnan(b64)
        if not same_nan.all():
            return float("inf"), 1.0
        finite = np.isfinite(b64)
        diff = np.abs(a64[finite] - b64[finite])
        if diff.size:
            err = float(diff.max())
            out_scale = max(1.0, float(np.abs(b64[finite]).max()))
            if err / out_scale > worst / scale:
                worst, scale = err, out_scale
    return worst, scale


def _time(timed: list[tuple[dict[str, Any], Any]], inputs: dict[str, Any], seconds: float) -> None:
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


def _none_can(model: Model, rows: list[dict[str, Any]]) -> UnsupportedError:
    listed = "; ".join(
        f"{r['driver']} {r['device']}: {r.get('status')} ({r.get('why', '')})" for r in rows
    )
    return UnsupportedError(
        f"device='auto': no driver can run {model.name!r} with these options and outputs "
        f"within the tolerance: {listed or 'no driver is available'}. Allow fallback='cpu', "
        "give the inputs to measure with as probe={name: array}, or name a device",
        details={"candidates": rows},
    )


def _choice_line(decision: Mapping[str, Any]) -> str:
    chosen = decision.get("chosen") or {}
    return f"chose {chosen.get('driver')} on {chosen.get('device')}: {decision.get('why')}"


def _say(text: str) -> None:
    """The progress line on stderr."""
    print(f"crossrt auto: {text}", file=sys.stderr, flush=True)


def _short(message: str) -> str:
    return message if len(message) <= 300 else message[:297] + "..."


def _plain(stages: Any) -> Any:
    if stages is None:
        return None
    return [{str(k): [int(d) for d in v] for k, v in s.items()} for s in stages]
