"""The ``onnxruntime`` driver: ONNX Runtime's CPU execution provider.

- ``supported_nodes`` looks each node up in ORT's own kernel registry (by domain, operator,
  opset version and the node's input and output types), honours ORT's ONNX function
  inlining, and knows the newest IR version and opsets this ORT build accepts.
- ``compile`` runs ORT's portable graph optimizations (level EXTENDED, no hardware-specific
  layouts) and returns the optimized ONNX model as the artifact.
- ``load`` creates a session with as many intra-op threads as cores it is given.
- ``run`` calls the session's C++ ``run`` directly: it is the cheapest path from NumPy inputs
  (cheaper than ``InferenceSession.run``, which re-validates inputs the runtime already
  checked, and than building an IOBinding per call); preallocated outputs go through
  IOBinding so results land in the caller's buffers.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ..errors import CompileError, ExecutionError
from ..model import Model
from .base import (
    Capabilities,
    CompileOptions,
    DeviceInfo,
    Driver,
    PerformanceMode,
    Program,
)
from .host import host_cpu

_PROVIDER = "CPUExecutionProvider"
_KernelRange = tuple[int, int, dict[str, list[str]]]


class OnnxRuntimeDriver(Driver):
    """ONNX Runtime, CPU execution provider."""

    name = "onnxruntime"
    preference = 100

    def __init__(self) -> None:
        # ORT's console warnings would interleave with the user's output; errors still raise.
        ort.set_default_logger_severity(3)
        self._lock = threading.Lock()
        self._kernels: dict[tuple[str, str], list[_KernelRange]] | None = None
        self._limits: tuple[int, int] | None = None

    @property
    def version(self) -> str:
        return str(ort.__version__)

    def devices(self) -> list[DeviceInfo]:
        caps = Capabilities(performance_modes=tuple(PerformanceMode), cache_export=True)
        return [host_cpu(self.name, caps)]

    # -- what ORT can run ----------------------------------------------------------------

    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        return [reason is None for reason in self.unsupported_reasons(model, device)]

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        """Per node: ``None`` when ORT can run it, else why not."""
        kernels, (max_ir, max_opset) = self._registry()
        nodes = model.nodes
        if model.proto.ir_version > max_ir:
            why = f"IR version {model.proto.ir_version} is newer than ORT {self.version} reads"
            return [f"{why} (max {max_ir})"] * len(nodes)
        onnx_opset = model.opsets.get("", model.opsets.get("ai.onnx", 0))
        if onnx_opset > max_opset:
            why = f"ai.onnx opset {onnx_opset} is newer than ORT {self.version} supports"
            return [f"{why} (max {max_opset})"] * len(nodes)
        types = model.value_types()
        return [_node_reason(node, model.opsets, types, kernels, depth=0) for node in nodes]

    def _registry(self) -> tuple[dict[tuple[str, str], list[_KernelRange]], tuple[int, int]]:
        with self._lock:
            if self._kernels is None:
                kernels: dict[tuple[str, str], list[_KernelRange]] = {}
                for k in ort.capi._pybind_state.get_all_opkernel_def():
                    if k.provider != _PROVIDER:
                        continue
                    domain = "" if k.domain in ("", "ai.onnx") else k.domain
                    start, end = k.version_range
                    kernels.setdefault((domain, k.op_name), []).append(
                        (start, end, dict(k.type_constraints))
                    )
                self._kernels = kernels
                self._limits = _probe_limits()
            assert self._limits is not None
            return self._kernels, self._limits

    # -- compile and load ----------------------------------------------------------------

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        so = ort.SessionOptions()
        # EXTENDED, not ALL: ALL adds layouts tied to this CPU's instruction set, and the
        # artifact must stay portable; the load applies the rest on the target machine.
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.log_severity_level = 3
        with tempfile.TemporaryDirectory(prefix="crossrt-ort-") as tmp:
            out = Path(tmp) / "optimized.onnx"
            so.optimized_model_filepath = str(out)
            try:
                ort.InferenceSession(model.to_bytes(), so, providers=[_PROVIDER])
            except Exception as exc:
                raise CompileError(
                    f"ONNX Runtime {self.version} could not compile model {model.name!r}: "
                    f"{_short(exc)}",
                    details={"driver": self.name},
                ) from None
            return out.read_bytes()

    def load(
        self,
        artifact: bytes,
        device: DeviceInfo,
        cores: Sequence[int],
        options: CompileOptions,
    ) -> Program:
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, len(cores))
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        if options.performance_mode is PerformanceMode.LOW:
            # Low power: idle pool threads sleep instead of spin-waiting for work.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(artifact, so, providers=[_PROVIDER])
        except Exception as exc:
            raise CompileError(
                f"ONNX Runtime {self.version} could not load the artifact: {_short(exc)}",
                details={"driver": self.name},
            ) from None
        return OrtProgram(session)


class OrtProgram(Program):
    """An ORT session ready to run."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self._output_names = [o.name for o in session.get_outputs()]
        self._run = session._sess.run  # the C++ entry point; see the module docstring
        self._run_options = ort.RunOptions()

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        if outputs:
            return self._run_bound(inputs, outputs)
        try:
            results = self._run(self._output_names, inputs, self._run_options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {_short(exc)}") from None
        return dict(zip(self._output_names, results, strict=True))

    def _run_bound(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_cpu_input(name, value)
        for name in self._output_names:
            out = outputs.get(name)
            if out is None:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        try:
            self.session.run_with_iobinding(binding, self._run_options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {_short(exc)}") from None
        produced = binding.get_outputs()
        result: dict[str, np.ndarray] = {}
        for name, value in zip(self._output_names, produced, strict=True):
            given = outputs.get(name)
            result[name] = given if given is not None else value.numpy()
        return result

    def close(self) -> None:
        del self._run
        del self.session


def _node_reason(
    node: onnx.NodeProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    kernels: Mapping[tuple[str, str], list[_KernelRange]],
    depth: int,
) -> str | None:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain, opsets.get("ai.onnx", 0) if domain == "" else 0)
    ranges = [r for r in kernels.get((domain, node.op_type), []) if r[0] <= version <= r[1]]
    schema = _schema(node.op_type, version, domain)
    if not ranges:
        # ORT inlines an ONNX function when it has no kernel for the operator.
        expandable = schema is not None and (
            schema.has_function or schema.has_context_dependent_function
        )
        if expandable and depth < 4:
            return _function_reason(node, schema, version, opsets, types, kernels, depth)
        where = f"{domain or 'ai.onnx'} opset {version}"
        return f"ONNX Runtime has no CPU kernel for {node.op_type} ({where})"
    if schema is None:
        return None
    bound = _bind_types(node, schema, types)
    for _, _, constraints in ranges:
        if all(t not in constraints or s in constraints[t] for t, s in bound.items()):
            return None
    given = ", ".join(f"{t}={s}" for t, s in sorted(bound.items()))
    return f"ONNX Runtime has no CPU kernel for {node.op_type} with types {given}"


def _function_reason(
    node: onnx.NodeProto,
    schema: Any,
    version: int,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    kernels: Mapping[tuple[str, str], list[_KernelRange]],
    depth: int,
) -> str | None:
    body: onnx.FunctionProto | None = None
    if schema.has_function:
        body = schema.function_body
    else:
        in_types = [types[i] if i in types else onnx.TypeProto() for i in node.input]
        try:
            raw = schema.get_context_dependent_function(
                node.SerializeToString(), [t.SerializeToString() for t in in_types]
            )
            body = onnx.FunctionProto.FromString(raw)
        except Exception:
            return None  # cannot expand here; ORT may still, so do not refuse the node
    if body is None:
        return None
    inner_opsets = {**opsets, **{(o.domain or ""): o.version for o in body.opset_import}}
    for inner in body.node:
        why = _node_reason(inner, inner_opsets, {}, kernels, depth + 1)
        if why is not None:
            return f"{node.op_type} is an ONNX function and its body needs: {why}"
    return None


def _schema(op_type: str, version: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _bind_types(
    node: onnx.NodeProto, schema: Any, types: Mapping[str, onnx.TypeProto]
) -> dict[str, str]:
    """Map the schema's type parameters (``T``) to the node's actual type strings."""
    bound: dict[str, str] = {}
    for formals, actuals in ((schema.inputs, node.input), (schema.outputs, node.output)):
        for i, name in enumerate(actuals):
            if not formals or not name:
                continue
            formal = formals[min(i, len(formals) - 1)]
            if i >= len(formals) and formal.option != formal.option.Variadic:
                continue
            t = types.get(name)
            if t is not None and (text := _type_string(t)):
                bound.setdefault(formal.type_str, text)
    return bound


def _type_string(t: onnx.TypeProto) -> str | None:
    which = t.WhichOneof("value")
    if which == "tensor_type":
        if not t.tensor_type.elem_type:
            return None
        return f"tensor({onnx.TensorProto.DataType.Name(t.tensor_type.elem_type).lower()})"
    if which == "sequence_type":
        inner = _type_string(t.sequence_type.elem_type)
        return f"seq({inner})" if inner else None
    if which == "optional_type":
        inner = _type_string(t.optional_type.elem_type)
        return f"optional({inner})" if inner else None
    return None


def _probe_limits() -> tuple[int, int]:
    """The newest (IR version, ai.onnx opset) this ORT build accepts, found by trying."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    so = ort.SessionOptions()
    so.log_severity_level = 4

    def accepts(ir: int, opset: int) -> bool:
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = ir or helper.find_min_ir_version_for(opsets)
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=[_PROVIDER])
        except Exception:
            return False
        return True

    max_opset = next((v for v in range(onnx.defs.onnx_opset_version(), 6, -1) if accepts(0, v)), 7)
    max_ir = next((v for v in range(onnx.IR_VERSION, 3, -1) if accepts(v, 7)), 7)
    return max_ir, max_opset


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
