"""``Runtime``: the process's context for loading and running models (nrt_init / nrt_close)."""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ..compiler import Executable, compile
from ..config import settings, simulated_devices_asked
from ..drivers import (
    DeviceInfo,
    DeviceKind,
    available_drivers,
    device_order,
    parse_device,
    resolve_device,
)
from ..errors import (
    ClosedError,
    DeviceUnavailableError,
    InvalidArgumentError,
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
)
from ..host import format_cpus
from . import observer
from .batching import batching
from .cores.groups import CoreGroup, pick_free, split_instances
from .cores.reservation import reserve_cores
from .loaded import LoadedModel
from .loading import load_instances
from .memory import shm
from .memory.allocator import MemoryStats, all_stats
from .profiler import Profile
from .scheduler import Instance
from .staged import StagedModel


class Runtime:
    """Loads models onto devices and keeps track of them.

    Use it as a context manager, or call :meth:`close` (nrt_close) when done: closing
    unloads every model, releases its cores, and later calls raise ``CLOSED``.

    Cores (docs/cores.md): with no core arguments and neither ``CROSSRT_VISIBLE_CORES`` nor
    ``CROSSRT_NUM_CORES`` set, the runtime shares every host CPU the process may use. Asking
    for cores reserves them for this process alone until every runtime of the process
    holding them is closed, or the process dies; runtimes of one process share its cores.

    Args:
        visible_cores: reserve exactly these host CPUs: ``3``, ``"3-6"``, ``"3,4,5"`` or
            ``[3, 4, 5]``, one contiguous range (``CROSSRT_VISIBLE_CORES``). Wins over
            ``num_cores``; either argument wins over the environment.
        num_cores: reserve this many free host CPUs, 0 for every free one
            (``CROSSRT_NUM_CORES``).

    Raises:
        InvalidArgumentError: a bad ``visible_cores`` or ``num_cores``.
        OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) not enough usable or free cores;
            (EXEC_NC_BUSY) a named core is owned by another process, named in the message.

    Example:
        >>> with crossrt.Runtime() as rt:
        ...     model = rt.load("model.onnx")
        ...     outputs = model.run({"x": x})
    """

    def __init__(
        self,
        *,
        visible_cores: str | int | Sequence[int] | None = None,
        num_cores: int | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._models: list[LoadedModel] = []
        self._groups: list[CoreGroup] = []
        self._closed = False
        shm.sweep_once()  # named segments of crossrt processes killed with their group
        self._cores = reserve_cores(visible_cores, num_cores)
        # An unclosed runtime gives its cores back when collected, not only at exit.
        self._release_cores = weakref.finalize(self, self._cores.release)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def cores(self) -> tuple[int, ...]:
        """The host CPUs this runtime runs on; core index ``i`` of :meth:`load` is ``cores[i]``."""
        return self._cores.host_cpus

    @property
    def exclusive(self) -> bool:
        """Whether :attr:`cores` are reserved for this process alone."""
        return self._cores.exclusive

    @property
    def models(self) -> list[LoadedModel]:
        """The models loaded and not yet unloaded."""
        with self._lock:
            return list(self._models)

    def profile(
        self, path: str | os.PathLike[str] | None = None, models: Sequence[LoadedModel] = ()
    ) -> Profile:
        """A :class:`Profile` of ``models`` (default: every model loaded now), not started:
        ``with rt.profile("trace.json"): ...`` records the block and writes a Chrome trace
        that Perfetto opens (``docs/observability.md``)."""
        self._check_open()
        return Profile(list(models) or self.models, path)

    def memory_stats(self) -> dict[str, MemoryStats]:
        """Memory statistics per device (``nrt_get_vnc_memory_stats``): bytes in use, peak,
        limit, and per loaded model (its ``memory.owner``). Memory belongs to the process,
        so the figures cover every runtime in it; ``"host"`` is host and shared memory."""
        self._check_open()
        for model in self.models:
            model.memory.stats()  # so each model's device appears, even with nothing in use
        return all_stats()

    def devices(self, *, simulated: bool | None = None) -> list[DeviceInfo]:
        """Every device of every available driver (a device served by two drivers twice), in
        natural order (``sim:2`` before ``sim:10``).

        Args:
            simulated: include the devices of simulated drivers (``sim:N``, a test and
                template device); ``None``: only when ``CROSSRT_SIM`` is set. Loading onto a
                simulated device works either way.
        """
        self._check_open()
        if simulated is None:
            simulated = simulated_devices_asked()
        found = [
            info
            for drv in available_drivers()
            if simulated or not drv.simulated
            for info in drv.devices()
        ]
        return sorted(found, key=lambda info: device_order(info.id))

    def load(
        self,
        source: Any,
        device: str | Sequence[str] | None = None,
        *,
        cores: int | Sequence[int] | None = None,
        driver: str | None = None,
        group: CoreGroup | None = None,
        instances: int = 1,
        cores_per_instance: int | None = None,
        queue_depth: int | None = None,
        exec_timeout: float | None = None,
        check_numerics: bool | None = None,
        mode: str = "shared",
        max_batch_size: int = 0,
        batch_delay: float = 0.0,
        name: str | None = None,
        **compile_options: Any,
    ) -> LoadedModel:
        """Load a model onto a device (nrt_load). See ``docs/concurrency.md``.

        Args:
            source: an :class:`Executable`, or anything :func:`crossrt.compile` accepts (a
                :class:`Model`, a path, bytes, an ``onnx.ModelProto``), compiled first. With
                shape ``stages``, every stage is loaded on the same cores and each run goes
                to the stage its input shapes match.
            device: the device (``"cpu"``, ``"cpu:0"``); for an executable, default the one
                it was compiled for. A list of devices (``["sim:0", "sim:1"]``) loads
                ``instances`` copies on each, on the same core indices of each: the devices
                must be linked to each other (``DeviceInfo.links``, drawn by ``crossrt ls
                --topology``), directly or through the others of the list.
            cores: how many cores (the first N that no explicit core group holds) or which
                core indices to use; default all but those of explicit groups. On the CPU
                device, indices count from 0 within :attr:`cores` (index ``i`` is host CPU
                ``cores[i]``).
            driver: for a model that is not compiled yet, the driver to compile with.
            group: an explicit :class:`CoreGroup` to load onto (instead of ``cores``); the
                model is loaded stopped: call ``model.start()``. Without it the load makes an
                implicit group, started at once and removed at unload.
            instances: copies of the model on disjoint cores, run in parallel (on each
                device, for a list of devices).
            cores_per_instance: cores (engine threads) per instance; default an equal share.
            queue_depth: requests ``run_async`` admits at once (waiting or running); default
                instances + nodes + 1, plus ``max_batch_size`` per instance when batching.
            exec_timeout: seconds one run may take before it is stopped with TIMEOUT;
                default ``CROSSRT_EXEC_TIMEOUT`` (none).
            check_numerics: raise EXEC_COMPLETED_WITH_NUM_ERR when an output holds a NaN or
                an infinity; default ``CROSSRT_CHECK_NUMERICS`` (off).
            mode: for a multi-node executable, ``"shared"``: its nodes share the instance's
                cores; ``"normal"``: each node gets cores of its own.
            max_batch_size: more than 0: queued requests are joined along their first
                dimension, up to this many rows, and run as one batch (dynamic batching,
                ``docs/concurrency.md``); the model's inputs and outputs need a dynamic
                first dimension. 0 (default): each request runs alone.
            batch_delay: with ``max_batch_size``, seconds a worker waits for more requests
                before running a smaller batch (Triton's ``max_queue_delay``); default 0:
                batches form only from requests already waiting.
            name: what to call the model in errors, statistics, ``crossrt top`` and profile
                traces (``model.name``); default its graph's name (``main_graph`` for many
                exporters). A daemon loads each model under the name it serves it as.
            **compile_options: for a model that is not compiled yet, the compile options.

        Raises:
            ClosedError: the runtime is closed.
            OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) more cores asked for than exist, or
                instances x cores_per_instance more than the load has.
        """
        self._check_open()
        batched = batching(max_batch_size, batch_delay)
        observer.watch(self)  # crossrt top, monitor and profile --pid see its models
        # A list of devices: a load across them; checked once the executable is known.
        listed = None if device is None or isinstance(device, str) else [str(d) for d in device]
        one = listed[0] if listed else device if isinstance(device, str) else None
        if isinstance(source, Executable):
            if compile_options or driver:
                raise InvalidArgumentError(
                    "compile options and driver apply to models, not to an Executable; "
                    "compile again with them instead"
                )
            exe = source
        else:
            if (one or settings().default_device) == "auto":
                # Choosing measures models on their own runtime: compile first, then load.
                raise InvalidArgumentError(
                    "load(device='auto') does not choose a device; compile with "
                    "exe = crossrt.compile(model, device='auto'), then load(exe)",
                    details={"device": "auto"},
                )
            exe = compile(source, one, driver=driver, **compile_options)
        spread = _linked_devices(listed, exe) if listed is not None else None
        info = spread[0] if spread else _model_device(exe, one or exe.device)
        for other in spread or []:
            info = other if parse_device(other.id)[0] != exe.device_kind else info
        if parse_device(info.id)[0] != exe.device_kind:  # sim:3 is a sim, cpu:0 a cpu
            raise InvalidArgumentError(
                f"{exe.name!r} was compiled for {exe.device_kind}, not {info.id}; compile it "
                f"for {info.id}",
                details={"compiled_for": exe.device, "device": info.id},
            )
        cpu = info.kind is DeviceKind.CPU
        if group is not None:
            group.check_usable(self)
            if cores is not None:
                raise InvalidArgumentError(
                    "give cores= or group=, not both: a model loaded onto a group uses its cores"
                )
            chosen = group.indices
        elif cpu and not isinstance(cores, Sequence) and (taken := self._explicit_cores()):
            # Cores not named: take them from those no explicit group holds.
            free = len(self.cores) - len(taken)
            if cores is None and not free:
                raise OutOfResourcesError(
                    "every core of this runtime is in an explicit core group; load onto one "
                    "of them with group=, or destroy one",
                    code=StatusCode.LOAD_NOT_ENOUGH_NC,
                )
            _choose_cores(cores, info, self.cores)  # the argument's own checks first
            count = free if cores is None else int(cores)
            chosen = pick_free(len(self.cores), taken, count, "a load on")
        else:
            chosen = _choose_cores(cores, info, self.cores if cpu else None)
            if cpu:
                self._check_free(chosen)
        core_sets = split_instances(chosen, instances, cores_per_instance)
        config = settings()
        timeout = config.exec_timeout if exec_timeout is None else exec_timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise InvalidArgumentError(f"exec_timeout={timeout!r}: give seconds, more than 0")
        numerics = config.check_numerics if check_numerics is None else check_numerics

        def load_all(exe: Executable) -> list[Instance]:
            """Every instance, on each device of the load in turn."""
            runs: list[Instance] = []
            for dev in spread or [info]:
                runs += load_instances(
                    exe, dev, core_sets, mode, self.cores, self.exclusive, first=len(runs)
                )
            return runs

        runs = load_all(exe)
        implicit = group is None
        with self._lock:
            home = group or CoreGroup(self, chosen, implicit=True)
        try:
            loaded = LoadedModel(
                self._forget, exe, runs, info, chosen, home,
                queue_depth=queue_depth, exec_timeout=timeout, check_numerics=bool(numerics),
                batching=batched, name=name,
            ) if not exe.stages or batched else StagedModel(
                self._forget, exe, runs, info, chosen, home,
                queue_depth=queue_depth, exec_timeout=timeout, check_numerics=bool(numerics),
                load=load_all, name=name,
            )  # fmt: skip
        except BaseException:
            for inst in runs:
                for program in inst.programs:
                    program.close()
            raise
        with self._lock:
            if self._closed:
                loaded._close_from_runtime()
                raise ClosedError("the runtime was closed while the model was loading")
            self._models.append(loaded)
            if implicit:
                self._groups.append(home)
        home._add(loaded)
        if implicit:
            loaded.start()
        else:
            loaded.stop()  # explicit groups load stopped: model.start() runs it
        return loaded

    def create_core_group(
        self, cores: int | None = None, *, indices: Sequence[int] | None = None
    ) -> CoreGroup:
        """Set cores aside for models loaded with ``group=``; no other group may use them.

        Args:
            cores: how many cores: the lowest-numbered ones in no other group.
            indices: or exactly these core indices (within :attr:`cores`).

        Raises:
            OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) not enough cores free of other groups.
            OperationForbiddenError: a core asked for is in another group.
        """
        self._check_open()
        if (cores is None) == (indices is None):
            raise InvalidArgumentError("give cores=N or indices=[...] (one of them)")
        with self._lock:
            taken = {i for g in self._groups for i in g.indices}
            if indices is not None:
                cpu = DeviceInfo("cpu:0", "", "", DeviceKind.CPU, "", len(self.cores), 0)
                chosen = _choose_cores(list(indices), cpu, self.cores)
                busy = [g for g in self._groups if set(g.indices) & set(chosen)]
                if busy:
                    raise OperationForbiddenError(
                        f"cores {sorted(set(busy[0].indices) & set(chosen))} are in {busy[0]!r}; "
                        "a core belongs to one group: choose others, or unload or destroy it",
                        details={"indices": list(chosen)},
                    )
            else:
                assert cores is not None
                chosen = pick_free(len(self.cores), taken, cores)
            group = CoreGroup(self, tuple(chosen), implicit=False)
            self._groups.append(group)
        return group

    @property
    def core_groups(self) -> list[CoreGroup]:
        """The core groups, explicit and implicit (one per model loaded without a group)."""
        with self._lock:
            return list(self._groups)

    def _explicit_cores(self) -> set[int]:
        with self._lock:
            return {i for g in self._groups if not g.implicit for i in g.indices}

    def _check_free(self, chosen: tuple[int, ...]) -> None:
        with self._lock:
            for g in self._groups:
                if not g.implicit and set(g.indices) & set(chosen):
                    raise OperationForbiddenError(
                        f"cores {sorted(set(g.indices) & set(chosen))} are in explicit {g!r}; "
                        "load onto it with group=, or choose other cores",
                        details={"cores": list(chosen)},
                    )

    def _forget_group(self, group: CoreGroup) -> None:
        with self._lock:
            if group in self._groups:
                self._groups.remove(group)

    def close(self) -> None:
        """Unload every model, release the cores and the runtime (nrt_close). Safe twice."""
        with self._lock:
            self._closed = True
            models, self._models = self._models, []
        for m in models:
            m._close_from_runtime()
        with self._lock:
            self._groups.clear()
        self._release_cores()

    def _forget(self, model: LoadedModel) -> None:
        with self._lock:
            if model in self._models:
                self._models.remove(model)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the runtime is closed; create a new crossrt.Runtime()")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._models)} models"
        return f"Runtime({state})"


def _choose_cores(
    cores: int | Sequence[int] | None,
    device: DeviceInfo,
    reserved: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """Core indices for a load: within ``reserved`` (the runtime's host CPUs) when given."""
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


def _model_device(exe: Executable, device: str) -> DeviceInfo:
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


def _linked_devices(devices: Sequence[str], exe: Executable) -> list[DeviceInfo]:
    """The devices of a load across devices, checked: distinct devices of one kind, each
    linked to the others directly or through them (a group of devices follows the links)."""
    infos = [_model_device(exe, d) for d in devices]
    ids = [i.id for i in infos]
    if not infos or len(set(ids)) != len(ids):
        raise InvalidArgumentError(
            f"device={list(devices)!r}: give distinct devices, e.g. ['sim:0', 'sim:1']",
            details={"devices": ids},
        )
    if len(infos) == 1:
        return infos
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
