"""``crossrt.onnxruntime``: one program, run through ``onnxruntime`` and through crossrt's
module, gives bit-equal outputs on several models (every output and subsets by name) and
raises the same ORT exception classes; providers, options, ``.crm`` models and crossrt's
statistics underneath."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import crossrt
import crossrt.onnxruntime as crossrt_ort
from concurrency_models import tiny
from crossrt.onnxruntime.capi import onnxruntime_pybind11_state as state
from small_models import add_one, relu, three_outputs

pytestmark = pytest.mark.usefixtures("runtime_dir")
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"


def _models() -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(7)
    images = np.load(DIGITS / "test_images.npy")[:16].astype(np.float32)
    return {
        "relu": (relu().proto.SerializeToString(), {"x": rng.standard_normal((2, 3), np.float32)}),
        "add_one": (add_one("n").proto.SerializeToString(), {"x": rng.random(5, np.float32)}),
        "tiny": (tiny().proto.SerializeToString(), {"x": rng.random((4, 8), np.float32)}),
        "digits": ((DIGITS / "digits.onnx").read_bytes(), {"input": images}),
        "three_outputs": (
            three_outputs().proto.SerializeToString(),
            {"x": rng.random(3, np.float32)},
        ),
    }


MODELS = _models()


def program(rt: ModuleType, model: bytes, feed: dict[str, np.ndarray]) -> list[Any]:
    """An ORT program: every output, then each output alone and the outputs reversed."""
    sess = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    results = [sess.run(None, feed), sess.run([], feed)]
    results += [sess.run([name], feed) for name in names]
    results.append(sess.run(names[::-1], feed))
    results.append([(a.name, a.type, a.shape) for a in (*sess.get_inputs(), *sess.get_outputs())])
    return results


@pytest.mark.parametrize("name", MODELS)
def test_one_program_bit_equal_outputs(name: str) -> None:
    model, feed = MODELS[name]
    expected = program(ort, model, feed)
    got = program(crossrt_ort, model, feed)
    assert got[-1] == expected[-1]  # inputs and outputs: names, ORT's types, shapes
    for mine, theirs in zip(got[:-1], expected[:-1], strict=True):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b)


def _raised(call: Any) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize(
    ("what", "names", "feed"),
    [
        ("dtype", None, {"x": np.ones((4, 8), np.float64)}),
        ("dimension", None, {"x": np.ones((3, 8), np.float32)}),
        ("rank", None, {"x": np.ones((4, 8, 1), np.float32)}),
        ("missing input", None, {"z": np.ones((4, 8), np.float32)}),
        ("extra input", None, {"x": np.ones((4, 8), np.float32), "z": np.ones(1)}),
        ("output name", ["nope"], {"x": np.ones((4, 8), np.float32)}),
    ],
)
def test_bad_input_raises_ort_class(what: str, names: Any, feed: dict[str, Any]) -> None:
    model = MODELS["tiny"][0]
    real = _raised(lambda: ort.InferenceSession(model).run(names, feed))
    mine = _raised(lambda: crossrt_ort.InferenceSession(model).run(names, feed))
    assert isinstance(mine, crossrt.InvalidInputError)  # crossrt's own except clauses hold
    classes = [c.__name__ for c in type(mine).__mro__]
    # Where ORT raises its InvalidArgument, the very name; where its Python layer raises a
    # builtin (ValueError for a missing input), an InvalidArgument that is that builtin.
    assert type(real).__name__ in classes, (what, type(real), classes)
    assert type(mine).__name__ == "InvalidArgument" and isinstance(mine, state.InvalidArgument)


def test_loading_errors_are_ort_classes(tmp_path: Path) -> None:
    for source in (str(tmp_path / "absent.onnx"), b"not a model"):
        real = _raised(lambda s=source: ort.InferenceSession(s))
        mine = _raised(lambda s=source: crossrt_ort.InferenceSession(s))
        assert type(mine).__name__ == type(real).__name__  # NoSuchFile, InvalidProtobuf
        assert isinstance(mine, crossrt.CrossrtError)
    assert isinstance(_raised(lambda: crossrt_ort.InferenceSession("/absent")), FileNotFoundError)


def test_providers() -> None:
    model = MODELS["tiny"][0]
    assert "CPUExecutionProvider" in crossrt_ort.get_available_providers()
    assert crossrt_ort.get_all_providers() == ort.get_all_providers()
    with pytest.raises(state.InvalidArgument, match="FooExecutionProvider") as caught:
        crossrt_ort.InferenceSession(model, providers=["FooExecutionProvider"])
    assert isinstance(caught.value, ValueError)
    # Known to ORT, not served here: ORT's warning, then ORT's CPU provider.
    absent = next(
        p for p in ort.get_all_providers() if p not in crossrt_ort.get_available_providers()
    )
    with pytest.warns(UserWarning, match=f"Specified provider '{absent}' is not in available"):
        sess = crossrt_ort.InferenceSession(model, providers=[absent])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    reference = crossrt_ort.InferenceSession(model, providers=["CrossrtReferenceExecutionProvider"])
    assert reference.get_providers() == ["CrossrtReferenceExecutionProvider"]
    assert reference.model.executable.nodes[0].driver == "reference"
    with pytest.raises(state.InvalidArgument, match="1 provider_options for 2 providers"):
        crossrt_ort.InferenceSession(model, providers=["A", "B"], provider_options=[{}])


def test_openvino_provider() -> None:
    if "OpenVINOExecutionProvider" not in crossrt_ort.get_available_providers():
        pytest.skip("the openvino driver is not available here")
    model, feed = MODELS["relu"]
    sess = crossrt_ort.InferenceSession(
        model, providers=[("OpenVINOExecutionProvider", {"device_type": "CPU"})]
    )
    assert sess.get_providers() == ["OpenVINOExecutionProvider"]
    assert sess.get_provider_options() == {"OpenVINOExecutionProvider": {"device_type": "CPU"}}
    np.testing.assert_array_equal(sess.run(None, feed)[0], np.maximum(feed["x"], 0))


def test_session_options_and_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, feed = MODELS["tiny"]
    options = crossrt_ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = crossrt_ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    options.add_session_config_entry("session.anything", "1")
    sess = crossrt_ort.InferenceSession(model, options)
    assert sess.get_session_options() is options
    assert options.get_session_config_entry("session.anything") == "1"
    assert len(sess.model.cores) == 1
    assert sess.model.executable.options.portable  # below ORT_ENABLE_ALL: portable
    for _ in range(3):
        sess.run(None, feed)
    assert sess.model.statistics().success == 3
    path = Path(sess.end_profiling())
    assert path.parent == tmp_path and path.name.startswith("trace")
    assert json.loads(path.read_text())["traceEvents"]
    assert sess.end_profiling() == ""


def test_a_crm_file_is_a_model(tmp_path: Path) -> None:
    model, feed = MODELS["digits"]
    exe = crossrt.compile(model)
    exe.save(tmp_path / "digits.crm")
    expected = ort.InferenceSession(model).run(None, feed)
    for source in (str(tmp_path / "digits.crm"), (tmp_path / "digits.crm").read_bytes()):
        sess = crossrt_ort.InferenceSession(source)
        assert [o.name for o in sess.get_outputs()] == ["label", "probabilities"]
        for a, b in zip(sess.run(None, feed), expected, strict=True):
            assert np.array_equal(a, b)
        assert sess.get_modelmeta().graph_name == exe.name


def test_an_ortvalue_in_the_feed_is_its_tensor() -> None:
    """``sess.run(names, {"x": OrtValue})`` as ORT takes it: the value's memory, no copy of
    the feed made to find it."""
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    ours = crossrt_ort.InferenceSession(tiny().to_bytes())
    theirs = ort.InferenceSession(tiny().to_bytes())
    want = theirs.run(None, {"x": ort.OrtValue.ortvalue_from_numpy(x)})[0]
    got = ours.run(None, {"x": crossrt_ort.OrtValue.ortvalue_from_numpy(x)})[0]
    np.testing.assert_array_equal(got, want)
    got = ours.run(["y"], {"x": crossrt_ort.OrtValue.ortvalue_from_numpy(x)})[0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(state.InvalidArgument):
        ours.run(None, {"x": crossrt_ort.OrtValue.ortvalue_from_numpy(x[:, :4].copy())})


def test_terminate_stops_runs_until_cleared() -> None:
    model, feed = MODELS["tiny"]
    sess = crossrt_ort.InferenceSession(model)
    options = crossrt_ort.RunOptions()
    options.terminate = True
    real = ort.RunOptions()
    real.terminate = True
    theirs = _raised(lambda: ort.InferenceSession(model).run(None, feed, real))
    mine = _raised(lambda: sess.run(None, feed, options))
    assert type(mine).__name__ == type(theirs).__name__ == "Fail"
    assert sess.model.statistics().failures == {"CANCELLED": 1}
    options.terminate = False
    assert np.array_equal(sess.run(None, feed, options)[0], sess.run(None, feed)[0])


def test_run_async_calls_back() -> None:
    model, feed = MODELS["three_outputs"]
    sess = crossrt_ort.InferenceSession(model)
    done = threading.Event()
    got: list[Any] = []

    def callback(results: list[np.ndarray], data: Any, err: str) -> None:
        got.append((results, data, err))
        done.set()

    sess.run_async(["times"], feed, callback, "mine")
    assert done.wait(30)
    ((results, data, err),) = got
    assert err == "" and data == "mine"
    np.testing.assert_array_equal(results[0], feed["x"] * 2)


def test_iobinding_repeats_and_outputs_by_name() -> None:
    model, feed = MODELS["three_outputs"]
    sess = crossrt_ort.InferenceSession(model)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", feed["x"])
    out = crossrt_ort.OrtValue.ortvalue_from_shape_and_type([3], np.float32)
    binding.bind_ortvalue_output("times", out)
    binding.bind_output("plus")
    for _ in range(2):
        sess.run_with_iobinding(binding)
        np.testing.assert_array_equal(out.numpy(), feed["x"] * 2)
        times, plus = binding.copy_outputs_to_cpu()
        np.testing.assert_array_equal(plus, feed["x"] + 1)
        np.testing.assert_array_equal(times, feed["x"] * 2)
    binding.clear_binding_outputs()
    with pytest.raises(state.InvalidArgument, match="no output is bound"):
        sess.run_with_iobinding(binding)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about in a plain session
        crossrt_ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_errors_crossing_processes_keep_crossrt_classes() -> None:
    # errors.error_class finds a class by its default code for errors that come back from
    # the daemon or another process: ORT's classes (loaded here) are never the answer.
    from crossrt.errors import error_class

    assert not any(issubclass(error_class(code), state.OrtError) for code in crossrt.StatusCode)
