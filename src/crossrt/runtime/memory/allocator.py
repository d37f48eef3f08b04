"""Device memory: one allocator per device over its driver's memory hooks.

Every byte the runtime allocates (device tensors, host tensors, shared-memory segments,
outputs it allocates for a run) goes through an :class:`Allocator`, which keeps statistics
(bytes in use, peak, limit, per owner), enforces per-owner budgets (a loaded model's
``model.memory.set_budget``) and the device's limit, and records every event in the allocation log
(:mod:`.memlog`), dumped as CSV when an allocation fails. Allocators live as long as the
process: memory is a property of the device, not of one :class:`Runtime`.

:func:`copied_bytes` counts the bytes the runtime copies on its own while running models
(staging a tensor that is not host-visible, copying a dynamic result into a caller's tensor,
passing results between the nodes of a multi-node model). It does not count copies the caller
asks for (``Tensor.read``, ``write``, ``copy_to``, ``Device.memcpy_*``) nor copies inside an
engine.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...drivers import DeviceInfo, Driver, resolve_device
from ...drivers.registry import loaded_driver
from ...errors import InvalidArgumentError, OutOfResourcesError
from .allocation import HOST, Allocation, HostMemory, MemoryHooks, is_coherent
from .memlog import MemoryEvent, memory_log

_copied = 0
_copied_lock = threading.Lock()


def count_copy(nbytes: int) -> None:
    """Add ``nbytes`` to the process's count of bytes the runtime copied."""
    global _copied
    with _copied_lock:
        _copied += nbytes


def copied_bytes() -> int:
    """Bytes the runtime has copied on its own while running models, since the process began.

    Take the difference around a call to see what that call copied; a run whose inputs and
    outputs are bound in place adds 0.
    """
    return _copied


@dataclass(frozen=True)
class OwnerStats:
    """Memory charged to one owner (a loaded model) on one device.

    Attributes:
        owner: the owner key.
        bytes_in_use: bytes allocated and not freed.
        peak_bytes: the most ``bytes_in_use`` has been.
        budget_bytes: the owner's budget, or ``None`` for none.
        allocations: live allocations.
    """

    owner: str
    bytes_in_use: int
    peak_bytes: int
    budget_bytes: int | None
    allocations: int


@dataclass(frozen=True)
class MemoryStats:
    """One device's memory (``nrt_get_vnc_memory_stats``, ``bm_get_stat``).

    Attributes:
        device: the device (``"cpu:0"``; ``"host"`` for host tensors and shared memory).
        coherent: whether its memory is host memory (NumPy views, no flush/invalidate).
        bytes_in_use: bytes allocated and not freed.
        peak_bytes: the most ``bytes_in_use`` has been.
        limit_bytes: how much may be allocated (the device's usable memory; 0 where the driver
            does not know it, and then only the driver's own allocation limits it).
        allocations: live allocations.
        failures: allocations refused so far.
        owners: per owner, :class:`OwnerStats` (``""`` is memory no model owns).
    """

    device: str
    coherent: bool
    bytes_in_use: int
    peak_bytes: int
    limit_bytes: int
    allocations: int
    failures: int
    owners: dict[str, OwnerStats]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return dataclasses.asdict(self)


class _Account:
    __slots__ = ("allocations", "budget", "forgotten", "in_use", "label", "peak")

    def __init__(self) -> None:
        self.in_use = self.peak = self.allocations = 0
        self.budget: int | None = None
        self.label = ""
        self.forgotten = False  # its owner is gone: drop it once its last allocation is freed


