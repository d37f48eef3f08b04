"""A bound call repeated with the same objects reuses its checks (``OutputBinder.reuse``);
anything that changes what the checks saw (another object, a new shape or dtype set in place,
other memory, a freed tensor) is checked again, with the same errors as a first call."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt import InvalidInputError, Tensor
from crossrt.errors import InvalidHandleError, OperationForbiddenError
from crossrt.runtime.memory.allocator import copied_bytes
from small_models import add_one

# Allocation failures dump their log into the test's own directory, not the real one.
pytestmark = pytest.mark.usefixtures("runtime_dir")
N = 256


@pytest.fixture(params=("onnxruntime", "reference"))
def model(request: pytest.FixtureRequest) -> Iterator[crossrt.LoadedModel]:
    with crossrt.Runtime() as rt:
        yield rt.load(add_one(N), "cpu", driver=str(request.param))


@pytest.fixture
def checks(model: crossrt.LoadedModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls whose inputs were checked (not reused)."""
    counted: list[int] = []
    check: Callable[[Any], dict[str, Any]] = model._checker.check

    def counting(inputs: Any) -> dict[str, Any]:
        counted.append(1)
        return check(inputs)

    monkeypatch.setattr(model._checker, "check", counting)
    return counted


def _x(value: float = 0.0) -> np.ndarray:
    return np.full(N, value, np.float32)


