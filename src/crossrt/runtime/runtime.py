"""``Runtime``: the process's context for loading and running models (nrt_init / nrt_close)."""

from __future__ import annotations

import numbers
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ..compiler import Executable, compile
from ..drivers import (
    DeviceInfo,
    DeviceKind,
    Program,
    available_drivers,
    get_driver,
    resolve_device,
)
from ..drivers.host import format_cpus
from ..errors import ClosedError, InvalidArgumentError, OutOfResourcesError, StatusCode
from .cores import reserve_cores
from .devices import Device
from .loaded import LoadedModel
from .memory import MemoryStats, all_stats


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
        self._closed = False
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

    def device(self, device: str = "cpu:0") -> Device:
        """One device's memory, BMLib style: ``malloc``, ``memcpy_*``, ``mmap`` (see
        :class:`Device`).

        Raises:
            DeviceUnavailableError: no available driver serves ``device``.
        """
        self._check_open()
        return Device.open(device)

    def memory_stats(self) -> dict[str, MemoryStats]:
        """Memory statistics per device (``nrt_get_vnc_memory_stats``): bytes in use, peak,
        limit, and per loaded model (its ``memory_owner``). Memory belongs to the process,
        so the figures cover every runtime in it; ``"host"`` is host and shared memory."""
        self._check_open()
        for model in self.models:
            model.memory_stats()  # so each model's device appears, even with nothing in use
        return all_stats()

    def devices(self) -> list[DeviceInfo]:
        """Every device of every available driver (a device served by two drivers twice)."""
        self._check_open()
        return [info for drv in available_drivers() for info in drv.devices()]

    def load(
        self,
        source: Any,
        device: str | None = None,
        *,
        cores: int | Sequence[int] | None = None,
        driver: str | None = None,
        **compile_options: Any,
    ) -> LoadedModel:
        """Load a model onto a device (nrt_load).

        Args:
            source: an :class:`Executable`, or anything :func:`crossrt.compile` accepts (a
                :class:`Model`, a path, bytes, an ``onnx.ModelProto``), compiled first.
            device: the device (``"cpu"``, ``"cpu:0"``); for an executable, default the one
                it was compiled for.
            cores: how many cores (the first N) or which core indices to use; default all.
                On the CPU device, indices count from 0 within :attr:`cores` (index ``i`` is
                host CPU ``cores[i]``). The engine uses one thread per core.
            driver: for a model that is not compiled yet, the driver to compile with.
            **compile_options: for a model that is not compiled yet, the compile options.

        Raises:
            ClosedError: the runtime is closed.
            OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) more cores asked for than exist.
        """
        self._check_open()
        if isinstance(source, Executable):
            if compile_options or driver:
                raise InvalidArgumentError(
                    "compile options and driver apply to models, not to an Executable; "
                    "compile again with them instead"
                )
            exe = source
        else:
            exe = compile(source, device, driver=driver, **compile_options)
        first = get_driver(exe.nodes[0].driver)
        _, info = resolve_device(device or exe.device, first.name)
        if info.kind.value != exe.device_kind:
            raise InvalidArgumentError(
                f"{exe.name!r} was compiled for {exe.device_kind}, not {info.id}; compile it "
                f"for {info.id}",
                details={"compiled_for": exe.device, "device": info.id},
            )
        chosen = _choose_cores(cores, info, self.cores if info.kind is DeviceKind.CPU else None)
        programs: list[Program] = []
        try:
            for node in exe.nodes:
                drv = get_driver(node.driver)
                if node.device_kind == info.kind.value:
                    _, node_device = resolve_device(info.id, drv.name)
                    node_cores = chosen
                else:  # a fallback node on another kind of device: all of its cores
                    _, node_device = resolve_device(node.device_kind, drv.name)
                    cpu = node_device.kind is DeviceKind.CPU
                    node_cores = tuple(range(len(self.cores) if cpu else node_device.cores))
                programs.append(drv.load(node.artifact, node_device, node_cores, exe.options))
        except BaseException:
            for program in programs:
                program.close()
            raise
        loaded = LoadedModel(self, exe, programs, info, chosen)
        with self._lock:
            if self._closed:
                loaded._close_from_runtime()
                raise ClosedError("the runtime was closed while the model was loading")
            self._models.append(loaded)
        return loaded

    def close(self) -> None:
        """Unload every model, release the cores and the runtime (nrt_close). Safe twice."""
        with self._lock:
            self._closed = True
            models, self._models = self._models, []
        for m in models:
            m._close_from_runtime()
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
