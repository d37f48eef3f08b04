"""Status codes and the exception hierarchy.

Every error crossrt raises is a :class:`CrossrtError` with a :class:`StatusCode` in ``.code``,
a message that names the thing, the expectation and the fix, and optional machine-readable
``details``. Each subclass also inherits the builtin exception it resembles, so
``except ValueError`` keeps working for code that does not know crossrt.

The numbers of the Neuron runtime's ``NRT_STATUS`` are kept as they are (the compat layers map
them one to one); crossrt's own codes start at 2000.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class StatusCode(IntEnum):
    """Status codes: Neuron NRT_STATUS numbers first, then crossrt's own (2000+)."""

    SUCCESS = 0
    FAILURE = 1
    INVALID = 2
    INVALID_HANDLE = 3
    RESOURCE = 4
    TIMEOUT = 5
    HW_ERROR = 6
    QUEUE_FULL = 7
    LOAD_NOT_ENOUGH_NC = 9
    UNSUPPORTED_NEFF_VERSION = 10
    FAIL_HOST_MEM_ALLOC = 11
    UNINITIALIZED = 13
    CLOSED = 14
    QUEUE_EMPTY = 15
    EXEC_UNIT_UNRECOVERABLE = 101
    EXEC_BAD_INPUT = 1002
    EXEC_COMPLETED_WITH_NUM_ERR = 1003
    EXEC_COMPLETED_WITH_ERR = 1004
    EXEC_NC_BUSY = 1005
    EXEC_OOB = 1006
    COLL_PENDING = 1100
    EXEC_HW_ERR_COLLECTIVES = 1200
    HW_ERR_HBM_UE = 1201
    HW_ERR_NC_UE = 1202
    HW_ERR_DMA_ABORT = 1203
    EXEC_SW_NQ_OVERFLOW = 1204
    HW_ERR_REPAIRABLE_HBM_UE = 1205
    NETWORK_PROXY_FAILURE = 1206

    # crossrt's own.
    UNSUPPORTED_OPERATOR = 2001
    COMPILE_ERROR = 2002
    INVALID_MODEL = 2003
    DEVICE_UNAVAILABLE = 2004
    OPERATION_FORBIDDEN = 2005
    INVALID_OPTION = 2006
    NOT_FOUND = 2007
    DRIVER_UNAVAILABLE = 2008

    def describe(self) -> str:
        """``NAME (number)``, the form used at the start of every message."""
        return f"{self.name} ({self.value})"


class CrossrtError(Exception):
    """Base of every crossrt error.

    Args:
        message: what went wrong and what to do about it.
        code: the status code; each subclass has a sensible default.
        details: structured facts for programs (input name, expected dtype, node list, ...).
    """

    default_code: StatusCode = StatusCode.FAILURE

    def __init__(
        self,
        message: str,
        code: StatusCode | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.code: StatusCode = StatusCode(code) if code is not None else self.default_code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(message)

    def __str__(self) -> str:
        return f"[{self.code.describe()}] {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable (multiprocessing, concurrent.futures) despite the extra arguments.
        return (type(self), (self.message, self.code, self.details))


class InvalidArgumentError(CrossrtError, ValueError):
    """A call got an argument it cannot use (a bad device string, a bad core list...)."""

    default_code = StatusCode.INVALID


class InvalidOptionError(CrossrtError, ValueError):
    """An unknown compile/load option, or a known one with a bad value."""

    default_code = StatusCode.INVALID_OPTION


class InvalidInputError(CrossrtError, ValueError):
    """An inference input is missing, unknown, or of the wrong dtype or shape."""

    default_code = StatusCode.EXEC_BAD_INPUT


class InvalidModelError(CrossrtError, ValueError):
    """A model file or graph is corrupt, truncated or fails validation."""

    default_code = StatusCode.INVALID_MODEL


class InvalidContainerError(CrossrtError, ValueError):
    """A compiled-model container (``.crm``) is corrupt, truncated or fails validation."""

    default_code = StatusCode.INVALID


class ModelNotFoundError(CrossrtError, FileNotFoundError):
    """A model path does not exist."""

    default_code = StatusCode.NOT_FOUND


class UnsupportedError(CrossrtError, NotImplementedError):
    """A driver cannot run some operators, or a feature is not available."""

    default_code = StatusCode.UNSUPPORTED_OPERATOR


class DeviceUnavailableError(CrossrtError, RuntimeError):
    """No driver serves the device, or it cannot honour a requested option."""

    default_code = StatusCode.DEVICE_UNAVAILABLE


class CompileError(CrossrtError, RuntimeError):
    """The driver failed to compile a model it said it supports."""

    default_code = StatusCode.COMPILE_ERROR


class OperationForbiddenError(CrossrtError, RuntimeError):
    """The object is in a state that forbids the call (e.g. editing a finished graph)."""

    default_code = StatusCode.OPERATION_FORBIDDEN


class ClosedError(CrossrtError, RuntimeError):
    """The runtime was closed (``nrt_close``); create a new one."""

    default_code = StatusCode.CLOSED


class InvalidHandleError(CrossrtError, RuntimeError):
    """The handle (a loaded model, a group) was released and may not be used again."""

    default_code = StatusCode.INVALID_HANDLE


class OutOfResourcesError(CrossrtError, MemoryError):
    """Memory, cores or another resource ran out."""

    default_code = StatusCode.RESOURCE


class ExecutionError(CrossrtError, RuntimeError):
    """The engine failed while running a model."""

    default_code = StatusCode.FAILURE


class DeadlineExceededError(CrossrtError, TimeoutError):
    """An operation did not finish in the time allowed."""

    default_code = StatusCode.TIMEOUT


def error_class(code: StatusCode) -> type[CrossrtError]:
    """The error class whose default code is ``code`` (the first found, from the base
    down), else :class:`CrossrtError`: how an error that crossed a process boundary as a
    code and a message is raised again as the class its sender raised."""
    pending: list[type[CrossrtError]] = [CrossrtError]
    while pending:
        cls = pending.pop(0)
        if cls.default_code == code:
            return cls
        pending += cls.__subclasses__()
    return CrossrtError
