"""The ``onnxruntime`` driver: ONNX Runtime's CPU execution provider.

- ``supported_nodes`` decides as an ORT session would: it resolves each node against ORT's
  own operator schemas (which may be older than the ``onnx`` package's), looks it up in
  ORT's kernel registry (by domain, operator version and the node's input and output types,
  with ORT's version matching), and otherwise follows ORT's fallbacks: Constant nodes become
  initializers, ONNX functions are inlined (their bodies checked with inferred types), and
  float16 nodes run in float32 between inserted Casts. It knows the newest IR version and
  opsets this ORT build accepts.
- ``compile`` runs ORT's portable graph optimizations (level EXTENDED, no hardware-specific
  layouts) and returns the optimized ONNX model, its large weights stored beside the graph
  (``ort_artifact``), as the artifact.
- ``load`` creates a session with as many intra-op threads as cores it is given, from the
  small graph, handing ORT the weights as views of the artifact (of the ``.crm`` mapping).
- ``run`` calls the session's C++ ``run`` directly: it is the cheapest path from NumPy inputs
  (cheaper than ``InferenceSession.run``, which re-validates inputs the runtime already
  checked, and than building an IOBinding per call); preallocated outputs go through
  IOBinding so results land in the caller's buffers.
"""

from __future__ import annotations

import mmap
import operator
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
from onnx import helper

from ..errors import CompileError, CrossrtError, DeadlineExceededError, ExecutionError
from ..model import Model
from . import ort_artifact
from .base import (
    CancelToken,
    Capabilities,
    CompileOptions,
    DeviceInfo,
    Driver,
    PerformanceMode,
    Program,
)
from .host import host_cpu

_PROVIDER = "CPUExecutionProvider"
# ONNX element types NumPy has only through ml_dtypes: bfloat16 and newer (16 and up).
_UNEXCHANGEABLE = frozenset(range(onnx.TensorProto.BFLOAT16, 64))
_C = ort.capi._pybind_state
_CPU = _C.OrtDevice(_C.OrtDevice.cpu(), _C.OrtDevice.default_memory(), 0)
_KernelRange = tuple[int, int, dict[str, list[str]]]
_FLOAT16 = "tensor(float16)"
_INT_MAX = 2**31 - 1  # the end version of a kernel registered without one
_PROBE = 16  # how often a run whose arrays keep changing still offers its binding for reuse


@dataclass(frozen=True)
class _OrtRegistry:
    """What this ORT build knows: its CPU kernels, its own operator schemas and its limits.

    ORT resolves a node against the ONNX schemas compiled into it, which may be older than
    the ``onnx`` package's; ``schemas`` holds each operator's versions, oldest first.
    """

    kernels: dict[tuple[str, str], list[_KernelRange]]
    schemas: dict[tuple[str, str], list[Any]]
    max_ir: int
    max_opset: int


