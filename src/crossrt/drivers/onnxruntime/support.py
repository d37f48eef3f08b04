"""What ONNX Runtime's CPU provider can run, decided as an ORT session would decide it.

Each node is resolved against ORT's own operator schemas (which may be older than the
``onnx`` package's), looked up in ORT's kernel registry by domain, operator version and the
node's input and output types (with ORT's version matching), and otherwise follows ORT's
fallbacks: Constant nodes become initializers, ONNX functions are inlined (their bodies
checked with inferred types), and float16 nodes run in float32 between inserted Casts. The
newest IR version and opsets this ORT build accepts are found by trying.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx.inliner
import onnxruntime as ort
from onnx import helper

from ...model import Model
from . import lower, types

log = logging.getLogger("crossrt")
PROVIDER = "CPUExecutionProvider"
_BUILT_IN = frozenset({PROVIDER, "AzureExecutionProvider"})
"""Providers compiled into ORT itself: listing kernels creates no other library's."""


def new_session(
    model: str | bytes,
    options: ort.SessionOptions,
    providers: Sequence[Any] = (PROVIDER,),
    **kwargs: Any,
) -> ort.InferenceSession:
    """An ORT session on ``providers`` (default :data:`PROVIDER`). ORT's Python wrapper, when
    a session cannot be created, would print "EP Error ... Falling back to
    CPUExecutionProvider" to stdout and try again (twice the time, the same error): crossrt
    reports one coded error instead."""
    return ort.InferenceSession(
        model, options, providers=list(providers), enable_fallback=0, **kwargs
    )


# ONNX element types NumPy has only through ml_dtypes (bfloat16 and newer, 16 and up) that the
# driver cannot convert at a session's boundary (ort_types converts bfloat16, float8, int4).
_UNEXCHANGEABLE = frozenset(range(onnx.TensorProto.BFLOAT16, 64)) - {
    kind.onnx for kind in types.KINDS.values()
}
_KernelRange = tuple[int, int, dict[str, list[str]]]
_FLOAT16 = "tensor(float16)"
_INT_MAX = 2**31 - 1  # the end version of a kernel registered without one


@dataclass(frozen=True)
class OrtRegistry:
    """What this ORT build knows: its CPU kernels, its own operator schemas and its limits.

    ORT resolves a node against the ONNX schemas compiled into it, which may be older than
    the ``onnx`` package's; ``schemas`` holds each operator's versions, oldest first.
    """

    kernels: dict[tuple[str, str], list[_KernelRange]] | None
    """``None`` where they could not be read: then each node is asked of a session of its
    own (:func:`unsupported_reasons`)."""
    schemas: dict[tuple[str, str], list[Any]]
    max_ir: int
    max_opset: int


def build_registry() -> OrtRegistry:
    """Read this ORT build's kernels, operator schemas and limits (once per driver)."""
    state = ort.capi._pybind_state
    found: dict[tuple[str, str], list[_KernelRange]] = {}
    for domain, op, start, end, constraints in _cpu_kernels():
        found.setdefault((_domain(domain), op), []).append((start, end, constraints))
    schemas: dict[tuple[str, str], list[Any]] = {}
    for schema in state.get_all_operator_schema():
        schemas.setdefault((_domain(schema.domain), schema.name), []).append(schema)
    for versions in schemas.values():
        versions.sort(key=lambda sc: sc.since_version)
    max_ir, max_opset = _probe_limits()
    return OrtRegistry(found or None, schemas, max_ir, max_opset)


_KERNELS_SCRIPT = f"""
import json, onnxruntime
kernels = onnxruntime.capi._pybind_state.get_all_opkernel_def()
print(json.dumps([[k.domain, k.op_name, *k.version_range, dict(k.type_constraints)]
                  for k in kernels if k.provider == {PROVIDER!r}]))
"""


def _cpu_kernels() -> list[tuple[str, str, int, int, dict[str, list[str]]]]:
    """The CPU provider's kernels: (domain, operator, first and last version, type
    constraints); none where they cannot be read.

    ORT lists kernels by creating every provider it was built with, and dereferences a null
    factory for one whose library does not load: onnxruntime-gpu, built with TensorRT, dies
    of a segmentation fault on a machine without TensorRT (or without CUDA). So a build with
    such providers is asked in a subprocess of its own.
    """
    state = ort.capi._pybind_state
    if set(ort.get_available_providers()) <= _BUILT_IN:
        return [
            (k.domain, k.op_name, *k.version_range, dict(k.type_constraints))
            for k in state.get_all_opkernel_def()
            if k.provider == PROVIDER
        ]
    package = os.path.dirname(os.path.dirname(ort.__file__))  # the same onnxruntime there
    path = os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _KERNELS_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=path),
            check=True,
        )
        return [tuple(k) for k in json.loads(done.stdout.strip().splitlines()[-1])]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.info(
            "ONNX Runtime %s cannot list its CPU kernels here (%s): each node is asked of a "
            "session of its own instead",
            ort.__version__,
            type(exc).__name__,
        )
        return []


