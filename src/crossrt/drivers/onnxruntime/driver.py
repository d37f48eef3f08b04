"""The ``onnxruntime`` driver: compile, load, devices (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ...config import settings
from ...errors import (
    CompileError,
    CrossrtError,
    InvalidContainerError,
    InvalidModelError,
    StatusCode,
    UnsupportedError,
)
from ...model import Model, tensors
from ..base import (
    CPU_MODES,
    ArtifactFile,
    Capabilities,
    CompileOptions,
    CoreSet,
    DeviceInfo,
    Driver,
    PerformanceMode,
    Program,
    host_cpu,
)
from . import artifact as ort_artifact
from . import cuda, gpu_memory, lower, precision, spill, support
from .gpu_program import GpuProgram
from .program import ORT_SEVERITY, OrtProgram, short_error

log = logging.getLogger("crossrt")
COMPILE_PREFIX = "crossrt-ort-"  # ORT saves the optimized model in such a temporary folder
_SAVE_DATA = "session.optimized_model_external_initializers_file_name"
_SAVE_DATA_MIN = "session.optimized_model_external_initializers_min_size_in_bytes"
_SAVE_PREPACKED = "session.save_external_prepacked_constant_initializers"
_FOLDING = "ConstantFolding"
# An artifact storing more than this many times the model's bytes, plus the slack, is
# compiled again without constant folding (see compile): a float16 model's weights cast to
# float32 for kernels without float16 are 3 times its own at most.
_EXPANSION = 4
_EXPANSION_SLACK = 1 << 20
_LEVELS = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
}


class OnnxRuntimeDriver(Driver):
    """ONNX Runtime, CPU execution provider."""

    name = "onnxruntime"
    preference = 100
    install_hint = "pip install onnxruntime"

    def __init__(self) -> None:
        # ORT prints its log lines to stderr itself, interleaved with the user's output: only
        # those CROSSRT_LOG_LEVEL asks for. Its default logger is the process's (the sessions
        # and runs of this driver set theirs too, as ORT's own default is WARNING).
        self._severity = ORT_SEVERITY[settings().log_level]
        ort.set_default_logger_severity(self._severity)
        self._lock = threading.Lock()
        self._known: support.OrtRegistry | None = None

    @property
    def version(self) -> str:
        return str(ort.__version__)

    def devices(self) -> list[DeviceInfo]:
        # Only what changes the session: LOW and MEDIUM run on one and half the cores, their
        # idle pool threads sleeping instead of spinning (docs/drivers.md).
        modes = CPU_MODES
        # Reduced precision by rewriting the model (precision.py): int8 weights everywhere;
        # float16 only where this build has float16 MatMul and Conv kernels (ARM64 builds; the
        # x86 CPU provider has none: a float16 model would compute in float32 between casts).
        fp16 = precision.has_float16_arithmetic(self._registry())
        caps = Capabilities(fp16=fp16, int8=True, performance_modes=modes, cache_export=True)
        return [host_cpu(self.name, caps), *cuda.devices(self.name)]

    def check_options(self, options: CompileOptions, device: DeviceInfo) -> None:
        super().check_options(cuda.check_extensions(self.name, device, options), device)

    # -- what ORT can run ----------------------------------------------------------------

    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        return [reason is None for reason in self.unsupported_reasons(model, device)]

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        """Per node: ``None`` when ORT can run it, else why not (see ``support``)."""
        return support.unsupported_reasons(model, self._registry())

    def _registry(self) -> support.OrtRegistry:
        with self._lock:
            if self._known is None:
                self._known = support.build_registry()
            return self._known

    # -- compile and load ----------------------------------------------------------------

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        on_gpu = cuda.is_cuda(device)
        model = precision.convert(model, options.precision, None if on_gpu else self._registry())
        if on_gpu:
            # ORT's EXTENDED level, run by a CPU session, fuses for ORT's CPU kernels (ResNet's
            # Conv+Relu into FusedConv, BERT's MatMul+Add into Reshape/Gemm/Reshape): on an
            # H200 such an artifact ran ResNet-50 2.25x and BERT 1.12x slower than raw ORT.
            # So a GPU's artifact stops at BASIC (folding, eliminations: any provider's), and
            # the CUDA provider's own fusions are made as the session is.
            artifact = self._optimize(model, "basic", ())
            assert artifact is not None  # level BASIC is always reloaded as it is saved
            return artifact
        # Level ALL adds layouts tied to this CPU's vector extensions (NCHWc blocks) and keeps
        # the weights ORT's kernels pre-pack: such an artifact loads only on a CPU with the
        # same features, but without optimizing or packing again, and sessions map its
        # weights from the .crm instead of each building its own. A portable compile stops at
        # EXTENDED, and its load applies the rest.
        artifact = None if options.portable else self._optimize(model, "all", device.features)
        if artifact is not None and not self._loads(artifact, device, options):
            artifact = None  # a form of ORT's output the artifact does not carry over
        if artifact is None:
            artifact = self._optimize(model, "extended", ())
        assert artifact is not None  # level EXTENDED is always reloaded as it is saved
        # ORT's constant folding materialises every tensor the graph computes from constants:
        # a model that generates its weights from small ones (ConstantOfShape, Expand or Tile
        # of a scalar, as weights-stripped model-zoo files do) would become an artifact of
        # hundreds of megabytes (ResNet-50: 28 KiB of model, 69 MiB of artifact). Such a
        # model's artifact is the portable one compiled without folding: each load folds and
        # packs, as ORT does on its own, and runs at full speed (computing those tensors at
        # every run instead would cost ResNet-50 about 1.5x its run time).
        stored = ort_artifact.unpack(artifact).stored_bytes
        held = _model_bytes(model)
        if stored > _EXPANSION * held + _EXPANSION_SLACK:
            unfolded = self._optimize(model, "extended", (), (_FOLDING,))
            assert unfolded is not None
            smaller = ort_artifact.unpack(unfolded).stored_bytes
            log.info(
                "model %r: ONNX Runtime's constant folding would store %.1f MiB of tensors "
                "for a model of %.1f MiB; compiled without it (%.1f MiB), it folds at each load",
                model.name,
                stored / 2**20,
                held / 2**20,
                smaller / 2**20,
            )
            if smaller < stored:
                artifact = unfolded
        return artifact

    def _engine_model(self, model: Model, so: ort.SessionOptions) -> tuple[bytes, list[np.ndarray]]:
        """The model as ORT reads it: its skeleton, the large weights handed over beside it
        on ``so`` (serializing them would cost a second per 400 MB); lowered to ORT's IR
        version and opset when it is newer and means the same there (``lower``;
        ``supported_nodes`` vouched for its nodes). The arrays ORT reads the weights from
        come back too: they must outlive the session's creation."""
        light = model.skeleton
        initializers = model.proto.graph.initializer
        dtypes = [ort_artifact.numpy_dtype(initializers[i].data_type) for i in light.stubbed]
        arrays: list[np.ndarray] = []
        names: list[str] = []
        if any(d is None for d in dtypes):  # a type NumPy cannot hand ORT: the model whole
            proto = model.proto
        else:
            # ORT drops an initializer nothing reads before it takes those given beside the
            # graph, then looks for that stub's data as a file: leave such stubs out.
            read = _names_read(model.proto.graph)
            unread = [i for i in light.stubbed if initializers[i].name not in read]
            proto = light.proto
            if unread:
                # Copied before stubs are dropped; without any to drop, not copied: a model
                # whose bytes are in node attributes (a tree ensemble) is as large as its
                # skeleton, and the copy cost 0.7 s of a 160 MB one.
                proto = onnx.ModelProto()
                proto.CopyFrom(light.proto)
                for i in reversed(unread):
                    del proto.graph.initializer[i]
            for i, dtype in zip(light.stubbed, dtypes, strict=True):
                weight = initializers[i]
                if weight.name in read:
                    names.append(weight.name)
                    arrays.append(np.frombuffer(weight.raw_data, dtype).reshape(weight.dims))
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
            so.add_external_initializers(names, values)
        given = set(names)
        for found in tensors.files_named(proto):  # a Model's proto may be edited after
            if not (found.main_initializer and found.tensor.name in given):
                raise InvalidModelError(
                    f"model {model.name!r}: the {found.where} keeps its bytes in the file "
                    f"{tensors.location(found.tensor)[:100]!r}; load the model with "
                    "crossrt.load_model, which reads such files from the model's folder",
                    details={"driver": self.name},
                )
        known = self._registry()
        onnx_opset = model.opsets.get("", model.opsets.get("ai.onnx", 0))
        if proto.ir_version > known.max_ir or onnx_opset > known.max_opset:
            proto = lower.lowered(proto, known.max_ir, known.max_opset)
        if proto is light.proto:  # serialized once, by validation where it could be
            return model.skeleton_bytes(), arrays
        return bytes(proto.SerializeToString()), arrays

    def _optimize(
        self, model: Model, level: str, features: tuple[str, ...], disabled: tuple[str, ...] = ()
    ) -> bytes | None:
        """ORT's optimized model at ``level``, packed as the artifact (``artifact``);
        ``None`` when ORT cannot load what it saved at level ALL (it happens: a model with
        a subgraph constant can come back in a form ORT's own checker refuses)."""
        # Named by its owner: a compile killed here leaves the folder (ORT writes files in
        # it), and the next process to compile removes it (spill.sweep).
        spill.sweep(COMPILE_PREFIX)
        with tempfile.TemporaryDirectory(prefix=spill.owned(COMPILE_PREFIX)) as tmp:
            out = Path(tmp) / "optimized.onnx"
            try:
                so = _save_options(level, out, self._severity)
                graph, weights = self._engine_model(model, so)
                support.new_session(graph, so, disabled_optimizers=list(disabled))
                del weights  # ORT has its own copy now
            except CrossrtError:
                raise
            except Exception as exc:
                raise CompileError(
                    f"ONNX Runtime {self.version} could not compile model {model.name!r}: "
                    f"{short_error(exc)}",
                    details={"driver": self.name},
                ) from None
            # Parsed from mappings: reading the files into bytes first costs a copy of them.
            with contextlib.ExitStack() as stack:
                model_view, data = (
                    _mapped(stack, path) if path.exists() and path.stat().st_size else None
                    for path in (out, out.parent / "weights.bin")
                )
                if model_view is None:
                    raise CompileError(f"ONNX Runtime wrote no optimized model for {model.name!r}")
                return ort_artifact.pack(model_view, data=data, level=level, features=features)

    def describe_artifact(self, artifact: bytes | memoryview) -> dict[str, str]:
        unpacked = ort_artifact.unpack(artifact)
        cpu = " ".join(unpacked.features) if unpacked.level == "all" else "any (portable)"
        return {"optimization": unpacked.level, "cpu": cpu}

    def artifact_weights(self, artifact: bytes | memoryview) -> list[dict[str, Any]] | None:
        """The weights stored beside the graph (small initializers stay inside it)."""
        unpacked = ort_artifact.unpack(artifact)
        packs = unpacked.prepacked or [[] for _ in unpacked.names]
        return [
            {
                "name": name,
                "dtype": str(array.dtype),
                "shape": list(array.shape),
                "bytes": array.nbytes,
                "offset": offset,
                "prepacked_bytes": sum(n for _, buffers in packed for _, n in buffers),
            }
            for name, array, offset, packed in zip(
                unpacked.names, unpacked.arrays, unpacked.offsets, packs, strict=True
            )
        ]

    def _loads(self, artifact: bytes, device: DeviceInfo, options: CompileOptions) -> bool:
        """Whether ``artifact`` loads as a ``.crm`` will: from a file, the weights and their
        pre-packed forms mapped from it, without optimizing again. One session checks both
        what ORT wrote (a model with a subgraph constant can come back in a form ORT's own
        checker refuses) and the artifact made of it; it was two (ORT's saved files, then the
        artifact from memory), each as slow to create as the model is large."""
        try:
            with spill.spilled(artifact) as file:
                self._load(artifact, device, CoreSet((0,)), options, file, fresh=True).close()
        except CrossrtError:
            return False
        return True

    def sharing(
        self, artifact: bytes | memoryview, file: ArtifactFile | None, loads: int
    ) -> contextlib.AbstractContextManager[ArtifactFile | None]:
        """ORT maps the weights of a file once for every session: an artifact held in memory
        for several instances is written to one owner-only file for their loads."""
        if file is None and loads > 1:
            return spill.spilled(artifact)
        return contextlib.nullcontext(file)

    def load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        *,
        file: ArtifactFile | None = None,
    ) -> Program:
        return self._load(artifact, device, cores, options, file)

    def _load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        file: ArtifactFile | None,
        *,
        fresh: bool = False,
    ) -> Program:
        """:meth:`load`; ``fresh``: ``artifact`` is the one this process just packed, whose
        graph ORT may take as it is (see :meth:`_model_and_weights`)."""
        so = ort.SessionOptions()
        mode = options.performance_mode
        threads = mode.threads(cores.threads)
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        pin = cores.pin
        if pin is not None and threads > 1:
            # One pool thread per core after the first, which is the calling thread's: ORT
            # never pins that one. Logical processors count from 1 in ORT's syntax.
            affinities = ";".join(str(cpu + 1) for cpu in pin[1:threads])
            so.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = self._severity
        if mode in (PerformanceMode.LOW, PerformanceMode.MEDIUM):
            # Less power: idle pool threads sleep instead of spin-waiting for work.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        _onnx_only(so)
        try:
            model, weights, mapped = self._model_and_weights(artifact, device, file, so, fresh)
        except CrossrtError:
            raise
        except Exception as exc:  # crossrt's own unpacking: the artifact, not ORT, is at fault
            raise InvalidContainerError(
                f"the onnxruntime artifact is damaged ({type(exc).__name__}: "
                f"{str(exc)[:200]}); recompile the model with `crossrt compile`",
                details={"driver": self.name},
            ) from None
        try:
            session = support.new_session(model, so, cuda.providers(device, options))
        except Exception as exc:
            raise CompileError(
                f"ONNX Runtime {self.version} could not load the artifact: {short_error(exc)}",
                details={"driver": self.name},
            ) from None
        if mapped and file is not None and not file.unchanged():
            raise CompileError(  # ORT read the weights from a path that now names another file
                f"the file {file.path!r} changed while the model was loading; load it again",
                details={"driver": self.name, "path": file.path},
            )
        if cuda.is_cuda(device):  # its tensors in the GPU's memory (gpu_program)
            cuda.check_session(session, device)
            return GpuProgram(session, gpu_memory.memory_of(device), severity=self._severity)
        return OrtProgram(session, weights=weights, severity=self._severity)

    # -- memory: a cuda:N device's own (gpu_memory); the host's for the CPU ---------------

    def coherent(self, device: DeviceInfo) -> bool:
        return not cuda.is_cuda(device)

    def allocate(self, device: DeviceInfo, nbytes: int) -> Any:
        if cuda.is_cuda(device):
            return gpu_memory.memory_of(device).allocate(nbytes)
        return super().allocate(device, nbytes)

    def free(self, device: DeviceInfo, buffer: Any) -> None:
        if cuda.is_cuda(device):
            gpu_memory.memory_of(device).free(buffer)
        else:
            super().free(device, buffer)

    def copy_in(self, device: DeviceInfo, dst: Any, src: memoryview, offset: int = 0) -> None:
        if cuda.is_cuda(device):
            gpu_memory.memory_of(device).copy_in(dst, src, offset)
        else:
            super().copy_in(device, dst, src, offset)

    def copy_out(self, device: DeviceInfo, dst: memoryview, src: Any, offset: int = 0) -> None:
        if cuda.is_cuda(device):
            gpu_memory.memory_of(device).copy_out(dst, src, offset)
        else:
            super().copy_out(device, dst, src, offset)

    def copy_device(
        self,
        device: DeviceInfo,
        dst: Any,
        src: Any,
        nbytes: int,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        if cuda.is_cuda(device):
            gpu_memory.memory_of(device).copy_device(dst, src, nbytes, dst_offset, src_offset)
        else:
            super().copy_device(device, dst, src, nbytes, dst_offset, src_offset)

    def address_of(self, device: DeviceInfo, buffer: Any) -> int | None:
        if cuda.is_cuda(device):
            return gpu_memory.memory_of(device).own(buffer, "address_of").pointer
        return None

    def wrap_address(self, device: DeviceInfo, address: int, nbytes: int, keep: Any) -> Any:
        if cuda.is_cuda(device):
            return gpu_memory.memory_of(device).adopt(address, nbytes, keep)
        return super().wrap_address(device, address, nbytes, keep)

    def _model_and_weights(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        file: ArtifactFile | None,
        so: ort.SessionOptions,
        fresh: bool = False,
    ) -> tuple[bytes, tuple[np.ndarray, ...], bool]:
        """The model bytes to create a session from, the weight arrays handed to ORT, and
        whether ORT maps the weights from ``file``.

        Sets the optimization level on ``so``, and where the weights come from. An artifact
        that is not ``fresh`` is untrusted: its graph is parsed, checked and serialized again
        (``artifact.parse_graph``); a fresh one without weights is handed to ORT as it is
        (its graph is ORT's own output, which ``artifact.pack`` left unchanged or wrote).
        """
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        unpacked = ort_artifact.unpack(artifact)
        if unpacked.level == "all":
            if unpacked.features != device.features:
                raise _other_cpu(unpacked.features, device)
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if file is not None and unpacked.names and file.unchanged():
            # ORT maps the weights from the file itself: one copy in the page cache for every
            # session and process, where in-memory initializers would each be copied.
            folder, name = os.path.split(file.path)
            so.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", folder
            )
            _warn_if_copied(unpacked, file)
            return ort_artifact.graph_reading(unpacked, name, file.offset), (), True
        # ORT copies initializers handed to it in memory (it never writes to them): a
        # read-only view of the mapping or of bytes is enough; graph_in_memory checked that
        # each matches the name, type and shape of its stub. A writable buffer (a bytearray
        # the caller loaded from) is copied first: its owner may overwrite it meanwhile.
        if fresh and not unpacked.names:
            return bytes(unpacked.graph), (), False
        graph = ort_artifact.graph_in_memory(unpacked)  # names no file ORT would read
        arrays = tuple(a.copy() if a.flags.writeable else a for a in unpacked.arrays)
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        so.add_external_initializers(unpacked.names, values)
        return graph, arrays, False


