"""The driver boundary (``drivers/boundary.py``): whatever a driver raises, callers of
``compile``, ``Runtime.load`` and ``run`` get a CrossrtError naming the driver and what it
raised. A driver that leaks is a real Driver subclass registered for the test."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError

import crossrt
from crossrt.drivers import registry
from crossrt.drivers.base import Program
from crossrt.drivers.reference import ReferenceDriver
from crossrt.errors import StatusCode
from crossrt.model import GraphBuilder


class LeakyProgram(Program):
    """The reference program, raising ``leak`` from run (and bound calls) when set."""

    def __init__(self, inner: Program, leak: BaseException | None) -> None:
        self.inner, self.leak = inner, leak

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        if self.leak is not None:
            raise self.leak
        return self.inner.run(inputs, outputs)

    def bind(self, inputs: Mapping[str, Any], outputs: Any = None) -> Any:
        def call() -> dict[str, Any]:  # raises itself, not through the guarded run
            if self.leak is not None:
                raise self.leak
            return self.inner.run(inputs, outputs)

        return call

    def close(self) -> None:
        self.inner.close()


class LeakyDriver(ReferenceDriver):
    """The reference driver that raises ``leaks[method]`` from that method."""

    name = "leaky"
    preference = -1  # never the default for "cpu"

    def __init__(self) -> None:
        self.leaks: dict[str, BaseException] = {}

    def _leak(self, method: str) -> None:
        if method in self.leaks:
            raise self.leaks[method]

    def compile(self, model: Any, device: Any, options: Any) -> bytes:
        self._leak("compile")
        return super().compile(model, device, options)

    def load(self, artifact: Any, device: Any, cores: Any, options: Any, *, file: Any = None):
        self._leak("load")
        inner = super().load(artifact, device, cores, options, file=file)
        return LeakyProgram(inner, self.leaks.get("run"))

    def sharing(self, artifact: Any, file: Any, loads: int) -> Any:
        @contextlib.contextmanager
        def prepared() -> Iterator[Any]:
            self._leak("sharing")
            yield file

        return prepared()


@pytest.fixture
def leaky(monkeypatch) -> LeakyDriver:
    driver = LeakyDriver()
    table = dict(registry._table())
    table["leaky"] = registry.DriverStatus("leaky", "test:LeakyDriver", driver)
    monkeypatch.setattr(registry, "_statuses", table)
    return driver


def _model() -> crossrt.Model:
    b = GraphBuilder("tiny")
    x = b.input("x", "float32", [2])
    b.output(b.op("Relu", [x], outputs=["y"]))
    return b.finish()


X = {"x": np.array([-1.0, 2.0], np.float32)}


def test_a_driver_that_leaks_nothing_works(leaky) -> None:
    with crossrt.Runtime() as rt:
        model = rt.load(_model(), "cpu", driver="leaky")
        np.testing.assert_array_equal(model.run(X)["y"], [0.0, 2.0])


def test_a_leak_in_compile_is_a_compile_error_naming_the_driver_and_the_exception(
    leaky,
) -> None:
    leaky.leaks["compile"] = KeyError("opset")
    with pytest.raises(crossrt.CompileError) as info:
        crossrt.compile(_model(), "cpu", driver="leaky")
    error = info.value
    assert error.code is StatusCode.COMPILE_ERROR
    assert "driver 'leaky'" in error.message and "KeyError" in error.message
    assert error.details == {
        "driver": "driver 'leaky'",
        "method": "compile",
        "exception": "KeyError",
    }
    assert isinstance(error.__cause__, KeyError)


@pytest.mark.parametrize(
    "leak",
    [DecodeError("Wire format was corrupt"), ValueError("bad"), NotImplementedError("op")],
    ids=lambda e: type(e).__name__,
)
def test_a_leak_in_load_says_to_compile_again(leaky, leak) -> None:
    exe = crossrt.compile(_model(), "cpu", driver="leaky")
    leaky.leaks["load"] = leak
    with crossrt.Runtime() as rt, pytest.raises(crossrt.errors.InvalidContainerError) as info:
        rt.load(exe)
    assert info.value.code is StatusCode.INVALID
    assert type(leak).__name__ in info.value.message
    assert "compile the model again" in info.value.message
    assert rt.models == []  # nothing left half-loaded


def test_a_leak_entering_sharing_is_a_crossrt_error(leaky) -> None:
    exe = crossrt.compile(_model(), "cpu", driver="leaky")
    leaky.leaks["sharing"] = OSError(28, "No space left on device")
    with crossrt.Runtime() as rt, pytest.raises(crossrt.CrossrtError, match="OSError") as info:
        rt.load(exe)
    assert "No space left on device" in info.value.message
    assert info.value.details["method"] == "sharing"


def test_a_leak_in_run_is_an_execution_error_in_run_and_run_async(leaky) -> None:
    leaky.leaks["run"] = IndexError("list index out of range")
    with crossrt.Runtime() as rt:
        model = rt.load(_model(), "cpu", driver="leaky")
        with pytest.raises(crossrt.ExecutionError, match="IndexError") as info:
            model.run(X)
        assert info.value.code is StatusCode.FAILURE
        assert "LeakyProgram" in info.value.message
        with pytest.raises(crossrt.ExecutionError, match="IndexError"):
            model.run_async(X).result(timeout=60)


def test_a_bound_call_that_leaks_is_an_execution_error(leaky) -> None:
    """A bound request's later runs call what ``Program.bind`` returned; the runtime maps
    its leak."""
    exe = crossrt.compile(_model(), "cpu", driver="leaky")
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        out = {"y": crossrt.Tensor((2,), "float32")}
        request = model.request(X, out)
        request.run()
        request.run()  # bound on its second run: later runs call the bound call
        np.testing.assert_array_equal(out["y"].numpy(), [0.0, 2.0])
        (program,) = model._programs
        program.leak = RuntimeError("engine state lost")
        with pytest.raises(
            crossrt.ExecutionError, match=r"RuntimeError.*engine state lost"
        ) as info:
            request.run()
        assert "a bound call" in info.value.message


def test_running_out_of_memory_is_out_of_resources(leaky) -> None:
    exe = crossrt.compile(_model(), "cpu", driver="leaky")
    leaky.leaks["load"] = MemoryError()
    with crossrt.Runtime() as rt, pytest.raises(crossrt.OutOfResourcesError) as info:
        rt.load(exe)
    assert info.value.code is StatusCode.RESOURCE
    assert "ran out of memory in load" in info.value.message


@pytest.mark.parametrize("leak", [KeyboardInterrupt(), SystemExit(3)], ids=repr)
def test_interrupts_and_exits_pass_untouched(leaky, leak) -> None:
    leaky.leaks["compile"] = leak
    with pytest.raises(type(leak)) as info:
        crossrt.compile(_model(), "cpu", driver="leaky")
    assert info.value is leak


def test_a_crossrt_error_passes_as_it_is(leaky) -> None:
    mine = crossrt.UnsupportedError("no such op here")
    leaky.leaks["compile"] = mine
    with pytest.raises(crossrt.UnsupportedError) as info:
        crossrt.compile(_model(), "cpu", driver="leaky")
    assert info.value is mine


def test_the_traceback_is_logged_at_debug(leaky, caplog) -> None:
    leaky.leaks["compile"] = KeyError("opset")
    with caplog.at_level(logging.DEBUG, logger="crossrt"), pytest.raises(crossrt.CompileError):
        crossrt.compile(_model(), "cpu", driver="leaky")
    record = next(r for r in caplog.records if "raised KeyError in compile" in r.getMessage())
    assert record.levelno == logging.DEBUG and record.exc_info is not None


def test_a_huge_message_is_cut(leaky) -> None:
    leaky.leaks["compile"] = ValueError("x" * 100_000)
    with pytest.raises(crossrt.CompileError) as info:
        crossrt.compile(_model(), "cpu", driver="leaky")
    assert len(info.value.message) < 1000


def test_every_driver_method_is_guarded_on_every_installed_driver() -> None:
    """Third-party drivers included: the guard is applied when a Driver class is made."""
    from crossrt.drivers.boundary import DRIVER_METHODS, PROGRAM_METHODS

    for driver in crossrt.drivers.available_drivers():
        for name in DRIVER_METHODS:
            assert getattr(getattr(type(driver), name), "__crossrt_guarded__", False), name
    for cls in [Program, *Program.__subclasses__()]:
        for name in PROGRAM_METHODS:
            assert getattr(getattr(cls, name), "__crossrt_guarded__", False), (cls, name)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_an_exception_that_cannot_be_printed_is_still_an_error(leaky) -> None:
    leaky.leaks["compile"] = Unprintable()
    with pytest.raises(crossrt.CompileError, match=r"Unprintable: no message"):
        crossrt.compile(_model(), "cpu", driver="leaky")
