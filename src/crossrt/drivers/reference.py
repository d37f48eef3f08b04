"""The ``reference`` driver: ``onnx.reference.ReferenceEvaluator`` (NumPy, shipped in onnx).

Slow and exact: the numerical oracle the other drivers are checked against, and the fallback
that needs no native engine. The artifact is the validated ONNX model itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Mapping, Set
from typing import Any, cast

import numpy as np
import onnx

from ..errors import CompileError, DeadlineExceededError, ExecutionError, InvalidContainerError
from ..model import Model, tensors
from .base import (
    ArtifactFile,
    CancelToken,
    Capabilities,
    CompileOptions,
    CoreSet,
    DeviceInfo,
    Driver,
    Program,
    copy_into,
    host_cpu,
)

# Operators the evaluator implements only when an optional package is present.
_NEEDS = {"ImageDecoder": "PIL"}

# Where the evaluator finds each domain's operators (ReferenceEvaluator._load_impl).
_LOADERS = {
    "": "onnx.reference.ops",
    "ai.onnx.ml": "onnx.reference.ops.aionnxml",
    "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
    "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training",
    "experimental": "onnx.reference.ops.experimental",
}


class ReferenceDriver(Driver):
    """onnx's reference evaluator on the host CPU."""

    name = "reference"
    preference = 0
    install_hint = "pip install onnx"

    @property
    def version(self) -> str:
        return str(onnx.__version__)

    def devices(self) -> list[DeviceInfo]:
        return [host_cpu(self.name, Capabilities(cache_export=True))]

    def supported_nodes(self, model: Model, device: DeviceInfo) -> list[bool]:
        return [reason is None for reason in self.unsupported_reasons(model, device)]

    def unsupported_reasons(self, model: Model, device: DeviceInfo) -> list[str | None]:
        """Per node: ``None`` when the evaluator implements it, else why not."""
        opsets = model.opsets
        functions = {(f.domain, f.name) for f in model.proto.functions}
        return [_reason(node, opsets, functions) for node in model.nodes]

    def compile(self, model: Model, device: DeviceInfo, options: CompileOptions) -> bytes:
        return model.to_bytes()

    def load(
        self,
        artifact: bytes | memoryview,
        device: DeviceInfo,
        cores: CoreSet,
        options: CompileOptions,
        *,
        file: ArtifactFile | None = None,
    ) -> Program:
        # protobuf parses a memoryview (a view into a .crm file) without a copy.
        try:
            proto = onnx.ModelProto.FromString(artifact)
            if not proto.graph.output:  # b"" and foreign bytes can parse as an empty model
                raise ValueError("it holds no ONNX graph with outputs")
        except Exception as exc:
            raise CompileError(
                f"the reference driver could not load the artifact: {type(exc).__name__}: "
                f"{str(exc)[:200]}; it is damaged or another driver's: compile the model again",
                details={"driver": self.name},
            ) from None
        # The evaluator reads a tensor marked as external data from the file it names, in the
        # working directory (numpy_helper.to_array); a compiled model holds all its bytes.
        named = next(tensors.files_named(proto), None)
        if named is not None:
            raise InvalidContainerError(
                f"the reference artifact is damaged or crafted: its {named.where} refers to "
                f"the file {tensors.location(named.tensor)!r}; compile the model again",
                details={"driver": self.name},
            )
        try:
            return ReferenceProgram(proto)
        except Exception as exc:
            raise CompileError(
                f"the reference driver could not load the artifact: {type(exc).__name__}: "
                f"{str(exc)[:200]}; it is damaged or another driver's: compile the model again",
                details={"driver": self.name},
            ) from None


