"""The driver boundary: whatever a driver raises, its caller gets a :class:`CrossrtError`.

Drivers adapt engines that raise what they like on hostile input (protobuf's ``DecodeError``,
``KeyError``, ``RuntimeError``...), and a third-party driver may leak the same. Rather than
trust each driver to catch everything, every method of the :class:`~crossrt.drivers.base.Driver`
and :class:`~crossrt.drivers.base.Program` interfaces is wrapped when its class is created
(``__init_subclass__`` calls :func:`guard_class`): a :class:`CrossrtError` passes as it is, a
``MemoryError`` becomes :class:`OutOfResourcesError` (RESOURCE), any other ``Exception``
becomes the error that method's callers expect, naming the driver, the method and the
original exception (chained as ``__cause__``; its traceback is logged at DEBUG).
``KeyboardInterrupt`` and ``SystemExit`` pass untouched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import types
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ..errors import (
    CompileError,
    CrossrtError,
    DeviceUnavailableError,
    ExecutionError,
    InvalidContainerError,
    OutOfResourcesError,
)

log = logging.getLogger("crossrt")

_TEXT_LIMIT = 300  # characters of the original message kept: hostile input can make it huge

_DAMAGED = (
    "its compiled artifact is damaged, or was made by another version of the engine: "
    "compile the model again"
)
# The original exception is this error's __cause__: a printed traceback shows both.
_REPORT = "this is a bug in the driver: report it with the whole traceback"

# What each guarded method's callers expect, and what to tell the user.
DRIVER_METHODS: dict[str, tuple[type[CrossrtError], str]] = {
    "devices": (DeviceUnavailableError, _REPORT),
    "supported_nodes": (CompileError, _REPORT),
    "unsupported_reasons": (CompileError, _REPORT),
    "check_options": (CompileError, _REPORT),
    "compile": (CompileError, f"the engine cannot compile this model; {_REPORT}"),
    "describe_artifact": (InvalidContainerError, _DAMAGED),
    "load": (InvalidContainerError, _DAMAGED),
    "sharing": (CrossrtError, f"it could not prepare the compiled model to load; {_REPORT}"),
    "allocate": (ExecutionError, _REPORT),
    "free": (ExecutionError, _REPORT),
    "copy_in": (ExecutionError, _REPORT),
    "copy_out": (ExecutionError, _REPORT),
    "copy_device": (ExecutionError, _REPORT),
    "address_of": (ExecutionError, _REPORT),
    "wrap_address": (ExecutionError, _REPORT),
}
PROGRAM_METHODS: dict[str, tuple[type[CrossrtError], str]] = {
    "residence": (ExecutionError, _REPORT),
    "run": (ExecutionError, f"the engine failed on these inputs; {_REPORT}"),
    "run_outputs": (ExecutionError, f"the engine failed on these inputs; {_REPORT}"),
    "run_cancellable": (ExecutionError, f"the engine failed on these inputs; {_REPORT}"),
    "bind": (ExecutionError, f"the engine failed on these inputs; {_REPORT}"),
    "close": (ExecutionError, _REPORT),
}
_RETURNS_CONTEXT = {"sharing"}  # the context manager it returns is guarded too


def _who(obj: Any, methods: dict[str, tuple[type[CrossrtError], str]]) -> str:
    name = getattr(obj, "name", None)
    if methods is DRIVER_METHODS and isinstance(name, str) and name:
        return f"driver {name!r}"
    cls = type(obj)
    return f"{cls.__qualname__} ({cls.__module__})"


def driver_error(
    who: str, method: str, exc: Exception, error: type[CrossrtError], advice: str
) -> CrossrtError:
    """The :class:`CrossrtError` for ``exc`` raised by ``who``'s ``method``.

    Args:
        who: the driver (``"driver 'onnxruntime'"``) or program class.
        method: the method that raised.
        exc: what it raised (not a :class:`CrossrtError`).
        error: the error class the method's callers expect.
        advice: what to do, ending the message.
    """
    try:
        text = str(exc)
    except Exception:  # an exception that cannot say what it is still becomes an error
        text = ""
    if len(text) > _TEXT_LIMIT:
        text = text[:_TEXT_LIMIT] + "..."
    kind = type(exc).__name__
    log.debug("crossrt: %s raised %s in %s", who, kind, method, exc_info=exc)
    details = {"driver": who, "method": method, "exception": kind}
    if isinstance(exc, MemoryError):
        return OutOfResourcesError(
            f"{who} ran out of memory in {method} ({kind}: {text or 'no message'}); free memory "
            "(unload models, fewer instances) or use a smaller model",
            details=details,
        )
    return error(
        f"{who} failed in {method} ({kind}: {text or 'no message'}); {advice}", None, details
    )


def guard(
    method: Callable[..., Any], name: str, methods: dict[str, tuple[type[CrossrtError], str]]
) -> Any:
    """``method`` (called ``name``, one of ``methods``: :data:`DRIVER_METHODS` or
    :data:`PROGRAM_METHODS`) wrapped so that it raises only :class:`CrossrtError`."""
    error, advice = methods[name]
    if name == "run":  # the hot path: no *args tuple, no **kwargs dict to build
        return _guard_run(method, methods)

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
        except CrossrtError:
            raise
        except Exception as exc:
            raise driver_error(_who(self, methods), name, exc, error, advice) from exc
        if name in _RETURNS_CONTEXT:
            return _GuardedContext(result, _who(self, methods), name, error, advice)
        return result

    guarded.__crossrt_guarded__ = True  # type: ignore[attr-defined]
    return guarded


def _guard_run(
    method: Callable[..., Any], methods: dict[str, tuple[type[CrossrtError], str]]
) -> Any:
    error, advice = methods["run"]

    @functools.wraps(method)
    def run(self: Any, inputs: Any, outputs: Any = None) -> Any:
        try:
            return method(self, inputs, outputs)
        except CrossrtError:
            raise
        except Exception as exc:
            raise driver_error(_who(self, methods), "run", exc, error, advice) from exc

    run.__crossrt_guarded__ = True  # type: ignore[attr-defined]
    return run


def guard_class(cls: type, methods: dict[str, tuple[type[CrossrtError], str]]) -> None:
    """Wrap each of ``methods`` that ``cls`` itself defines, once."""
    for name in methods:
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "__crossrt_guarded__", False):
            setattr(cls, name, guard(method, name, methods))


def unguarded(method: Any) -> Any:
    """A program's bound method without its guard, for the one caller that maps failures
    itself: ``LoadedModel.run`` on its direct path (the hottest there is), where the guard's
    extra call is a measurable share of a small model's run. Others are returned as they are."""
    func = getattr(method, "__func__", None)
    inner = getattr(func, "__wrapped__", None)
    if inner is None or not getattr(func, "__crossrt_guarded__", False):
        return method
    return types.MethodType(inner, method.__self__)


