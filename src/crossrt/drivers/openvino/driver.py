"""The openvino driver: OpenVINO's CPU plugin (and its GPU and NPU plugins where present).

``compile`` converts the ONNX model with OpenVINO's ONNX frontend, compiles it for the device
(both in a worker process: ``isolated.py``) and stores OpenVINO's exported blob
(``CompiledModel.export_model``); ``load`` imports it
(``Core.import_model``) without converting or compiling again. Every model computes in its
own precision: OpenVINO's CPU plugin would run fp32 models in bf16 on CPUs that have it, so
``INFERENCE_PRECISION_HINT`` is set to f32 unless a reduced precision was asked for (or int8:
:func:`_precision`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import onnx
import openvino as ov

from ...errors import CompileError, InvalidContainerError
from ...model import Model
from ..base import (
    CPU_MODES,
    ArtifactFile,
    Capabilities,
    CompileOptions,
    CoreSet,
    DeviceInfo,
    DeviceKind,
    Driver,
    host_cpu,
)
from . import artifact as ov_artifact
from .isolated import Crashed, Worker
from .program import OpenVinoProgram, first_line
from .refusals import exact_infinities, refusals

_KINDS = {
    "CPU": ("cpu", DeviceKind.CPU),
    "GPU": ("gpu", DeviceKind.GPU),
    "NPU": ("npu", DeviceKind.ACCELERATOR),
}
_NODE_CACHE = 4096  # one-node models whose conversion was tried (see _node_reason)
_BLOBS_KEPT = 2  # whole models compiled by unsupported_reasons, for compile to reuse


class OpenVinoDriver(Driver):
    """OpenVINO (``pip install crossrt[openvino]``)."""

    name = "openvino"
    # Below reference too: what onnxruntime lacks still falls back to the exact reference
    # evaluator. openvino is chosen by name (driver="openvino"), or by `auto` where faster.
    preference = -10
    install_hint = "pip install openvino"

    def __init__(self) -> None:
        self._core = ov.Core()
        self._lock = threading.Lock()
        self._devices: dict[str, tuple[DeviceInfo, str]] | None = None
        self._node_reasons: OrderedDict[str, str | None] = OrderedDict()
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._worker = Worker()  # converts and compiles: OpenVINO may crash on a model

    @property
    def version(self) -> str:
        # The build, not only the release: an exported blob loads only in the same build.
        return f"{ov_artifact.FORMAT}+openvino-{ov.__version__.split('-releases')[0]}"

    # -- devices -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [info for info, _ in self._device_table().values()]

    def _device_table(self) -> dict[str, tuple[DeviceInfo, str]]:
        """crossrt's device id -> (its DeviceInfo, OpenVINO's device name)."""
        with self._lock:
            if self._devices is None:
                self._devices = {}
                for ov_name in self._core.available_devices:
                    abilities = _optimization_capabilities(self._core, ov_name)
                    caps = Capabilities(
                        fp16="FP16" in abilities,
                        bf16="BF16" in abilities,
                        # Threads per mode (docs/drivers.md); OpenVINO's MODEL_PRIORITY is for
                        # its GPU and AUTO plugins: no priorities.
                        performance_modes=CPU_MODES,
                        dynamic_shapes=True,
                        cache_export=True,
                    )
                    base, _, index = ov_name.partition(".")
                    prefix, kind = _KINDS.get(base, (base.lower(), DeviceKind.OTHER))
                    full = str(self._core.get_property(ov_name, "FULL_DEVICE_NAME"))
                    if kind is DeviceKind.CPU:
                        info = host_cpu(self.name, caps)
                        info = dataclasses.replace(info, name=full or info.name)
                    else:
                        info = DeviceInfo(
                            id=f"{prefix}:{index or 0}",
                            name=full,
                            vendor="Intel",
                            kind=kind,
                            driver=self.name,
                            cores=1,
                            memory_bytes=0,
                            capabilities=caps,
                            features=(ov_name,),
                        )
                    self._devices[info.id] = (info, ov_name)
            return self._devices

    def _ov_device(self, device: DeviceInfo) -> str:
        found = self._device_table().get(device.id)
        if found is None:
            raise InvalidContainerError(
                f"openvino has no device {device.id}; its devices are "
                f"{', '.join(self._device_table()) or 'none'}",
                details={"driver": self.name},
            )
        return found[1]

    # -- what OpenVINO can run ---------------------------------------------------------------

    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        return [reason is None for reason in self.unsupported_reasons(model, device)]

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        """Per node: ``None`` when OpenVINO converts it, its plugin has a kernel for it
        (``Core.query_model``) and the plugin compiles it, else why not. The whole model is
        tried first (its compiled blob kept for :meth:`compile`); when it fails, each node
        alone."""
        target = self._ov_device(device)
        missing = [self._no_converter(model, i, target) for i in range(len(model.nodes))]
        if not any(refusals(model, whole=True)) and not any(missing):
            try:
                self._compiled_blob(model, target, _precision(model, device, None))
                return [None] * len(model.nodes)
            except CompileError:  # the reasons come from the nodes, one by one
                pass
        refused = refusals(model)
        types = model.value_types()
        return [
            why or gone or self._node_reason(model, i, target, types)
            for i, (why, gone) in enumerate(zip(refused, missing, strict=True))
        ]

    def _no_converter(self, model: Model, index: int, target: str) -> str | None:
        """Why OpenVINO's ONNX frontend has no converter for node ``index``, asked of the
        operator alone (no attributes, no weights: a few hundred bytes), for operators outside
        the ONNX domain only (``ai.onnx.ml``, ``com.microsoft``), where OpenVINO lacks many.
        Without it a 185 MB tree ensemble was sent whole, then again as its one node, to be
        refused (19 s)."""
        node = model.nodes[index]
        if node.domain in ("", "ai.onnx"):
            return None
        opset = model.opsets.get(node.domain, 1)
        key = f"no-converter:{target}:{node.domain}:{opset}:{node.op_type}"
        with self._lock:
            if key in self._node_reasons:
                return self._node_reasons[key]
        bare = onnx.helper.make_node(
            node.op_type, [f"in{i}" for i, _ in enumerate(node.input)], ["out"], domain=node.domain
        )
        inputs = [
            onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in bare.input
        ]
        graph = onnx.helper.make_graph([bare], "bare", inputs, [onnx.ValueInfoProto(name="out")])
        proto = onnx.helper.make_model(graph, opset_imports=list(model.proto.opset_import))
        proto.ir_version = model.proto.ir_version
        try:
            stage, error = self._worker.check_node(proto.SerializeToString(), target, _config(1))
        except Crashed:
            stage, error = "crash", ""
        reason = None
        if stage == "convert" and "No conversion rule found" in error:  # as _node_reason says
            reason = f"OpenVINO's ONNX frontend cannot convert {node.op_type}: {first_line(error)}"
        _remember(self._node_reasons, key, reason, _NODE_CACHE, self._lock)
        return reason

    def _compiled_blob(self, model: Model, target: str, precision: str | None = None) -> bytes:
        """OpenVINO's exported blob of the whole model, compiled in the worker process and
        kept for the next call with the same model (unsupported_reasons, then compile,
        compile it once).

        Raises:
            CompileError: OpenVINO refused the model, or crashed on it.
        """
        key = f"{target}:{precision}:{model.content_hash}"
        with self._lock:
            blob = self._blobs.get(key)
        if blob is not None:
            return blob
        try:
            config = _config(1, precision)
            blob, error = self._worker.compile(exact_infinities(model), target, config)
        except Crashed as exc:
            error = str(exc)
        if not blob:
            raise CompileError(
                f"OpenVINO {self.version} could not compile model {model.name!r}: "
                f"{first_line(error)}",
                details={"driver": self.name},
            )
        _remember(self._blobs, key, blob, _BLOBS_KEPT, self._lock)
        return blob

    def _node_reason(
        self, model: Model, index: int, target: str, types: Mapping[str, onnx.TypeProto]
    ) -> str | None:
        """Whether OpenVINO converts, places and compiles node ``index`` alone (its constant
        inputs kept: OpenVINO needs some, a Reshape's shape, as constants)."""
        data = model.node_alone(index, types)
        key = hashlib.sha256(target.encode() + data).hexdigest()
        with self._lock:
            if key in self._node_reasons:
                return self._node_reasons[key]
        op = model.nodes[index].op_type
        try:
            stage, error = self._worker.check_node(data, target, _config(1))
        except Crashed:
            stage, error = "crash", ""
        reason = {
            "": None,
            "convert": f"OpenVINO's ONNX frontend cannot convert {op}: {first_line(error)}",
            "place": f"OpenVINO's {target} plugin has no kernel for {op} here",
            "compile": f"OpenVINO's {target} plugin cannot compile {op}: {first_line(error)}",
            "crash": f"OpenVINO crashed compiling {op} here",
        }[stage]
        _remember(self._node_reasons, key, reason, _NODE_CACHE, self._lock)
        return reason

    # -- compile and load --------------------------------------------------------------------

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        precision = _precision(model, device, options.precision)
        blob = self._compiled_blob(model, self._ov_device(device), precision)
        inputs = [s.name for s in model.inputs]
        outputs = [s.name for s in model.outputs]
        kept = None if precision == options.precision else precision
        return ov_artifact.pack(blob, inputs, outputs, kept)

    def load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        *,
        file: ArtifactFile | None = None,
    ) -> OpenVinoProgram:
        unpacked = ov_artifact.unpack(artifact)
        target = self._ov_device(device)
        try:
            threads = options.performance_mode.threads(cores.threads)
            config = _config(threads, unpacked.precision or options.precision)
            compiled = self._core.import_model(bytes(unpacked.blob), target, config)
        except Exception as exc:
            raise InvalidContainerError(
                f"OpenVINO {self.version} could not import the artifact ({first_line(exc)}): it "
                "is damaged or from another OpenVINO build or CPU; recompile the model",
                details={"driver": self.name},
            ) from None
        inputs = _order(compiled.inputs, unpacked.inputs, "input")
        outputs = _order(compiled.outputs, unpacked.outputs, "output")
        return OpenVinoProgram(compiled, inputs, outputs)