class ReferenceProgram(Program):
    """A reference evaluator ready to run."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        from onnx.reference import ReferenceEvaluator  # ~0.1 s to import: only when used

        self._evaluator = ReferenceEvaluator(proto, new_ops=_corrections())
        self._output_names = [o.name for o in proto.graph.output]
        # The evaluator keeps per-run state in its operator objects: one run at a time.
        self._lock = threading.Lock()
        # A run stops between two nodes once cancelled: NumPy cannot be interrupted, but a
        # slow model is slow over many nodes (verify's oracle once ran 1 min 55 s past any
        # use), so an execution timeout ends it within one node's time.
        self._cancel: CancelToken | None = None
        for node in self._evaluator.rt_nodes_:
            node.run = self._stoppable(node.run)

    def _stoppable(self, run: Any) -> Any:
        def stoppable(*args: Any, **kwargs: Any) -> Any:
            if self._cancel is not None and self._cancel.cancelled:
                raise DeadlineExceededError("the reference evaluator was stopped between nodes")
            return run(*args, **kwargs)

        return stoppable

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        with self._lock:
            self._cancel = cancel
            try:
                return self._run(inputs, outputs)
            finally:
                self._cancel = None

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        with self._lock:
            return self._run(inputs, outputs)

    def _run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        try:
            results = self._evaluator.run(None, dict(inputs))
        except DeadlineExceededError:
            raise
        except Exception as exc:
            raise ExecutionError(
                f"reference evaluator failed: {type(exc).__name__}: {exc}"
            ) from None
        # The evaluator computes into arrays of its own: results are copied into the buffers
        # given, which must match them exactly (a dynamic output's shape is known only now).
        produced: dict[str, np.ndarray] = dict(
            zip(self._output_names, cast(list[np.ndarray], results), strict=True)
        )
        return copy_into(produced, outputs or {})

    def close(self) -> None:
        del self._evaluator


def _corrections() -> list[type[Any]]:
    """Operators of onnx.reference replaced where its answer is wrong (found by comparing it
    with onnxruntime and OpenVINO on real models, tests/drivers/test_reference_corrections.py).

    BatchNormalization of opsets 9 to 13: onnx.reference normalizes with the batch's own
    statistics whenever the node has a ``momentum`` attribute, which exporters always write
    (rapidocr's recognition model: off by 0.16). The standard computes in inference mode, with
    the running mean and variance given, unless the node asks for the training outputs.
    """
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops import op_batch_normalization

    bn: Any = op_batch_normalization  # its _run methods are untyped

    class BatchNormalization(OpRun):  # the evaluator matches by class name
        op_domain = ""

        def _run(  # type: ignore[no-untyped-def]
            self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None
        ):
            eps = 1e-5 if epsilon is None else epsilon
            if training_mode:  # opset 14: the running statistics are outputs too
                return bn.BatchNormalization_14._run(
                    self, x, scale, bias, mean, var, eps, momentum, training_mode
                )
            if len(self.output) > 1:  # opsets 9 to 13 in training mode
                return bn.BatchNormalization_9._run(self, x, scale, bias, mean, var, eps, momentum)
            shape = (-1,) + (1,) * (x.ndim - 2)
            scale, bias, mean, var = (np.reshape(a, shape) for a in (scale, bias, mean, var))
            return ((scale * (x - mean) / np.sqrt(var + eps) + bias).astype(x.dtype),)

    return [BatchNormalization]


def _reason(
    node: onnx.NodeProto, opsets: Mapping[str, int], functions: Set[tuple[str, str]]
) -> str | None:
    """Look the node up the way ``ReferenceEvaluator`` does: by domain, then in the model's
    local functions."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain)
    missing = _NEEDS.get(node.op_type)
    if missing and importlib.util.find_spec(missing) is None:
        return f"the reference {node.op_type} needs the {missing} package"
    if (node.domain, node.op_type) in functions:
        return None
    # Imported here, not at module load: listing drivers or loading another driver's model
    # should not pay ~0.1 s for the evaluator's operator tables.
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import RuntimeContextError
    from onnx.reference.ops import load_op

    loader = _LOADERS.get(domain)
    if loader is None:
        return f"the reference evaluator has no operators in domain {domain!r}"
    try:
        if domain == "":
            # Operators defined by an ONNX function are run through their body.
            load_op(domain, node.op_type, version, evaluator_cls=ReferenceEvaluator)
        else:
            importlib.import_module(loader).load_op(domain, node.op_type, version)
    except RuntimeContextError:
        return None  # a function the evaluator expands with the node's types at load
    except Exception as exc:
        return f"the reference evaluator has no {node.op_type} ({domain or 'ai.onnx'}): {exc}"
    if domain == "ai.onnx.ml":
        return _ml_divergence(node)
    return None


def _ml_divergence(node: onnx.NodeProto) -> str | None:
    """Why onnx.reference's answer for this ai.onnx.ml node is not to be trusted, if it is not.

    An oracle that answers wrongly is worse than one that refuses: these are the cases where
    the evaluator's result differs from onnxruntime's (and scikit-learn's), found by running
    skl2onnx exports of scikit-learn estimators on both (tests/drivers/test_reference_ml.py).
    The node is refused, so a compile with fallback places it on another driver.
    """
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    classes = len(attrs.get("classlabels_ints") or attrs.get("classlabels_strings") or [])
    if node.op_type == "SVMClassifier" and attrs.get("prob_a") and classes > 2:
        return (
            "onnx.reference's SVMClassifier differs from onnxruntime (probabilities): with "
            f"{classes} classes its pairwise coupling is not libsvm's, off by up to 0.2 on "
            "scikit-learn's SVC(probability=True)"
        )
    if node.op_type == "LinearClassifier":
        intercepts = attrs.get("intercepts") or []
        if not intercepts:
            return (
                "onnx.reference's LinearClassifier differs from onnxruntime (scores): without "
                "intercepts it computes NaN"
            )
        transform = attrs.get("post_transform", b"NONE")
        if len(intercepts) == 1 and classes == 2 and transform != b"LOGISTIC":
            return (
                "onnx.reference's LinearClassifier differs from onnxruntime (scores): for two "
                "classes from one row of coefficients it expands the score s to [-s, s] "
                f"before post_transform {transform.decode(errors='replace')}, onnxruntime "
                "does not"
            )
    return None
