"""The decision of ``device="auto"``: which timed candidate is kept (:func:`kept`), and the
record of it that the executable, the compile cache and ``crossrt inspect`` keep, with the
sentence that says why (:func:`record`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..host import cpu_model
from .probe import beats_default, spelled

OWN = "model's own"
"""A candidate row's ``precision`` when it computes in the model's own precision although a
reduced one was allowed."""


def record(
    best: dict[str, Any],
    ok: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    reference: str,
    tolerance: float,
    allowed: str | None,
    inputs: Mapping[str, np.ndarray],
    guessed: list[str],
    seconds: float,
) -> dict[str, Any]:
    """The decision kept in the executable and the compile cache: the candidate chosen
    (``best`` of the timed rows ``ok``), why, and every candidate's row; ``allowed`` is the
    precision allowed (a candidate at the model's own computes in none)."""
    reason = why(ok, best, f"{reference} within {tolerance:g}") + precision_said(
        best.get("precision"), allowed
    )
    if guessed:
        shapes_said = ", ".join(f"{n} {list(inputs[n].shape)}" for n in guessed)
        reason += (
            f"; measured on a guessed shape ({shapes_said}: each dynamic dimension 1), "
            f"not necessarily what will run: give {spelled('probe_shapes_advice')}"
        )
    return {
        "chosen": {
            "driver": best["driver"],
            "device": best["device"],
            "precision": None if best.get("precision") == OWN else allowed,
        },
        "why": reason,
        "reference": reference,
        "tolerance": tolerance,
        "precision": allowed,
        "probe": {n: list(a.shape) for n, a in inputs.items()},
        "probe_guessed": guessed,
        "seconds": seconds,
        "host": " ".join(cpu_model()).strip(),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "candidates": rows,
    }


def kept(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate kept: the default (the first, what a compile without ``auto`` takes)
    unless another is faster by more than the noise measured (:func:`.probe.beats_default`);
    of several such, the one with the lowest median ratio to the default."""
    winners = [r for r in timed[1:] if beats_default(r)]
    return min(winners, key=lambda r: r["vs_default"]) if winners else timed[0]


def why(timed: list[dict[str, Any]], best: dict[str, Any], match: str) -> str:
    """The decision's ``why``: what was kept, against what, by how much and with what noise."""
    if len(timed) == 1:
        return f"the only candidate whose outputs match {match}: {best['median_ms']:.3f} ms"

    def against(r: Mapping[str, Any]) -> str:
        return (
            f"{label(r)} {r['median_ms']:.3f} ms, {r.get('vs_default', 1.0):.3f}x the "
            f"default's time, spread {r.get('spread', 0.0):.3f}"
        )

    default = timed[0]
    others = "; ".join(against(r) for r in timed[1:] if r is not best)
    if best is default:
        return (
            f"the default, {default['median_ms']:.3f} ms: no other of {len(timed)} candidates "
            f"whose outputs match {match} is faster by more than the spread of its rounds "
            f"({others})"
        )
    return (
        f"faster than the default {label(default)} ({default['median_ms']:.3f} ms) by more "
        f"than the noise, among {len(timed)} candidates whose outputs match {match}: "
        f"{against(best)} over {best.get('rounds', 0)} rounds"
        + (f" (also {others})" if others else "")
    )


def precision_said(computed: str | None, allowed: str | None) -> str:
    """What the ``why`` says of the chosen candidate's precision, where one was allowed."""
    if computed == OWN:
        return f"; it computes in the model's own precision ({allowed} was allowed, not required)"
    return f"; it computes in {computed}" if computed else ""


def label(row: Mapping[str, Any]) -> str:
    """A candidate's name in a sentence: driver, device and, where it was a choice, precision."""
    precision = row.get("precision")
    return f"{row['driver']} {row['device']}" + (f" ({precision})" if precision else "")


def choice_line(decision: Mapping[str, Any]) -> str:
    """The progress line of a decision: what was chosen, and why."""
    chosen = decision.get("chosen") or {}
    return f"chose {chosen.get('driver')} on {chosen.get('device')}: {decision.get('why')}"
