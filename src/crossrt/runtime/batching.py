"""Dynamic batching: queued requests to one model run together, as one batch.

A model loaded with ``max_batch_size=N`` (N > 0) has its queued requests joined along their
first dimension, up to N rows, and run once; each request gets its own rows of the outputs.
What joins (the scheduler's workers call these, ``scheduler.py``):

- only requests that wait in the queue: a ``run()`` that finds an idle instance runs at
  once, alone, so a model under light load answers as fast as without batching, and
  batches form from the requests that queue up while its instances are busy;
- only requests whose inputs are host arrays agreeing in everything but their first
  dimension (dtype, the other dimensions), with no ``outputs=`` buffers given;
- ``batch_delay`` seconds (default 0): how long a worker holding an instance waits for more
  requests before it runs a batch smaller than N (Triton's ``max_queue_delay``).

A model can be batched when its executable is one node without shape stages and every input
and output has a dynamic first dimension (:func:`why_not_batchable`). The results' first
dimension must be the sum of the requests' rows; when it is not (an output that does not
follow the batch), each request is run alone instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiler import Executable
from ..errors import InvalidArgumentError
from ..model import TensorSpec


@dataclass(frozen=True)
class Batching:
    """How a model's queued requests are batched.

    Attributes:
        max_size: the most rows (first-dimension entries) one batch holds.
        delay: seconds a worker waits for more requests before running a smaller batch.
    """

    max_size: int
    delay: float = 0.0


def batching(max_batch_size: Any, batch_delay: Any) -> Batching | None:
    """The :class:`Batching` of ``Runtime.load``'s arguments; ``None`` for 0 (off).

    Raises:
        InvalidArgumentError: a size that is not a whole number >= 0, a delay that is not
            seconds >= 0.
    """
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
        raise InvalidArgumentError(
            f"max_batch_size={max_batch_size!r}: give a whole number >= 0 (0: no batching)"
        )
    if max_batch_size < 0:
        raise InvalidArgumentError(
            f"max_batch_size={max_batch_size}: give a whole number >= 0 (0: no batching)"
        )
    if (
        isinstance(batch_delay, bool)
        or not isinstance(batch_delay, int | float)
        or not 0 <= batch_delay < float("inf")
    ):
        raise InvalidArgumentError(f"batch_delay={batch_delay!r}: give seconds >= 0")
    if max_batch_size == 0:
        if batch_delay:
            raise InvalidArgumentError(
                f"batch_delay={batch_delay} without batching: give max_batch_size= too"
            )
        return None
    return Batching(max_batch_size, float(batch_delay))


def why_not_batchable(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], nodes: int, staged: bool
) -> str | None:
    """Why a model cannot be batched (``None``: it can)."""
    if staged:
        return "it has shape stages, each of fixed shapes"
    if nodes != 1:
        return f"it runs as {nodes} nodes; batching joins requests to single-node models"
    for usage, specs in (("input", inputs), ("output", outputs)):
        for spec in specs:
            if spec.shape is None or not spec.shape:
                return f"{usage} {spec.name!r} has no first dimension to batch along"
            if isinstance(spec.shape[0], int):
                return (
                    f"{usage} {spec.name!r} has a fixed first dimension ({spec.shape[0]}); "
                    "export the model with a dynamic batch dimension"
                )
    return None


def refuse_unbatchable(name: str, executable: Executable, batching: Batching) -> None:
    """Raise INVALID_ARGUMENT when model ``name`` (``executable``) cannot be batched."""
    why = why_not_batchable(
        executable.inputs, executable.outputs, len(executable.nodes), bool(executable.stages)
    )
    if why is not None:
        raise InvalidArgumentError(
            f"model {name!r} cannot be batched: {why}; load it without max_batch_size",
            details={"max_batch_size": batching.max_size},
        )


def batch_key(feed: dict[str, Any]) -> tuple[Any, int] | None:
    """What a request must share with others to join them, and its rows; ``None`` when it
    cannot join any (an input that is not a host array, or one without a first dimension,
    or inputs that disagree on it)."""
    rows = -1
    key = []
    for name, value in feed.items():
        if type(value) is not np.ndarray or value.ndim == 0:
            return None
        if rows < 0:
            rows = value.shape[0]
        elif value.shape[0] != rows:
            return None
        key.append((name, value.dtype.str, value.shape[1:]))
    return (tuple(key), rows) if rows > 0 else None


def join(feeds: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """One feed of the requests' inputs, stacked along the first dimension in order."""
    return {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}


def split(result: dict[str, Any], rows: Sequence[int]) -> list[dict[str, Any]] | None:
    """Each request's rows of a batch's outputs (views, no copy); ``None`` when an output's
    first dimension is not the batch's rows (it does not follow the batch)."""
    total = sum(rows)
    for value in result.values():
        if getattr(value, "shape", None) is None or not value.shape or value.shape[0] != total:
            return None
    parts = []
    start = 0
    for n in rows:
        parts.append({name: value[start : start + n] for name, value in result.items()})
        start += n
    return parts
