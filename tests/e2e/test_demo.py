"""End to end: the digits demo (``make demo``) and the committed example model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

import crossrt

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
COMMITTED = ("digits.onnx", "test_images.npy", "test_labels.npy")


def test_demo_runs_and_reports_accuracy() -> None:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, str(DIGITS / "demo.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert len(lines) < 30, proc.stdout
    match = re.search(r"^accuracy: ([0-9.]+) \((\d+)/(\d+)\)$", proc.stdout, re.MULTILINE)
    assert match, f"no accuracy line in:\n{proc.stdout}"
    accuracy, correct, total = float(match[1]), int(match[2]), int(match[3])
    assert accuracy >= 0.9
    assert total == len(np.load(DIGITS / "test_labels.npy"))
    assert abs(accuracy - correct / total) < 1e-4
    assert re.search(r"^batch 1: .* median, .* p90", proc.stdout, re.MULTILINE), proc.stdout
    assert "images/s" in proc.stdout


def test_committed_model_matches_onnxruntime() -> None:
    sizes = {name: (DIGITS / name).stat().st_size for name in COMMITTED}
    assert sum(sizes.values()) < 1_000_000, sizes

    images = np.load(DIGITS / "test_images.npy")
    labels = np.load(DIGITS / "test_labels.npy")
    assert images.dtype == np.float32 and images.ndim == 2 and images.shape[1] == 64
    assert labels.dtype == np.int64 and labels.shape == (len(images),)

    model = crossrt.load_model(DIGITS / "digits.onnx")  # strict validation
    assert [(s.name, s.dtype.name if s.dtype else None) for s in model.inputs] == [
        ("input", "float32")
    ]

    session = ort.InferenceSession(str(DIGITS / "digits.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, {"input": images}), strict=True))

    with crossrt.Runtime() as rt:
        loaded = rt.load(crossrt.compile(model, device="cpu"), cores=1)
        batched = loaded.run({"input": images})
        single = [loaded.run({"input": images[i : i + 1]}) for i in range(len(images))]

    assert batched.keys() == expected.keys()
    for name, want in expected.items():
        got = batched[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.max(np.abs(got.astype(np.float64) - want)) <= 1e-5, name
        one_by_one = np.concatenate([out[name] for out in single])
        assert np.max(np.abs(one_by_one.astype(np.float64) - want)) <= 1e-5, name
    assert np.mean(expected["label"] == labels) >= 0.9


def test_readme_snippet_names() -> None:
    """The README's ten lines: these paths, the input name and the load options."""
    exe = crossrt.compile(str(DIGITS / "digits.onnx"), device="cpu")
    with crossrt.Runtime() as rt:
        model = rt.load(exe, cores=min(2, rt.devices()[0].cores))
        info = {t.name: t for t in model.tensors.info()}
        assert info["input"].usage == "input"
        x = np.load(DIGITS / "test_images.npy")[:1]
        out = model.run({"input": x})
    assert out["label"].shape == (1,)
    assert out["probabilities"].shape == (1, 10)
