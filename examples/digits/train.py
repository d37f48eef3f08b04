"""Train the digits example model and export it to ONNX.

Trains a small multi-layer perceptron on scikit-learn's bundled 8x8 digits data set (no
download), exports it with skl2onnx and checks the export against scikit-learn. Writes, next
to this file:

- ``digits.onnx``: input ``input`` float32 [N, 64] (pixels scaled to [0, 1]), outputs
  ``label`` int64 [N] and ``probabilities`` float32 [N, 10];
- ``test_images.npy``: the held-out test images, float32 [N, 64], ready to feed;
- ``test_labels.npy``: their true digits, int64 [N].

Deterministic: the split, the initial weights and the training order use fixed seeds, so
re-running it rewrites the same files. Needs the ``examples`` extra::

    .venv/bin/pip install -e '.[examples]'
    .venv/bin/python examples/digits/train.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

import crossrt

HERE = Path(__file__).resolve().parent
SEED = 0
TEST_FRACTION = 0.2
OPSET = 21  # ai.onnx opset of the export: one every crossrt driver runs


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed train/test split, pixels scaled from 0..16 to [0, 1] as float32."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SEED, stratify=y
    )
    return x_train, x_test, y_train, y_test


def plain_onnx_labels(onx: onnx.ModelProto) -> None:
    """Compute ``label`` with ai.onnx operators only, in place.

    skl2onnx maps the ArgMax index to a class through ``ArrayFeatureExtractor`` (domain
    ai.onnx.ml), which only some engines run (not onnx's reference evaluator). The classes
    here are 0..9, so the index is the digit: ``label = ArgMax(probabilities, keepdims=0)``.
    """
    graph = onx.graph
    ops = [n.op_type for n in graph.node]
    tail = ["ArgMax", "ArrayFeatureExtractor", "Reshape", "Cast"]
    if ops[-len(tail) :] != tail or graph.node[-1].output[0] != "label":
        raise RuntimeError(f"unexpected skl2onnx graph {ops}; update plain_onnx_labels()")
    argmax = graph.node[-len(tail)]
    del graph.node[-len(tail) + 1 :]
    argmax.output[0] = "label"
    argmax.attribute.append(onnx.helper.make_attribute("keepdims", 0))
    dropped = {"classes", "shape_tensor"}
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    opsets = [o for o in onx.opset_import if o.domain != "ai.onnx.ml"]
    del onx.opset_import[:]
    onx.opset_import.extend(opsets)
    onnx.checker.check_model(onx, full_check=True)


def main() -> int:
    x_train, x_test, y_train, y_test = load_data()

    clf = MLPClassifier(
        hidden_layer_sizes=(64,),
        alpha=1e-3,
        max_iter=500,
        random_state=SEED,
    )
    clf.fit(x_train, y_train)
    expected_labels = clf.predict(x_test)
    expected_probs = clf.predict_proba(x_test)
    accuracy = float(np.mean(expected_labels == y_test))

    onx = to_onnx(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        options={id(clf): {"zipmap": False}},
        target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    if not np.array_equal(clf.classes_, np.arange(10)):
        print(f"error: unexpected classes {clf.classes_}", file=sys.stderr)
        return 1
    plain_onnx_labels(onx)
    onx.graph.name = "digits_mlp"
    onx.doc_string = "MLP digit classifier: scikit-learn digits, see examples/digits/train.py"

    # The export must match scikit-learn and load through crossrt's strict validation.
    session = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    labels, probs = session.run(None, {"input": x_test})
    if not np.array_equal(labels, expected_labels):
        print("error: ONNX labels differ from scikit-learn's", file=sys.stderr)
        return 1
    if not np.allclose(probs, expected_probs, atol=1e-5):
        print("error: ONNX probabilities differ from scikit-learn's", file=sys.stderr)
        return 1
    model = crossrt.load_model(onx)

    onnx.save_model(onx, HERE / "digits.onnx")
    np.save(HERE / "test_images.npy", np.ascontiguousarray(x_test, dtype=np.float32))
    np.save(HERE / "test_labels.npy", y_test.astype(np.int64))

    hits = int(np.sum(expected_labels == y_test))
    print(f"trained {model!r}")
    print(f"train: {len(x_train)} images, test: {len(x_test)} images")
    print(f"test accuracy: {accuracy:.4f} ({hits}/{len(y_test)})")
    for name in ("digits.onnx", "test_images.npy", "test_labels.npy"):
        print(f"wrote {name}: {(HERE / name).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
