"""A bound request (``model.request(inputs, outputs)``) run again with the same objects skips
its checks (``Binding.holds``); anything that changes what the checks saw (another object, a
new shape or dtype set in place, other memory, a freed tensor) is checked again, with the
same errors as a first call. ``model.run(inputs, outputs)`` is checked on every call."""

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
    check: Callable[[Any], dict[str, Any]] = model._checker.checked_feed

    def counting(inputs: Any) -> dict[str, Any]:
        counted.append(1)
        return check(inputs)

    monkeypatch.setattr(model._checker, "checked_feed", counting)
    return counted


def _x(value: float = 0.0) -> np.ndarray:
    return np.full(N, value, np.float32)


def test_the_same_tensors_are_checked_until_bound_and_copy_nothing(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    feed, outs = {"x": x}, {"y": y}
    where = y.address
    before = copied_bytes()
    request = model.request(feed, outs)
    assert len(checks) == 1  # checked as it is made
    for value in (1.0, 5.0, -2.0, 3.0):
        x.numpy()[:] = value  # the engine reads the input's current bytes each time
        result = request.run()
        assert result == {"y": y} and result is not outs and y.address == where
        assert np.all(y.numpy() == value + 1)
    assert copied_bytes() == before
    assert len(checks) == 3  # the first run, and the second as it binds: no more
    if model.executable.nodes[0].driver == "onnxruntime":  # straight into ORT's binding
        assert request._binding is not None and len(request._binding.calls) == 1


def test_a_plain_run_with_outputs_is_checked_every_call(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    x, y = Tensor.from_buffer(_x(3)), Tensor((N,), "float32")
    for _ in range(3):  # the same objects: no guessing from their identity
        assert model.run({"x": x}, outputs={"y": y}) == {"y": y}
    assert len(checks) == 3 and np.all(y.numpy() == 4)


def bound(model: crossrt.LoadedModel, feed: dict[str, Any], outs: dict[str, Any]) -> Any:
    """A request run twice: bound to ``feed`` and ``outs``."""
    request = model.request(feed, outs)
    request.run()
    request.run()
    assert request._binding is not None
    return request


def test_another_tensor_under_the_same_name_is_checked(
    model: crossrt.LoadedModel, checks: list[int]
) -> None:
    y = Tensor((N,), "float32")
    request = bound(model, {"x": Tensor.from_buffer(_x(1))}, {"y": y})
    checked = len(checks)
    request.set_input("x", Tensor.from_buffer(_x(7)))
    request.run()
    assert np.all(y.numpy() == 8) and len(checks) == checked + 1
    with pytest.raises(InvalidInputError, match="expected float32 \\[256\\], got int32"):
        request.set_input("x", Tensor((N,), "int32"))
        request.run()


def test_an_input_tensor_reshaped_in_place_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    x.set_shape((N // 2,))
    with pytest.raises(InvalidInputError, match="dimension 0 must be 256"):
        request.run()
    x.set_shape((N,), "int32")
    with pytest.raises(InvalidInputError, match="got int32"):
        request.run()


def test_an_input_array_changed_in_place_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = _x(), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    x.shape = (2, N // 2)
    with pytest.raises(InvalidInputError, match="give it 1 dimensions"):
        request.run()
    x.shape = (N,)
    x.dtype = np.int32  # the same bytes seen as another type
    with pytest.raises(InvalidInputError, match="got int32"):
        request.run()


def test_an_output_tensor_given_another_dtype_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    y.set_shape((N // 2,), "float64")
    with pytest.raises(InvalidInputError, match="is float64, the output is float32"):
        request.run()


def test_a_freed_output_tensor_is_refused(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    y.free()
    with pytest.raises(InvalidHandleError, match="was freed"):
        request.run()


def test_an_output_tensor_attached_elsewhere_is_written_there(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x(2)), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    out = np.zeros(N, np.float32)
    y.attach_buffer(out)
    request.run()
    assert np.all(out == 3)
    y.attach_buffer(np.zeros(N, np.float32).view())  # fine, and then a read-only one:
    request.run()
    frozen = np.zeros(N, np.float32)
    frozen.flags.writeable = False
    y.attach_buffer(frozen)
    with pytest.raises(OperationForbiddenError, match="read-only"):
        request.run()


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
    y = Tensor((N,), "float32")
    xs = [Tensor.from_buffer(_x(i)) for i in range(3)]
    request = model.request(outputs={"y": y})
    for i in range(40):  # a new input each run: each must see its own
        request.set_input("x", xs[i % 3])
        request.run()
        assert np.all(y.numpy() == i % 3 + 1)
    assert len(checks) == 40
    request.set_input("x", xs[0])
    for _ in range(20):  # the same again: bound at its second run
        request.run()
        assert np.all(y.numpy() == 1)
    assert len(checks) == 40 + 2


def test_a_bound_request_keeps_no_tensor_alive(model: crossrt.LoadedModel) -> None:
    x = Tensor.from_buffer(_x())
    y = Tensor((N,), "float32", owner=model)
    request = bound(model, {"x": x}, {"y": y})
    assert model.memory.stats().bytes_in_use == 4 * N
    del y, request
    gc.collect()
    assert model.memory.stats().bytes_in_use == 0  # the tensor was freed: its memory too


def test_an_unloaded_model_refuses_a_bound_request(model: crossrt.LoadedModel) -> None:
    x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
    request = bound(model, {"x": x}, {"y": y})
    model.unload()
    with pytest.raises(InvalidHandleError, match="was unloaded"):
        request.run()


@pytest.mark.parametrize("load", [{"check_numerics": True}, {"exec_timeout": 60.0}])
def test_repeated_calls_keep_what_wraps_the_engine(load: dict[str, Any]) -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(N), "cpu", driver="onnxruntime", **load)
        x, y = Tensor.from_buffer(_x()), Tensor((N,), "float32")
        request = model.request({"x": x}, {"y": y})
        for value in (1.0, 2.0, 3.0):
            x.numpy()[:] = value
            request.run()
            assert np.all(y.numpy() == value + 1)
        if load.get("check_numerics"):
            x.numpy()[0] = np.nan  # the numerics check still runs on a bound run
            with pytest.raises(crossrt.CrossrtError, match="non-finite"):
                request.run()


def test_each_instance_runs_its_own_binding() -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(add_one(N), "cpu", driver="onnxruntime", instances=2, cores_per_instance=1)
        x, y = Tensor.from_buffer(_x(4)), Tensor((N,), "float32")
        feed, outs = {"x": x}, {"y": y}
        start = threading.Barrier(2)
        failures: list[BaseException] = []
        request = bound(model, feed, outs)

        def calls() -> None:
            start.wait(timeout=60)
            try:
                for _ in range(50):  # both threads at once: each on an idle instance
                    assert request.run() == {"y": y}
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=calls) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures and np.all(y.numpy() == 5)
        assert request._binding is not None and 1 <= len(request._binding.calls) <= 2
