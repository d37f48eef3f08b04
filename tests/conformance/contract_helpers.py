"""What the driver contract suite (``test_driver_contract.py``) shares: its small models and
their NumPy answers, the expected failures file, and moving arrays to where a program wants
them through the driver's own memory hooks.

Nothing here knows a driver by name: a driver registered later is tested as it is.
"""

from __future__ import annotations

import functools
import gc
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

import crossrt
from crossrt.drivers import get_driver
from crossrt.drivers.base import CompileOptions, DeviceArray, DeviceInfo, Driver, Program, Residence
from crossrt.runtime.memory.allocation import is_coherent

EXPECTED = Path(__file__).with_name("contract_expected.toml")
OPTIONS = CompileOptions()

# -- the expected failures --------------------------------------------------------------------


def load_expected(path: Path = EXPECTED) -> dict[str, dict[str, str]]:
    """``{driver: {test function name: reason}}`` from the expected failures file.

    Raises:
        ValueError: an entry is not ``name = "reason"`` with a reason.
    """
    with path.open("rb") as f:
        tables = tomllib.load(f)
    for driver, table in tables.items():
        if not isinstance(table, dict):
            raise ValueError(f"{path.name}: [{driver}] must be a table of test = reason")
        for test, reason in table.items():
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{path.name}: [{driver}] {test} needs a reason (a string)")
    return tables


# -- models and their answers -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A small model, a way to make its inputs, and its answer in NumPy."""

    name: str
    build: Callable[[], crossrt.Model]
    inputs: Callable[[int, int], dict[str, np.ndarray]]  # (seed, batch) -> inputs
    answer: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


_W = (np.arange(8 * 5, dtype=np.float32).reshape(8, 5) - 20) / 16
_B = np.linspace(-1, 1, 5, dtype=np.float32)
_D = (np.arange(4 * 3, dtype=np.float32).reshape(4, 3) - 6) / 4


def _random(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _add() -> crossrt.Model:
    b = crossrt.GraphBuilder("contract_add")
    x = b.input("x", "float32", [2, 3])
    y = b.input("y", "float32", [2, 3])
    b.output(b.op("Add", [x, y], outputs=["z"]))
    return b.finish()


def _dense() -> crossrt.Model:
    b = crossrt.GraphBuilder("contract_dense")
    x = b.input("x", "float32", [4, 8])
    h = b.op("Add", [b.op("MatMul", [x, b.constant(_W)]), b.constant(_B)])
    b.output(b.op("Relu", [h], outputs=["y"]))
    return b.finish()


def _two_outputs() -> crossrt.Model:
    b = crossrt.GraphBuilder("contract_two_outputs")
    x = b.input("x", "float32", [3, 4])
    b.output(b.op("Add", [x, b.constant(np.float32(1))], outputs=["shifted"]))
    b.output(b.op("Relu", [x], outputs=["positive"]))
    return b.finish()


def _dynamic() -> crossrt.Model:
    b = crossrt.GraphBuilder("contract_dynamic")
    x = b.input("x", "float32", ["batch", 4])
    b.output(b.op("Relu", [b.op("MatMul", [x, b.constant(_D)])], outputs=["y"]))
    return b.finish()


ADD = Case(
    "add",
    _add,
    lambda seed, _: {"x": _random(seed, (2, 3)), "y": _random(seed + 1000, (2, 3))},
    lambda f: {"z": f["x"] + f["y"]},
)
DENSE = Case(
    "dense",
    _dense,
    lambda seed, _: {"x": _random(seed, (4, 8))},
    lambda f: {"y": np.maximum(f["x"] @ _W + _B, 0)},
)
TWO_OUTPUTS = Case(
    "two_outputs",
    _two_outputs,
    lambda seed, _: {"x": _random(seed, (3, 4))},
    lambda f: {"shifted": f["x"] + 1, "positive": np.maximum(f["x"], 0)},
)
DYNAMIC = Case(
    "dynamic_batch",
    _dynamic,
    lambda seed, batch: {"x": _random(seed, (batch, 4))},
    lambda f: {"y": np.maximum(f["x"] @ _D, 0)},
)
CASES = {case.name: case for case in (ADD, DENSE, TWO_OUTPUTS, DYNAMIC)}
STATIC = ("add", "dense", "two_outputs")


def unknown_op_model() -> crossrt.Model:
    """Relu, then an operator no driver knows (a made-up domain)."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"]),
            helper.make_node("NoSuchOp", ["h"], ["y"], domain="conformance.test"),
        ],
        "contract_unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("conformance.test", 1)],
    )
    proto.ir_version = 8
    return crossrt.load_model(proto)


def check_results(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], what: str = ""
) -> None:
    """``got`` holds exactly ``want``'s outputs, equal to float32 rounding."""
    assert set(got) == set(want), f"{what}: outputs {sorted(got)}, expected {sorted(want)}"
    for name, expected in want.items():
        value = np.asarray(got[name])
        assert value.shape == expected.shape, f"{what}: {name} is {value.shape}"
        assert value.dtype == np.float32, f"{what}: {name} is {value.dtype}"
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5, err_msg=f"{what} {name}")


@functools.cache
def artifact(driver_name: str, case: str) -> bytes:
    """``case`` compiled by ``driver_name`` for its first device (once per session)."""
    driver = get_driver(driver_name)
    return driver.compile(CASES[case].build(), driver.devices()[0], OPTIONS)


# -- moving arrays where a program wants them -------------------------------------------------


