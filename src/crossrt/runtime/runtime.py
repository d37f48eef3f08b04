"""``Runtime``: the process's context for loading and running models (nrt_init / nrt_close)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ..config import simulated_devices_asked
from ..drivers import DeviceInfo, DeviceKind, available_drivers
from ..drivers.registry import device_order
from ..errors import ClosedError, InvalidArgumentError, OperationForbiddenError
from . import observer
from .batching import batching
from .cores.groups import CoreGroup, choose_cores, core_indices, pick_free, split_instances
from .cores.pinning import CALLER
from .cores.reservation import reserve_cores
from .loaded import LoadedModel, close_from_runtime
from .loading import LoadPlan, executable_for, load_devices, run_limits
from .memory import shm
from .memory.allocator import MemoryStats, all_stats
from .numerics import Numerics
from .profiler import Profile


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
        check_numerics: Numerics | None = None,
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
                cores; ``"normal"``: each node gets cores of its own (both pipeline requests
                through the nodes); ``"serial"``: as ``"shared"``, one request at a time
                (neuron-rtd's shared NC mode).
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
        CALLER.unpin()  # a request thread's pin is not for the threads this load starts
        batched = batching(max_batch_size, batch_delay)
        observer.watch(self)  # crossrt top, monitor and profile --pid see its models
        exe = executable_for(source, device, driver, compile_options)
        devices = load_devices(exe, device)
        chosen = self._cores_for(cores, group, devices[0])
        core_sets = split_instances(chosen, instances, cores_per_instance)
        plan = LoadPlan(devices, chosen, core_sets, mode, self.cores, self.exclusive)
        timeout, numerics = run_limits(exec_timeout, check_numerics)
        with self._lock:
            home = group or CoreGroup(self, chosen, implicit=True)
        loaded = plan.load(
            exe, self._forget, home, batched,
            queue_depth=queue_depth, exec_timeout=timeout, check_numerics=numerics, name=name,
        )  # fmt: skip
        self._adopt(loaded, home, implicit=group is None)
        return loaded

    def _cores_for(
        self, cores: int | Sequence[int] | None, group: CoreGroup | None, device: DeviceInfo
    ) -> tuple[int, ...]:
        """The core indices of a load (:func:`.cores.groups.choose_cores`)."""
        if group is not None:
            group.check_usable(self)
        with self._lock:
            explicit = [g for g in self._groups if not g.implicit]
        return choose_cores(cores, group, device, self.cores, explicit)

    def _adopt(self, loaded: LoadedModel, home: CoreGroup, *, implicit: bool) -> None:
        """Keep a model just loaded, in its group; one loaded without a group starts now, one
        loaded onto an explicit group waits for ``model.start()``."""
        with self._lock:
            if self._closed:
                close_from_runtime(loaded)
                raise ClosedError("the runtime was closed while the model was loading")
            self._models.append(loaded)
            if implicit:
                self._groups.append(home)
        home.add_model(loaded)
        if implicit:
            loaded.start()
        else:
            loaded.stop()  # explicit groups load stopped: model.start() runs it

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
                chosen = core_indices(list(indices), cpu, self.cores)
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
            close_from_runtime(m)
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