class Allocator:
    """Allocates one device's memory through its driver's hooks, and keeps the books.

    Args:
        hooks: the driver (its memory hooks).
        device: the device.
        limit: bytes that may be in use at once; default the device's usable memory (0, where
            the driver does not know it: no limit here, the driver's allocation refuses).
    """

    def __init__(self, hooks: MemoryHooks, device: DeviceInfo, limit: int | None = None):
        self.hooks = hooks
        self.device = device
        self.coherent = is_coherent(hooks, device)
        # A coherent driver keeps Driver's own allocate and free (zeroed NumPy bytes, a
        # dropped reference): every tensor allocates, so call that code directly rather
        # than through the driver boundary's wrapper.
        self._allocate_hook = _host_bytes if self.coherent else hooks.allocate
        self.limit = device.memory_bytes if limit is None else limit
        self._lock = threading.Lock()
        self._in_use = self._peak = self._count = self._failures = 0
        self._accounts: dict[str, _Account] = {}

    def allocate(self, nbytes: int, *, owner: str = "", name: str = "") -> Allocation:
        """Allocate ``nbytes``, charged to ``owner``.

        Raises:
            InvalidArgumentError: ``nbytes`` is negative.
            OutOfResourcesError: (RESOURCE) the owner's budget or the device's memory would be
                exceeded, or the driver is out of memory; ``details["memlog"]`` is the CSV
                dump of the allocation log.
        """
        nbytes = _check_size(nbytes)
        with self._lock:
            self._admit(nbytes, owner, name)
            try:
                handle = self._allocate_hook(self.device, nbytes)
            except MemoryError as exc:
                why = f"the driver is out of memory ({exc})"
                raise self._refuse(nbytes, owner, name, why) from None
            return self._book("alloc", handle, nbytes, owner, name)

    def adopt(
        self,
        handle: Any,
        nbytes: int,
        *,
        owner: str = "",
        name: str = "",
        from_driver: bool = False,
    ) -> Allocation:
        """Account for memory made elsewhere (an engine's output, a shared-memory segment).

        The budget and limit apply as to :meth:`allocate`. Freeing it only drops the handle,
        unless ``from_driver``: a buffer the device's driver allocated (a program's device
        output), which freeing returns to the driver.
        """
        nbytes = _check_size(nbytes)
        with self._lock:
            self._admit(nbytes, owner, name)
            return self._book("adopt", handle, nbytes, owner, name, adopted=not from_driver)

    def free(self, allocation: Allocation) -> None:
        """Release an allocation (idempotent)."""
        with self._lock:
            if allocation.freed:
                return
            allocation.freed = True
            account = self._accounts[allocation.owner]
            account.in_use -= allocation.nbytes
            account.allocations -= 1
            if account.forgotten and not account.allocations:
                del self._accounts[allocation.owner]
            self._in_use -= allocation.nbytes
            self._count -= 1
            in_use, owner_in_use = self._in_use, account.in_use
        handle, allocation.handle, allocation.host = allocation.handle, None, None
        if not allocation.adopted and not self.coherent:
            self.hooks.free(self.device, handle)
        memory_log().record(
            "free",
            self.device.id,
            allocation.owner,
            allocation.name,
            allocation.nbytes,
            in_use,
            owner_in_use,
        )

    def register(self, owner: str, label: str) -> None:
        """Open ``owner``'s account, named ``label`` in messages (``"model 'resnet'"``)."""
        with self._lock:
            account = self._accounts.setdefault(owner, _Account())
            account.label, account.forgotten = label, False

    def forget(self, owner: str) -> None:
        """Close ``owner``'s account, now or when its last allocation is freed."""
        with self._lock:
            account = self._accounts.get(owner)
            if account is not None and owner:
                if account.allocations:
                    account.forgotten = True
                else:
                    del self._accounts[owner]

    def set_budget(self, owner: str, nbytes: int | None, *, label: str = "") -> None:
        """Limit what ``owner`` may hold on this device (``None``: no limit).

        ``label`` names the owner in messages (``"model 'resnet'"``).
        """
        if nbytes is not None:
            nbytes = _check_size(nbytes)
        with self._lock:
            account = self._accounts.setdefault(owner, _Account())
            account.budget = nbytes
            account.label = label or account.label

    def budget(self, owner: str) -> int | None:
        """The owner's budget, or ``None``."""
        with self._lock:
            account = self._accounts.get(owner)
            return None if account is None else account.budget

    def owner_stats(self, owner: str) -> OwnerStats:
        """What ``owner`` holds on this device."""
        with self._lock:
            a = self._accounts.get(owner) or _Account()
            return OwnerStats(owner, a.in_use, a.peak, a.budget, a.allocations)

    def stats(self) -> MemoryStats:
        """This device's :class:`MemoryStats`."""
        with self._lock:
            owners = {
                k: OwnerStats(k, a.in_use, a.peak, a.budget, a.allocations)
                for k, a in self._accounts.items()
            }
            return MemoryStats(
                self.device.id,
                self.coherent,
                self._in_use,
                self._peak,
                self.limit,
                self._count,
                self._failures,
                owners,
            )

    # -- under the lock ------------------------------------------------------------------

    def _admit(self, nbytes: int, owner: str, name: str) -> None:
        account = self._accounts.get(owner)
        if account is None:
            account = self._accounts[owner] = _Account()
        if account.budget is not None and account.in_use + nbytes > account.budget:
            left = account.budget - account.in_use
            raise self._refuse(
                nbytes,
                owner,
                name,
                f"its memory budget is {account.budget} bytes and {left} are left; raise the "
                "budget (LoadedModel.memory.set_budget) or free tensors it no longer needs",
                budget=account.budget,
                available=left,
            )
        # A limit of 0: the driver does not say how much the device has (a GPU whose total
        # nvidia-smi could not tell); its own allocation then refuses when it runs out.
        if self.limit and self._in_use + nbytes > self.limit:
            left = self.limit - self._in_use
            raise self._refuse(
                nbytes,
                owner,
                name,
                f"{self.device.id} has {left} of its {self.limit} bytes left; free tensors or "
                "device memory no longer needed",
                available=left,
            )

    def _book(
        self, event: str, handle: Any, nbytes: int, owner: str, name: str, adopted: bool = False
    ) -> Allocation:
        allocation = Allocation(self, handle, nbytes, owner, name, adopted)
        account = self._accounts[owner]
        account.in_use += nbytes
        account.peak = max(account.peak, account.in_use)
        account.allocations += 1
        self._in_use += nbytes
        self._peak = max(self._peak, self._in_use)
        self._count += 1
        log = memory_log()
        log.record(event, self.device.id, owner, name, nbytes, self._in_use, account.in_use)
        return allocation

    def _refuse(
        self, nbytes: int, owner: str, name: str, why: str, **details: Any
    ) -> OutOfResourcesError:
        self._failures += 1
        account = self._accounts.get(owner)
        who = (account.label if account and account.label else None) or (
            f"owner {owner!r}" if owner else "the process"
        )
        log = memory_log()
        row: MemoryEvent = log.record(
            "fail",
            self.device.id,
            owner,
            name,
            nbytes,
            self._in_use,
            account.in_use if account else 0,
            why.partition(";")[0],
        )
        try:
            path: str | None = log.dump(row)
        except OSError:
            path = None
        what = f"{name!r} ({nbytes} bytes)" if name else f"{nbytes} bytes"
        where = f"; allocation log: {path}" if path else ""
        return OutOfResourcesError(
            f"{who} cannot allocate {what} on {self.device.id}: {why}{where}",
            details={
                "device": self.device.id,
                "owner": owner,
                "requested": nbytes,
                "memlog": path,
                **details,
            },
        )


