"""OpenVINO's conversion and compilation of a model, in a child process.

The ONNX frontend and the CPU plugin's compiler are native code, and crafted models crash
them (the fuzzer of tests/security found a SIGFPE and a SIGSEGV within a few thousand
models). A model is untrusted input, so crossrt never converts or compiles one in its own
process: one worker process per driver does it, and a crash there is a CompileError for that
model, never the end of the user's process. The worker is started on first use (``spawn``: a
fresh interpreter, nothing inherited) and again after a crash.

Only bytes cross the pipe: the ONNX model in, OpenVINO's exported blob (or the error's text)
out.
"""

from __future__ import annotations

import atexit
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

_core: Any = None  # the worker's own ov.Core


class Crashed(Exception):
    """The worker died while OpenVINO handled the model."""


def _worker_core() -> Any:
    global _core
    if _core is None:
        import openvino as ov

        _core = ov.Core()
    return _core


def _compile(model: bytes, target: str, config: dict[str, Any]) -> tuple[bytes, str]:
    """In the worker: the exported blob, or ``b""`` and the error's text."""
    core = _worker_core()
    try:
        converted = core.read_model(model)
        compiled = core.compile_model(converted, target, config)
        return bytes(compiled.export_model().getvalue()), ""
    except Exception as exc:
        return b"", str(exc)


def _check_node(model: bytes, target: str, config: dict[str, Any]) -> tuple[str, str]:
    """In the worker: ``("", "")`` when the one-node model converts, is placed whole on
    ``target`` and compiles; else the stage that failed (``convert``, ``place``,
    ``compile``) and the error's text."""
    core = _worker_core()
    try:
        converted = core.read_model(model)
    except Exception as exc:
        return "convert", str(exc)
    try:
        placed = core.query_model(converted, target)
        if any(op.get_friendly_name() not in placed for op in converted.get_ops()):
            return "place", ""
        core.compile_model(converted, target, config)
    except Exception as exc:
        return "compile", str(exc)
    return "", ""


class Worker:
    """The child process that converts and compiles for one driver."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def compile(self, model: bytes, target: str, config: dict[str, Any]) -> tuple[bytes, str]:
        """OpenVINO's blob of ``model``, or ``b""`` and why not.

        Raises:
            Crashed: OpenVINO crashed the worker.
        """
        result: tuple[bytes, str] = self._call(_compile, model, target, config)
        return result

    def check_node(self, model: bytes, target: str, config: dict[str, Any]) -> tuple[str, str]:
        """See :func:`_check_node`.

        Raises:
            Crashed: OpenVINO crashed the worker.
        """
        result: tuple[str, str] = self._call(_check_node, model, target, config)
        return result

    def _call(self, function: Any, *args: Any) -> Any:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(1, mp_context=context)
                # Stopped before the interpreter's teardown, which breaks the pool's own hooks.
                atexit.register(self._pool.shutdown, wait=False, cancel_futures=True)
            pool = self._pool
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None  # the next call starts a new worker
            pool.shutdown(wait=False, cancel_futures=True)
            raise Crashed("OpenVINO crashed its worker process on this model") from None

    def close(self) -> None:
        """Stop the worker."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
