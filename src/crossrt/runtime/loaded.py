"""A model staged on a device: ``LoadedModel`` (nrt_model_t, bmruntime::Network)."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from ..compiler import Executable
from ..drivers import DeviceInfo
from ..errors import ClosedError, InvalidHandleError, OperationForbiddenError
from ..model import TensorSpec
from .batching import Batching
from .instance import Instance
from .numerics import Numerics
from .running import Running
from .statistics import Statistics
from .views import Instances, Memory, TensorInfo, Tensors

if TYPE_CHECKING:
    from .cores.groups import CoreGroup

__all__ = ["LoadedModel", "TensorInfo"]

_serial = itertools.count(1)


class LoadedModel(Running):
    """An :class:`Executable` loaded on a device's cores, ready to run.

    Created by :meth:`Runtime.load`. ``run`` may be called from several threads at once: it
    runs in the caller's thread on an idle instance, waiting in line for one when all are
    busy. For queued runs see :meth:`run_async` and :meth:`infer`; for a request bound once
    and run many times, :meth:`request`; for instances, the queue, core groups
    (:meth:`start`, :meth:`stop`), timeouts and pipelining, ``docs/concurrency.md``.

    Attributes:
        name: the name the model was loaded under (``Runtime.load(name=)``), else its graph's
            name: errors, ``crossrt top`` and profile traces call it so.
        executable: what was loaded.
        device: the device it was loaded on.
        cores: the core indices it holds there.
        served_as: ``NAME:VERSION`` when a daemon serves this model (its repository's name
            for it, which ``crossrt top`` and ``crossrt profile`` show beside :attr:`name`).
        instances: its instances, their cores and devices, queue depth and execution timeout
            (:class:`~crossrt.runtime.views.Instances`; ``len(model.instances)``).
        memory: what it holds on its device, its budget, the bytes its runs moved
            (:class:`~crossrt.runtime.views.Memory`).
        tensors: its inputs and outputs described: ``tensors.info()``,
            ``tensors.output_shapes()``, ``tensors.dim_ranges()``.
    """

    def __init__(
        self,
        forget: Callable[[LoadedModel], None],
        executable: Executable,
        instances: Sequence[Instance],
        device: DeviceInfo,
        cores: tuple[int, ...],
        group: CoreGroup,
        *,
        queue_depth: int | None = None,
        exec_timeout: float | None = None,
        check_numerics: Numerics = False,
        statistics: Statistics | None = None,
        batching: Batching | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or executable.name
        self.executable = executable
        self.device = device
        self.cores = cores
        self.served_as: str | None = None
        self._group = group
        self._forget = forget  # the runtime's: it stops counting this model
        self._lock = threading.Lock()
        self.memory = Memory(self.name, f"{self.name}#{next(_serial)}", device)
        self._prepare_runs(
            instances,
            self.memory,
            queue_depth=queue_depth,
            exec_timeout=exec_timeout,
            check_numerics=check_numerics,
            statistics=statistics,
            batching=batching,
        )
        self.instances = Instances.of(
            instances,
            device.id,
            group=group,
            queue_depth=self._scheduler.depth,
            exec_timeout=exec_timeout,
            batching=batching,
            check_numerics=check_numerics,
        )
        self.tensors = Tensors(executable, self._last, self._record_shapes, self.name)
        # A model never unloaded stops its workers when collected; at exit, daemon workers
        # just end (joining them could hold the exit up behind a long run).
        weakref.finalize(self, self._scheduler.close).atexit = False

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs ``run`` takes."""
        return self.executable.inputs

    @property
    def loaded(self) -> bool:
        """False once unloaded (or its runtime closed)."""
        return self._released is None

    @property
    def running(self) -> bool:
        """Whether the model is started on its core group (and loaded)."""
        return self._released is None and self._group.running is self

    def start(self) -> None:
        """Make the model the one running on its core group.

        Raises:
            OperationForbiddenError: another model of the group is running; stop it first.
            InvalidHandleError: the model was unloaded.
        """
        with self._lock:
            if self._released is not None:
                raise self._released[0](self._released[1])
            self._group.start_model(self)
            self._refusal = None

    def stop(self) -> None:
        """Stop running the model; it stays loaded and can be started again. ``run`` then
        raises OPERATION_FORBIDDEN. Requests already queued still run."""
        with self._lock:
            if self._released is not None:
                return
            self._group.stop_model(self)
            self._refusal = (
                OperationForbiddenError,
                f"model {self.name!r} is stopped on its core group "
                f"{list(self._group.indices)}; call model.start() (after stopping the group's "
                "running model) to run it",
            )

    def unload(self) -> None:
        """Release the model (nrt_unload). Later calls raise INVALID_HANDLE."""
        self._release(InvalidHandleError, f"model {self.name!r} was unloaded; load it again")
        self._forget(self)

    def _release(self, error: type[Exception], message: str) -> None:
        with self._lock:
            if self._released is not None:
                return
            self._released = self._refusal = (error, message)
            programs, self._programs = self._programs, []
        self._scheduler.close(partial(error, message))
        for program in programs:
            program.close()
        self.memory.forget()  # its stats go once its tensors are freed
        self._group.remove_model(self)

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "released"
        return f"LoadedModel({self.name!r}, {self.device.id}, cores={list(self.cores)}, {state})"


def close_from_runtime(model: LoadedModel) -> None:
    """Release ``model`` because the runtime that loaded it was closed (``Runtime.close``,
    or a close while it loaded): later calls raise CLOSED. For the runtime, not a member of
    ``LoadedModel``'s public face."""
    model._release(
        ClosedError,
        f"the runtime that loaded model {model.name!r} was closed; "
        "create a new Runtime and load the model again",
    )