def _host_bytes(device: DeviceInfo, nbytes: int) -> np.ndarray:
    """What ``Driver.allocate`` gives (``nbytes`` already checked): zeroed host bytes."""
    return np.zeros(nbytes, dtype=np.uint8)  # calloc: pages are zeroed when first touched


def _check_size(nbytes: Any) -> int:
    if type(nbytes) is int and nbytes >= 0:
        return nbytes  # the common case, before the slower isinstance checks
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
        raise InvalidArgumentError(
            f"a memory size must be a whole number of bytes >= 0, not {nbytes!r}",
            details={"size": repr(nbytes)},
        )
    return int(nbytes)


# -- the process's allocators ----------------------------------------------------------------

_allocators: dict[str, Allocator] = {}
_registry_lock = threading.Lock()


def host_allocator() -> Allocator:
    """The allocator of host memory."""
    with _registry_lock:
        found = _allocators.get(HOST)
        if found is None:
            hooks = HostMemory()
            found = _allocators[HOST] = Allocator(hooks, hooks.device())
        return found


def device_allocator(driver: Driver, device: DeviceInfo) -> Allocator:
    """The allocator of ``device``, created over ``driver``'s hooks on first use.

    Two drivers serving one device (``cpu:0``) share its allocator. A driver registered
    again under the same name (a new instance) gets a new allocator.
    """
    with _registry_lock:
        found = _allocators.get(device.id)
        stale = found is not None and (
            found.hooks is not driver and getattr(found.hooks, "name", None) == driver.name
        )
        if stale and found is not None and found.coherent and is_coherent(driver, device):
            # Host memory either way: the books (each model's budget and what it holds) stay
            # with the device. A new allocator here left a model charging its tensors to one
            # and its budget set on the other, which it kept (a budget that never applied).
            found.hooks = driver
        elif found is None or stale:
            found = _allocators[device.id] = Allocator(driver, device)
        return found


# Device string -> its allocator, as last resolved: every Tensor(...) asks, and resolving
# lists each driver's devices (tens of microseconds). Valid while the driver that served it
# is still the registered one (a driver registered again is a new instance).
_resolved: dict[str, Allocator] = {}


def allocator_for(device: str) -> Allocator:
    """The allocator of a device string (``"cpu"``, ``"cpu:0"``, ``"host"``).

    Raises:
        DeviceUnavailableError: no available driver serves the device.
    """
    if device == HOST:
        return host_allocator()
    found = _resolved.get(device)
    if found is not None and _registered(found.hooks):
        return found
    driver, info = resolve_device(device)
    found = _resolved[device] = device_allocator(driver, info)
    return found


def _registered(hooks: Any) -> bool:
    return loaded_driver(getattr(hooks, "name", "")) is hooks


def all_stats() -> dict[str, MemoryStats]:
    """:class:`MemoryStats` of every device memory was allocated on, by device."""
    with _registry_lock:
        allocators = list(_allocators.values())
    return {a.device.id: a.stats() for a in allocators}


__all__ = [
    "Allocation",
    "Allocator",
    "MemoryStats",
    "OwnerStats",
    "all_stats",
    "allocator_for",
    "copied_bytes",
    "count_copy",
    "device_allocator",
    "host_allocator",
]
