"""A two-layer MLP and its tensor-parallel shards: rank r of n holds hidden units
[r*H/n, (r+1)*H/n) of the first layer and the matching rows of the second."""

from __future__ import annotations

import numpy as np

import crossrt
from crossrt.model import GraphBuilder

BATCH, IN, HIDDEN, OUT = 4, 16, 32, 8


def weights(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((BATCH, IN)).astype(np.float32),
        "w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32) / 4,
        "b1": rng.standard_normal(HIDDEN).astype(np.float32),
        "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / 4,
        "b2": rng.standard_normal(OUT).astype(np.float32),
    }


def model(w: dict[str, np.ndarray], rank: int = 0, size: int = 1) -> crossrt.Model:
    """The MLP (``size`` 1: outputs ``hidden`` and ``y``), or rank ``rank``'s shard (outputs
    ``hidden``, its units, and ``partial``, its share of ``y`` before ``b2``)."""
    part = slice(rank * HIDDEN // size, (rank + 1) * HIDDEN // size)
    b = GraphBuilder("mlp" if size == 1 else f"mlp_shard{rank}")
    x = b.input("x", "float32", [BATCH, IN])
    h = b.op("MatMul", [x, b.constant(w["w1"][:, part])])
    h = b.op("Add", [h, b.constant(w["b1"][part])])
    hidden = b.op("Relu", [h], outputs=["hidden"])
    b.output(hidden)
    if size == 1:
        y = b.op("MatMul", [hidden, b.constant(w["w2"])])
        b.output(b.op("Add", [y, b.constant(w["b2"])], outputs=["y"]))
    else:
        b.output(b.op("MatMul", [hidden, b.constant(w["w2"][part])], outputs=["partial"]))
    return b.finish()
