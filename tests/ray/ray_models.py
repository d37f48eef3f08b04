"""What the Ray tests share: the cluster's description, the held-out model, raw
onnxruntime's answers (conftest.py builds the ``.crm`` files) and the replicas' placement."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import crossrt


def mlp() -> crossrt.Model:
    """y = Relu(x @ W1 + b1) @ W2 + b2 on [N, 16] -> [N, 4], seeded weights."""
    rng = np.random.default_rng(26)
    b = crossrt.GraphBuilder("mlp")
    x = b.input("x", "float32", ["N", 16])
    w1 = b.constant(rng.standard_normal((16, 32), dtype=np.float32))
    b1 = b.constant(rng.standard_normal(32, dtype=np.float32))
    w2 = b.constant(rng.standard_normal((32, 4), dtype=np.float32))
    b2 = b.constant(rng.standard_normal(4, dtype=np.float32))
    h = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, w1]), b1])])
    b.output(b.op("Add", [b.op("MatMul", [h, w2]), b2], outputs=["y"]))
    return b.finish()


def raw_ort(folder: Path, name: str, feed: dict[str, Any]) -> list[Any]:
    """Raw onnxruntime's outputs for model ``name`` of :func:`crm_dir`."""
    import onnxruntime as ort

    session = ort.InferenceSession((folder / f"{name}.onnx.bytes").read_bytes())
    return session.run(None, feed)


LOOPBACK = "127.0.0.2"
"""The test cluster's address: loopback, but not 127.0.0.1, which Ray 2.60 rewrites to the
host's routable address before a driver connects (docs/scale-out.md)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayCluster:
    """The running cluster and Serve's ports on it."""

    address: str
    http: int
    grpc: int
    runtime_dir: Path
    node_pids: list[int]  # the nodes' own processes (GCS, raylets, agents), not workers


def placements(handle: Any, count: int = 2, tries: int = 60) -> dict[int, dict[str, Any]]:
    """Each replica's placement by pid, asked through the handle until ``count`` answered."""
    found: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        answer = handle.options(method_name="placement").remote().result(timeout_s=30)
        found[answer["pid"]] = answer
        if len(found) == count:
            return found
    raise AssertionError(f"only replicas {sorted(found)} answered in {tries} calls")
