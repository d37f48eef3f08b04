"""One rank of the tensor-parallel MLP (``ranks.py mlp``): its shard compiled and run with
crossrt, then combined through the crossrt API or Neuron's."""

from __future__ import annotations

import numpy as np
from mlp import model, weights

import crossrt
from crossrt.collectives import Communicator


def run(rank: int, size: int, root: str, api: str) -> dict:
    w = weights()
    exe = crossrt.compile(model(w, rank, size), "cpu")
    if api == "neuron":
        from neuron_rank import combine

        return combine(exe, w, rank, size, root)
    with crossrt.Runtime() as rt, Communicator.join(rank, size, root, timeout=60) as comm:
        out = rt.load(exe).run({"x": w["x"]})
        y = comm.all_reduce(out["partial"]) + w["b2"]
        hidden = comm.all_gather(out["hidden"], axis=1)
        comm.barrier()
    return {"y": y.tolist(), "hidden": np.asarray(hidden).tolist()}