def unsupported_reasons(model: Model, known: OrtRegistry) -> list[str | None]:
    """Per node: ``None`` when ORT can run it, else why not."""
    version = ort.__version__
    nodes = model.nodes
    types = model.value_types()
    opsets = dict(model.opsets)
    onnx_opset = opsets.get("", opsets.get("ai.onnx", 0))
    blockers: list[str | None] = [None] * len(nodes)
    if model.proto.ir_version > known.max_ir or onnx_opset > known.max_opset:
        # Newer than ORT reads: nodes that mean the same at ORT's versions are checked there
        # (the driver lowers the model: ort_lower); the others say why not.
        newest = lower.newest_type(known.max_ir) if model.proto.ir_version > known.max_ir else None
        if model.proto.ir_version > known.max_ir and newest is None:
            why = f"IR version {model.proto.ir_version} is newer than ORT {version} reads"
            return [f"{why} (max {known.max_ir})"] * len(nodes)
        blocked = _blocked_functions(model, known)
        blockers = [
            blocked.get((n.domain, n.op_type))
            or lower.node_blocker(n, onnx_opset, known.max_opset, newest, types)
            for n in nodes
        ]
        for domain in ("", "ai.onnx"):
            if domain in opsets:
                opsets[domain] = min(opsets[domain], known.max_opset)
    reasons = [
        f"ONNX Runtime {version}: {blocker}"
        if blocker is not None
        else _node_reason(node, opsets, types, known, depth=0)
        for node, blocker in zip(nodes, blockers, strict=True)
    ]
    if known.kernels is None:  # each node ORT knows, asked of a session of its own
        for i, node in enumerate(nodes):
            if reasons[i] is None and node.op_type != "Constant":
                reasons[i] = _kernel_probe(model, i, types)
    # ORT's Python binding cannot take or return NumPy arrays of ml_dtypes' types; the driver
    # converts bfloat16, float8 and int4 (ort_types), not the rest (int2, float4...), so nodes
    # reading or writing such a graph input or output cannot run here, even with a kernel;
    # inside the graph those types are fine.
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


_probed: dict[tuple[Any, ...], str | None] = {}
_probe_lock = threading.Lock()


def _kernel_probe(model: Model, index: int, types: Mapping[str, onnx.TypeProto]) -> str | None:
    """Whether ORT's CPU provider has a kernel for node ``index`` (where its kernel list
    could not be read): a session of that node alone, made once per node signature."""
    node = model.nodes[index]
    # Its kernel depends on the operator, the opset it resolves at and the types it binds.
    signature = (
        node.domain,
        node.op_type,
        tuple(sorted(model.opsets.items())),
        tuple(types[v].SerializeToString() if v in types else b"" for v in node.input),
    )
    with _probe_lock:
        if signature in _probed:
            return _probed[signature]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    reason = None
    try:
        ort.InferenceSession(model.node_alone(index, types), options, providers=[PROVIDER])
    except Exception as exc:  # ORT's own error types
        text = str(exc)
        if "Could not find an implementation" in text or "NOT_IMPLEMENTED" in text:
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            reason = f"ONNX Runtime has no CPU kernel for {node.op_type}: {first[:200]}"
    with _probe_lock:
        _probed[signature] = reason
    return reason


def _blocked_functions(model: Model, known: OrtRegistry) -> dict[tuple[str, str], str]:
    """The model's local functions whose bodies cannot be lowered, with why."""
    blocked = {}
    for function in model.proto.functions:
        imports = {(o.domain or ""): o.version for o in function.opset_import}
        opset = imports.get("", imports.get("ai.onnx", 0))
        for inner in function.node:
            why = lower.node_blocker(inner, opset, known.max_opset, None, {})
            if why is not None:
                blocked[(function.domain, function.name)] = f"function {function.name}: {why}"
                break
    return blocked


def _node_reason(
    node: onnx.NodeProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    known: OrtRegistry,
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
    if known.kernels is None:
        return None  # its kernels unknown: unsupported_reasons asks a session of the node
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
    onnx_version = opsets.get("", opsets.get("ai.onnx", 0))  # what the body's nodes resolve at
    body = _function_body(node, schema, types, onnx_version) if schema is not None else None
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
    node: onnx.NodeProto, schema: Any, types: Mapping[str, onnx.TypeProto], opset: int
) -> onnx.FunctionProto | None:
    """The body ORT inlines for ``node`` when no kernel takes it, or ``None``.

    ORT asks ONNX for the body registered for the newest opset not after the operator's own
    version: Relu-14's body is registered for opset 18 only, so ORT cannot inline Relu-14.
    The body's nodes then resolve at the model's ``opset``, and ONNX refuses a body one of
    whose operators changed in between: Swish-24's body uses CastLike-24, which became
    CastLike-25, so ORT cannot inline Swish in an opset-25 or 26 model.
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
    except Exception:
        # onnx cannot build the body here (too little type information); ORT may still, so
        # an empty body: nothing in it to refuse.
        return onnx.FunctionProto()
    if lower.changed_operator(body.node, max(fitting), opset) is not None:
        return None
    return body


def _body_reason(
    node: onnx.NodeProto,
    schema: Any,
    body: onnx.FunctionProto,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto],
    known: OrtRegistry,
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
            new_session(model.SerializeToString(), so)
        except Exception:
            return False
        return True

    max_opset = next((v for v in range(onnx.defs.onnx_opset_version(), 6, -1) if accepts(0, v)), 7)
    max_ir = next((v for v in range(onnx.IR_VERSION, 3, -1) if accepts(v, 7)), 7)
    return max_ir, max_opset


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain
