"""An ONNX Runtime session as a crossrt Program: the run paths (plain, bound, converting).

See the package docstring for why ``run`` calls the session's C++ entry point directly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from ...dtypes import DType
from ...errors import (
    CrossrtError,
    DeadlineExceededError,
    ExecutionError,
)
from ..base import (
    CancelToken,
    Program,
    copy_into,
)
from . import types

log = logging.getLogger("crossrt")
_C = ort.capi._pybind_state
_CPU = _C.OrtDevice(_C.OrtDevice.cpu(), _C.OrtDevice.default_memory(), 0)
# ORT's log severity (0 verbose, 1 info, 2 warning, 3 error, 4 fatal) for each crossrt log
# level (CROSSRT_LOG_LEVEL); unset: ORT's errors are not printed either, they reach the caller
# as crossrt errors.
ORT_SEVERITY = {"DEBUG": 0, "INFO": 1, "WARNING": 2, "ERROR": 3, "CRITICAL": 4, None: 4}


class OrtProgram(Program):
    """An ORT session ready to run."""

    def __init__(
        self,
        session: ort.InferenceSession,
        *,
        weights: tuple[np.ndarray, ...] = (),
        severity: int = ORT_SEVERITY[None],
    ) -> None:
        self.session = session
        # The weights ORT reads where they lie (views of the artifact): kept while it runs.
        self.weights = weights
        self._output_names = [o.name for o in session.get_outputs()]
        # A model of one output (the common case) gets its result by name as a literal: here
        # dict(zip(..., strict=True)) cost 0.5 µs, a tenth of a tiny model's whole call.
        self._only = self._output_names[0] if len(self._output_names) == 1 else None
        self._run = session._sess.run  # the C++ entry point; see the module docstring
        # Inputs or outputs of types ORT's binding cannot exchange as NumPy arrays (bfloat16,
        # float8, int4): every run converts them (types), the fast paths stay for others.
        kinds_in = types.special_kinds(session.get_inputs())
        kinds_out = types.special_kinds(session.get_outputs())
        self._special = bool(kinds_in or kinds_out)
        if self._special:
            self._run = functools.partial(_run_converting, session._sess, kinds_in, kinds_out)
        self._severity = severity
        self._run_options = run_options(severity)
        self._run_binding = session._sess.run_with_iobinding

    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        if outputs:
            return self._execute(inputs, outputs, self._run_options, None)
        try:  # the common call, written out: one Python call less (it is a few µs in all)
            results = self._run(self._output_names, inputs, self._run_options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {short_error(exc)}") from None
        if self._only is not None:
            return {self._only: results[0]}
        # ORT gives one result per name asked; strict=True would cost 0.2 µs more.
        return dict(zip(self._output_names, results, strict=False))

    def run_outputs(self, inputs: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        # ORT fetches (and turns into arrays) those outputs alone; it still runs every node
        # (ORT 1.32, RunOptions.only_execute_path_to_fetches too: docs/onnxruntime-api.md).
        try:
            results = self._run(list(names), inputs, self._run_options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {short_error(exc)}") from None
        return dict(zip(names, results, strict=True))

    def run_cancellable(
        self,
        inputs: Mapping[str, Any],
        cancel: CancelToken,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        options = cancellable_options(self._severity, cancel)
        return self._execute(inputs, outputs, options, cancel)

    def _execute(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None,
        options: ort.RunOptions,
        cancel: CancelToken | None,
    ) -> dict[str, np.ndarray]:
        """One run, bound to ``outputs`` where given, under ``options``; ORT's failure as a
        crossrt error (TIMEOUT when ``cancel`` stopped it)."""
        try:
            if outputs:
                return self._run_bound(inputs, outputs, options)
            results = self._run(self._output_names, inputs, options)
        except CrossrtError:
            raise
        except Exception as exc:
            raise run_failure(exc, cancel) from None
        return self._by_name(results)

    def _run_bound(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray], options: ort.RunOptions
    ) -> dict[str, np.ndarray]:
        """Run with ``outputs`` bound (ORT's failure to run propagates as it is)."""
        if self._special:  # converted on every run: nothing to bind
            return copy_into(self._converted(inputs, options), outputs)
        # A binding costs 6 µs or more to build: a caller that repeats a run on the same arrays
        # binds once instead (bind; the runtime does it for repeated bound runs).
        try:
            binding = self._new_binding(inputs, outputs)
        except RuntimeError as exc:
            if any(type(v) is not np.ndarray for v in inputs.values()):
                # ORT binds tensors only: run unbound, then copy into the buffers given.
                return copy_into(self._converted(inputs, options), outputs)
            raise ExecutionError(f"ONNX Runtime could not bind: {short_error(exc)}") from None
        self._run_binding(binding, options)
        if len(outputs) == len(self._output_names):
            return dict(outputs)
        produced = binding.get_outputs()
        return {
            name: outputs[name] if name in outputs else produced[i].numpy()
            for i, name in enumerate(self._output_names)
        }

    def _by_name(self, results: Sequence[Any]) -> dict[str, Any]:
        """ORT's results, one per output name asked, by name."""
        if self._only is not None:
            return {self._only: results[0]}
        return dict(zip(self._output_names, results, strict=False))

    def _converted(self, inputs: Mapping[str, Any], options: ort.RunOptions) -> dict[str, Any]:
        """An unbound run's results by name."""
        results = self._run(self._output_names, inputs, options)
        return self._by_name(results)

    def bind(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Callable[[], dict[str, Any]]:
        """An IOBinding of ``inputs`` and ``outputs`` built once, as a call that runs it again
        as it is (see :meth:`Program.bind` for the caller's promise). The call holds the
        arrays, since ORT reads the inputs and writes the outputs by address.

        Where a binding could not be run again as it is — types converted on every run, an
        output left to ORT (it would overwrite, in place, results already returned), an input
        ORT copies — each call is a :meth:`run`.
        """
        outputs = outputs or {}
        if self._special or len(outputs) != len(self._output_names) or not _in_place(inputs):
            return super().bind(inputs, outputs)
        try:
            binding = self._new_binding(inputs, outputs)
        except RuntimeError:
            return super().bind(inputs, outputs)
        # The call holds the arrays too: ORT reads and writes them by address.
        return functools.partial(
            self._run_again, self._run_binding, binding, self._run_options, dict(outputs), inputs
        )

    @staticmethod
    def _run_again(
        run_binding: Any,
        binding: Any,
        options: ort.RunOptions,
        outputs: dict[str, Any],
        inputs: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Run ``binding``; its outputs are ``outputs`` (the binding holds the inputs)."""
        try:
            run_binding(binding, options)
        except Exception as exc:
            raise ExecutionError(f"ONNX Runtime failed to run: {short_error(exc)}") from None
        return outputs

    def _new_binding(self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> Any:
        """An IOBinding of ``inputs`` and ``outputs`` (ORT allocates the outputs not given)."""
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
        return binding

    def close(self) -> None:
        del self._run, self._run_binding
        del self.session


def _in_place(inputs: Mapping[str, Any]) -> bool:
    """Whether ORT reads every input where it lies (C-contiguous numeric arrays): a binding
    of other inputs holds copies, stale the next time."""
    return all(
        type(v) is np.ndarray and v.flags.c_contiguous and v.dtype.kind in "iuf"
        for v in inputs.values()
    )


def _run_converting(
    session: Any,
    kinds_in: Mapping[str, DType],
    kinds_out: Mapping[str, DType],
    names: Sequence[str],
    inputs: Mapping[str, Any],
    options: ort.RunOptions,
) -> list[np.ndarray]:
    """``session.run`` for a model with bfloat16, float8 or int4 tensors (``types``)."""
    try:
        return types.run_converting(session, inputs, kinds_in, names, kinds_out, options)
    except TypeError as exc:
        raise ExecutionError(str(exc)) from None


def run_options(severity: int) -> ort.RunOptions:
    """Options for runs that log no more than the session does (ORT logs a failed node as an
    error before it raises it)."""
    options = ort.RunOptions()
    options.log_severity_level = severity
    return options


def cancellable_options(severity: int, cancel: CancelToken) -> ort.RunOptions:
    """:func:`run_options` of one call that ``cancel`` stops (ORT's ``terminate``); per call,
    since terminate set on shared options would stop every concurrent call."""
    options = run_options(severity)
    cancel.on_cancel(lambda: setattr(options, "terminate", True))
    return options


def run_failure(exc: BaseException, cancel: CancelToken | None) -> CrossrtError:
    """ORT's failure to run as a crossrt error: TIMEOUT when ``cancel`` stopped the call."""
    if cancel is not None and cancel.cancelled:
        return DeadlineExceededError(
            "ONNX Runtime stopped the call: its execution timeout expired; raise exec_timeout "
            "(or CROSSRT_EXEC_TIMEOUT) or give the model more cores"
        )
    return ExecutionError(f"ONNX Runtime failed to run: {short_error(exc)}")


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
