"""The ``sim`` driver: a simulated multi-device accelerator, and the template for a new driver.

What it simulates, so that code above the driver (placement, core groups, the runtime's
memory moves) can be written and tested without the hardware:

- **Devices** ``sim:0 .. sim:N-1`` with cores, a memory capacity and direct links between
  them (a 2-D torus by default, as the 16 devices of an AWS trn1.32xlarge), configured by
  ``CROSSRT_SIM`` (:class:`~crossrt.config.SimSettings`).
- **Device memory apart from the host's** (:mod:`.sim_memory`): buffers the host reaches only
  through the memory hooks, each tied to one device, a capacity per device.
- **Programs that compute on device memory**: :meth:`SimProgram.residence` wants every tensor
  on the device; ``run`` reads its inputs where they lie in device buffers and writes its
  outputs into device buffers.
- Optionally **time**: a copy bandwidth and a cost per operator (``copy_gbps``, ``op_us``),
  spent in ``time.sleep`` so that scheduling and transfer effects can be seen.

What is real: the arithmetic. The operators run on a host engine, ONNX Runtime (or onnx's
reference evaluator when ORT is missing), through that engine's own driver; the sim artifact
is the engine's artifact behind a small header.

To write a driver for real hardware, copy this file: keep the shape (devices, ask before
compile, an artifact with a header you can check, a program that says where its data lies,
the five memory hooks), and replace the host engine and :mod:`.sim_memory` with the device's
compiler, loader and memory calls. ``docs/writing-a-driver.md`` walks through it.
"""

from __future__ import annotations

import contextlib
import math
import platform
import threading
import time
from typing import Any

import numpy as np
import onnx

from ..config import SimSettings, settings
from ..errors import (
    CrossrtError,
    DeadlineExceededError,
    DeviceUnavailableError,
    InvalidArgumentError,
    StatusCode,
    UnsupportedError,
)
from ..host import cpu_features
from ..model import Model
from . import sim_artifact
from .base import (
    ArtifactFile,
    CancelToken,
    Capabilities,
    CompileOptions,
    CoreSet,
    DeviceInfo,
    DeviceKind,
    Driver,
    Program,
)
from .registry import get_driver
from .sim_artifact import Header
from .sim_memory import DeviceMemory, SimBuffer
from .sim_program import SimProgram


