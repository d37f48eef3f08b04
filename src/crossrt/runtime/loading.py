"""Loading, as the steps ``Runtime.load`` takes: the executable (:func:`executable_for`), its
devices (:func:`load_devices`), the cores (``cores.groups.choose_cores``), the limits of each run
(:func:`run_limits`), then a :class:`LoadPlan` that loads every node once per instance through
its driver, with the one :class:`CoreSet` each load gets (``docs/cores.md``), and makes the
:class:`LoadedModel` over them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..compiler import Executable, compile_for_device
from ..config import settings
from ..drivers import (
    DeviceInfo,
    DeviceKind,
    Driver,
    Program,
    get_driver,
    parse_device,
    resolve_device,
)
from ..drivers.base import Residence
from ..errors import DeviceUnavailableError, InvalidArgumentError
from .batching import Batching
from .cores.groups import MODES, CoreGroup, core_set, node_cores, pinned_cpus
from .loaded import LoadedModel
from .memory.transfer import ResidentProgram, Transfers
from .numerics import Numerics
from .scheduler import Instance
from .staged import StagedModel

# -- the executable and its devices -------------------------------------------------------------


def executable_for(
    source: Any, device: str | Sequence[str] | None, driver: str | None, options: dict[str, Any]
) -> Executable:
    """The executable a load runs: ``source`` itself, or ``source`` compiled for the (first)
    device asked for."""
    if isinstance(source, Executable):
        if options or driver:
            raise InvalidArgumentError(
                "compile options and driver apply to models, not to an Executable; "
                "compile again with them instead"
            )
        return source
    first = device if isinstance(device, str) or device is None else next(iter(device), None)
    if (first or settings().default_device) == "auto":
        # Choosing measures models on their own runtime: compile first, then load.
        raise InvalidArgumentError(
            "load(device='auto') does not choose a device; compile with "
            "exe = crossrt.compile(model, device='auto'), then load(exe)",
            details={"device": "auto"},
        )
    return compile_for_device(source, first and str(first), driver=driver, **options)


def load_devices(exe: Executable, device: str | Sequence[str] | None) -> tuple[DeviceInfo, ...]:
    """The devices ``exe`` loads on, the model's own first: the one named (default the one it
    was compiled for), or every device of a list, linked to each other (:func:`linked_devices`).

    Raises:
        InvalidArgumentError: a device of another kind than ``exe`` was compiled for.
    """
    if device is None or isinstance(device, str):
        devices = [model_device(exe, device or exe.device)]
    else:
        devices = linked_devices([str(d) for d in device], exe)
    wrong = [d for d in devices if parse_device(d.id)[0] != exe.device_kind]
    if wrong:  # sim:3 is a sim, cpu:0 a cpu
        info = wrong[-1]
        raise InvalidArgumentError(
            f"{exe.name!r} was compiled for {exe.device_kind}, not {info.id}; compile it "
            f"for {info.id}",
            details={"compiled_for": exe.device, "device": info.id},
        )
    return tuple(devices)


def model_device(exe: Executable, device: str) -> DeviceInfo:
    """The device ``exe`` loads on: served by the driver of a node placed there (the first of
    the executable's drivers that serves it; a node that fell back to the CPU does not), or by
    any driver when every node fell back."""
    for name in dict.fromkeys(n.driver for n in exe.nodes):
        try:
            _, info = resolve_device(device, name)
        except DeviceUnavailableError:
            continue
        return info
    return resolve_device(device)[1]


def linked_devices(devices: Sequence[str], exe: Executable) -> list[DeviceInfo]:
    """The devices of a load across devices, checked: distinct devices of one kind, each
    linked to the others directly or through them (a group of devices follows the links)."""
    infos = [model_device(exe, d) for d in devices]
    ids = [i.id for i in infos]
    if not infos or len(set(ids)) != len(ids):
        raise InvalidArgumentError(
            f"device={list(devices)!r}: give distinct devices, e.g. ['sim:0', 'sim:1']",
            details={"devices": ids},
        )
    reached, todo = {ids[0]}, [infos[0]]
    by_id = {i.id: i for i in infos}
    while todo:
        for linked in todo.pop().links:
            if linked in by_id and linked not in reached:
                reached.add(linked)
                todo.append(by_id[linked])
    apart = [i for i in ids if i not in reached]
    if apart:
        raise InvalidArgumentError(
            f"devices {', '.join(apart)} are not linked to {ids[0]}, directly or through the "
            f"other devices of the load: a load across devices follows the devices' links "
            "(see `crossrt ls --topology`); choose linked devices",
            details={"devices": ids, "not_linked": apart},
        )
    return infos


def run_limits(
    exec_timeout: float | None, check_numerics: Numerics | None
) -> tuple[float | None, Numerics]:
    """``(exec_timeout, check_numerics)`` of every run, the environment's where not given.

    Raises:
        InvalidArgumentError: a timeout that is not a number of seconds more than 0.
    """
    config = settings()
    timeout = config.exec_timeout if exec_timeout is None else exec_timeout
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise InvalidArgumentError(f"exec_timeout={timeout!r}: give seconds, more than 0")
    numerics = config.check_numerics if check_numerics is None else check_numerics
    return timeout, "nan" if numerics == "nan" else bool(numerics)


# -- the plan: instances, then the model -------------------------------------------------------


@dataclass(frozen=True)
class LoadPlan:
    """Where a load puts its executable, decided before any engine loads it.

    Attributes:
        devices: every device of the load, the model's own first.
        cores: the core indices chosen (the same on each device).
        core_sets: the instances' cores, disjoint parts of ``cores``.
        mode: how a multi-node executable's nodes share an instance's cores (``MODES``).
        host_cpus: the runtime's host CPUs (core ``i`` is host CPU ``host_cpus[i]``).
        exclusive: whether the runtime owns them (its threads are then pinned).
    """

    devices: tuple[DeviceInfo, ...]
    cores: tuple[int, ...]
    core_sets: Sequence[tuple[int, ...]]
    mode: str
    host_cpus: tuple[int, ...]
    exclusive: bool

    def instances(self, exe: Executable) -> list[Instance]:
        """Every instance of ``exe`` (the executable, or one of its stages), on each device of
        the load in turn; what was loaded is closed again when a later load fails."""
        runs: list[Instance] = []
        try:
            for device in self.devices:
                runs += load_instances(
                    exe,
                    device,
                    self.core_sets,
                    self.mode,
                    self.host_cpus,
                    self.exclusive,
                    first=len(runs),
                )
        except BaseException:
            _close(runs)
            raise
        return runs

    def load(
        self,
        exe: Executable,
        forget: Callable[[LoadedModel], None],
        group: CoreGroup,
        batched: Batching | None,
        **options: Any,
    ) -> LoadedModel:
        """The loaded model over every instance of ``exe``: a :class:`StagedModel` for an
        executable with shape stages (batching runs one shape: no stages then), else a
        :class:`LoadedModel`. ``options`` are the model's (``queue_depth``, ``exec_timeout``,
        ``check_numerics``, ``name``)."""
        runs = self.instances(exe)
        where = (forget, exe, runs, self.devices[0], self.cores, group)
        try:
            if exe.stages and not batched:
                return StagedModel(*where, load=self.instances, **options)
            return LoadedModel(*where, batching=batched, **options)
        except BaseException:
            _close(runs)
            raise


def _close(runs: Sequence[Instance]) -> None:
    for inst in runs:
        for program in inst.programs:
            program.close()


def load_instances(
    exe: Executable,
    device: DeviceInfo,
    core_sets: Sequence[tuple[int, ...]],
    mode: str,
    host_cpus: tuple[int, ...],
    exclusive: bool = False,
    first: int = 0,
) -> list[Instance]:
    """Load every node of ``exe`` once per core set, on ``device``; the instances are numbered
    from ``first`` (a load across devices loads each device's in turn).

    In ``shared`` mode every node of an instance uses all the instance's cores (one at a time
    per request, pipelined across requests); in ``normal`` mode each node on the model's
    device gets cores of its own, the instance's cores split between them; in ``serial`` mode
    the nodes share the cores as in ``shared`` and one request at a time passes through them
    (no pipelining: neuron-rtd's shared NC mode). ``host_cpus`` are
    the runtime's cores (core ``i`` is host CPU ``host_cpus[i]``): a node or instance on part
    of them, or on cores the runtime owns (``exclusive``), has its threads pinned to its own.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode={mode!r}: use 'shared', 'normal' or 'serial'")
    local = [n.device_kind == device.kind.value for n in exe.nodes]
    steps = [(tuple(n.inputs), tuple(n.outputs)) for n in exe.nodes]
    outputs = tuple(s.name for s in exe.outputs)
    cpu = device.kind is DeviceKind.CPU
    result: list[Instance] = []
    every: list[Program] = []  # closed again when a later load fails
    files = contextlib.ExitStack()
    try:
        # Each node's artifact prepared by its driver for the loads of every instance.
        located = [
            files.enter_context(
                get_driver(node.driver).sharing(node.artifact, node.artifact_file, len(core_sets))
            )
            for node in exe.nodes
        ]
        for k, cores in enumerate(core_sets):
            nodes = zip(exe.nodes, located, node_cores(cores, local, mode), strict=True)
            programs = _load_nodes(exe, device, nodes, host_cpus, exclusive, every)
            pin = pinned_cpus(cores, host_cpus, exclusive) if cpu else None
            result.append(
                Instance(
                    first + k, cores, programs, steps, outputs, pin=pin, device=device.id,
                    pipelined=mode != "serial",
                )
            )  # fmt: skip
    except BaseException:
        for program in every:
            program.close()
        raise
    finally:
        files.close()  # the engines map what they read: the files' names can go
    return result


def _load_nodes(
    exe: Executable,
    device: DeviceInfo,
    nodes: Any,
    host_cpus: tuple[int, ...],
    exclusive: bool,
    every: list[Program],
) -> list[Program]:
    """One instance's programs, a node each (``nodes``: node, its prepared file, its cores);
    each is also added to ``every`` as soon as it is loaded."""
    programs: list[Program] = []
    placed: list[tuple[Driver, DeviceInfo]] = []
    for node, file, own_cores in nodes:
        drv = get_driver(node.driver)
        if own_cores is not None:
            _, node_device = resolve_device(device.id, drv.name)
        else:  # a fallback node on another kind of device: all of its cores
            _, node_device = resolve_device(node.device_kind, drv.name)
            cpu = node_device.kind is DeviceKind.CPU
            own_cores = tuple(range(len(host_cpus) if cpu else node_device.cores))
        placement = core_set(own_cores, node_device, host_cpus, exclusive)
        programs.append(drv.load(node.artifact, node_device, placement, exe.options, file=file))
        every.append(programs[-1])
        placed.append((drv, node_device))
    if any(Residence.DEVICE in p.residence().values() for p in programs):
        # Some node wants device memory: every node gets the moves around it, since values
        # pass between them (the model sets where they are counted).
        programs = [
            ResidentProgram(p, d, dev, Transfers())
            for p, (d, dev) in zip(programs, placed, strict=True)
        ]
    return programs
