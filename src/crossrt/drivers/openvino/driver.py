"""The openvino driver: OpenVINO's CPU plugin (and its GPU and NPU plugins where present).

``compile`` converts the ONNX model with OpenVINO's ONNX frontend, compiles it for the device
and stores OpenVINO's exported blob (``CompiledModel.export_model``); ``load`` imports it
(``Core.import_model``) without converting or compiling again. Every model computes in its
own precision: OpenVINO's CPU plugin would run fp32 models in bf16 on CPUs that have it, so
``INFERENCE_PRECISION_HINT`` is always set to f32.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import Any

import onnx
import openvino as ov

from ...errors import CompileError, CrossrtError, InvalidContainerError
from ...model import Model
from ..base import (
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
from .program import OpenVinoProgram

log = logging.getLogger("crossrt")

_KINDS = {
    "CPU": ("cpu", DeviceKind.CPU),
    "GPU": ("gpu", DeviceKind.GPU),
    "NPU": ("npu", DeviceKind.ACCELERATOR),
}
_NODE_CACHE = 4096  # one-node models whose conversion was tried (see _node_reason)


class OpenVinoDriver(Driver):
    """OpenVINO (``pip install crossrt[openvino]``)."""

    name = "openvino"
    preference = 50  # below onnxruntime: chosen by name, or by `auto` where it is faster
    install_hint = "pip install openvino"

    def __init__(self) -> None:
        self._core = ov.Core()
        self._lock = threading.Lock()
        self._devices: dict[str, tuple[DeviceInfo, str]] | None = None
        self._node_reasons: OrderedDict[str, str | None] = OrderedDict()

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
                caps = Capabilities(dynamic_shapes=True, cache_export=True)
                for ov_name in self._core.available_devices:
                    base, _, index = ov_name.partition(".")
                    prefix, kind = _KINDS.get(base, (base.lower(), DeviceKind.OTHER))
                    full = str(self._core.get_property(ov_name, "FULL_DEVICE_NAME"))
                    if kind is DeviceKind.CPU:
                        info = host_cpu(self.name, caps)
                        info = _replace(info, name=full or info.name)
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
        """Per node: ``None`` when OpenVINO converts it and its plugin has a kernel for it
        (``Core.query_model``), else why not."""
        target = self._ov_device(device)
        try:
            converted = self._core.read_model(model.to_bytes())
        except Exception:  # the frontend fails on some node: find which, one by one
            return [self._node_reason(model, i, target) for i in range(len(model.nodes))]
        try:
            placed = self._core.query_model(converted, target)
        except Exception as exc:
            why = f"OpenVINO's {target} plugin cannot take the model: {_first_line(exc)}"
            return [why] * len(model.nodes)
        names = {op.get_friendly_name() for op in converted.get_ops()}
        reasons: list[str | None] = []
        for node in model.nodes:
            ops = [n for n in (node.name, *node.output) if n in names]
            missing = [n for n in ops if n not in placed]
            reasons.append(
                f"OpenVINO's {target} plugin has no kernel for {node.op_type} here"
                if missing
                else None
            )
        return reasons

    def _node_reason(self, model: Model, index: int, target: str) -> str | None:
        """Whether OpenVINO converts and runs node ``index`` alone (its constant inputs kept:
        OpenVINO needs some, a Reshape's shape, as constants)."""
        data = _one_node_model(model, index)
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._node_reasons:
                return self._node_reasons[key]
        node = model.nodes[index]
        try:
            converted = self._core.read_model(data)
            placed = self._core.query_model(converted, target)
            missing = [op for op in converted.get_ops() if op.get_friendly_name() not in placed]
            reason = (
                f"OpenVINO's {target} plugin has no kernel for {node.op_type} here"
                if missing
                else None
            )
        except Exception as exc:
            reason = f"OpenVINO's ONNX frontend cannot convert {node.op_type}: {_first_line(exc)}"
        with self._lock:
            self._node_reasons[key] = reason
            while len(self._node_reasons) > _NODE_CACHE:
                self._node_reasons.popitem(last=False)
        return reason

    # -- compile and load --------------------------------------------------------------------

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        target = self._ov_device(device)
        try:
            converted = self._core.read_model(model.to_bytes())
            compiled = self._core.compile_model(converted, target, _config(1))
            blob = compiled.export_model().getvalue()
        except CrossrtError:
            raise
        except Exception as exc:
            raise CompileError(
                f"OpenVINO {self.version} could not compile model {model.name!r}: "
                f"{_first_line(exc)}",
                details={"driver": self.name},
            ) from None
        inputs = [s.name for s in model.inputs]
        outputs = [s.name for s in model.outputs]
        return ov_artifact.pack(bytes(blob), inputs, outputs)

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
            compiled = self._core.import_model(bytes(unpacked.blob), target, _config(cores.threads))
        except Exception as exc:
            raise InvalidContainerError(
                f"OpenVINO {self.version} could not import the artifact ({_first_line(exc)}): it "
                "is damaged or from another OpenVINO build or CPU; recompile the model",
                details={"driver": self.name},
            ) from None
        inputs = _order(compiled.inputs, unpacked.inputs, "input")
        outputs = _order(compiled.outputs, unpacked.outputs, "output")
        return OpenVinoProgram(compiled, inputs, outputs)


def _config(threads: int) -> dict[str, Any]:
    """The plugin settings: the model's own precision, one stream of ``threads`` threads.
    OpenVINO cannot pin its threads to CPUs crossrt names, so it pins none."""
    return {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": max(1, threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,
    }


def _order(ports: Any, names: tuple[str, ...], what: str) -> list[str]:
    """The model's names in the compiled model's port order."""
    ordered = []
    for port in ports:
        known = [n for n in names if n in port.get_names()]
        if not known:
            raise InvalidContainerError(
                f"the openvino artifact's {what} {port.get_any_name()!r} is none of the model's "
                f"{what}s {list(names)}; recompile the model",
                details={"driver": "openvino"},
            )
        ordered.append(known[0])
    return ordered


def _one_node_model(model: Model, index: int) -> bytes:
    """Node ``index`` of ``model`` as a model of its own, its typed inputs as graph inputs
    (initializers kept as they are), its outputs as graph outputs."""
    node = model.nodes[index]
    graph = model.proto.graph
    weights = {t.name: t for t in graph.initializer}
    types = model.value_types()
    inputs, initializers = [], []
    for name in dict.fromkeys(n for n in node.input if n):
        if name in weights:
            initializers.append(weights[name])
        elif name in types:
            inputs.append(onnx.helper.make_value_info(name, types[name]))
    outputs = [
        onnx.helper.make_value_info(name, types[name])
        if name in types
        else onnx.ValueInfoProto(name=name)
        for name in node.output
        if name
    ]
    one = onnx.helper.make_graph([node], "one_node", inputs, outputs, initializer=initializers)
    proto = onnx.helper.make_model(one, opset_imports=list(model.proto.opset_import))
    proto.ir_version = model.proto.ir_version
    proto.functions.extend(model.proto.functions)
    return bytes(proto.SerializeToString())


def _replace(info: DeviceInfo, **changes: Any) -> DeviceInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)


def _first_line(exc: BaseException) -> str:
    """The line of an OpenVINO error that says what is wrong (its first lines name source
    files and failed checks)."""
    lines = [line.strip(" -") for line in str(exc).splitlines() if line.strip()]
    noise = ("Exception from src/", "Check '", "FrontEnd API failed", "Model wasn't", "Summary:")
    useful = [line for line in lines if not line.startswith(noise)]
    return ((useful or lines or [type(exc).__name__])[0])[:300]
