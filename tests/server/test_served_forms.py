"""What the daemon serves is what a request can get (issue 23, point 7): a model with an
input or output KServe cannot carry is refused at load (not READY, the reason in the
repository index) instead of failing every request; sklearn's ZipMap outputs, a sequence of
maps, are served as BYTES of JSON (docs/daemon.md); and a model within the limits of
model/limits.py (exporter-written dimension names) is served, one over them refused at load
with load_model's reason. A real daemon subprocess, real skl2onnx models, raw onnxruntime
as the reference."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")
pytest.importorskip("skl2onnx", reason="skl2onnx builds the ZipMap models")

import numpy as np
import onnx
import onnxruntime as ort
import tritonclient.grpc as tc
from serving import Daemon, start_daemon

import crossrt
from limit_models import (
    detector_like,
    many_inputs,
    rank_model,
    sequence_of_tensors,
    zipmap_classifier,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[onnx.ModelProto, Path]]:
    folder = tmp_path_factory.mktemp("forms")
    repository = folder / "models"
    repository.mkdir()
    built = {
        "zipmap": zipmap_classifier()[0],
        "zipmap_str": zipmap_classifier(string_labels=True)[0],
        "sequence": sequence_of_tensors(),
        "detector": detector_like()[0],
        "rank65": rank_model(65, 65),
        "many": many_inputs(40_000),
    }
    for name, proto in built.items():
        onnx.save(proto, repository / f"{name}.onnx")
    served = {name: (proto, repository / f"{name}.onnx") for name, proto in built.items()}
    wheel_detector = _nudenet_file()
    if wheel_detector is not None:  # the real file, byte for byte, as its exporter wrote it
        shutil.copyfile(wheel_detector, repository / "nudenet.onnx")
        served["nudenet"] = (onnx.load(str(wheel_detector)), repository / "nudenet.onnx")
    from onnxruntime.datasets import get_example  # a ZipMap classifier that ships in a wheel

    shutil.copyfile(get_example("logreg_iris.onnx"), repository / "logreg_iris.onnx")
    served["logreg_iris"] = (
        onnx.load(get_example("logreg_iris.onnx")),
        repository / "logreg_iris.onnx",
    )
    return served


def _nudenet_file() -> Path | None:
    """nudenet's YOLOv8n detector (installed --no-deps by make test), or None."""
    try:
        dist = importlib.metadata.distribution("nudenet")
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if str(f).endswith(".onnx")]
    return Path(str(dist.locate_file(files[0]))) if files else None


