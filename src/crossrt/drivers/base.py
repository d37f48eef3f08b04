"""The driver interface: what an engine adapter implements.

A driver adapts one real engine (ONNX Runtime, OpenVINO, PyTorch, ...) to crossrt. The runtime
runs no operator itself; it asks drivers. A new driver is one file with a :class:`Driver`
subclass plus an entry point in the ``crossrt.drivers`` group::

    [project.entry-points."crossrt.drivers"]
    mydriver = "mypackage.crossrt_driver:MyDriver"

The life of a model on a driver:

1. :meth:`Driver.devices` lists what the driver can run on.
2. :meth:`Driver.supported_nodes` answers, node by node, before anything is compiled.
3. :meth:`Driver.check_options` refuses, by name, an option the device cannot honour.
4. :meth:`Driver.compile` turns the model into an opaque, serializable artifact.
5. :meth:`Driver.load` stages an artifact on a :class:`CoreSet` and returns a :class:`Program`.
6. :meth:`Program.residence` says where it wants each input and output (host memory or the
   device's own, :class:`Residence`); the runtime moves data through the driver's memory hooks
   (:meth:`Driver.allocate` ... :meth:`Driver.copy_device`) only where that differs from where
   the caller's data lies, and counts every byte it moves.
7. :meth:`Program.run` executes it; :meth:`Program.bind` prepares a call on fixed inputs and
   outputs to run many times; :meth:`Program.close` releases it.

``docs/writing-a-driver.md`` walks through it line by line; ``drivers/sim.py`` is the template.

A driver class must be importable even when its engine is missing only if it raises
``ImportError`` at import time with a message that says what to install; the registry catches
that and reports the driver as unavailable with the reason.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import platform
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cancel import CancelToken as CancelToken  # re-exported: part of the contract (Program.run)
from ..errors import (
    ExecutionError,
    InvalidArgumentError,
    InvalidOptionError,
    UnsupportedError,
)
from ..host import cpu_features, cpu_model, host_cpus, usable_memory
from ..model import Model
from .boundary import DRIVER_METHODS, PROGRAM_METHODS, guard_class


class DeviceKind(enum.Enum):
    """What sort of processor a device is (OH_NN_DeviceType)."""

    CPU = "cpu"
    GPU = "gpu"
    ACCELERATOR = "accelerator"
    OTHER = "other"


class PerformanceMode(enum.IntEnum):
    """How hard the device may work (OH_NN_PerformanceMode). What each mode does on each
    driver: docs/drivers.md, "Performance modes and priority"."""

    NONE = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    EXTREME = 4

    def threads(self, given: int) -> int:
        """The engine threads of a run under this mode, of ``given`` cores: one for LOW,
        half for MEDIUM, all otherwise (the CPU drivers' meaning)."""
        if self is PerformanceMode.LOW:
            return 1
        if self is PerformanceMode.MEDIUM:
            return max(1, given // 2)
        return max(1, given)


CPU_MODES = (PerformanceMode.NONE, PerformanceMode.LOW, PerformanceMode.MEDIUM)
"""The modes a CPU driver honours: HIGH and EXTREME would change nothing, the engines running
a request as fast as the cores allow by default."""


class Priority(enum.IntEnum):
    """Scheduling priority of a model on its device (OH_NN_Priority)."""

    NONE = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3


class Residence(enum.Enum):
    """Where a program wants one of its inputs or outputs to lie when it runs."""

    HOST = "host"
    """Host memory: the program takes and returns NumPy arrays."""
    DEVICE = "device"
    """The memory of the program's device: it takes and returns :class:`DeviceArray` values."""


@dataclass(frozen=True)
class DeviceArray:
    """A tensor in a device's own memory, as a :class:`Program` takes or returns it.

    Attributes:
        buffer: the driver's handle, as :meth:`Driver.allocate` returned it.
        device: the id of the device whose memory holds it (``"sim:3"``).
        dtype: its element type.
        shape: its dimensions.
        offset: where its first byte lies in ``buffer``.
    """

    buffer: Any
    device: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        """Its number of dimensions."""
        return len(self.shape)


@dataclass(frozen=True)
class CoreSet:
    """The cores a program is staged on, built and validated by the runtime in one place.

    Attributes:
        indices: the cores, as indices within the device (``0 .. DeviceInfo.cores - 1``).
            A program uses one engine thread per core.
        host_cpus: for a CPU device, the host CPU number of each core, in order.
        pinned: whether the program should pin the threads it starts, one per core, to
            ``host_cpus`` (the node runs on part of the process's CPUs, or the runtime owns
            its CPUs). The thread that calls ``run`` is the caller's: never pinned by a driver.
    """

    indices: tuple[int, ...]
    host_cpus: tuple[int, ...] = ()
    pinned: bool = False

    def __post_init__(self) -> None:
        if not self.indices:
            raise ValueError("a CoreSet holds at least one core")
        if self.host_cpus and len(self.host_cpus) != len(self.indices):
            raise ValueError("a CoreSet names one host CPU per core, or none")
        if self.pinned and not self.host_cpus:
            raise ValueError("a pinned CoreSet names the host CPU of each core")

    @property
    def threads(self) -> int:
        """How many engine threads a program on these cores uses: one per core."""
        return len(self.indices)

    @property
    def pin(self) -> tuple[int, ...] | None:
        """The host CPUs to pin threads to, or ``None`` when threads are not pinned."""
        return self.host_cpus if self.pinned else None


@dataclass(frozen=True)
class Capabilities:
    """What a device can do beyond running fp32 graphs.

    Attributes:
        fp16: computes in float16 when ``precision="fp16"`` (or ``fp16=True``) allows it.
        bf16: computes in bfloat16 when ``precision="bf16"`` allows it.
        int8: computes with int8 weights, activations quantized at run time, when
            ``precision="int8-dynamic"`` allows it.
        performance_modes: the :class:`PerformanceMode` values it honours.
        priority: honours :class:`Priority`.
        dynamic_shapes: runs models with dynamic input dimensions.
        cache_export: its compiled artifacts can be exported and imported.
    """

    fp16: bool = False
    bf16: bool = False
    int8: bool = False
    performance_modes: tuple[PerformanceMode, ...] = (PerformanceMode.NONE,)
    priority: bool = False
    dynamic_shapes: bool = True
    cache_export: bool = True


@dataclass(frozen=True)
class DeviceInfo:
    """One device a driver serves.

    Attributes:
        id: ``"<kind>:<index>"``, e.g. ``"cpu:0"``.
        name: a human-readable name (the CPU model, the GPU name).
        vendor: who makes it.
        kind: :class:`DeviceKind`.
        driver: the driver serving it.
        cores: compute cores usable by this process.
        memory_bytes: memory usable by this process.
        status: ``"available"``, ``"busy"`` or ``"offline"``.
        capabilities: see :class:`Capabilities`.
        links: ids of devices it has a direct link to (topology).
        features: what compiled code for it may depend on beyond its name: for a CPU, the
            machine architecture then its vector extensions (``("x86_64", "avx", "avx2")``).
    """

    id: str
    name: str
    vendor: str
    kind: DeviceKind
    driver: str
    cores: int
    memory_bytes: int
    status: str = "available"
    capabilities: Capabilities = field(default_factory=Capabilities)
    links: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        caps = self.capabilities
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind.value,
            "driver": self.driver,
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "status": self.status,
            "capabilities": {
                "fp16": caps.fp16,
                "bf16": caps.bf16,
                "int8": caps.int8,
                "performance_modes": [m.name for m in caps.performance_modes],
                "priority": caps.priority,
                "dynamic_shapes": caps.dynamic_shapes,
                "cache_export": caps.cache_export,
            },
            "links": list(self.links),
            "features": list(self.features),
        }


@dataclass(frozen=True)
class CompileOptions:
    """Validated compile options (OH_NNCompilation_Set*).

    Attributes:
        performance_mode: :class:`PerformanceMode`.
        priority: :class:`Priority`.
        fp16: allow reduced-precision arithmetic (NNRt's EnableFloat16: ``precision="fp16"``).
        precision: the arithmetic the model may be computed in: ``None`` (default), the
            model's own, never changed silently; ``"fp32"``; or a reduced one the driver
            really supports, asked for by name: ``"bf16"``, ``"fp16"``, ``"int8-dynamic"``.
        portable: compile for any device of the kind rather than for the one at hand (for a
            CPU: any CPU of its architecture, without layouts tied to its vector extensions);
            a portable artifact loads more slowly.
        extensions: driver-specific settings, passed to the driver as they are.
    """

    performance_mode: PerformanceMode = PerformanceMode.NONE
    priority: Priority = Priority.NONE
    fp16: bool = False
    portable: bool = False
    extensions: Mapping[str, Any] = field(default_factory=dict)
    precision: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return {
            "performance_mode": self.performance_mode.name,
            "priority": self.priority.name,
            "fp16": self.fp16,
            "precision": self.precision,
            "portable": self.portable,
            "extensions": dict(self.extensions),
        }


@dataclass(frozen=True)
class ArtifactFile:
    """Where an artifact's bytes lie in a file (the ``.crm`` it was mapped from).

    An engine that maps weight files itself (ONNX Runtime) reads them from here: every session
    over one file then shares the operating system's page cache instead of holding a private
    copy, across instances and processes.

    Attributes:
        path: the file's absolute path.
        offset: where the artifact's first byte lies in the file.
        identity: ``(device, inode, size, mtime_ns)`` of the file when it was mapped.
    """

    path: str
    offset: int
    identity: tuple[int, int, int, int]

    @staticmethod
    def identity_of(stat: os.stat_result) -> tuple[int, int, int, int]:
        """The identity of a file from its status."""
        return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def unchanged(self) -> bool:
        """Whether the path still names the file that was mapped, unmodified."""
        try:
            return self.identity_of(os.stat(self.path)) == self.identity
        except OSError:
            return False


class Program(ABC):
    """A compiled artifact staged on cores, ready to run.

    ``run`` must be safe to call from several threads at once. Whatever a method raises, its
    caller gets a :class:`~crossrt.errors.CrossrtError` (``drivers/boundary.py``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        guard_class(cls, PROGRAM_METHODS)

    def residence(self) -> Mapping[str, Residence]:
        """Where the program wants each input and output, by name; names left out are
        :attr:`Residence.HOST`. The default wants everything in host memory (a CPU engine).

        The runtime hands :meth:`run` a NumPy array for a HOST name and a
        :class:`DeviceArray` on the program's device for a DEVICE name, moving data through
        the driver's memory hooks only where the caller's data lies elsewhere.
        """
        return {}

    @abstractmethod
    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Execute once.

        Args:
            inputs: one value per model input, already validated by the runtime: a NumPy
                array where :meth:`residence` says HOST, a :class:`DeviceArray` on this
                program's device where it says DEVICE (non-tensor values as they are).
            outputs: preallocated buffers to write results into, where the engine can, of the
                same kinds; outputs not named are allocated by the program (device outputs
                through its driver's :meth:`Driver.allocate`).

        Returns:
            One value per model output, by name, of the kind :meth:`residence` says.
        """

    def run_outputs(self, inputs: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        """Execute once for the outputs ``names`` only (distinct output names, checked by
        the runtime), returned in that order, as ``model.run(output_names=)`` asks.

        The default runs the whole model and keeps those outputs. Engines that can fetch or
        compute fewer override it (ONNX Runtime's ``run(output_names)`` fetches those alone).
        The runtime asks it only of programs whose outputs are in host memory (a device
        output dropped here would not be freed).
        """
        results = self.run(inputs)
        return {name: results[name] for name in names}

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Execute once, stopping early where the engine can when ``cancel`` is triggered.

        The default cannot stop a call that has started: it runs to the end, and the runtime
        reports ``TIMEOUT`` when it finishes late. Engines that can abort a call (ONNX
        Runtime's ``RunOptions.terminate``) override this and register their abort with
        ``cancel.on_cancel``.
        """
        return self.run(inputs, outputs)

    def bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Callable[[], dict[str, Any]]:
        """Prepare a run on exactly these inputs and outputs, to be called many times.

        The caller (a :class:`~crossrt.runtime.Request`, or the runtime for it) promises to
        keep the values' memory, shapes and dtypes unchanged while it holds the call (the
        contents may change between calls: that is the point), and never to make the call
        from two threads at once. The call returns what :meth:`run` would.

        The default binds nothing: each call is a :meth:`run`. Engines with a reusable
        binding (ONNX Runtime's IOBinding, a device's command buffer) prepare it once here.
        """
        return functools.partial(self.run, dict(inputs), dict(outputs) if outputs else None)

    @abstractmethod
    def close(self) -> None:
        """Release the engine's resources. Further calls to ``run`` are not allowed."""


def copy_into(
    results: dict[str, np.ndarray], outputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Copy each result into the caller's buffer for it, for engines that cannot write there.

    Raises:
        ExecutionError: a buffer's dtype or shape differs from the result (for a dynamic
            output, known only after the run).
    """
    for name, buffer in outputs.items():
        result = np.asarray(results[name])
        if result.shape != buffer.shape or result.dtype != buffer.dtype:
            raise ExecutionError(
                f"output {name!r} is {result.dtype} {list(result.shape)}, but the buffer given "
                f"for it is {buffer.dtype} {list(buffer.shape)}; pass a buffer of that dtype "
                "and shape, or none to receive the result"
            )
        np.copyto(buffer, result, casting="no")
        results[name] = buffer
    return results


class Driver(ABC):
    """An engine adapter. Subclasses set :attr:`name` and implement the methods below.

    Whatever a method raises, its caller gets a :class:`~crossrt.errors.CrossrtError`: each
    method a subclass defines is wrapped when the class is made (``drivers/boundary.py``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        guard_class(cls, DRIVER_METHODS)

    name: str = ""
    """The driver's registry name (``"onnxruntime"``)."""

    preference: int = 50
    """When several drivers serve a device kind, the highest preference is the default."""

    simulated: bool = False
    """Whether its devices are simulated (a test and template device, not hardware): tools list
    them only when asked (``crossrt ls --all``, or the driver's own setting is given)."""

    install_hint: str = ""
    """What to install for this driver's engine (``"pip install 'crossrt[openvino]'"``), said
    when its engine is missing or a compiled model needs it."""

    @property
    @abstractmethod
    def version(self) -> str:
        """The engine's version; compiled artifacts are tied to it."""

    @abstractmethod
    def devices(self) -> list[DeviceInfo]:
        """The devices this driver can use in this process."""

    @abstractmethod
    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        """For each node of ``model.nodes``, whether this driver can run it on ``device``."""

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        """Per node: ``None`` when supported, else why not (for messages).

        The default derives a generic reason from :meth:`supported_nodes`; drivers that know
        more say more.
        """
        return [
            None if ok else f"driver {self.name!r} cannot run {node.op_type}"
            for ok, node in zip(self.supported_nodes(model, device), model.nodes, strict=True)
        ]

    def check_options(self, options: CompileOptions, device: DeviceInfo) -> None:
        """Refuse, by name, each option the device cannot honour.

        The default checks the device's :class:`Capabilities`; drivers add their own checks
        for ``options.extensions``.

        Raises:
            InvalidOptionError: (INVALID_OPTION) naming the option, the driver, the device and
                what it supports.
        """
        caps = device.capabilities
        if options.fp16 and not caps.fp16:
            raise _cannot_honour("fp16", self.name, device, "it computes in float32 only")
        reduced = {"fp16": caps.fp16, "bf16": caps.bf16, "int8-dynamic": caps.int8}
        if options.precision in reduced and not reduced[options.precision]:
            able = [name for name, ok in reduced.items() if ok]
            why = f"it computes in {', '.join(['fp32', *able])} only"
            raise _cannot_honour(f"precision={options.precision!r}", self.name, device, why)
        if options.performance_mode not in caps.performance_modes:
            modes = ", ".join(m.name for m in caps.performance_modes)
            raise _cannot_honour("performance_mode", self.name, device, f"it supports {modes}")
        if options.priority is not Priority.NONE and not caps.priority:
            raise _cannot_honour("priority", self.name, device, "it has no priorities")
        if options.extensions:
            names = ", ".join(sorted(options.extensions))
            raise _cannot_honour(
                f"extensions ({names})", self.name, device, "it takes no extensions"
            )

    @abstractmethod
    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        """Compile ``model`` for ``device`` into an opaque artifact the runtime stores."""

    def describe_artifact(self, artifact: bytes | memoryview) -> dict[str, str]:
        """What an artifact is tied to beyond the engine version, for people: short labels
        and values (``{"cpu": "x86_64 avx avx2"}``), stored in the ``.crm`` header and shown
        by ``crossrt inspect``. The default says nothing."""
        return {}

    def artifact_weights(self, artifact: bytes | memoryview) -> list[dict[str, Any]] | None:
        """The weights an artifact stores where they can be read (``crossrt container
        weights``, model_tool's ``--weight``): one ``{"name", "dtype", "shape", "bytes",
        "offset", "prepacked_bytes"}`` per weight, ``offset`` from the artifact's first byte;
        ``None`` (the default) for an artifact whose layout is the engine's own."""
        return None

    @abstractmethod
    def load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        *,
        file: ArtifactFile | None = None,
    ) -> Program:
        """Stage an artifact on ``cores``, using one engine thread per core.

        ``file`` says where ``artifact`` lies on disk when it was mapped from a file; a driver
        may read it from there instead (see :class:`ArtifactFile`). Where ``cores.pinned``, a
        driver pins the threads it starts to ``cores.host_cpus`` (the thread that calls
        ``run`` is the caller's, pinned by the runtime's workers, never by the driver).
        """

    def sharing(
        self, artifact: bytes | memoryview, file: ArtifactFile | None, loads: int
    ) -> contextlib.AbstractContextManager[ArtifactFile | None]:
        """Prepare one artifact for ``loads`` loads of it (the instances of a model), for the
        duration of the block: what to pass as ``file=`` to each :meth:`load`.

        The default passes ``file`` on as it is. An engine that shares what it maps between
        the programs it loads from one file (ONNX Runtime maps weights) may write an artifact
        held in memory (``file`` is ``None``) to a file for the block.
        """
        return contextlib.nullcontext(file)

    # Memory hooks. The defaults serve devices whose memory is the host's (coherent): a buffer
    # is a NumPy byte array and copies are NumPy copies. Drivers for devices with their own
    # memory override all five.

    def allocate(self, device: DeviceInfo, nbytes: int) -> Any:
        """Allocate ``nbytes`` of device memory, zero-filled, and return a handle to it."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgumentError(
                f"cannot allocate {nbytes!r} bytes on {device.id}: give a whole number >= 0"
            )
        return np.zeros(nbytes, dtype=np.uint8)  # calloc: pages are zeroed when first touched

    def free(self, device: DeviceInfo, buffer: Any) -> None:
        """Release memory from :meth:`allocate`."""
        del buffer

    def copy_in(self, device: DeviceInfo, dst: Any, src: memoryview, offset: int = 0) -> None:
        """Copy host bytes into device memory at ``offset``."""
        view = np.frombuffer(src, dtype=np.uint8)
        check_range(dst.size, offset, view.size, f"copy_in to {device.id}")
        dst[offset : offset + view.size] = view

    def copy_out(self, device: DeviceInfo, dst: memoryview, src: Any, offset: int = 0) -> None:
        """Copy device memory from ``offset`` into a host buffer."""
        out = np.frombuffer(dst, dtype=np.uint8)
        check_range(src.size, offset, out.size, f"copy_out from {device.id}")
        out[:] = src[offset : offset + out.size]

    def copy_device(
        self,
        device: DeviceInfo,
        dst: Any,
        src: Any,
        nbytes: int,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        """Copy ``nbytes`` between two buffers of the same device."""
        check_range(src.size, src_offset, nbytes, f"copy_device on {device.id} (source)")
        check_range(dst.size, dst_offset, nbytes, f"copy_device on {device.id} (destination)")
        dst[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]

    def coherent(self, device: DeviceInfo) -> bool:
        """Whether ``device``'s memory is host memory, which the runtime then allocates and
        reads directly (NumPy bytes) instead of through the hooks. The default: when the
        driver keeps all five default memory hooks. A driver serving host memory on some
        devices and its own on others (onnxruntime: the CPU, and ``cuda:N``) says per device.
        """
        return keeps_default_memory(self)

    # Device addresses, for DLPack and the CUDA array interface: how a tensor in a device's
    # memory is handed to torch or cupy, and theirs to crossrt, without a copy. Drivers whose
    # buffers have addresses other libraries use (a GPU's) override both.

    def address_of(self, device: DeviceInfo, buffer: Any) -> int | None:
        """The address of ``buffer`` in ``device``'s memory, or ``None`` where the driver's
        buffers have none another library could use."""
        return None

    def wrap_address(self, device: DeviceInfo, address: int, nbytes: int, keep: Any) -> Any:
        """A buffer over the ``nbytes`` at ``address`` of ``device``'s memory, which ``keep``
        (a torch or cupy array) holds allocated: freeing the buffer lets go of ``keep``.

        Raises:
            UnsupportedError: the driver takes no memory from other libraries.
        """
        raise UnsupportedError(
            f"driver {self.name!r} takes no memory from other libraries on {device.id}; copy "
            "the data in through the host"
        )


MEMORY_HOOKS = ("allocate", "free", "copy_in", "copy_out", "copy_device")
"""The driver methods that reach a device's memory."""


def keeps_default_memory(hooks: Any) -> bool:
    """Whether ``hooks`` (a driver, or any object with the memory hooks) keeps all five of
    :class:`Driver`'s default memory hooks: host memory as NumPy bytes."""
    return all(getattr(type(hooks), h, None) is getattr(Driver, h) for h in MEMORY_HOOKS)


guard_class(Program, PROGRAM_METHODS)  # the defaults too: a subclass may not override them
guard_class(Driver, DRIVER_METHODS)


def check_range(size: int, offset: Any, nbytes: Any, what: str) -> None:
    """Refuse ``nbytes`` at ``offset`` unless they lie inside a buffer of ``size`` bytes.

    Raises:
        InvalidArgumentError: (INVALID) naming the operation, the range and the size.
    """
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, nbytes))
    if not ok or offset + nbytes > size:
        raise InvalidArgumentError(
            f"{what}: {nbytes!r} bytes at offset {offset!r} do not fit a buffer of {size} "
            f"bytes; give 0 <= offset and offset + size <= {size}",
            details={"offset": repr(offset), "size": repr(nbytes), "buffer_size": size},
        )


def _cannot_honour(option: str, driver: str, device: DeviceInfo, why: str) -> InvalidOptionError:
    return InvalidOptionError(
        f"option {option} cannot be honoured by driver {driver!r} on {device.id}: {why}; "
        "drop the option or choose another device",
        details={"option": option, "driver": driver, "device": device.id},
    )


def host_cpu(driver: str, capabilities: Capabilities) -> DeviceInfo:
    """The host CPU as device ``cpu:0`` of ``driver``."""
    name, vendor = cpu_model()
    return DeviceInfo(
        id="cpu:0",
        name=name,
        vendor=vendor,
        kind=DeviceKind.CPU,
        driver=driver,
        cores=host_cpus().limit,
        memory_bytes=usable_memory(),
        capabilities=capabilities,
        features=(platform.machine(), *cpu_features()),
    )
