"""Moving tensors to where a program wants them, and counting every byte moved.

A program says where it wants each input and output (:meth:`Program.residence`): host memory
(NumPy arrays) or its device's own (:class:`DeviceArray`). :class:`ResidentProgram` wraps the
programs of a model that wants anything on a device, and moves a value through the drivers'
memory hooks only where it lies elsewhere:

- a host array for a DEVICE input is copied in (host -> device), once per run;
- a device tensor for a HOST input is copied out (device -> host);
- a device tensor is handed over as it is: nothing moves. A tensor on another device is
  refused by the program's driver (the one that knows its memory): crossrt never moves data
  between devices behind the caller's back.

Results stay where the program leaves them unless the caller asked for them elsewhere (a host
array or tensor in ``outputs=``, or a plain ``run()``, which returns host arrays). Every move
is counted per model and per direction in :class:`Transfers`.

A model whose programs all want host memory (every CPU engine) is not wrapped: its runs pay
nothing for this.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...drivers import DeviceInfo, Driver, Program, resolve_device
from ...drivers.base import CancelToken, DeviceArray, Residence
from ...errors import InvalidInputError
from .allocation import host_contiguous, host_empty

if TYPE_CHECKING:
    from .tensor import Tensor

H2D, D2H, D2D = "host_to_device", "device_to_host", "device_to_device"


@dataclass(frozen=True)
class TransferStats:
    """Bytes and copies a model moved between memories, per direction.

    Attributes:
        host_to_device_bytes: bytes copied from host memory into device memory.
        device_to_host_bytes: bytes copied from device memory into host memory.
        device_to_device_bytes: bytes copied between buffers of devices.
        host_to_device_copies: how many copies made the first figure.
        device_to_host_copies: how many copies made the second.
        device_to_device_copies: how many copies made the third.
    """

    host_to_device_bytes: int = 0
    device_to_host_bytes: int = 0
    device_to_device_bytes: int = 0
    host_to_device_copies: int = 0
    device_to_host_copies: int = 0
    device_to_device_copies: int = 0

    def to_dict(self) -> dict[str, int]:
        """A JSON-friendly form."""
        return dict(self.__dict__)


class Transfers:
    """Counts the bytes one model moves, per direction (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = {H2D: 0, D2H: 0, D2D: 0}
        self._copies = {H2D: 0, D2H: 0, D2D: 0}
        self.spans: MutableSequence[tuple[str, int, int, int]] | None = None
        """While a profile records: ``(direction, bytes, began, ended)`` per copy whose
        start was given (``time.perf_counter_ns()``)."""

    def count(self, direction: str, nbytes: int, began: int = 0) -> None:
        """Count one copy of ``nbytes`` in ``direction`` (``H2D``, ``D2H`` or ``D2D``) that
        ended now; ``began`` (``time.perf_counter_ns()``) lets a profile draw it."""
        with self._lock:
            self._bytes[direction] += nbytes
            self._copies[direction] += 1
        spans = self.spans
        if spans is not None and began:
            spans.append((direction, nbytes, began, time.perf_counter_ns()))

    def stats(self) -> TransferStats:
        """The counts so far."""
        with self._lock:
            b, c = dict(self._bytes), dict(self._copies)
        return TransferStats(b[H2D], b[D2H], b[D2D], c[H2D], c[D2H], c[D2D])


def device_array(tensor: Tensor) -> DeviceArray | None:
    """The memory of a tensor the host cannot address, as a program takes it; ``None`` for a
    tensor in host memory."""
    storage = tensor._live("run")
    if storage.host is not None or storage.allocation is None:
        return None
    allocation = storage.allocation
    return DeviceArray(
        allocation.handle,
        allocation.allocator.device.id,
        tensor.dtype.numpy,
        tensor.shape,
        tensor._offset,
    )


@functools.lru_cache(maxsize=64)
def _driver_of(device: str) -> tuple[Driver, DeviceInfo]:
    return resolve_device(device)


def to_host(value: DeviceArray, transfers: Transfers) -> np.ndarray:
    """A host copy of a device array (device -> host, counted)."""
    driver, info = _driver_of(value.device)
    out = host_empty(value.shape, value.dtype, f"a host copy of a result on {value.device}")
    began = time.perf_counter_ns()
    driver.copy_out(info, _bytes_of(out), value.buffer, value.offset)
    transfers.count(D2H, out.nbytes, began)
    return out


def to_device(array: np.ndarray, device: DeviceInfo, driver: Driver, transfers: Transfers) -> Any:
    """A new buffer on ``device`` holding ``array`` (host -> device, counted)."""
    array = host_contiguous(array, f"an input staged for {device.id}")
    buffer = driver.allocate(device, array.nbytes)
    began = time.perf_counter_ns()
    try:
        driver.copy_in(device, buffer, _bytes_of(array), 0)
    except BaseException:
        driver.free(device, buffer)
        raise
    transfers.count(H2D, array.nbytes, began)
    return buffer


def release(value: Any) -> None:
    """Free a device array's buffer through its driver (intermediate values, staging)."""
    if isinstance(value, DeviceArray):
        driver, info = _driver_of(value.device)
        driver.free(info, value.buffer)


def release_made(results: Mapping[str, Any], outputs: Mapping[str, Any] | None) -> None:
    """Free the device arrays among ``results`` that the program made (not the caller's
    ``outputs``): the results of a run nobody will receive (it timed out)."""
    given = {id(v.buffer) for v in (outputs or {}).values() if isinstance(v, DeviceArray)}
    for value in results.values():
        if isinstance(value, DeviceArray) and id(value.buffer) not in given:
            release(value)


def to_host_results(results: dict[str, Any], transfers: Transfers) -> dict[str, Any]:
    """Results as host arrays: each device array copied out (counted) and its buffer freed."""
    for name, value in results.items():
        if isinstance(value, DeviceArray):
            results[name] = to_host(value, transfers)
            release(value)
    return results


def _bytes_of(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


class ResidentProgram(Program):
    """A program with the moves its residence needs around it (see the module's docstring).

    It takes inputs and output buffers wherever they lie (host arrays, device arrays) and
    returns, for outputs the caller gave no buffer for, what the program produced.

    Args:
        program: the driver's program.
        driver: its driver (for the memory hooks).
        device: the device it runs on.
        transfers: where moves are counted (set by the model that loads it).
    """

    def __init__(
        self, program: Program, driver: Driver, device: DeviceInfo, transfers: Transfers
    ) -> None:
        self.inner = program
        self.driver = driver
        self.device = device
        self.transfers = transfers
        residence = program.residence()
        self.on_device = frozenset(n for n, r in residence.items() if r is Residence.DEVICE)

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return self._call(inputs, outputs, lambda feed, given: self.inner.run(feed, given))

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._call(
            inputs, outputs, lambda feed, given: self.inner.run_cancellable(feed, cancel, given)
        )

    def close(self) -> None:
        self.inner.close()

    # -- the moves ---------------------------------------------------------------------------

    def _call(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        execute: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any]],
    ) -> dict[str, Any]:
        staged: list[DeviceArray] = []
        feed: dict[str, Any] = {}
        try:
            for name, value in inputs.items():
                placed = feed[name] = self._placed(name, value)
                if placed is not value and isinstance(placed, DeviceArray):
                    staged.append(placed)
            given, after = self._buffers(outputs)
            results = execute(feed, given)
        finally:
            for value in staged:
                release(value)
        return self._finish(results, after)

    def _placed(self, name: str, value: Any) -> Any:
        """``value`` where the program wants input ``name`` (moved and counted if needed)."""
        if name in self.on_device:
            if isinstance(value, np.ndarray):
                buffer = to_device(value, self.device, self.driver, self.transfers)
                return DeviceArray(buffer, self.device.id, value.dtype, value.shape)
            return value  # not a tensor: the engine takes it as it is
        if isinstance(value, DeviceArray):
            return to_host(value, self.transfers)
        return value

    def _buffers(
        self, outputs: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any] | None, list[tuple[str, Any]]]:
        """The caller's output buffers the program can write itself, and those it cannot
        (filled by a copy after the run)."""
        if not outputs:
            return None, []
        given: dict[str, Any] = {}
        after: list[tuple[str, Any]] = []
        for name, buffer in outputs.items():
            # A buffer in the memory the program wants is written by the program itself.
            if isinstance(buffer, DeviceArray) == (name in self.on_device):
                given[name] = buffer
            else:
                after.append((name, buffer))
        return given or None, after

    def _finish(self, results: dict[str, Any], after: list[tuple[str, Any]]) -> dict[str, Any]:
        """Copy results into the buffers the program could not write, counting each copy."""
        for name, buffer in after:
            produced = results[name]
            if isinstance(buffer, DeviceArray):  # a host result into device memory
                array = host_contiguous(produced, f"result {name!r}")
                driver, info = _driver_of(buffer.device)
                began = time.perf_counter_ns()
                driver.copy_in(info, buffer.buffer, _bytes_of(array), buffer.offset)
                self.transfers.count(H2D, array.nbytes, began)
            else:  # a device result into a host buffer
                if produced.nbytes != buffer.nbytes or produced.dtype != buffer.dtype:
                    release(produced)
                    raise InvalidInputError(
                        f"output {name!r} is {produced.dtype} {list(produced.shape)}, but the "
                        f"buffer given for it is {buffer.dtype} {list(buffer.shape)}; pass a "
                        "buffer of that dtype and shape, or none to receive the result",
                        details={"output": name},
                    )
                driver, info = _driver_of(produced.device)
                began = time.perf_counter_ns()
                driver.copy_out(info, _bytes_of(buffer), produced.buffer, produced.offset)
                self.transfers.count(D2H, buffer.nbytes, began)
                release(produced)
            results[name] = buffer
        return results