@pytest.fixture(scope="module")
def forms_daemon(models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repository = next(iter(models.values()))[1].parent
    d = start_daemon(tmp_path_factory.mktemp("forms-daemon"), repository)
    yield d
    assert d.stop() == 0, "".join(d.log)


@pytest.fixture
def forms_client(forms_daemon: Daemon) -> Iterator[tc.InferenceServerClient]:
    c = forms_daemon.client()
    yield c
    c.close()


def _raw(path: Path, x: np.ndarray) -> list:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


@pytest.mark.parametrize("name", ["zipmap", "zipmap_str"])
def test_a_zipmap_classifier_is_served_as_json_maps_equal_to_raw_onnxruntime(
    forms_client, models, name
):
    """On main: READY, metadata datatype "sequence", and every default request failed."""
    _, x = zipmap_classifier(string_labels=name == "zipmap_str")
    assert forms_client.is_model_ready(name)
    meta = forms_client.get_model_metadata(name)
    outputs = {t.name: (t.datatype, list(t.shape)) for t in meta.outputs}
    assert outputs["output_probability"] == ("BYTES", [-1])
    infer_input = tc.InferInput("X", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)
    result = forms_client.infer(name, [infer_input])  # no outputs named: all of them
    labels, maps = _raw(models[name][1], x)
    got = result.as_numpy("output_label")
    if labels.dtype == object:  # BYTES arrive as bytes
        got = np.array([b.decode() for b in got], dtype=object)
    np.testing.assert_array_equal(got, labels)
    served = [json.loads(t) for t in result.as_numpy("output_probability")]
    assert len(served) == len(x) and len(served[0]) == 3
    assert served == [{str(k): v for k, v in m.items()} for m in maps]
    assert result.get_output("output_probability").datatype == "BYTES"


def test_the_zipmap_classifier_onnxruntime_ships_is_served_as_json_maps(forms_client, models):
    """onnxruntime's own logreg_iris.onnx (onnxmltools): READY, probabilities as BYTES JSON
    maps equal to raw ONNX Runtime's."""
    assert forms_client.is_model_ready("logreg_iris")
    x = np.random.default_rng(3).uniform(0, 8, (3, 2)).astype(np.float32)
    tensor = tc.InferInput("float_input", [3, 2], "FP32")
    tensor.set_data_from_numpy(x)
    result = forms_client.infer("logreg_iris", [tensor])
    labels, maps = _raw(models["logreg_iris"][1], x)
    np.testing.assert_array_equal(result.as_numpy("label"), labels)
    served = [json.loads(t) for t in result.as_numpy("probabilities")]
    assert [m.keys() for m in served] == [{"0", "1", "2"}] * 3
    for mine, theirs in zip(served, maps, strict=True):
        assert all(abs(mine[str(k)] - v) <= 1e-6 for k, v in theirs.items())


def test_a_sequence_of_tensors_is_refused_at_load_with_the_reason(forms_client):
    assert not forms_client.is_model_ready("sequence")
    index = {m.name: m for m in forms_client.get_model_repository_index().models}
    assert index["sequence"].state == "UNAVAILABLE"
    assert "output 'both' is a seq(tensor(float))" in index["sequence"].reason
    assert "run this model in-process" in index["sequence"].reason


def test_exporter_dimension_names_are_served_and_rank_65_refused_at_load(forms_client):
    """On main the detector was UNAVAILABLE ('more than the 256 allowed'); rank 65 is refused
    at load with load_model's reason, as compile and every tool refuse it."""
    assert forms_client.is_model_ready("detector")
    x = np.arange(2 * 3 * 16 * 8, dtype=np.float32).reshape(2, 3, 16, 8)
    images = tc.InferInput("images", list(x.shape), "FP32")
    images.set_data_from_numpy(x)
    boxes = forms_client.infer("detector", [images]).as_numpy("boxes")
    np.testing.assert_array_equal(boxes, x.reshape(2, 3, 4, 4, 2, 4).max(axis=(3, 5)))
    index = {m.name: m for m in forms_client.get_model_repository_index().models}
    assert index["rank65"].state == "UNAVAILABLE"
    assert "has 65 dimensions, more than the 64" in index["rank65"].reason


def test_a_wheel_detector_with_exporter_written_dimensions_is_served(forms_client, models):
    """nudenet's detector as torch 2.3 wrote it (a 330-character output dimension name):
    READY, its metadata says the dimension is dynamic, and a request gets raw ONNX Runtime's
    answer."""
    if "nudenet" not in models:
        pytest.skip("nudenet is not installed (`pip install --no-deps nudenet`; make test does)")
    assert forms_client.is_model_ready("nudenet")
    meta = forms_client.get_model_metadata("nudenet")
    assert [list(t.shape) for t in meta.outputs] == [[-1, 22, -1]]
    x = np.random.default_rng(5).uniform(0, 1, (1, 3, 320, 320)).astype(np.float32)
    images = tc.InferInput("images", list(x.shape), "FP32")
    images.set_data_from_numpy(x)
    got = forms_client.infer("nudenet", [images]).as_numpy("output0")
    (want,) = _raw(models["nudenet"][1], x)
    assert got.shape == want.shape == (1, 22, 2100)
    assert float(np.max(np.abs(got - want))) <= 1e-5


def test_forty_thousand_inputs_are_served(forms_client):
    """Within the limits: compiled at load (the documented limit is what a header holds),
    READY, and a request with every input answered."""
    assert forms_client.is_model_ready("many")
    assert len(forms_client.get_model_metadata("many").inputs) == 40_000
    inputs = []
    for i in range(40_000):
        tensor = tc.InferInput(f"x{i}", [1], "FP32")
        tensor.set_data_from_numpy(np.full(1, 0.5, np.float32))
        inputs.append(tensor)
    assert forms_client.infer("many", inputs).as_numpy("y").tolist() == [20_000.0]


def test_a_model_sent_by_connect_is_refused_as_the_repository_refuses_it(forms_daemon):
    with crossrt.connect(forms_daemon.url) as remote:
        with pytest.raises(crossrt.UnsupportedError, match=r"output 'both' is a seq\(tensor"):
            remote.load(sequence_of_tensors().SerializeToString(), name="sent_sequence")
        names = {m.name for m in forms_daemon.client().get_model_repository_index().models}
    assert "sent_sequence" not in names