@dataclass
class Place:
    """One driver's first device and its memory hooks, as the suite moves data with them."""

    driver: Driver
    device: DeviceInfo

    def wants_device(self, program: Program, name: str) -> bool:
        """Whether ``program`` takes or returns ``name`` in device memory."""
        return program.residence().get(name, Residence.HOST) is Residence.DEVICE

    def upload(self, array: np.ndarray) -> DeviceArray:
        """A new buffer of this device holding ``array``."""
        array = np.ascontiguousarray(array)
        buffer = self.driver.allocate(self.device, array.nbytes)
        self.driver.copy_in(self.device, buffer, host_bytes(array))
        return DeviceArray(buffer, self.device.id, array.dtype, array.shape)

    def empty(self, shape: tuple[int, ...], dtype: Any = np.float32) -> DeviceArray:
        """A new buffer of this device for a ``dtype`` tensor of ``shape``."""
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return DeviceArray(self.driver.allocate(self.device, nbytes), self.device.id, dt, shape)

    def download(self, value: Any) -> np.ndarray:
        """A host copy of a program's value (a device array is copied out)."""
        if not isinstance(value, DeviceArray):
            return np.array(value)
        out = np.empty(value.shape, value.dtype)
        self.driver.copy_out(self.device, host_bytes(out), value.buffer, value.offset)
        return out

    def write(self, value: Any, array: np.ndarray) -> None:
        """Overwrite the contents of ``value`` (a host array or device array) in place."""
        if isinstance(value, DeviceArray):
            data = np.ascontiguousarray(array, dtype=value.dtype)
            self.driver.copy_in(self.device, value.buffer, host_bytes(data), value.offset)
        else:
            value[...] = array

    def free(self, *values: Any) -> None:
        """Free the device arrays among ``values`` (host arrays need nothing)."""
        for value in values:
            if isinstance(value, DeviceArray):
                self.driver.free(self.device, value.buffer)

    def feed(self, program: Program, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """``inputs`` where ``program`` wants them: device inputs uploaded."""
        return {
            name: self.upload(array) if self.wants_device(program, name) else array
            for name, array in inputs.items()
        }

    def targets(self, program: Program, like: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Output buffers where ``program`` wants them, shaped as ``like``."""
        return {
            name: self.empty(a.shape, a.dtype)
            if self.wants_device(program, name)
            else np.empty_like(a)
            for name, a in like.items()
        }

    def collect(self, results: Mapping[str, Any], keep: bool = False) -> dict[str, np.ndarray]:
        """Host copies of ``results``; device buffers the program allocated are freed unless
        ``keep`` (they are the caller's own, or a binding's)."""
        out = {name: self.download(value) for name, value in results.items()}
        for value in results.values():
            if not keep and isinstance(value, DeviceArray):
                self.free(value)
        return out

    def run(self, program: Program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on host arrays, moved in and out through the hooks, nothing left behind."""
        feed = self.feed(program, inputs)
        try:
            return self.collect(program.run(feed))
        finally:
            self.free(*feed.values())


def host_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as the memory hooks take them."""
    return memoryview(array.reshape(-1).view(np.uint8))


def own_memory(driver: Driver, device: DeviceInfo | None = None) -> bool:
    """Whether the driver's devices (``device``, where given) have memory of their own: it
    overrides the hooks, for a device that is no CPU (onnxruntime's ``cuda:N``)."""
    return not is_coherent(driver, device)


def other_device(driver: Driver, device: DeviceInfo) -> tuple[Driver, DeviceInfo] | None:
    """A device with memory of its own other than ``device``: another of the same driver
    first, else one of another available driver; ``None`` when there is none here."""
    candidates = [driver] + [
        s.driver for s in crossrt.drivers.driver_statuses() if s.driver is not driver
    ]
    for candidate in candidates:
        if candidate is None or not own_memory(candidate):
            continue
        for info in candidate.devices():
            if info.id != device.id and own_memory(candidate, info):
                return candidate, info
    return None


# -- what a process holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """What the process holds that a closed program must give back."""

    threads: int  # OS threads, native ones included (an engine's thread pool)
    descriptors: int  # open file descriptors (mapped artifact files)
    device_bytes: int | None  # bytes in use on the device, where the driver says

    @staticmethod
    def now(driver: Driver, device: DeviceInfo) -> Held:
        gc.collect()  # buffers a dropped binding holds are freed by finalizers
        return Held(
            _count("/proc/self/task"), _count("/proc/self/fd"), device_bytes(driver, device)
        )

    def grown_since(self, before: Held) -> list[str]:
        """What grew since ``before``: a leak. (What shrank may be another test's threads
        ending, or its garbage collected: not this test's business.)"""
        grown = [
            f"{what} {old} -> {new}"
            for what, old, new in (
                ("threads", before.threads, self.threads),
                ("file descriptors", before.descriptors, self.descriptors),
                ("device bytes", before.device_bytes or 0, self.device_bytes or 0),
            )
            if new > old
        ]
        return grown


def _count(folder: str) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:  # not Linux: nothing to compare
        return 0


def device_bytes(driver: Driver, device: DeviceInfo) -> int | None:
    """Bytes the driver has allocated on ``device``, for drivers that keep such accounts
    (``driver.memory(device).used``, as ``sim``); ``None`` for the others."""
    memory = getattr(driver, "memory", None)
    if not callable(memory):
        return None
    used = getattr(memory(device), "used", None)
    return used if isinstance(used, int) else None
