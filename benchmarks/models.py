"""Benchmark models, built with ``crossrt.GraphBuilder`` from seeded random weights.

- ``tiny``: ``x[1,16] @ W[16,16] + b``, where per-call overhead dominates.
- ``resnet50``: ResNet-50 in torchvision's layout with batch norm folded into the convolutions
  (53 Conv with bias, Relu, 16 residual Add, MaxPool, GlobalAveragePool, Flatten, Gemm), about
  100 MB of weights.
- ``bert``: a BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, erf GELU,
  LayerNormalization, word and position embeddings), about 440 MB of weights.
- ``trees``: a gradient-boosted tree ensemble like a large LightGBM export (one
  ``ai.onnx.ml`` TreeEnsembleRegressor of 2,400 complete trees of depth 10 over 32 features),
  about 180 MB, all of it in node attributes: no initializer, so nothing of it is a weight
  the skeleton leaves out.

The builders take size parameters so tests can build small variants. :func:`get` builds a
model once into ``benchmarks/.models/`` (never committed) and reuses the file afterwards.

Run ``python benchmarks/models.py [names...]`` to build (or find) the files and print paths.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import crossrt

MODELS_DIR = Path(__file__).resolve().parent / ".models"
VERSION = 1
"""Bump when a builder changes so that :func:`get` rebuilds the cached files."""

SEED = 0


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


# -- tiny ----------------------------------------------------------------------------------


def build_tiny(features: int = 16, seed: int = SEED) -> crossrt.Model:
    """``y = x @ W + b`` with ``x: float32[1, features]``."""
    rng = _rng(seed)
    b = crossrt.GraphBuilder("tiny")
    x = b.input("x", "float32", [1, features])
    w = b.constant(_normal(rng, (features, features), 1 / math.sqrt(features)), "W")
    bias = b.constant(_normal(rng, (features,), 0.1), "b")
    b.output(b.op("Add", [b.op("MatMul", [x, w]), bias], outputs=["y"]))
    return b.finish()


# -- ResNet-50 -----------------------------------------------------------------------------


def build_resnet(
    layers: Sequence[int] = (3, 4, 6, 3),
    width: int = 64,
    num_classes: int = 1000,
    image_size: int = 224,
    batch: int | str = "N",
    seed: int = SEED,
) -> crossrt.Model:
    """ResNet with bottleneck blocks (v1.5: stride on the 3x3 conv), batch norm folded.

    With the defaults this is ResNet-50: 53 Conv, 49 Relu, 16 Add, MaxPool,
    GlobalAveragePool, Flatten, Gemm. Weights are He-initialised; the last conv of each
    residual branch is scaled down so that activations stay of order one through the depth.

    Args:
        layers: bottleneck blocks per stage.
        width: channels of the stem and of the first stage's bottleneck (64 in ResNet-50);
            stage ``i`` uses ``width * 2**i``, expanded 4x at each block's output.
        num_classes: outputs of the final Gemm.
        image_size: height and width of the input image.
        batch: the batch dimension: an int, or a name for a dynamic one.
        seed: seed of the weights.
    """
    rng = _rng(seed)
    b = crossrt.GraphBuilder("resnet50" if tuple(layers) == (3, 4, 6, 3) else "resnet")
    # Each residual branch adds variance; scaling its last conv keeps the sum bounded.
    branch_gain = 1.0 / math.sqrt(sum(layers))

    def conv(
        x: str, cin: int, cout: int, k: int, stride: int = 1, gain: float = 1.0, relu: bool = True
    ) -> str:
        std = gain * math.sqrt(2.0 / (cin * k * k))
        w = b.constant(_normal(rng, (cout, cin, k, k), std))
        bias = b.constant(_normal(rng, (cout,), 0.01))
        pad = k // 2
        y = b.op(
            "Conv",
            [x, w, bias],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
        )
        return b.op("Relu", [y]) if relu else y

    x = b.input("input", "float32", [batch, 3, image_size, image_size])
    y = conv(x, 3, width, 7, stride=2)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, blocks in enumerate(layers):
        mid = width * 2**stage
        cout = mid * 4
        for block in range(blocks):
            stride = 2 if (block == 0 and stage > 0) else 1
            h = conv(y, cin, mid, 1)
            h = conv(h, mid, mid, 3, stride=stride)
            h = conv(h, mid, cout, 1, gain=branch_gain, relu=False)
            shortcut = conv(y, cin, cout, 1, stride=stride, relu=False) if block == 0 else y
            y = b.op("Relu", [b.op("Add", [h, shortcut])])
            cin = cout
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    fc_w = b.constant(_normal(rng, (num_classes, cin), 1 / math.sqrt(cin)))
    fc_b = b.constant(_normal(rng, (num_classes,), 0.01))
    b.output(b.op("Gemm", [y, fc_w, fc_b], transB=1, outputs=["logits"]))
    return b.finish()


# -- BERT ----------------------------------------------------------------------------------


def build_bert(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    vocab: int = 30522,
    seq: int = 128,
    max_positions: int = 512,
    batch: int = 1,
    seed: int = SEED,
) -> crossrt.Model:
    """A BERT encoder: embeddings, then post-norm layers of attention and erf-GELU FFN.

    Input ``input_ids: int64[batch, seq]`` (no attention mask); output
    ``last_hidden_state: float32[batch, seq, hidden]``. Weights are normal with std 0.02, as
    BERT initialises them; LayerNormalization keeps activations of order one.
    """
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
    head_dim = hidden // heads
    rng = _rng(seed)
    b = crossrt.GraphBuilder("bert" if layers == 12 and hidden == 768 else "bert_small")

    def const(shape: Sequence[int], std: float = 0.02) -> str:
        return b.constant(_normal(rng, shape, std))

    def int64(values: Sequence[int]) -> str:
        return b.constant(np.asarray(values, dtype=np.int64))

    def linear(x: str, cin: int, cout: int) -> str:
        return b.op("Add", [b.op("MatMul", [x, const((cin, cout))]), const((cout,))])

    def layer_norm(x: str) -> str:
        gamma = b.constant((1 + _normal(rng, (hidden,), 0.02)).astype(np.float32))
        beta = const((hidden,))
        return b.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)

    ids = b.input("input_ids", "int64", [batch, seq])
    words = b.op("Gather", [const((vocab, hidden)), ids], axis=0)
    positions = b.op(
        "Gather", [const((max_positions, hidden)), int64(range(seq))], axis=0
    )  # [seq, hidden], broadcast over the batch
    x = layer_norm(b.op("Add", [words, positions]))

    split_heads = int64([batch, seq, heads, head_dim])
    merge_heads = int64([batch, seq, hidden])
    scale = b.constant(np.float32(1 / math.sqrt(head_dim)))
    inv_sqrt2 = b.constant(np.float32(1 / math.sqrt(2)))
    one = b.constant(np.float32(1))
    half = b.constant(np.float32(0.5))
    for _ in range(layers):
        q, k, v = (
            b.op("Reshape", [linear(x, hidden, hidden), split_heads]) for _ in range(3)
        )  # [batch, seq, heads, head_dim]
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.op("Mul", [b.op("MatMul", [q, k]), scale])  # [batch, heads, seq, seq]
        probs = b.op("Softmax", [scores], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, merge_heads])
        x = layer_norm(b.op("Add", [linear(ctx, hidden, hidden), x]))
        h = linear(x, hidden, ffn)
        gelu = b.op(
            "Mul",
            [
                b.op("Mul", [h, half]),
                b.op("Add", [b.op("Erf", [b.op("Mul", [h, inv_sqrt2])]), one]),
            ],
        )
        x = layer_norm(b.op("Add", [linear(gelu, ffn, hidden), x]))
    b.output(b.op("Identity", [x], outputs=["last_hidden_state"]))
    return b.finish()


def build_trees(
    trees: int = 2400, depth: int = 10, features: int = 32, seed: int = SEED
) -> crossrt.Model:
    """A TreeEnsembleRegressor of ``trees`` complete binary trees of ``depth`` (random splits
    and leaf weights), ``X [N, features] -> Y [N, 1]``."""
    import onnx
    from onnx import TensorProto, helper

    rng = _rng(seed)
    inner, total = 2**depth - 1, 2 ** (depth + 1) - 1
    ids = np.arange(total, dtype=np.int64)
    leaf = ids >= inner
    n, leaves = trees * total, trees * (total - inner)
    node = helper.make_node(
        "TreeEnsembleRegressor",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        n_targets=1,
        aggregate_function="SUM",
    )

    def add(name: str, values: np.ndarray | list[bytes]) -> None:
        # One attribute at a time, built in place: lists of millions of Python numbers are
        # made and dropped one by one.
        attr = node.attribute.add(name=name)
        if isinstance(values, list):
            attr.type = onnx.AttributeProto.STRINGS
            attr.strings.extend(values)
        elif values.dtype.kind == "f":
            attr.type = onnx.AttributeProto.FLOATS
            attr.floats.extend(values.tolist())
        else:
            attr.type = onnx.AttributeProto.INTS
            attr.ints.extend(values.tolist())

    add("nodes_treeids", np.repeat(np.arange(trees), total))
    add("nodes_nodeids", np.tile(ids, trees))
    add("nodes_featureids", rng.integers(0, features, n))
    add("nodes_values", rng.standard_normal(n, dtype=np.float32))
    add("nodes_modes", ([b"BRANCH_LEQ"] * inner + [b"LEAF"] * (total - inner)) * trees)
    add("nodes_truenodeids", np.tile(np.where(leaf, 0, 2 * ids + 1), trees))
    add("nodes_falsenodeids", np.tile(np.where(leaf, 0, 2 * ids + 2), trees))
    add("target_treeids", np.repeat(np.arange(trees), total - inner))
    add("target_nodeids", np.tile(ids[inner:], trees))
    add("target_ids", np.zeros(leaves, np.int64))
    add("target_weights", rng.standard_normal(leaves, dtype=np.float32) * np.float32(0.01))
    graph = helper.make_graph(
        [node],
        "trees",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return crossrt.load_model(helper.make_model(graph, opset_imports=opsets, ir_version=8))


# -- the cache -----------------------------------------------------------------------------

BUILDERS: dict[str, Callable[[], crossrt.Model]] = {
    "tiny": build_tiny,
    "resnet50": build_resnet,
    "bert": build_bert,
    "trees": build_trees,
}


def path_of(name: str) -> Path:
    """Where :func:`get` keeps model ``name``."""
    return MODELS_DIR / f"{name}-v{VERSION}.onnx"


def get(name: str) -> Path:
    """The path of benchmark model ``name``, building and saving it on first use."""
    if name not in BUILDERS:
        raise KeyError(f"unknown benchmark model {name!r}; choose from {', '.join(BUILDERS)}")
    path = path_of(name)
    if path.is_file():
        return path
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    model = BUILDERS[name]()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    model.save(tmp)
    tmp.replace(path)  # atomic: a concurrent or interrupted build never leaves a torn file
    return path


def example_input(name: str, seed: int = 1) -> dict[str, np.ndarray]:
    """A random input for benchmark model ``name`` (batch 1)."""
    rng = _rng(seed)
    if name == "tiny":
        return {"x": rng.standard_normal((1, 16), dtype=np.float32)}
    if name == "resnet50":
        return {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}
    if name == "bert":
        return {"input_ids": rng.integers(0, 30522, size=(1, 128), dtype=np.int64)}
    if name == "trees":
        return {"X": rng.standard_normal((1, 32), dtype=np.float32)}
    raise KeyError(f"unknown benchmark model {name!r}; choose from {', '.join(BUILDERS)}")


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(BUILDERS):
        p = get(arg)
        print(f"{arg}: {p} ({p.stat().st_size / 1e6:.1f} MB)")
