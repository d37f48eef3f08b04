"""``InferenceSession``: ONNX Runtime's session over a crossrt :class:`~crossrt.LoadedModel`.

A session compiles its model with :func:`crossrt.compile` (crossrt's device choice, compile
cache and drivers: ``providers`` name them, see ``providers.py``), or loads a ``.crm`` as it
is, and loads it on one runtime the module shares (:func:`shared_runtime`), unloaded when the
session is collected. ``run`` is ``model.run`` with ORT's arguments and results; whatever it
raises is ORT's exception class and crossrt's at once (``capi``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import Any

import numpy as np
import onnx

from ..choice import compile
from ..compiler import Executable, load_executable
from ..errors import CrossrtError
from ..runtime import LoadedModel, Profile, Runtime
from ..runtime.memory.tensor import Tensor
from .capi.onnxruntime_pybind11_state import translated
from .iobinding import IOBinding
from .options import GraphOptimizationLevel, RunOptions, SessionOptions
from .providers import Target, provider_name, target
from .values import OrtValue, spec_type, type_string

_CONTAINER_MAGIC = b"CROSSRTM"
_UNSET_VERSION = 2**63 - 1  # ORT's ModelMetadata.version when the model sets none
_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def shared_runtime() -> Runtime:
    """The :class:`crossrt.Runtime` every session of this process loads its model on (made
    on first use; again if it was closed)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.closed:
            _runtime = Runtime()
        return _runtime