def program_error(program: Any, exc: Exception, what: str = "run") -> CrossrtError:
    """What an unguarded call of ``program`` (:func:`unguarded` ``run``, or the call
    ``program.bind`` returns, which is never wrapped) raised, as a :class:`CrossrtError`."""
    error, advice = PROGRAM_METHODS["run"]
    return driver_error(_who(program, PROGRAM_METHODS), what, exc, error, advice)


class _GuardedContext(contextlib.AbstractContextManager[Any]):
    """A driver's context manager whose entering and leaving raise only CrossrtError."""

    def __init__(
        self,
        inner: contextlib.AbstractContextManager[Any],
        who: str,
        name: str,
        error: type[CrossrtError],
        advice: str,
    ) -> None:
        self._inner, self._who, self._name = inner, who, name
        self._error, self._advice = error, advice

    def __enter__(self) -> Any:
        try:
            return self._inner.__enter__()
        except CrossrtError:
            raise
        except Exception as exc:
            raise driver_error(self._who, self._name, exc, self._error, self._advice) from exc

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        try:
            return self._inner.__exit__(kind, value, traceback)
        except CrossrtError:
            raise
        except Exception as exc:
            if exc is value:  # the block's own exception, passed back: not the driver's
                raise
            raise driver_error(self._who, self._name, exc, self._error, self._advice) from exc