def _model_bytes(model: Model) -> int:
    """The bytes ``model`` holds: its graph and every tensor in it (without serializing the
    large weights again)."""
    light = model.skeleton
    initializers = model.proto.graph.initializer
    # The skeleton's bytes, not ByteSize(): protobuf's upb serializes the message to size it.
    return len(model.skeleton_bytes()) + sum(len(initializers[i].raw_data) for i in light.stubbed)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` reads: its inputs and outputs, every node's inputs, and those of
    the subgraphs its nodes hold (which may read the outer graph's initializers)."""
    names = {v.name for v in (*graph.input, *graph.output)}
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                names |= _names_read(sub)
    return names


def _save_options(level: str, out: Path, severity: int) -> ort.SessionOptions:
    """Options for a session that optimizes at ``level`` and saves the result to ``out``,
    logging from ``severity`` up."""
    so = ort.SessionOptions()
    _onnx_only(so)
    so.graph_optimization_level = _LEVELS[level]
    so.log_severity_level = severity
    so.optimized_model_filepath = str(out)
    if level == "all":
        # Large weights to a data file, with the forms ORT's kernels pack them into (only
        # this way does ORT save those). Not for the portable form: a data file can make ORT
        # save a model it then refuses (test_loop16_seq_none), and an artifact of level ALL
        # that does not load again is replaced by a portable one.
        so.add_session_config_entry(_SAVE_DATA, "weights.bin")
        so.add_session_config_entry(_SAVE_DATA_MIN, str(ort_artifact.THRESHOLD))
        so.add_session_config_entry(_SAVE_PREPACKED, "1")
    return so


def _onnx_only(so: ort.SessionOptions) -> None:
    """Have ORT read the bytes it is handed as ONNX, whatever they look like: it takes bytes
    with ``ORTM`` at offset 4 for its own ORT format otherwise, which a model can spell (a
    one-byte ir_version, then a producer name of ``ORTM...``) and crossrt never checked."""
    so.add_session_config_entry("session.load_model_format", "ONNX")


def _warn_if_copied(unpacked: ort_artifact.Unpacked, file: ArtifactFile) -> None:
    """Say so when ORT will copy pre-packed weights into the session instead of mapping them:
    it maps them only at aligned file offsets, which artifacts and containers written before
    crossrt aligned them to pages may not give (ORT itself says nothing)."""
    misplaced = sum(
        n
        for packs in unpacked.prepacked
        for _, spans in packs
        for offset, n in spans
        if (file.offset + offset) % ort_artifact.PREPACKED_FILE_ALIGN
    )
    if misplaced:
        log.warning(
            "%s: %.1f MiB of pre-packed weights lie at file offsets ONNX Runtime %s copies "
            "into every session instead of sharing (not multiples of %d); recompile the model "
            "with this crossrt and save it again to share them",
            file.path,
            misplaced / 2**20,
            ort.__version__,
            ort_artifact.PREPACKED_FILE_ALIGN,
        )


def _mapped(stack: contextlib.ExitStack, path: Path) -> memoryview:
    """A read-only view of the file at ``path``, closed with ``stack``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mapped = stack.enter_context(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)  # the mapping keeps its own descriptor
    return stack.enter_context(memoryview(mapped))


def _other_cpu(compiled: tuple[str, ...], device: DeviceInfo) -> UnsupportedError:
    missing = sorted(set(compiled) - set(device.features))
    extra = sorted(set(device.features) - set(compiled))
    diff = "; ".join(
        part
        for part in (
            f"this CPU lacks {', '.join(missing)}" if missing else "",
            f"this CPU adds {', '.join(extra)}" if extra else "",
        )
        if part
    )
    return UnsupportedError(
        f"the onnxruntime artifact was compiled for a CPU with {' '.join(compiled)} ({diff}); "
        "its layouts depend on them: recompile on this machine, or compile with "
        "portable=True (crossrt compile --portable) for any CPU of the architecture",
        code=StatusCode.UNSUPPORTED_NEFF_VERSION,
        details={"driver": "onnxruntime", "compiled_for": list(compiled)},
    )
