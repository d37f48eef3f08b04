"""``model.run(inputs, output_names=[...])``: only the outputs named, in that order, fetched
alone from an engine that can (ONNX Runtime, as ``InferenceSession.run(output_names)``); an
unknown name is EXEC_BAD_INPUT naming the model's outputs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import crossrt
from concurrency_models import gate
from crossrt import InvalidInputError, StatusCode
from small_models import three_outputs

pytestmark = pytest.mark.usefixtures("runtime_dir")


@pytest.fixture(params=("onnxruntime", "reference", "sim"))
def model(request: pytest.FixtureRequest) -> Iterator[crossrt.LoadedModel]:
    """The model on ONNX Runtime (asked for the outputs named), on the reference driver
    (every output computed, those kept) and on a device with memory of its own (results
    copied to the host)."""
    with crossrt.Runtime() as rt:
        if request.param == "sim":
            yield rt.load(three_outputs(), "sim:0")
        else:
            yield rt.load(three_outputs(), "cpu", driver=str(request.param))


def test_only_the_named_outputs_in_their_order(model: crossrt.LoadedModel) -> None:
    x = np.arange(3, dtype=np.float32)
    result = model.run({"x": x}, output_names=["times", "plus"])
    assert list(result) == ["times", "plus"]
    np.testing.assert_array_equal(result["times"], x * 2)
    np.testing.assert_array_equal(result["plus"], x + 1)
    assert list(model.run({"x": x})) == ["plus", "times", "trap"]  # None: every output


def test_onnxruntime_is_asked_for_the_named_outputs_only() -> None:
    # ORT fetches (and turns into arrays) only the outputs named. It still runs every node:
    # ORT 1.32 computes the 'trap' branch even with RunOptions.only_execute_path_to_fetches
    # (docs/onnxruntime-api.md), so the run below uses an input 'trap' accepts.
    x = np.arange(3, dtype=np.float32)
    with crossrt.Runtime() as rt:
        model = rt.load(three_outputs(), "cpu", driver="onnxruntime")
        program = model._programs[0]
        fetched: list[list[str]] = []
        real = program._run

        def spy(names: list[str], *rest: object) -> object:
            fetched.append(list(names))
            return real(names, *rest)

        program._run = spy
        result = model.run({"x": x}, output_names=["times"])
        np.testing.assert_array_equal(result["times"], x * 2)
        assert list(result) == ["times"] and fetched == [["times"]]
        assert model.statistics().success == 1  # counted like any run


def test_unknown_name_names_the_outputs(model: crossrt.LoadedModel) -> None:
    with pytest.raises(InvalidInputError) as caught:
        model.run({"x": np.ones(3, np.float32)}, output_names=["plus", "tims"])
    err = caught.value
    assert err.code is StatusCode.EXEC_BAD_INPUT
    assert "'tims'" in err.message and "plus, times, trap" in err.message
    assert "did you mean 'times'" in err.message
    for bad in ([], "plus", [1], ["plus", "plus"]):
        with pytest.raises(InvalidInputError):
            model.run({"x": np.ones(3, np.float32)}, output_names=bad)  # type: ignore[arg-type]


def test_with_deadline_buffers_and_busy_instances(model: crossrt.LoadedModel) -> None:
    x = np.arange(3, dtype=np.float32)
    later = time.monotonic() + 60
    result = model.run({"x": x}, output_names=["times"], deadline=later)
    assert list(result) == ["times"]
    np.testing.assert_array_equal(result["times"], x * 2)
    token = crossrt.CancelToken()
    assert list(model.run({"x": x}, output_names=["trap"], cancel=token)) == ["trap"]
    # A buffer for an output asked for is written in place.
    out = np.zeros(3, np.float32)
    result = model.run({"x": x}, {"plus": out}, output_names=["plus", "times"])
    assert result["plus"] is out and list(result) == ["plus", "times"]
    np.testing.assert_array_equal(out, x + 1)
    # A buffer for an output not asked for is refused: it would never be written.
    with pytest.raises(InvalidInputError, match="'trap'"):
        model.run({"x": x}, {"trap": np.zeros(3, np.float32)}, output_names=["plus"])


def test_busy_instance_queued_run_keeps_the_named_outputs() -> None:
    # The only instance busy: a run with a deadline waits in the queue, and gets the
    # outputs named like any other.
    x = np.arange(3, dtype=np.float32)
    with crossrt.Runtime() as rt:
        model = rt.load(three_outputs(), "cpu", driver="onnxruntime")
        gated = gate(model)
        first = model.run_async({"x": x})
        assert gated.started.wait(10)
        with ThreadPoolExecutor(1) as pool:
            later = pool.submit(
                model.run, {"x": x}, output_names=["times"], deadline=time.monotonic() + 30
            )
            gated.gate.set()
            assert list(later.result(timeout=30)) == ["times"]
        assert list(first.result(timeout=30)) == ["plus", "times", "trap"]
        gated.started.clear()
        assert list(model.run({"x": x}, output_names=["plus"])) == ["plus"]
        assert gated.started.is_set()  # the selected run went through the program in place