def test_the_same_tensors_are_checked_once_and_copy_nothing(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    feed, outs = {"x": x}, {"y": y}
    where = y.address
    before = copied_bytes()
    for value in (1.0, 5.0, -2.0, 3.0):
        x.numpy()[:] = value  # the engine reads the input's current bytes each time
        result = model.run(feed, outputs=outs)
        assert result == {"y": y} and result is not outs and y.address == where
        assert np.all(y.numpy() == value + 1)
    assert copied_bytes() == before
    assert len(checks) == 1
    model.run({"x": x}, outputs={"y": y})  # new dicts, the same objects: still reused
    assert len(checks) == 1
    if model.executable.nodes[0].driver == "onnxruntime":  # straight into ORT's binding
        assert model._binder._last is not None and len(model._binder._last.calls) == 1


def test_another_tensor_under_the_same_name_is_checked(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    y = Tensor((N,), "float32")
    feed, outs = {"x": Tensor.from_buffer(_x(1))}, {"y": y}
    model.run(feed, outputs=outs)
    feed["x"] = Tensor.from_buffer(_x(7))  # the caller's dict changed in place
    model.run(feed, outputs=outs)
    assert np.all(y.numpy() == 8) and len(checks) == 2
    other = Tensor((N,), "float32")
    assert model.run(feed, outputs={"y": other})["y"] is other
    assert np.all(other.numpy() == 8) and len(checks) == 3
    with pytest.raises(InvalidInputError, match="expected float32 \\[256\\], got int32"):
        model.run({"x": Tensor((N,), "int32")}, outputs=outs)


def test_an_input_tensor_reshaped_in_place_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    x.set_shape((N // 2,))
    with pytest.raises(InvalidInputError, match="dimension 0 must be 256"):
        model.run({"x": x}, outputs={"y": y})
    x.set_shape((N,), "int32")
    with pytest.raises(InvalidInputError, match="got int32"):
        model.run({"x": x}, outputs={"y": y})


def test_an_input_array_changed_in_place_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = _x(), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    x.shape = (2, N // 2)
    with pytest.raises(InvalidInputError, match="give it 1 dimensions"):
        model.run({"x": x}, outputs={"y": y})
    x.shape = (N,)
    x.dtype = np.int32  # the same bytes seen as another type
    with pytest.raises(InvalidInputError, match="got int32"):
        model.run({"x": x}, outputs={"y": y})


def test_an_output_tensor_given_another_dtype_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    y.set_shape((N // 2,), "float64")
    with pytest.raises(InvalidInputError, match="is float64, the output is float32"):
        model.run({"x": x}, outputs={"y": y})


def test_a_freed_output_tensor_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    y.free()
    with pytest.raises(InvalidHandleError, match="was freed"):
        model.run({"x": x}, outputs={"y": y})


def test_an_output_tensor_attached_elsewhere_is_written_there(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x(2)), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    out = np.zeros(N, np.float32)
    y.attach_buffer(out)
    model.run({"x": x}, outputs={"y": y})
    assert np.all(out == 3)
    y.attach_buffer(np.zeros(N, np.float32).view())  # fine, and then a read-only one:
    model.run({"x": x}, outputs={"y": y})
    frozen = np.zeros(N, np.float32)
    frozen.flags.writeable = False
    y.attach_buffer(frozen)
    with pytest.raises(OperationForbiddenError, match="read-only"):
        model.run({"x": x}, outputs={"y": y})


def test_converted_inputs_are_converted_each_time(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    y = Tensor((N,), "float32")
    values = [0.0] * N
    feed = {"x": values}  # a list: turned into a new array by every check
    for value in (1.0, 3.0):
        values[:] = [value] * N
        model.run(feed, outputs={"y": y})
        assert np.all(y.numpy() == value + 1)
    assert len(checks) == 2


def test_inputs_that_change_every_call_stay_correct(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    # Rotating objects are kept for reuse only now and then (every 16th miss): each call must
    # still see its own input.
    y = Tensor((N,), "float32")
    xs = [Tensor.from_buffer(_x(i)) for i in range(3)]
    for i in range(40):
        model.run({"x": xs[i % 3]}, outputs={"y": y})
        assert np.all(y.numpy() == i % 3 + 1)
    assert len(checks) == 40
    for _ in range(20):  # the same again: reused from the next kept call on
        model.run({"x": xs[0]}, outputs={"y": y})
        assert np.all(y.numpy() == 1)
    assert len(checks) < 40 + 20


def test_reuse_keeps_no_tensor_alive(model: crossrt.LoadedModel) -> None:
    x = Tensor.from_buffer(_x())
    y = Tensor((N,), "float32", owner=model)
    model.run({"x": x}, outputs={"y": y})
    model.run({"x": x}, outputs={"y": y})
    assert model.memory_stats().bytes_in_use == 4 * N
    del y
    gc.collect()
    assert model.memory_stats().bytes_in_use == 0  # the tensor was freed: its memory too


def test_an_unloaded_model_refuses_a_repeated_call(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    model.run({"x": x}, outputs={"y": y})
    model.unload()
    with pytest.raises(InvalidHandleError, match="was unloaded"):
        model.run({"x": x}, outputs={"y": y})


@pytest.mark.parametrize("load", [{"check_numerics": True}, {"exec_timeout": 60.0}])
def test_repeated_calls_keep_what_wraps_the_engine(load: dict[str, Any]) -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(N), "cpu", driver="onnxruntime", **load)
        x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
        for value in (1.0, 2.0, 3.0):
            x.numpy()[:] = value
            model.run({"x": x}, outputs={"y": y})
            assert np.all(y.numpy() == value + 1)
        if load.get("check_numerics"):
            x.numpy()[0] = np.nan  # the numerics check still runs on a reused call
            with pytest.raises(crossrt.CrossrtError, match="non-finite"):
                model.run({"x": x}, outputs={"y": y})


def test_each_instance_runs_its_own_binding() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(N), "cpu", driver="onnxruntime", instances=2, cores_per_instance=1)
        x, y = Tensor.from_buffer(_x(4)), Tensor((N,), "float32")
        feed, outs = {"x": x}, {"y": y}
        start = threading.Barrier(2)
        failures: list[BaseException] = []

        def calls() -> None:
            start.wait(timeout=60)
            try:
                for _ in range(50):  # both threads at once: each on an idle instance
                    assert model.run(feed, outputs=outs) == {"y": y}
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=calls) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures and np.all(y.numpy() == 5)
        assert model._binder._last is not None and 1 <= len(model._binder._last.calls) <= 2