class OnnxRuntimeDriver(Driver):
    """ONNX Runtime, CPU execution provider."""

    name = "onnxruntime"
    preference = 100

    def __init__(self) -> None:
        # ORT's console warnings would interleave with the user's output; errors still raise.
        ort.set_default_logger_severity(3)
        self._lock = threading.Lock()
        self._known: _OrtRegistry | None = None

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
        known = self._registry()
        nodes = model.nodes
        if model.proto.ir_version > known.max_ir:
            why = f"IR version {model.proto.ir_version} is newer than ORT {self.version} reads"
            return [f"{why} (max {known.max_ir})"] * len(nodes)
        onnx_opset = model.opsets.get("", model.opsets.get("ai.onnx", 0))
        if onnx_opset > known.max_opset:
            why = f"ai.onnx opset {onnx_opset} is newer than ORT {self.version} supports"
            return [f"{why} (max {known.max_opset})"] * len(nodes)
        types = model.value_types()
        reasons = [_node_reason(node, model.opsets, types, known, depth=0) for node in nodes]
        # ORT's Python binding cannot take or return NumPy arrays of ml_dtypes' types
        # (bfloat16, float8, int4...), so nodes reading or writing such a graph input or output
        # cannot run here, even with a kernel; inside the graph those types are fine.
        boundary = {
            v.name: v.type.tensor_type.elem_type
            for v in (*model.proto.graph.input, *model.proto.graph.output)
            if v.type.tensor_type.elem_type in _UNEXCHANGEABLE
        }
        if boundary:
            for i, node in enumerate(nodes):
                touched = [v for v in (*node.input, *node.output) if v in boundary]
                if touched and reasons[i] is None:
                    kind = onnx.TensorProto.DataType.Name(boundary[touched[0]]).lower()
                    reasons[i] = (
                        f"ONNX Runtime's Python API cannot pass {kind} tensors such as "
                        f"{touched[0]!r} in or out of a session"
                    )
        return reasons

    def _registry(self) -> _OrtRegistry:
        with self._lock:
            if self._known is None:
                state = ort.capi._pybind_state
                kernels: dict[tuple[str, str], list[_KernelRange]] = {}
                for k in state.get_all_opkernel_def():
                    if k.provider != _PROVIDER:
                        continue
                    start, end = k.version_range
                    kernels.setdefault((_domain(k.domain), k.op_name), []).append(
                        (start, end, dict(k.type_constraints))
                    )
                schemas: dict[tuple[str, str], list[Any]] = {}
                for schema in state.get_all_operator_schema():
                    schemas.setdefault((_domain(schema.domain), schema.name), []).append(schema)
                for versions in schemas.values():
                    versions.sort(key=lambda sc: sc.since_version)
                max_ir, max_opset = _probe_limits()
                self._known = _OrtRegistry(kernels, schemas, max_ir, max_opset)
            return self._known

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
            # Large weights go beside the graph so that a load can map them (ort_artifact).
            # Parsed from a mapping: reading the file into bytes first costs a copy of it.
            with (
                open(out, "rb") as f,
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as view,
            ):
                return ort_artifact.pack(view)

    def load(
        self,
        artifact: bytes | memoryview,
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
            model, weights = _model_and_weights(artifact, so)
            session = ort.InferenceSession(model, so, providers=[_PROVIDER])
        except CrossrtError:
            raise
        except Exception as exc:
            raise CompileError(
                f"ONNX Runtime {self.version} could not load the artifact: {_short(exc)}",
                details={"driver": self.name},
            ) from None
        return OrtProgram(session, weights=weights)


class OrtProgram(Program):
    """An ORT session ready to run."""

    def __init__(
        self, session: ort.InferenceSession, *, weights: tuple[np.ndarray, ...] = ()
    ) -> None:
        self.session = session
        # The weights ORT reads where they lie (views of the artifact): kept while it runs.
        self.weights = weights
        self._output_names = [o.name for o in session.get_outputs()]
        self._run = session._sess.run  # the C++ entry point; see the module docstring
        self._run_options = ort.RunOptions()
        self._reuse = threading.local()  # per thread: the last binding _run_bound may reuse
        self._run_binding = session._sess.run_with_iobinding

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

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        if outputs:  # IOBinding runs share the program's options: not cancellable
            return self._run_bound(inputs, outputs)
        # Per call: terminate set on shared options would stop every concurrent call.
        options = ort.RunOptions()
        cancel.on_cancel(lambda: setattr(options, "terminate", True))
        try:
            results = self._run(self._output_names, inputs, options)
        except Exception as exc:
            if cancel.cancelled:
                raise DeadlineExceededError(
                    "ONNX Runtime stopped the call: its execution timeout expired; raise "
                    "exec_timeout (or CROSSRT_EXEC_TIMEOUT) or give the model more cores"
                ) from None
            raise ExecutionError(f"ONNX Runtime failed to run: {_short(exc)}") from None
        return dict(zip(self._output_names, results, strict=True))

    def _run_bound(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        # A binding costs 6 µs or more to build; the same arrays again (the same objects under
        # the same names, with the same shapes and dtypes: a shape can be set in place) reuse
        # this thread's last one, as a caller of ORT's own IOBinding would.
        last = getattr(self._reuse, "last", None)  # (arrays, signature, names, binding, misses)
        binding = None
        if last is not None and last[0]:
            arrays = (*inputs.values(), *outputs.values())
            if (
                len(arrays) == len(last[0])
                and all(map(operator.is_, arrays, last[0]))
                and [(a.shape, a.dtype) for a in arrays] == last[1]
                and (*inputs, *outputs) == last[2]
            ):
                binding = last[3]
                if last[4]:
                    self._reuse.last = (*last[:4], 0)  # reused: the miss streak is over
        if binding is None:
            try:
                binding = self._bind(inputs, outputs, 0 if last is None else last[4] + 1)
            except RuntimeError as exc:
                if any(type(v) is not np.ndarray for v in inputs.values()):
                    return self._run_then_copy(inputs, outputs)  # ORT binds tensors only
                raise ExecutionError(f"ONNX Runtime could not bind: {_short(exc)}") from None
        try:
            self._run_binding(binding, self._run_options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {_short(exc)}") from None
        if len(outputs) == len(self._output_names):
            return dict(outputs)
        produced = binding.get_outputs()
        return {
            name: outputs[name] if name in outputs else produced[i].numpy()
            for i, name in enumerate(self._output_names)
        }

    def _run_then_copy(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Run unbound, then copy results into the buffers given (inputs ORT cannot bind)."""
        results = self.run(inputs)
        for name, buf in outputs.items():
            result = np.asarray(results[name])
            if result.shape != buf.shape or result.dtype != buf.dtype:
                raise ExecutionError(
                    f"output {name!r} is {result.dtype} {list(result.shape)}, but the buffer "
                    f"given for it is {buf.dtype} {list(buf.shape)}; pass a buffer of that dtype "
                    "and shape, or none to receive the result"
                )
            np.copyto(buf, result, casting="no")
            results[name] = buf
        return results

    def _bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray], misses: int
    ) -> Any:
        """A new binding of ``inputs`` and ``outputs``, kept for reuse where that is safe."""
        # The C++ binding objects directly: the Python IOBinding wrapper adds ~30 µs a call.
        binding = _C.SessionIOBinding(self.session._sess)
        for name, value in inputs.items():
            # ORT wraps a C-contiguous numeric array's memory in place (CreateTensor with
            # use_numpy_data_memory): no copy, and ~2 µs cheaper than the by-address overload,
            # whose ndarray.ctypes.data alone costs 1.5 µs.
            binding.bind_input(name, value)
        for name in self._output_names:
            out = outputs.get(name)
            if out is None:
                binding.bind_output(name, _CPU)
            else:
                binding.bind_output(name, _CPU, out.dtype, list(out.shape), out.ctypes.data)
        # Arrays that change every call (fresh or rotating buffers) never match: after two
        # misses in a row only every _PROBE-th call keeps a snapshot, so such callers pay for
        # little more than a new binding. A snapshot is kept only when ORT reads every input
        # where it lies (a copied one would be stale next time) and writes every output into
        # the caller's memory (an output ORT allocated would be overwritten in place by the
        # next run, under arrays already returned); it holds the arrays until this thread
        # binds others.
        keep = (misses < 2 or misses % _PROBE == 0) and len(outputs) == len(self._output_names)
        if keep and all(
            type(v) is np.ndarray and v.flags.c_contiguous and v.dtype.kind in "iuf"
            for v in inputs.values()
        ):
            arrays = (*inputs.values(), *outputs.values())
            signature = [(a.shape, a.dtype) for a in arrays]
            self._reuse.last = (arrays, signature, (*inputs, *outputs), binding, misses)
        else:
            self._reuse.last = ((), None, None, None, misses)
        return binding

    def close(self) -> None:
        del self._run, self._run_binding
        self._reuse = threading.local()  # drop the bindings (and the arrays they hold)
        del self.session


def _model_and_weights(
    artifact: bytes | memoryview, so: ort.SessionOptions
) -> tuple[bytes, tuple[np.ndarray, ...]]:
    """The model bytes to create a session from, and the weights ORT then reads in place."""
    if not ort_artifact.is_packed(artifact):
        # An artifact from before ort_artifact: the optimized model's plain ONNX bytes, still
        # loaded (the engine version, which keys artifacts, did not change). InferenceSession
        # takes bytes only, so a view into a .crm file is copied here.
        return (bytes(artifact) if isinstance(artifact, memoryview) else artifact), ()
    unpacked = ort_artifact.unpack(artifact)
    # ORT wraps each array's memory as it is, without a copy, and never writes to an
    # initializer (a read-only view of the .crm mapping is enough: a write would fault). The
    # arrays must outlive the session: the program keeps them. ORT checks that each one
    # matches the name, type and shape of its stub in the graph. A writable buffer (a
    # bytearray the caller loaded from) is copied: its owner may overwrite it while the
    # model runs; read-only ones (a mapped file, bytes) cannot change.
    arrays = tuple(a.copy() if a.flags.writeable else a for a in unpacked.arrays)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    so.add_external_initializers(unpacked.names, values)
    return bytes(unpacked.graph), arrays


def _node_reason(
    node: onnx.NodeProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    known: _OrtRegistry,
    depth: int,
) -> str | None:
    """Why ORT cannot run ``node``, or ``None``; the order follows ORT's session setup."""
    domain = _domain(node.domain)
    version = opsets.get(domain, opsets.get("ai.onnx", 0) if domain == "" else 0)
    where = f"{domain or 'ai.onnx'} opset {version}"
    # ORT resolves the node against its own schemas: the newest version not after the opset.
    versions = known.schemas.get((domain, node.op_type), [])
    ort_schema = next((sc for sc in reversed(versions) if sc.since_version <= version), None)
    if ort_schema is None:
        return f"ONNX Runtime {ort.__version__} does not know {node.op_type} ({where})"
    since = ort_schema.since_version
    schema = _schema(node.op_type, version, domain)
    if schema is not None and schema.since_version != since:
        return (
            f"{node.op_type} in {where} is version {schema.since_version}, which "
            f"ONNX Runtime {ort.__version__} does not know (its newest is {since})"
        )
    if domain == "" and node.op_type == "Constant":
        return None  # ORT turns Constant nodes into initializers when it loads the graph
    # A kernel registered without an end version serves only its start version.
    ranges = [
        r
        for r in known.kernels.get((domain, node.op_type), [])
        if r[0] == since or (r[1] != _INT_MAX and r[0] <= since <= r[1])
    ]
    bound = _bind_types(node, ort_schema, types)
    if ranges and _kernel_matches(ranges, bound):
        return None
    # A node no kernel claims is inlined when it is an ONNX function...
    body = _function_body(node, schema, types) if schema is not None else None
    if body is not None and depth < 4:
        return _body_reason(node, schema, body, opsets, types, known, depth)
    # ...else, with float16 inputs, run in float32 between inserted Casts when a float kernel
    # exists (ORT's InsertCastTransformer; never for nodes with subgraphs).
    if ranges and _FLOAT16 in _bind_types(node, ort_schema, types, outputs=False).values():
        as_float = {t: "tensor(float)" if s == _FLOAT16 else s for t, s in bound.items()}
        has_subgraph = any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute)
        if not has_subgraph and _kernel_matches(ranges, as_float):
            return None
    if not ranges:
        return f"ONNX Runtime has no CPU kernel for {node.op_type}-{since} ({where})"
    given = ", ".join(f"{t}={s}" for t, s in sorted(bound.items()))
    return f"ONNX Runtime has no CPU kernel for {node.op_type}-{since} with types {given}"


def _kernel_matches(ranges: Sequence[_KernelRange], bound: Mapping[str, str]) -> bool:
    """Whether one kernel accepts every type the node binds (unlisted parameters are free)."""
    return any(
        all(t not in constraints or s in constraints[t] for t, s in bound.items())
        for _, _, constraints in ranges
    )


def _function_body(
    node: onnx.NodeProto, schema: Any, types: Mapping[str, onnx.TypeProto]
) -> onnx.FunctionProto | None:
    """The body ORT inlines for ``node`` when no kernel takes it, or ``None``.

    ORT asks ONNX for the body registered for the newest opset not after the operator's own
    version: Relu-14's body is registered for opset 18 only, so ORT cannot inline Relu-14.
    """
    since = schema.since_version
    if schema.has_function:
        fitting = [v for v in schema.function_opset_versions if v <= since]
    elif schema.has_context_dependent_function:
        fitting = [v for v in schema.context_dependent_function_opset_versions if v <= since]
    else:
        return None
    if not fitting:
        return None
    try:
        if schema.has_function:
            raw = schema.get_function_with_opset_version(max(fitting))
        else:
            in_types = [types[i] if i in types else onnx.TypeProto() for i in node.input]
            raw = schema.get_context_dependent_function_with_opset_version(
                max(fitting), node.SerializeToString(), [t.SerializeToString() for t in in_types]
            )
        body: onnx.FunctionProto = onnx.FunctionProto.FromString(raw)
        return body
    except Exception:
        # onnx cannot build the body here (too little type information); ORT may still, so
        # an empty body: nothing in it to refuse.
        return onnx.FunctionProto()


def _body_reason(
    node: onnx.NodeProto,
    schema: Any,
    body: onnx.FunctionProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    known: _OrtRegistry,
    depth: int,
) -> str | None:
    """Check the nodes ORT inlines for ``node``, typed as they will be in the graph."""
    inner_opsets = {**opsets, **{(o.domain or ""): o.version for o in body.opset_import}}
    inner_nodes, inner_types = _inline(node, schema, body, inner_opsets, types)
    for inner in inner_nodes:
        why = _node_reason(inner, inner_opsets, inner_types, known, depth + 1)
        if why is not None:
            return f"{node.op_type} is an ONNX function and its body needs: {why}"
    return None


def _inline(
    node: onnx.NodeProto,
    schema: Any,
    body: onnx.FunctionProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
) -> tuple[list[onnx.NodeProto], dict[str, onnx.TypeProto]]:
    """``body`` inlined in place of ``node`` (attributes bound, defaults included) and the
    types onnx infers for it; the body's nodes untyped when onnx cannot do that."""
    domain = "crossrt.inline"  # a private domain: the call must not resolve to the schema
    function = onnx.FunctionProto()
    function.CopyFrom(body)
    function.domain = domain
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.domain, call.op_type = domain, function.name
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            call.attribute.append(attr.default_value)
    graph = helper.make_graph(
        [call],
        "inline",
        [helper.make_value_info(i, types.get(i, onnx.TypeProto())) for i in node.input if i],
        [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o],
    )
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    try:
        model = helper.make_model(
            graph, opset_imports=[*imports, helper.make_opsetid(domain, 1)], functions=[function]
        )
        inferred = onnx.shape_inference.infer_shapes(onnx.inliner.inline_local_functions(model))
    except Exception:
        return list(body.node), {}
    g = inferred.graph
    return list(g.node), {v.name: v.type for v in (*g.input, *g.value_info, *g.output)}


def _schema(op_type: str, version: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _bind_types(
    node: onnx.NodeProto,
    schema: Any,
    types: Mapping[str, onnx.TypeProto],
    *,
    outputs: bool = True,
) -> dict[str, str]:
    """Map an ORT schema's type parameters (``T``) to the node's actual type strings."""
    bound: dict[str, str] = {}
    pairs = [(schema.inputs, node.input)]
    if outputs:
        pairs.append((schema.outputs, node.output))
    for formals, actuals in pairs:
        for i, name in enumerate(actuals):
            if not formals or not name:
                continue
            formal = formals[min(i, len(formals) - 1)]
            if i >= len(formals) and formal.option != formal.option.Variadic:
                continue
            if "(" in formal.typeStr:
                continue  # a fixed type such as tensor(int64), not a type parameter
            t = types.get(name)
            if t is not None and (text := _type_string(t)):
                bound.setdefault(formal.typeStr, text)
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


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
