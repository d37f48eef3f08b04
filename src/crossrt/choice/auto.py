"""``device="auto"``: compile a model for every engine that can run it, measure each one on
the model's real input shapes, and keep the fastest whose outputs match the reference.

The choice never lowers precision below what was allowed. A reduced ``precision`` is a
permission, not a demand: every driver competes in the model's own precision, and a driver that
really computes in the reduced one competes in it too. With ``precision="bf16"``, onnxruntime's
fp32, OpenVINO's fp32 and OpenVINO's bf16 are measured side by side, so that on a CPU whose bf16
is slower than its fp32 (an Intel core without AMX), asking for bf16 never costs speed. Before
a candidate is timed, its outputs on the probe input are compared with the reference's (the
``reference`` driver, NumPy in float32; the most preferred candidate at the model's own
precision when the reference cannot run the model): one that differs by more than the
tolerance is never chosen. Candidates are timed in alternating blocks, so that a noisy machine
slows all of them alike, for a bounded time, each block after a pause that keeps one engine's
spinning threads from slowing the next (:func:`.probe.time_candidates`).

With a compile cache, the decision is stored under what it depends on (the model, the options,
the fallback, the probe shapes, every candidate's engine version and device fingerprint, the
host's usable cores): the next compile of the same model on the same machine reads it and
compiles (or takes from the cache) the chosen target without measuring again.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..compiler import Executable, compile_for_device
from ..compiler.cache import shared_cache
from ..compiler.cache_keys import fallback_material, fingerprint
from ..compiler.calibrate import prepare as prepare_int8
from ..compiler.options import parse_options
from ..compiler.stages import fixed_shapes
from ..config import settings
from ..drivers.base import CompileOptions, DeviceInfo, Driver
from ..drivers.registry import available_drivers
from ..errors import CrossrtError, InvalidOptionError, UnsupportedError
from ..host import usable_cores
from ..model import Model, load_model
from ..runtime import LoadedModel, Runtime
from .decision import OWN, choice_line, kept, record
from .oracle import compare, expected_outputs
from .probe import (
    TOLERANCES,
    guessed_inputs,
    probe_inputs,
    spelled,
    time_candidates,
    tolerance,
)

__all__ = ["AUTO", "DEFAULT_SECONDS", "NOT_CANDIDATES", "TOLERANCES", "compile"]

AUTO = "auto"
"""The device name that asks :func:`compile` to choose the driver and device."""

DEFAULT_SECONDS = 2.0
"""How long the candidates are timed, all together, unless ``auto_seconds`` says otherwise."""

NOT_CANDIDATES = {
    "reference": "the numerical oracle the candidates are checked against, not a fast engine",
    "sim": "a simulated accelerator: its speed is not a real device's",
}
"""Drivers ``auto`` never chooses, and why."""


def compile(
    model: Any,
    device: str | None = None,
    *,
    driver: str | None = None,
    fallback: str | Sequence[str] | None = None,
    cache_dir: Any = None,
    cache_version: int = 0,
    stages: Sequence[Mapping[str, Sequence[int]]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    probe: Mapping[str, Any] | None = None,
    probe_shapes: Mapping[str, Sequence[int]] | None = None,
    auto_seconds: float | None = None,
    **options: Any,
) -> Executable:
    """Compile a model for a device, or for the fastest one with ``device="auto"``.

    Takes what :func:`crossrt.compiler.compile_for_device` takes (its documentation has every
    argument), plus:

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
    model, options = prepare_int8(model, options)  # quantized once, for every candidate
    if (device or settings().default_device) != AUTO:
        if probe is not None or probe_shapes is not None or auto_seconds is not None:
            raise InvalidOptionError(
                f"{spelled('auto_options')} apply to {spelled('auto')} only; drop them, or "
                f"compile with {spelled('auto')}"
            )
        return compile_for_device(
            model,
            device,
            driver=driver,
            fallback=fallback,
            cache_dir=cache_dir,
            cache_version=cache_version,
            stages=stages,
            shapes=shapes,
            **options,
        )
    if driver is not None:
        raise InvalidOptionError(
            f"{spelled('auto')} chooses the driver; drop {spelled('driver', driver)}, or name "
            f"{spelled('device')} with it",
            details={"option": "driver"},
        )
    seconds = DEFAULT_SECONDS if auto_seconds is None else auto_seconds
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        raise InvalidOptionError(
            f"{spelled('auto_seconds', auto_seconds)}: give a number of seconds > 0",
            details={"option": "auto_seconds"},
        )
    if shapes is not None:  # every candidate compiles the model with those shapes
        model = fixed_shapes(load_model(model), shapes, stages, load_model)
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
        self.tolerance = tolerance(model, self.opts)

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
        inputs = probe_inputs(self.model, probe, self.compile_args["stages"], shapes)
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
                _say(f"{choice_line(known)} (decided before, from the compile cache)")
                return replace(exe, decision={**known, "cached": True})
        guessed = guessed_inputs(self.model, probe, self.compile_args["stages"], shapes)
        decision, exe = self._measure(inputs, seconds, guessed)
        if self.cache is not None and probe is None:
            self.cache.remember_decision(material, decision)
        return replace(exe, decision=decision)

    def _chosen(self, known: Mapping[str, Any] | None) -> tuple[Driver, DeviceInfo, bool] | None:
        if known is None or not isinstance(known.get("chosen"), dict):
            return None
        chosen = known["chosen"]
        want = (chosen.get("driver"), chosen.get("device"), chosen.get("precision"))
        return next(
            (c for c in self.candidates if (c[0].name, c[1].id, self._precision(c[2])) == want),
            None,
        )

    def _precision(self, own: bool) -> str | None:
        """The precision a candidate compiles with: the one allowed, or the model's own."""
        return None if own else self.opts.precision

    def _measure(
        self, inputs: dict[str, np.ndarray], seconds: float, guessed: list[str]
    ) -> tuple[dict[str, Any], Executable]:
        """Compile every candidate, check its outputs against the oracle's, time those that
        match, and decide."""
        rows = list(self.rows)
        compiled = self._compile_candidates(rows)
        try:
            oracle = expected_outputs(self.model, inputs, self.fallback)
        except CrossrtError as exc:
            raise UnsupportedError(
                f"{spelled('auto')}: {exc.message}. When the model needs particular inputs, "
                f"give {spelled('probe')}; or name {spelled('device')}",
                details=exc.details,
            ) from None
        if oracle.why:
            _say(f"checking against {oracle.said}")
        with Runtime() as rt:
            timed = self._matching(rt, compiled, inputs, oracle.outputs)
            if not timed:
                raise _none_can(self.model, rows)
            shapes = ", ".join(f"{n} {list(a.shape)}" for n, a in inputs.items())
            _say(f"timing {len(timed)} candidate(s) on {shapes or 'no inputs'} for {seconds:g} s")
            time_candidates(timed, inputs, seconds)
        ok = [r for r, _ in timed if r.get("status") == "ok"]
        best = kept(ok)
        decision = record(
            best, ok, rows, oracle.said, self.tolerance, self.opts.precision, inputs, guessed,
            seconds,
        )  # fmt: skip
        _say(choice_line(decision))
        return decision, next(e for r, e in compiled if r is best)

    def _compile_candidates(
        self, rows: list[dict[str, Any]]
    ) -> list[tuple[dict[str, Any], Executable]]:
        """Every candidate compiled, with its row (added to ``rows``); one that cannot compile
        the model has its row say why."""
        compiled: list[tuple[dict[str, Any], Executable]] = []
        for drv, dev, own in self.candidates:
            row: dict[str, Any] = {"driver": drv.name, "device": dev.id}
            in_ = ""
            if _reduced(self.opts):  # each row says which precision it computed in
                row["precision"] = OWN if own else self.opts.precision
                in_ = f" in {row['precision']} precision"
            rows.append(row)
            _say(f"compiling for {drv.name} on {dev.id}{in_}")
            try:
                exe = self.compile_for(drv, dev, own)
            except CrossrtError as exc:
                row.update(status="cannot run", why=_short(exc.message))
                continue
            row["placement"] = exe.placement_summary()
            compiled.append((row, exe))
        if not compiled:
            raise _none_can(self.model, rows)
        return compiled

    def _matching(
        self,
        rt: Runtime,
        compiled: list[tuple[dict[str, Any], Executable]],
        inputs: dict[str, np.ndarray],
        expected: Mapping[str, np.ndarray],
    ) -> list[tuple[dict[str, Any], LoadedModel]]:
        """The candidates loaded on ``rt`` whose outputs on the probe match ``expected`` within
        the tolerance; the others' rows say why not."""
        timed = []
        for row, exe in compiled:
            try:
                loaded = rt.load(exe)
                got = loaded.run(inputs)
            except CrossrtError as exc:
                row.update(status="failed", why=_short(exc.message))
                continue
            error, scale = compare(got, expected)
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
        return timed