_HINTS = {None: "f32", "fp32": "f32", "bf16": "bf16", "fp16": "f16"}
_QUANTIZED = "crossrt.quantization"  # compiler/calibrate.py's METADATA_KEY (drivers come first)


def _precision(model: Model, device: DeviceInfo, asked: str | None) -> str | None:
    """The precision OpenVINO computes in: the one asked for, except for a model that
    ``precision="int8"`` quantized (its metadata says so), whose layers that are not int8
    (normalization, softmax, GELU, attention's products, the Q/DQ themselves) compute in
    bf16 where the CPU has it: int8 was asked for, and bf16 is above it. On this project's
    EPYC (AVX512-BF16) a BERT-like encoder's int8 took 0.65x of its bf16 time this way
    against 0.77x with the rest in f32, its error 0.309 against 0.301 (max abs)."""
    quantized = any(p.key == _QUANTIZED for p in model.proto.metadata_props)
    if asked is None and quantized and device.capabilities.bf16:
        return "bf16"
    return asked


def _config(threads: int, precision: str | None = None) -> dict[str, Any]:
    """The plugin settings: the precision asked for (f32, the model's own, unless a reduced
    one is asked for by name: OpenVINO's own default is bf16 where the CPU has it), one
    stream of ``threads`` threads. OpenVINO cannot pin its threads to CPUs crossrt names, so
    it pins none."""
    return {
        "INFERENCE_PRECISION_HINT": _HINTS[precision],
        "INFERENCE_NUM_THREADS": max(1, threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,
    }


def _optimization_capabilities(core: Any, device: str) -> set[str]:
    try:
        return {str(c) for c in core.get_property(device, "OPTIMIZATION_CAPABILITIES")}
    except Exception:  # a plugin that does not say: claim nothing beyond fp32
        return set()


def _order(ports: Any, names: tuple[str, ...], what: str) -> list[str]:
    """The model's names in the compiled model's port order: by the names OpenVINO keeps on
    each port, else by position (OpenVINO keeps the graph's order, and may rename a tensor
    its optimizations merged with another: Dropout's output is its input). OpenVINO drops
    inputs nothing reads (CastLike's ``like`` gives only a type): those are never fed."""
    ports = list(ports)
    ordered: list[str] = []
    for port in ports:
        known = [n for n in names if n in port.get_names() and n not in ordered]
        # Unnamed: the next of the model's names, in order (OpenVINO keeps the graph's).
        after = names.index(ordered[-1]) + 1 if ordered else 0
        rest = [n for n in names[after:] if n not in ordered]
        if known or rest:
            ordered.append(known[0] if known else rest[0])
        else:
            raise InvalidContainerError(
                f"the openvino artifact's {what} {port.get_any_name()!r} is none of the "
                f"model's {what}s {list(names)}; recompile the model",
                details={"driver": "openvino"},
            )
    return ordered


def _remember(cache: OrderedDict[str, Any], key: str, value: Any, most: int, lock: Any) -> None:
    """Keep ``value`` under ``key``, dropping the oldest entries past ``most``."""
    with lock:
        cache[key] = value
        while len(cache) > most:
            cache.popitem(last=False)