class NodeArg:
    """An input or output as ORT describes it: ``name``, ``type`` (``'tensor(float)'``) and
    ``shape`` (ints, names of symbolic dimensions, ``None`` for unknown ones)."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, type: str, shape: list[int | str | None]) -> None:
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """ORT's model metadata: ``producer_name``, ``graph_name``, ``domain``, ``description``,
    ``graph_description``, ``version`` and ``custom_metadata_map``."""

    def __init__(self, proto: onnx.ModelProto | None, exe: Executable) -> None:
        self.custom_metadata_map: dict[str, str] = dict(exe.metadata)
        if proto is None:  # a .crm keeps the graph's name and metadata only
            self.producer_name = self.domain = self.description = self.graph_description = ""
            self.graph_name, self.version = exe.name, _UNSET_VERSION
            return
        self.producer_name = proto.producer_name
        self.graph_name = proto.graph.name
        self.domain = proto.domain
        self.description = proto.doc_string
        self.graph_description = proto.graph.doc_string
        self.version = proto.model_version if proto.HasField("model_version") else _UNSET_VERSION
        self.custom_metadata_map = {p.key: p.value for p in proto.metadata_props}


class InferenceSession:
    """ORT's ``InferenceSession`` over crossrt.

    Args:
        path_or_bytes: an ONNX model (path or bytes) or a ``.crm`` file of crossrt's (path
            or bytes: loaded as compiled, ``providers`` aside).
        sess_options: a :class:`SessionOptions`.
        providers: provider names, or ``(name, options)`` pairs, in priority order; ``None``:
            crossrt's default device (``CROSSRT_DEFAULT_DEVICE``, ``auto`` too).
        provider_options: one dict per provider.
        **kwargs: ORT's other keywords are accepted and have no effect.

    Raises:
        NoSuchFile, InvalidProtobuf, InvalidGraph, NotImplemented, EPFail, InvalidArgument:
            ORT's meaning, each also of the crossrt error class the runtime raised.
    """

    def __init__(
        self,
        path_or_bytes: str | bytes | os.PathLike[str],
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._source = path_or_bytes
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._proto: onnx.ModelProto | None = None
        self._profile: Profile | None = None
        self._profile_started = 0
        try:
            self._load(providers, provider_options)
        except CrossrtError as exc:
            raise translated(exc) from None

    def _load(
        self, providers: Sequence[Any] | None, provider_options: Sequence[Mapping[str, Any]] | None
    ) -> None:
        options = self._sess_options
        if _is_container(self._source):
            self._target = Target(None, None)
            exe = load_executable(self._source)
            self._from_onnx = False
        else:
            self._target = target(providers, provider_options)
            portable = options.graph_optimization_level < GraphOptimizationLevel.ORT_ENABLE_ALL
            exe = compile(
                self._source,
                self._target.device,
                driver=self._target.driver,
                fallback=list(self._target.fallback) or None,
                portable=portable,
            )
            self._from_onnx = True
        runtime = shared_runtime()
        threads = int(options.intra_op_num_threads)
        model = runtime.load(exe, cores=min(threads, len(runtime.cores)) if threads > 0 else None)
        self._model: LoadedModel = model
        self._unload = weakref.finalize(self, model.unload)
        self._run = model.run
        self._output_names = [s.name for s in exe.outputs]
        self._only = self._output_names[0] if len(self._output_names) == 1 else None
        self._inputs_meta = [self._node_arg(s, True) for s in exe.inputs]
        self._outputs_meta = [self._node_arg(s, False) for s in exe.outputs]
        if options.enable_profiling:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            path = f"{options.profile_file_prefix}_{stamp}.json"
            self._profile = Profile(model, path).start()
            self._profile_started = time.time_ns()

    # -- what the model is ---------------------------------------------------------------

    @property
    def model(self) -> LoadedModel:
        """The crossrt model underneath (statistics, profile, memory, placement)."""
        return self._model

    def _onnx(self) -> onnx.ModelProto | None:
        """The source model's graph and metadata, without its external weights (parsed when
        first asked); ``None`` for a ``.crm``."""
        if self._proto is None and self._from_onnx:
            source = self._source
            if isinstance(source, bytes | bytearray | memoryview):
                self._proto = onnx.load_from_string(bytes(source))
            elif isinstance(source, str | os.PathLike):
                self._proto = onnx.load(os.fspath(source), load_external_data=False)
            else:
                self._proto = getattr(source, "proto", source)
        return self._proto

    def _node_arg(self, spec: Any, is_input: bool) -> NodeArg:
        shape = list(spec.shape) if spec.shape is not None else []
        if spec.kind == "tensor" and spec.dtype is not None:
            return NodeArg(spec.name, spec_type(spec), shape)
        proto = self._onnx()
        kind = spec_type(spec)
        if proto is not None:
            values = proto.graph.input if is_input else proto.graph.output
            kind = next((type_string(v.type) for v in values if v.name == spec.name), kind)
        return NodeArg(spec.name, kind, shape)

    def get_inputs(self) -> list[NodeArg]:
        """The inputs, in order."""
        return list(self._inputs_meta)

    def get_outputs(self) -> list[NodeArg]:
        """The outputs, in order."""
        return list(self._outputs_meta)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """None here: crossrt compiles initializers into the model."""
        return []

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata (of its graph alone for a ``.crm``)."""
        return ModelMetadata(self._onnx(), self._model.executable)

    def get_providers(self) -> list[str]:
        """The providers of the drivers the model runs on, in the order of its nodes."""
        nodes = self._model.executable.nodes
        return list(dict.fromkeys(provider_name(n.driver, n.device_kind) for n in nodes))

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Per provider of :meth:`get_providers`, the options it was given."""
        return {p: dict(self._target.options.get(p, {})) for p in self.get_providers()}

    def get_session_options(self) -> SessionOptions:
        """The session's options."""
        return self._sess_options

    def set_providers(
        self,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Compile and load the model again for these providers."""
        self._unload()
        try:
            self._load(providers, provider_options)
        except CrossrtError as exc:
            raise translated(exc) from None

    def disable_fallback(self) -> None:
        """Kept for ORT's API: crossrt never changes providers after a failed run."""

    def enable_fallback(self) -> None:
        """Kept for ORT's API: crossrt never changes providers after a failed run."""

    # -- runs ------------------------------------------------------------------------------

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Run once: the outputs ``output_names`` (every output when empty or ``None``), in
        that order. ``input_feed`` values are NumPy arrays, :class:`OrtValue` objects or
        anything NumPy makes an array of; ``run_options.terminate`` stops the run."""
        # An OrtValue in the feed is fed as its tensor (values.py registers it with the
        # input check), so the feed goes to the model as it is.
        only = self._only
        if (
            run_options is None
            and only is not None
            and (not output_names or output_names == [only])
        ):
            # One output asked for, or all, of a one-output model: the plain run, at once
            # (the common ORT call: this path is a per-call cost on a few-µs model).
            try:
                return [self._run(input_feed)[only]]
            except Exception as exc:
                raise translated(exc) from None
        try:
            if run_options is None and (not output_names or output_names == self._output_names):
                result = self._run(input_feed)  # every output: the plain run, the cheapest
            else:
                result = self._run(
                    input_feed,
                    cancel=None if run_options is None else run_options._token,
                    output_names=output_names or None,
                )
        except Exception as exc:
            raise translated(exc) from None
        # The common shapes written out: a list comprehension is a call of its own (3.11).
        if not output_names:
            return [result[only]] if only is not None else [result[n] for n in self._output_names]
        if len(output_names) == 1:
            return [result[output_names[0]]]
        return [result[name] for name in output_names]

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        """:meth:`run`, its results as :class:`OrtValue` objects."""
        results = self.run(output_names, input_dict_ort_values, run_options)
        return [OrtValue(Tensor.from_buffer(np.ascontiguousarray(r))) for r in results]

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Callable[[Any, Any, str], None],
        user_data: Any = None,
        run_options: RunOptions | None = None,
    ) -> None:
        """Queue one run (crossrt's queue, ``model.run_async``); ``callback(results,
        user_data, error)`` is called in a worker thread when it is done: the outputs
        ``output_names`` and ``""``, or ``[]`` and the error's message."""
        names = list(output_names or self._output_names)

        def done(outcome: Any, data: Any) -> None:
            if isinstance(outcome, BaseException):
                callback([], data, str(translated(outcome)))
            else:
                callback([outcome[n] for n in names], data, "")

        if run_options is not None and run_options.terminate:
            done(translated(CancelledError()), user_data)
            return
        feed = _unwrapped(input_feed)
        try:
            self._model.run_async(feed, callback=done, user_data=user_data)
        except Exception as exc:
            raise translated(exc) from None

    def io_binding(self) -> IOBinding:
        """A new :class:`IOBinding` of this session."""
        return IOBinding(self)

    def run_with_iobinding(
        self, iobinding: IOBinding, run_options: RunOptions | None = None
    ) -> None:
        """Run with the inputs and outputs bound in ``iobinding``."""
        iobinding._run(run_options)

    # -- profiling -------------------------------------------------------------------------

    def end_profiling(self) -> str:
        """Stop the profile ``enable_profiling`` started and write it (a Chrome trace that
        Perfetto opens); its path, or ``""`` when profiling was not enabled."""
        profile, self._profile = self._profile, None
        if profile is None:
            return ""
        profile.stop()
        return str(profile.path)

    def get_profiling_start_time_ns(self) -> int:
        """When the profile started (``time.time_ns()``); 0 without one."""
        return self._profile_started


def _unwrapped(feed: Mapping[str, Any]) -> dict[str, Any]:
    """``feed`` with each :class:`OrtValue` replaced by its tensor."""
    return {k: v.tensor if type(v) is OrtValue else v for k, v in feed.items()}


def _is_container(source: Any) -> bool:
    """Whether ``source`` (a path or bytes) is a crossrt ``.crm``."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source[:8]) == _CONTAINER_MAGIC
    if isinstance(source, str | os.PathLike):
        try:
            with open(source, "rb") as f:
                return f.read(8) == _CONTAINER_MAGIC
        except OSError:
            return False  # compile says what is wrong with the path
    return False
