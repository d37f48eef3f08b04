"""The Ray tests' held-out model and raw onnxruntime's answers (conftest.py builds the
``.crm`` files)."""

from __future__ import annotations

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
