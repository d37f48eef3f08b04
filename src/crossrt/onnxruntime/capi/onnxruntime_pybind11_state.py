"""ONNX Runtime's exception classes, by their names, over crossrt's errors.

Each class has the name and meaning of ONNX Runtime's (``onnxruntime.capi.
onnxruntime_pybind11_state``) and is a :class:`crossrt.CrossrtError`. What the ORT API raises
is an instance of both the ORT class and the crossrt class the runtime raised: a wrong input
dtype is an ``InvalidArgument`` and an :class:`crossrt.InvalidInputError` (so also a
``ValueError``), and ``except InvalidArgument``, ``except crossrt.InvalidInputError`` and
``except ValueError`` all catch it.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

from ...errors import (
    ClosedError,
    CompileError,
    CrossrtError,
    DeadlineExceededError,
    DeviceUnavailableError,
    ExecutionError,
    InvalidArgumentError,
    InvalidContainerError,
    InvalidHandleError,
    InvalidInputError,
    InvalidModelError,
    InvalidOptionError,
    ModelNotFoundError,
    StatusCode,
    UnsupportedError,
)


class OrtError(CrossrtError):
    """Base of the ORT-named classes; ``ort_code`` is ONNX Runtime's status number."""

    ort_code = 1


class Fail(OrtError):
    """FAIL (1): the call failed (ORT: a run stopped by ``RunOptions.terminate`` too)."""

    ort_code = 1
    default_code = StatusCode.FAILURE


class InvalidArgument(OrtError):
    """INVALID_ARGUMENT (2): a wrong input name, dtype or shape, a bad option."""

    ort_code = 2
    default_code = StatusCode.INVALID


class NoSuchFile(OrtError):
    """NO_SUCHFILE (3): the model file does not exist."""

    ort_code = 3
    default_code = StatusCode.NOT_FOUND


class NoModel(OrtError):
    """NO_MODEL (4): the session has no model (its model was unloaded)."""

    ort_code = 4
    default_code = StatusCode.INVALID_HANDLE


class EngineError(OrtError):
    """ENGINE_ERROR (5): the device failed."""

    ort_code = 5
    # Not HW_ERROR: errors.error_class would then raise this ORT class for every hardware
    # error crossing a process boundary.


class RuntimeException(OrtError):
    """RUNTIME_EXCEPTION (6): a kernel failed while running."""

    ort_code = 6
    default_code = StatusCode.FAILURE


class InvalidProtobuf(OrtError):
    """INVALID_PROTOBUF (7): the model (or ``.crm``) does not parse."""

    ort_code = 7
    default_code = StatusCode.INVALID_MODEL


class ModelLoaded(OrtError):
    """MODEL_LOADED (8): the model is loaded already."""

    ort_code = 8
    default_code = StatusCode.OPERATION_FORBIDDEN


class NotImplemented(OrtError):  # ORT's name for it
    """NOT_IMPLEMENTED (9): an operator or feature no engine here implements."""

    ort_code = 9
    default_code = StatusCode.UNSUPPORTED_OPERATOR


class InvalidGraph(OrtError):
    """INVALID_GRAPH (10): the model fails validation."""

    ort_code = 10
    default_code = StatusCode.INVALID_MODEL


class EPFail(OrtError):
    """EP_FAIL (11): an execution provider (crossrt: a driver, a device) failed."""

    ort_code = 11
    default_code = StatusCode.DEVICE_UNAVAILABLE


# The first entry whose crossrt class the error is an instance of gives the ORT class.
_BY_CROSSRT: tuple[tuple[type[CrossrtError], type[OrtError]], ...] = (
    (ModelNotFoundError, NoSuchFile),
    (InvalidContainerError, InvalidProtobuf),
    (InvalidInputError, InvalidArgument),
    (InvalidOptionError, InvalidArgument),
    (InvalidArgumentError, InvalidArgument),
    (UnsupportedError, NotImplemented),
    (DeviceUnavailableError, EPFail),
    (CompileError, EPFail),
    (ExecutionError, RuntimeException),
    (InvalidHandleError, NoModel),
    (ClosedError, NoModel),
    (DeadlineExceededError, Fail),
)
_HARDWARE = {StatusCode.HW_ERROR, StatusCode.EXEC_UNIT_UNRECOVERABLE, StatusCode.HW_ERR_NC_UE}
_both: dict[tuple[type[OrtError], type[CrossrtError]], type[CrossrtError]] = {}
_lock = threading.Lock()


def ort_class(exc: CrossrtError) -> type[OrtError]:
    """The ORT class whose meaning ``exc`` has."""
    if isinstance(exc, InvalidModelError):  # the bytes do not parse, or the graph is wrong
        return InvalidProtobuf if "protobuf" in exc.message else InvalidGraph
    if exc.code in _HARDWARE:
        return EngineError
    return next((ort for cls, ort in _BY_CROSSRT if isinstance(exc, cls)), Fail)


def invalid_argument(message: str) -> CrossrtError:
    """ORT's ``InvalidArgument`` that is a crossrt :class:`InvalidArgumentError`."""
    return translated(InvalidArgumentError(message))  # type: ignore[return-value]


def not_implemented(message: str) -> CrossrtError:
    """ORT's ``NotImplemented`` that is a crossrt :class:`UnsupportedError`."""
    return translated(UnsupportedError(message))  # type: ignore[return-value]


def translated(exc: BaseException) -> BaseException:
    """``exc`` raised again as ONNX Runtime's class for it, still of its crossrt class; a
    cancelled run (``RunOptions.terminate``) is ORT's ``Fail``. Others are returned as they
    are."""
    if isinstance(exc, OrtError):
        return exc
    if isinstance(exc, CancelledError):
        return Fail(
            "the run was stopped: RunOptions.terminate was set (ORT: 'Exiting due to terminate "
            "flag being set to true'); set it to False to run again"
        )
    if not isinstance(exc, CrossrtError):
        return exc
    ort, own = ort_class(exc), type(exc)
    with _lock:
        both = _both.get((ort, own))
        if both is None:
            # Named as ORT's class, so a program that prints type(e).__name__ sees ORT's name.
            both = type(ort.__name__, (ort, own), {"__module__": __name__})
            both.__qualname__ = ort.__qualname__
            _both[(ort, own)] = both
    again = both(exc.message, exc.code, exc.details)
    again.__cause__ = exc.__cause__
    return again


__all__ = [
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoaded",
    "NoModel",
    "NoSuchFile",
    "NotImplemented",
    "OrtError",
    "RuntimeException",
    "invalid_argument",
    "not_implemented",
    "ort_class",
    "translated",
]
