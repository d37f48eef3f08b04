"""Loading an executable's nodes onto cores: every node once per instance, through its
driver, with the one :class:`CoreSet` each load gets (see ``docs/cores.md``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ..compiler import Executable
from ..drivers import DeviceInfo, DeviceKind, Driver, Program, get_driver, resolve_device
from ..drivers.base import Residence
from ..errors import InvalidArgumentError
from .cores.groups import MODES, core_set, node_cores, pinned_cpus
from .memory.transfer import ResidentProgram, Transfers
from .scheduler import Instance


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
            programs: list[Program] = []
            placed: list[tuple[Driver, DeviceInfo]] = []
            plan = zip(exe.nodes, located, node_cores(cores, local, mode), strict=True)
            for node, file, own_cores in plan:
                drv = get_driver(node.driver)
                if own_cores is not None:
                    _, node_device = resolve_device(device.id, drv.name)
                else:  # a fallback node on another kind of device: all of its cores
                    _, node_device = resolve_device(node.device_kind, drv.name)
                    cpu = node_device.kind is DeviceKind.CPU
                    own_cores = tuple(range(len(host_cpus) if cpu else node_device.cores))
                placement = core_set(own_cores, node_device, host_cpus, exclusive)
                programs.append(
                    drv.load(node.artifact, node_device, placement, exe.options, file=file)
                )
                every.append(programs[-1])
                placed.append((drv, node_device))
            if any(Residence.DEVICE in p.residence().values() for p in programs):
                # Some node wants device memory: every node gets the moves around it, since
                # values pass between them (the model sets where they are counted).
                programs = [
                    ResidentProgram(p, d, dev, Transfers())
                    for p, (d, dev) in zip(programs, placed, strict=True)
                ]
            pin = (
                pinned_cpus(cores, host_cpus, exclusive) if device.kind is DeviceKind.CPU else None
            )
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
