"""What a loaded model shows besides running: its instances (``model.instances``), its memory
(``model.memory``) and its tensors (``model.tensors``). Small read-mostly objects, so that
``LoadedModel`` itself keeps to loading, running and starting."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compiler import Executable
from ..drivers import DeviceInfo, get_driver
from ..errors import OperationForbiddenError
from .batching import Batching
from .instance import Instance
from .memory.allocator import Allocator, OwnerStats, device_allocator
from .memory.transfer import Transfers, TransferStats
from .numerics import Numerics
from .shapes import DimRange, declared_ranges

if TYPE_CHECKING:
    from .cores.groups import CoreGroup


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as ``nrt_get_model_tensor_info`` reports it.

    Attributes:
        name: tensor name.
        usage: ``"input"`` or ``"output"``.
        dtype: element type name (``"float32"``), or the value kind for non-tensors.
        shape: dims, with ``None`` or a symbolic name for dynamic ones.
        size: bytes for one value when the shape is static, else ``None``.
    """

    name: str
    usage: str
    dtype: str
    shape: tuple[int | str | None, ...] | None
    size: int | None


@dataclass(frozen=True, eq=False)
class Instances:
    """A model's instances (``model.instances``): how many copies of it run in parallel, on
    which cores and devices, and what bounds their runs. ``len(model.instances)`` counts
    them.

    Attributes:
        cores: the core indices of each instance (on its device: :attr:`devices`).
        devices: the device of each instance: the model's device, or for a load across
            devices (``Runtime.load(exe, ["sim:0", "sim:1"])``) each instance's own.
        group: the core group the model runs on.
        queue_depth: how many :meth:`~LoadedModel.run_async` requests may be waiting or
            running at once.
        exec_timeout: seconds one run may take before it is stopped with TIMEOUT (``None``:
            no limit).
        batching: how its queued requests are batched (``max_batch_size``); ``None``: they
            run one by one.
        check_numerics: whether each run's results are checked for NaN and infinity.
    """

    cores: list[tuple[int, ...]]
    devices: list[str]
    group: CoreGroup
    queue_depth: int
    exec_timeout: float | None
    batching: Batching | None
    check_numerics: Numerics

    @classmethod
    def of(cls, instances: Sequence[Instance], device: str, **settings: Any) -> Instances:
        """The view of ``instances`` loaded on ``device``, with the model's ``settings``."""
        cores = [inst.cores for inst in instances]
        return cls(cores, [inst.device or device for inst in instances], **settings)

    def __len__(self) -> int:
        return len(self.cores)


class Memory:
    """A model's memory on its device (``model.memory``): what is charged to it, its budget,
    and the bytes its runs moved between host and device memory.

    Attributes:
        owner: the key its memory is charged to in the allocator statistics.
        transfers: the bytes moved for this model, per direction (counted by its runs).
    """

    def __init__(self, name: str, owner: str, device: DeviceInfo) -> None:
        self._name = name
        self._device = device
        self.owner = owner
        self.transfers = Transfers()
        self._allocator: Allocator | None = None
        self._lock = threading.Lock()

    def allocator(self) -> Allocator:
        """The allocator of the model's device, with the model registered as an owner."""
        if self._allocator is None:
            with self._lock:
                if self._allocator is None:
                    allocator = device_allocator(get_driver(self._device.driver), self._device)
                    allocator.register(self.owner, f"model {self._name!r}")
                    self._allocator = allocator
        return self._allocator

    @property
    def budget(self) -> int | None:
        """Bytes this model may hold on its device (``None``: no limit)."""
        return self.allocator().budget(self.owner)

    def set_budget(self, nbytes: int | None) -> None:
        """Limit the memory charged to this model on its device: outputs the runtime
        allocates for it and tensors made with ``owner=model``. An allocation past the
        budget raises OutOfResourcesError (RESOURCE) naming the model."""
        self.allocator().set_budget(self.owner, nbytes)

    def stats(self) -> OwnerStats:
        """The memory charged to this model on its device."""
        return self.allocator().owner_stats(self.owner)

    def transfer_stats(self) -> TransferStats:
        """The bytes this model's runs moved between host and device memory, per direction.

        A model whose programs take host memory moves nothing unless given device tensors; one
        on a device with its own memory (``sim``, a GPU) copies each host input in and each
        output the caller wants on the host out, and nothing for device tensors on its device.
        """
        return self.transfers.stats()

    def summary(self) -> dict[str, Any]:
        """What this model has done, as a JSON-friendly dict: ``transfers`` (bytes and copies
        per direction, see :meth:`transfer_stats`) and ``memory`` (see :meth:`stats`)."""
        return {
            "model": self._name,
            "device": self._device.id,
            "transfers": self.transfers.stats().to_dict(),
            "memory": dataclasses.asdict(self.stats()) if self._allocator else None,
        }

    def forget(self) -> None:
        """The model is gone: its statistics go once its tensors are freed."""
        if self._allocator is not None:
            self._allocator.forget(self.owner)


class Tensors:
    """A model's inputs and outputs described (``model.tensors``)."""

    def __init__(
        self, executable: Executable, last: threading.local, recorded: bool, name: str
    ) -> None:
        self._executable = executable
        self._last = last
        self._recorded = recorded
        self._name = name
        self._dim_ranges: dict[str, tuple[DimRange, ...]] | None = None

    def info(self) -> list[TensorInfo]:
        """Inputs then outputs, with dtype, shape and byte size (nrt_get_model_tensor_info)."""
        infos = []
        for usage, specs in (
            ("input", self._executable.inputs),
            ("output", self._executable.outputs),
        ):
            for s in specs:
                size = None
                if s.is_static and s.dtype is not None and s.dtype.itemsize:
                    dims = [d for d in s.shape or () if isinstance(d, int)]
                    size = int(np.prod(dims)) * s.dtype.itemsize
                dtype = s.dtype.name if s.dtype else s.kind
                infos.append(TensorInfo(s.name, usage, dtype, s.shape, size))
        return infos

    def output_shapes(self) -> dict[str, tuple[int, ...] | None]:
        """The output shapes of this thread's last run (``OH_NNExecutor_GetOutputShape``).

        Static outputs need no run. ``None`` for an output that is not a tensor.

        Raises:
            OperationForbiddenError: the model has dynamic outputs and this thread has not
                run it yet.
        """
        shapes = getattr(self._last, "shapes", None)
        if shapes is not None:
            return dict(shapes)
        if self._recorded:
            raise OperationForbiddenError(
                f"model {self._name!r} has dynamic outputs and this thread has not run it yet; "
                "their shapes are known after a run",
                details={"model": self._name},
            )
        outputs = self._executable.outputs
        return {s.name: tuple(d for d in s.shape or () if isinstance(d, int)) for s in outputs}

    def dim_ranges(self) -> dict[str, tuple[DimRange, ...]]:
        """Per input, ``(min, max)`` per dimension (``OH_NNExecutor_GetInputDimRange``).

        Static dimensions give ``(d, d)``; dynamic ones ``(1, None)`` unless the model
        declares ranges in its ``crossrt.dim_ranges`` metadata (see ``docs/memory.md``).
        """
        if self._dim_ranges is None:
            self._dim_ranges = declared_ranges(self._executable)
        return dict(self._dim_ranges)
