"""Device memory of the ``sim`` driver: buffers the host cannot address, capacity per device.

An accelerator's memory is not host memory. The host reaches it only through copies (DMA), a
buffer belongs to one device, and a device runs out of it on its own. The simulation keeps
those three facts so that code written against it (the runtime, a model split across
devices) behaves as it will on hardware:

- :class:`SimBuffer` holds its bytes privately: it offers no buffer protocol and no
  ``__array__``, so the host cannot read it by accident; only the driver's ``copy_out`` does.
- Every access names the device it is made for; a buffer of another device is refused.
- :class:`DeviceMemory` counts the bytes allocated on one device and refuses an allocation
  past its capacity with ``RESOURCE``, as a full device would.

A driver for real hardware replaces the NumPy array inside :class:`SimBuffer` with the
engine's device pointer, and the slices in :meth:`DeviceMemory.region` with its DMA calls.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import (
    InvalidArgumentError,
    InvalidHandleError,
    OperationForbiddenError,
    OutOfResourcesError,
)


class SimBuffer:
    """A block of one simulated device's memory, as :meth:`SimDriver.allocate` returns it.

    Attributes:
        device: the id of the device whose memory holds it (``"sim:3"``).
        nbytes: its size in bytes.
        freed: whether it was freed (then every access is refused).
    """

    __slots__ = ("_bytes", "device", "freed", "nbytes")

    def __init__(self, device: str, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.freed = False
        # Zero-filled, as device memory handed out by a runtime should never show another
        # model's stale bytes; np.zeros maps pages lazily, so a large capacity costs nothing
        # until it is written.
        self._bytes = np.zeros(nbytes, dtype=np.uint8)

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return f"SimBuffer({self.device}, {self.nbytes} bytes{state})"


class DeviceMemory:
    """The memory of one simulated device: its capacity and the bytes allocated (thread-safe).

    Args:
        device: the device's id.
        capacity: how many bytes it holds.
    """

    def __init__(self, device: str, capacity: int) -> None:
        self.device = device
        self.capacity = capacity
        self.used = 0
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> SimBuffer:
        """A new zero-filled buffer of ``nbytes``.

        Raises:
            InvalidArgumentError: ``nbytes`` is not a whole number of bytes >= 0.
            OutOfResourcesError: (RESOURCE) the device has fewer than ``nbytes`` free.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
            raise InvalidArgumentError(
                f"allocate on {self.device}: {nbytes!r} is not a size; pass a whole number "
                "of bytes >= 0",
                details={"device": self.device},
            )
        nbytes = int(nbytes)
        with self._lock:  # reserve first: two threads must not both take the last bytes
            free = self.capacity - self.used
            if nbytes > free:
                raise OutOfResourcesError(
                    f"{self.device} is out of memory: {nbytes} bytes asked for, {free} of "
                    f"{self.capacity} free; free buffers on it, use another device, or give "
                    "the simulated devices more memory (CROSSRT_SIM=memory=...)",
                    details={"device": self.device, "requested": nbytes, "free": free},
                )
            self.used += nbytes
        try:
            return SimBuffer(self.device, nbytes)
        except MemoryError:  # the host itself ran out: give the reservation back
            with self._lock:
                self.used -= nbytes
            raise

    def free(self, buffer: Any) -> None:
        """Return ``buffer`` to the device.

        Raises:
            InvalidHandleError: it was freed already.
        """
        self.own(buffer, "free")
        with self._lock:  # checked again under the lock: two threads may free it at once
            if buffer.freed:
                raise self._freed(buffer, "free")
            buffer.freed = True
            self.used -= buffer.nbytes
        buffer._bytes = np.empty(0, dtype=np.uint8)  # the host's memory goes back now

    def region(self, buffer: Any, offset: int, nbytes: int, what: str) -> np.ndarray:
        """The ``uint8`` bytes ``[offset, offset + nbytes)`` of ``buffer``, after checking that
        it is a live buffer of this device and that they lie inside it.

        Args:
            buffer: a :class:`SimBuffer`.
            offset: the first byte.
            nbytes: how many bytes.
            what: the operation, named in errors (``"copy_in"``).
        """
        self.own(buffer, what)
        if buffer.freed:
            raise self._freed(buffer, what)
        if offset < 0 or nbytes < 0 or offset + nbytes > buffer.nbytes:
            raise InvalidArgumentError(
                f"{what} on {self.device}: bytes {offset} to {offset + nbytes} lie outside the "
                f"{buffer.nbytes}-byte buffer; pass an offset and size inside it",
                details={"device": self.device, "offset": offset, "nbytes": nbytes},
            )
        data: np.ndarray = buffer._bytes
        return data[offset : offset + nbytes]

    def own(self, buffer: Any, what: str) -> None:
        """Check that ``buffer`` is a :class:`SimBuffer` of this device.

        Raises:
            InvalidArgumentError: it is not a sim buffer (a NumPy array, another driver's).
            OperationForbiddenError: it lies in another device's memory.
        """
        if not isinstance(buffer, SimBuffer):
            raise InvalidArgumentError(
                f"{what} on {self.device}: {type(buffer).__name__} is not a buffer of the sim "
                "driver; allocate device memory with its allocate()",
                details={"device": self.device},
            )
        if buffer.device != self.device:
            raise OperationForbiddenError(
                f"{what} on {self.device}: the buffer lies in the memory of {buffer.device}; "
                f"a device reaches only its own memory: copy the bytes through the host "
                "(copy_out, then copy_in) or, between linked devices, with copy_device",
                details={"device": self.device, "buffer_device": buffer.device},
            )

    def _freed(self, buffer: SimBuffer, what: str) -> InvalidHandleError:
        return InvalidHandleError(
            f"{what} on {self.device}: the {buffer.nbytes}-byte buffer was freed; allocate another",
            details={"device": self.device},
        )