class SimDriver(Driver):
    """A simulated accelerator whose operators run on a host engine.

    Args:
        config: the simulated devices; by default ``CROSSRT_SIM`` (see
            :class:`~crossrt.config.SimSettings`).
    """

    name = "sim"
    # Below onnxruntime (100) and above reference (0): it serves only sim:N devices, so it is
    # never a CPU's default; the number matters only against other accelerator drivers.
    preference = 10
    simulated = True
    install_hint = (
        "nothing to install for the devices; their arithmetic runs on onnxruntime "
        "(pip install onnxruntime) or, without it, on onnx's reference evaluator"
    )

    def __init__(self, config: SimSettings | None = None) -> None:
        current = settings()
        if {"onnxruntime", "reference"} <= current.disabled_drivers:
            raise DeviceUnavailableError(
                "the simulated devices compute on onnxruntime or reference, and "
                "CROSSRT_DISABLE_DRIVERS disables both; enable one of them"
            )
        self.config = current.sim if config is None else config
        self._devices = _make_devices(self.config)
        self._memory = {d.id: DeviceMemory(d.id, d.memory_bytes) for d in self._devices}
        self._by_id = {d.id: d for d in self._devices}
        self._lock = threading.Lock()
        # The host engine is looked up on first use, never here: the registry constructs
        # drivers while it holds its lock, and asking it for another driver then would wait
        # on that lock forever.
        self._engine: tuple[Driver, DeviceInfo] | None = None

    @property
    def version(self) -> str:
        # A sim artifact holds the engine's artifact: it is tied to the engine's version too.
        engine, _ = self._host_engine()
        return f"{sim_artifact.FORMAT}+{engine.name}-{engine.version}"

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    # -- ask before compile: the host engine answers ------------------------------------------

    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        return [reason is None for reason in self.unsupported_reasons(model, device)]

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        self._device(device)
        engine, cpu = self._host_engine()
        reasons = engine.unsupported_reasons(model, cpu)
        # Device memory holds numbers: a node reading or writing strings stays on the host
        # (with fallback it runs there), as on an accelerator.
        string = onnx.TensorProto.STRING
        strings = {
            name
            for name, kind in model.value_types().items()
            if kind.HasField("tensor_type") and kind.tensor_type.elem_type == string
        }
        return [
            reason
            or (
                "sim devices hold no strings: the node reads or writes a string tensor"
                if strings.intersection((*node.input, *node.output))
                else None
            )
            for node, reason in zip(model.nodes, reasons, strict=True)
        ]

    # -- compile and load ----------------------------------------------------------------------

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        self._device(device)
        engine, cpu = self._host_engine()
        # check_options let through only what a sim device honours, a subset of the engine's.
        inner = engine.compile(model, cpu, options)
        header = Header(
            engine=engine.name,
            engine_version=engine.version,
            ops=len(model.nodes),
            inputs=tuple(model.inputs),
            outputs=tuple(model.outputs),
        )
        return sim_artifact.pack(header, inner)

    def describe_artifact(self, artifact: bytes | memoryview) -> dict[str, str]:
        header, start = sim_artifact.unpack(artifact)
        labels = {"engine": f"{header.engine} {header.engine_version}"}
        try:
            engine, _ = self._named_engine(header)
        except CrossrtError:  # the engine is gone or changed: say what is known
            return labels
        return {**labels, **engine.describe_artifact(memoryview(artifact)[start:])}

    def sharing(
        self, artifact: bytes | memoryview, file: ArtifactFile | None, loads: int
    ) -> contextlib.AbstractContextManager[ArtifactFile | None]:
        # The engine decides (ONNX Runtime writes an in-memory artifact to a file that all the
        # instances map). Handing it the whole sim artifact is right: the file then holds ours,
        # and load() finds the engine's inside it as it does in a .crm.
        header, _ = sim_artifact.unpack(artifact)
        engine, _ = self._named_engine(header)
        return engine.sharing(artifact, file, loads)

    def load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        *,
        file: ArtifactFile | None = None,
    ) -> Program:
        info = self._device(device)
        outside = [c for c in cores.indices if not 0 <= c < info.cores]
        if outside:
            raise InvalidArgumentError(
                f"{info.id} has cores 0 to {info.cores - 1}; cores {outside} do not exist; "
                "stage the program on cores of the device",
                details={"device": info.id, "cores": outside},
            )
        header, start = sim_artifact.unpack(artifact)
        engine, cpu = self._named_engine(header)
        if file is not None:  # the engine's artifact lies further into the same file
            file = ArtifactFile(file.path, file.offset + start, file.identity)
        program = _load_on_host(engine, memoryview(artifact)[start:], cpu, cores, options, file)
        return SimProgram(self.memory(info), self.spend_compute, info, program, header)

    # -- the memory hooks: device memory the host reaches only through these -------------------

    def allocate(self, device: DeviceInfo, nbytes: int) -> Any:
        return self.memory(device).allocate(nbytes)

    def free(self, device: DeviceInfo, buffer: Any) -> None:
        self.memory(device).free(buffer)

    def copy_in(self, device: DeviceInfo, dst: Any, src: memoryview, offset: int = 0) -> None:
        data = np.frombuffer(src, dtype=np.uint8)
        region = self.memory(device).region(dst, offset, data.size, "copy_in")
        self._spend_copy(data.size)
        region[:] = data

    def copy_out(self, device: DeviceInfo, dst: memoryview, src: Any, offset: int = 0) -> None:
        out = np.frombuffer(dst, dtype=np.uint8)
        region = self.memory(device).region(src, offset, out.size, "copy_out")
        self._spend_copy(out.size)
        out[:] = region

    def copy_device(
        self,
        device: DeviceInfo,
        dst: Any,
        src: Any,
        nbytes: int,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        """Copy between two buffers of ``device``, or between it and a device it links to
        directly (a peer copy over the link, as between Neuron devices); devices without a
        link copy through the host."""
        info = self._device(device)
        ends = []
        for buffer, offset in ((dst, dst_offset), (src, src_offset)):
            owner = buffer.device if isinstance(buffer, SimBuffer) else info.id
            # A linked peer's memory is reached over the link; region() refuses any other.
            memory = self._memory[owner if owner in info.links else info.id]
            ends.append(memory.region(buffer, offset, nbytes, "copy_device"))
        self._spend_copy(nbytes)
        ends[0][:] = ends[1]  # NumPy copies overlapping ranges of one buffer correctly

    def memory(self, device: DeviceInfo | str) -> DeviceMemory:
        """The memory of one of this driver's devices (capacity, bytes in use)."""
        return self._memory[self._device(device).id]

    # -- the latency model -------------------------------------------------------------------

    def _spend_copy(self, nbytes: int) -> None:
        # A simulated DMA: the calling thread waits as long as the copy would take. Sleeping,
        # not spinning, leaves the host's cores to the threads that compute.
        if self.config.copy_gbps and nbytes:
            time.sleep(nbytes / (self.config.copy_gbps * 1e9))

    def spend_compute(self, ops: int, cancel: CancelToken | None = None) -> None:
        """Wait as long as ``ops`` operators take on the device (``op_us`` each); a cancelled
        call stops waiting and raises TIMEOUT, as a device aborts a running program."""
        seconds = ops * self.config.op_us / 1e6
        if not seconds:
            return
        if cancel is None:
            time.sleep(seconds)
            return
        stopped = threading.Event()
        cancel.on_cancel(stopped.set)
        if stopped.wait(seconds):
            raise DeadlineExceededError(
                "the sim device stopped the call: its execution timeout expired; raise "
                "exec_timeout (or CROSSRT_EXEC_TIMEOUT) or lower CROSSRT_SIM op_us"
            )

    # -- helpers -----------------------------------------------------------------------------

    def _device(self, device: DeviceInfo | str) -> DeviceInfo:
        key = device if isinstance(device, str) else device.id
        info = self._by_id.get(key)
        if info is None:
            raise DeviceUnavailableError(
                f"the sim driver has no device {key!r}; it serves sim:0 to "
                f"sim:{len(self._devices) - 1} (CROSSRT_SIM=devices=N sets how many)",
                details={"driver": self.name, "device": key},
            )
        return info

    def _host_engine(self) -> tuple[Driver, DeviceInfo]:
        """The engine that computes for the devices, and its CPU device: ONNX Runtime, else
        the reference evaluator."""
        with self._lock:
            if self._engine is None:
                try:
                    engine = get_driver("onnxruntime")
                except DeviceUnavailableError:
                    engine = get_driver("reference")
                self._engine = (engine, engine.devices()[0])
            return self._engine

    def _named_engine(self, header: Header) -> tuple[Driver, DeviceInfo]:
        """The engine an artifact was compiled with, at the version it was compiled with."""
        name, version = header.engine, header.engine_version
        try:
            engine = get_driver(name)
        except DeviceUnavailableError as exc:
            raise DeviceUnavailableError(
                f"the sim artifact was compiled with {name} {version}, which is unavailable "
                f"({exc.message}); install it, or recompile the model with `crossrt compile`",
                code=StatusCode.DRIVER_UNAVAILABLE,
                details={"driver": self.name, "engine": name},
            ) from None
        if engine.version != version:
            raise UnsupportedError(
                f"the sim artifact was compiled with {name} {version}, but {name} "
                f"{engine.version} is installed; recompile the model with `crossrt compile`",
                code=StatusCode.UNSUPPORTED_NEFF_VERSION,
                details={"driver": self.name, "engine": name, "compiled_with": version},
            )
        return engine, engine.devices()[0]


def _load_on_host(
    engine: Driver,
    artifact: memoryview,
    cpu: DeviceInfo,
    cores: CoreSet,
    options: CompileOptions,
    file: ArtifactFile | None,
) -> Program:
    """Stage the engine's artifact on the host CPU with one thread per simulated core.

    The sim cores are not host CPUs: the engine gets as many threads, unpinned.
    """
    return engine.load(artifact, cpu, CoreSet(tuple(range(cores.threads))), options, file=file)


# -- the devices and their links -------------------------------------------------------------


def grid(devices: int) -> tuple[int, int]:
    """Rows and columns of the most nearly square grid of ``devices``: 4x4 for 16, 2x3 for 6,
    one row for a prime number."""
    rows = max(r for r in range(1, math.isqrt(devices) + 1) if devices % r == 0)
    return rows, devices // rows


def links(devices: int, topology: str) -> list[tuple[int, ...]]:
    """For each device, the indices of the devices it links to directly.

    ``torus``: the grid of :func:`grid`, each device linked up, left, down and right (the
    order ``neuron-ls`` lists them in), rows and columns wrapping around. ``mesh``: the same
    grid without wrapping. ``ring``: one row that wraps. ``none``: no links.
    """
    if topology == "none":
        return [() for _ in range(devices)]
    rows, cols = (1, devices) if topology == "ring" else grid(devices)
    wrap = topology != "mesh"
    result = []
    for i in range(devices):
        r, c = divmod(i, cols)
        found: list[int] = []
        for dr, dc in ((-1, 0), (0, -1), (1, 0), (0, 1)):
            nr, nc = r + dr, c + dc
            if wrap:
                nr, nc = nr % rows, nc % cols
            elif not (0 <= nr < rows and 0 <= nc < cols):
                continue
            j = nr * cols + nc
            if j != i and j not in found:  # a 2-wide torus reaches one neighbour both ways
                found.append(j)
        result.append(tuple(found))
    return result


def _make_devices(config: SimSettings) -> list[DeviceInfo]:
    # Capabilities claim only what the simulation honours: no fp16, no performance modes,
    # no priorities; dynamic shapes and cache export come with the host engine.
    caps = Capabilities()
    # The engine's artifact may be tied to the host CPU's vector extensions (ORT's level
    # ALL): they are what compiled code for a sim device depends on, so caches key on them.
    features = (platform.machine(), *cpu_features())
    return [
        DeviceInfo(
            id=f"sim:{i}",
            name="crossrt simulated accelerator",
            vendor="crossrt",
            kind=DeviceKind.ACCELERATOR,
            driver="sim",
            cores=config.cores,
            memory_bytes=config.memory_bytes,
            capabilities=caps,
            links=tuple(f"sim:{j}" for j in linked),
            features=features,
        )
        for i, linked in enumerate(links(config.devices, config.topology))
    ]