def _candidates(
    opts: CompileOptions,
) -> tuple[list[tuple[Driver, DeviceInfo, bool]], list[dict[str, Any]]]:
    """Every (driver, device, at the model's own precision) ``auto`` measures, and a row for
    each one it passes by."""
    found: list[tuple[Driver, DeviceInfo, bool]] = []
    # The options given, and (a reduced precision being a permission) the model's own: a
    # driver that accepts both is measured both ways.
    attempts = [(opts, False)]
    if _reduced(opts):
        attempts.append((replace(opts, precision=None, fp16=False), True))
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
            why = ""
            before = len(found)
            for tried, at_own in attempts:
                try:
                    drv.check_options(tried, dev)
                except CrossrtError as exc:
                    why = exc.message
                    continue
                found.append((drv, dev, at_own))
            if len(found) == before:
                row = {"driver": drv.name, "device": dev.id, "status": "refused"}
                rows.append({**row, "why": _short(why)})
    return found, rows


def _none_can(model: Model, rows: list[dict[str, Any]]) -> UnsupportedError:
    listed = "; ".join(
        f"{r['driver']} {r['device']}: {r.get('status')} ({r.get('why', '')})" for r in rows
    )
    return UnsupportedError(
        f"{spelled('auto')}: no driver can run {model.name!r} with these options and outputs "
        f"within the tolerance: {listed or 'no driver is available'}. Allow "
        f"{spelled('fallback')}, give {spelled('probe')}, or name {spelled('device')}",
        details={"candidates": rows},
    )


def _reduced(opts: CompileOptions) -> bool:
    """Whether a reduced precision was allowed (a permission: the model's own competes)."""
    return opts.precision not in (None, "fp32")


def _say(text: str) -> None:
    """The progress line on stderr."""
    print(f"crossrt auto: {text}", file=sys.stderr, flush=True)


def _short(message: str) -> str:
    return message if len(message) <= 300 else message[:297] + "..."


def _plain(stages: Any) -> Any:
    if stages is None:
        return None
    return [{str(k): [int(d) for d in v] for k, v in s.items()} for s in stages]
