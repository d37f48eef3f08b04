"""Core groups (Neuron's NeuronCore groups, NNRt devices): sets of core indices that models
are loaded onto, at most one of them running at a time; and how a load splits a group's cores
into instances and nodes; which cores a load takes (:func:`choose_cores`).

- An **explicit** group (``Runtime.create_core_group``) owns its cores: no other group, explicit
  or implicit, may use them. Models load onto it stopped; ``model.start()`` makes one running.
- An **implicit** group is made by a load without ``group=`` and removed at its unload; its
  model starts at once. Implicit groups may share cores with each other (host CPUs are
  time-shared, as in the shared mode of docs/cores.md), never with an explicit group.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ...drivers import DeviceInfo, DeviceKind
from ...drivers.base import CoreSet
from ...errors import (
    InvalidArgumentError,
    InvalidHandleError,
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
)
from ...host import format_cpus


class GroupMember(Protocol):
    """What a core group knows of a model loaded onto it (a :class:`GroupMember`)."""

    @property
    def name(self) -> str: ...


class GroupOwner(Protocol):
    """What a core group needs of the runtime that made it (a :class:`Runtime`)."""

    @property
    def cores(self) -> tuple[int, ...]: ...

    def _forget_group(self, group: CoreGroup) -> None: ...


MODES = ("shared", "normal", "serial")
"""How a multi-node executable's nodes use an instance's cores: ``shared``, every node on all
of them, requests pipelined through the nodes; ``normal``, each node on cores of its own,
pipelined; ``serial``, every node on all of them and one request at a time through the
nodes, no pipelining (neuron-rtd's shared NC mode, seed 003)."""


class CoreGroup:
    """A set of a runtime's core indices that models (:class:`LoadedModel`) load onto.

    Created by :meth:`Runtime.create_core_group` (explicit) or by a load without a group
    (implicit). At most one of its models runs at a time.

    Attributes:
        indices: the core indices (within :attr:`Runtime.cores`).
        implicit: made by a load and removed at its unload.
    """

    def __init__(self, runtime: GroupOwner, indices: tuple[int, ...], *, implicit: bool) -> None:
        self.indices = indices
        self.implicit = implicit
        self._runtime = runtime
        self._models: list[GroupMember] = []
        self._running: GroupMember | None = None
        self._lock = threading.Lock()
        self._destroyed = False
        self._dissolve = implicit  # destroyed when its last model is unloaded
        self.on_remove: list[Callable[[GroupMember], None]] = []
        """Called with each model unloaded from the group, once it has left (a daemon
        writes the model's profile then)."""

    @property
    def host_cpus(self) -> tuple[int, ...]:
        """The host CPUs of :attr:`indices`."""
        return tuple(self._runtime.cores[i] for i in self.indices)

    @property
    def models(self) -> list[GroupMember]:
        """The models loaded onto the group, running or stopped."""
        with self._lock:
            return list(self._models)

    @property
    def running(self) -> GroupMember | None:
        """The model running on the group, if any."""
        return self._running

    def destroy(self) -> None:
        """Give the cores back. Only an empty group can be destroyed.

        Raises:
            OperationForbiddenError: models are still loaded on it (named in the message).
        """
        with self._lock:
            if self._models:
                names = ", ".join(repr(m.name) for m in self._models)
                raise OperationForbiddenError(
                    f"core group {list(self.indices)} still holds models {names}; unload them "
                    "before destroying it",
                    details={"models": [m.name for m in self._models]},
                )
            self._destroyed = True
        self._runtime._forget_group(self)

    def check_usable(self, runtime: GroupOwner) -> None:
        """Raise unless a model may be loaded onto the group by ``runtime``."""
        if self._destroyed:
            raise InvalidHandleError(
                f"core group {list(self.indices)} was destroyed; create another"
            )
        if runtime is not self._runtime:
            raise InvalidArgumentError(
                "this core group belongs to another Runtime; create one with this runtime's "
                "create_core_group"
            )

    def add_model(self, model: GroupMember) -> None:
        """Count ``model`` as loaded onto the group (``Runtime.load`` calls it)."""
        with self._lock:
            self._models.append(model)

    def remove_model(self, model: GroupMember) -> None:
        """``model`` was unloaded: it leaves the group (``LoadedModel`` calls it), and an
        implicit group left empty is destroyed."""
        with self._lock:
            if model in self._models:
                self._models.remove(model)
            if self._running is model:
                self._running = None
            empty = not self._models
        for hook in list(self.on_remove):
            hook(model)
        if empty and self._dissolve:
            self._destroyed = True
            self._runtime._forget_group(self)

    def dissolve_when_empty(self) -> None:
        """Destroy the group when its last model is unloaded, as an implicit group is, while
        no other group may use its cores, as an explicit one (neuron-rtd's implicit group)."""
        self._dissolve = True

    def start_model(self, model: GroupMember) -> None:
        """Make ``model`` the one running on the group (``LoadedModel.start`` calls it).

        Raises:
            OperationForbiddenError: another model of the group is running.
        """
        with self._lock:
            if self._running is not None and self._running is not model:
                raise OperationForbiddenError(
                    f"model {self._running.name!r} is running on core group "
                    f"{list(self.indices)}; stop it before starting {model.name!r}",
                    details={"running": self._running.name, "model": model.name},
                )
            self._running = model

    def stop_model(self, model: GroupMember) -> None:
        """``model`` no longer runs on the group (``LoadedModel.stop`` calls it)."""
        with self._lock:
            if self._running is model:
                self._running = None

    def __repr__(self) -> str:
        kind = "implicit" if self.implicit else "explicit"
        running = self._running.name if self._running else None
        return (
            f"CoreGroup({list(self.indices)}, {kind}, models={len(self._models)}, "
            f"running={running!r})"
        )


def pick_free(
    total: int, taken: set[int], count: int, what: str = "a core group of"
) -> tuple[int, ...]:
    """The ``count`` lowest core indices below ``total`` not in ``taken``."""
    if count < 1:
        raise InvalidArgumentError(f"cores={count}: ask for at least one core")
    free = [i for i in range(total) if i not in taken]
    if count > len(free):
        raise OutOfResourcesError(
            f"asked for {what} {count} cores but only {len(free)} of the runtime's "
            f"{total} are in no other core group (explicit, or the implicit group of a model "
            "loaded without group=); unload or destroy one, or ask for fewer",
            code=StatusCode.LOAD_NOT_ENOUGH_NC,
            details={"requested": count, "free": len(free)},
        )
    return tuple(free[:count])


def split_instances(
    pool: tuple[int, ...], instances: int, per_instance: int | None
) -> list[tuple[int, ...]]:
    """``instances`` disjoint runs of ``per_instance`` cores out of ``pool``, in order."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise InvalidArgumentError(f"instances={instances!r}: give a whole number, at least 1")
    each = len(pool) // instances if per_instance is None else per_instance
    if (
        isinstance(each, bool)
        or not isinstance(each, int)
        or (per_instance is not None and each < 1)
    ):
        raise InvalidArgumentError(
            f"cores_per_instance={per_instance!r}: give a whole number, at least 1"
        )
    if each < 1 or instances * each > len(pool):
        raise OutOfResourcesError(
            f"{instances} instances x {max(each, 1)} cores need {instances * max(each, 1)} cores "
            f"but the load has {len(pool)} ({list(pool)}); load fewer instances or fewer cores "
            "per instance",
            code=StatusCode.LOAD_NOT_ENOUGH_NC,
            details={"instances": instances, "cores_per_instance": each, "available": len(pool)},
        )
    return [pool[i * each : (i + 1) * each] for i in range(instances)]


def core_set(
    cores: Sequence[int], device: DeviceInfo, host_cpus: tuple[int, ...], exclusive: bool
) -> CoreSet:
    """The one value a driver's load gets for ``cores`` (indices within ``device``)."""
    if device.kind is not DeviceKind.CPU:
        return CoreSet(tuple(cores))
    cpus = tuple(host_cpus[i] for i in cores)  # core i of a CPU is the runtime's host_cpus[i]
    return CoreSet(tuple(cores), cpus, pinned=pinned_cpus(cores, host_cpus, exclusive) is not None)


def pinned_cpus(
    cores: Sequence[int], host_cpus: tuple[int, ...], exclusive: bool
) -> tuple[int, ...] | None:
    """The host CPUs of ``cores`` (core ``i`` is ``host_cpus[i]``) when threads on them are
    pinned: when they are part of the runtime's cores (to keep instances and nodes off each
    other's), or when the runtime owns its cores (to keep it off CPUs others own). A shared
    runtime's load on all its cores is not: the OS places threads better among programs that
    share the CPUs."""
    if not exclusive and len(set(cores)) >= len(host_cpus):
        return None
    return tuple(host_cpus[i] for i in cores)


def node_cores(
    cores: tuple[int, ...], local: list[bool], mode: str
) -> list[tuple[int, ...] | None]:
    if mode != "normal":
        return [cores if is_local else None for is_local in local]
    count = sum(local)
    if len(cores) < count:
        raise OutOfResourcesError(
            f"normal mode gives each of the {count} nodes its own cores, but an instance has "
            f"{len(cores)}; give it at least {count} cores or load in mode='shared'",
            code=StatusCode.LOAD_NOT_ENOUGH_NC,
            details={"nodes": count, "cores_per_instance": len(cores)},
        )
    each, i = len(cores) // count, 0
    out: list[tuple[int, ...] | None] = []
    for is_local in local:
        if not is_local:
            out.append(None)
            continue
        last = i == count - 1
        out.append(cores[i * each :] if last else cores[i * each : (i + 1) * each])
        i += 1
    return out


def choose_cores(
    cores: int | Sequence[int] | None,
    group: CoreGroup | None,
    device: DeviceInfo,
    host_cpus: tuple[int, ...],
    explicit: Sequence[CoreGroup],
) -> tuple[int, ...]:
    """The core indices a load uses: its group's; else, on the CPU, those asked for (a count
    taken from the cores no ``explicit`` group holds, named indices outside them); else, on
    another device, those asked for of the device's own.

    Raises:
        InvalidArgumentError: ``cores`` with ``group``, or a bad ``cores``.
        OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) more cores than are free.
        OperationForbiddenError: a core named is in an explicit group.
    """
    if group is not None:
        if cores is not None:
            raise InvalidArgumentError(
                "give cores= or group=, not both: a model loaded onto a group uses its cores"
            )
        return group.indices
    if device.kind is not DeviceKind.CPU:
        return core_indices(cores, device)
    taken = {i for g in explicit for i in g.indices}
    if taken and not isinstance(cores, Sequence):
        # Cores not named: take them from those no explicit group holds.
        free = len(host_cpus) - len(taken)
        if cores is None and not free:
            raise OutOfResourcesError(
                "every core of this runtime is in an explicit core group; load onto one "
                "of them with group=, or destroy one",
                code=StatusCode.LOAD_NOT_ENOUGH_NC,
            )
        core_indices(cores, device, host_cpus)  # the argument's own checks first
        count = free if cores is None else int(cores)
        return pick_free(len(host_cpus), taken, count, "a load on")
    chosen = core_indices(cores, device, host_cpus)
    for g in explicit:
        if set(g.indices) & set(chosen):
            raise OperationForbiddenError(
                f"cores {sorted(set(g.indices) & set(chosen))} are in explicit {g!r}; "
                "load onto it with group=, or choose other cores",
                details={"cores": list(chosen)},
            )
    return chosen


def core_indices(
    cores: int | Sequence[int] | None,
    device: DeviceInfo,
    reserved: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """Core indices asked for, checked: within ``reserved`` (the runtime's host CPUs) when
    given, else within the device's cores."""
    total = device.cores if reserved is None else len(reserved)
    has = f"{device.id} has {total} cores"
    if reserved is not None:
        has = f"this runtime has {total} cores of {device.id} (host CPUs {format_cpus(reserved)})"
    if cores is None:
        return tuple(range(total))
    if isinstance(cores, bool) or not isinstance(cores, numbers.Integral | Sequence):
        raise InvalidArgumentError(
            f"cores={cores!r}: give a core count (int) or a list of core indices"
        )
    if isinstance(cores, numbers.Integral):
        cores = int(cores)
        if cores < 1:
            raise InvalidArgumentError(f"cores={cores}: ask for at least one core")
        if cores > total:
            raise OutOfResourcesError(
                f"asked for {cores} cores but {has}; ask for at most {total}",
                code=StatusCode.LOAD_NOT_ENOUGH_NC,
                details={"requested": cores, "available": total},
            )
        return tuple(range(cores))
    chosen = tuple(int(c) if isinstance(c, numbers.Integral) else c for c in cores)
    bad = [c for c in chosen if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < total]
    if not chosen or bad or len(set(chosen)) != len(chosen):
        raise InvalidArgumentError(
            f"cores={list(chosen)}: give distinct core indices from 0 to {total - 1} ({has})",
            details={"cores": list(chosen), "available": total},
        )
    return chosen
