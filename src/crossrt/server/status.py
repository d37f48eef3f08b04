"""gRPC status codes for crossrt's errors, in one table, the error the server raises for
what only the protocol knows (a region of another user, a token missing), and the way back
to crossrt's errors for a client."""

from __future__ import annotations

import re
from concurrent.futures import CancelledError

import grpc

from ..errors import (
    ClosedError,
    CrossrtError,
    DeadlineExceededError,
    ExecutionError,
    InvalidArgumentError,
    ModelNotFoundError,
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
    UnsupportedError,
    error_class,
)

GRPC_STATUS: dict[StatusCode, grpc.StatusCode] = {
    StatusCode.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    StatusCode.EXEC_BAD_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    StatusCode.INVALID_OPTION: grpc.StatusCode.INVALID_ARGUMENT,
    StatusCode.INVALID_MODEL: grpc.StatusCode.INVALID_ARGUMENT,
    StatusCode.UNSUPPORTED_NEFF_VERSION: grpc.StatusCode.INVALID_ARGUMENT,
    StatusCode.EXEC_OOB: grpc.StatusCode.OUT_OF_RANGE,
    StatusCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    StatusCode.INVALID_HANDLE: grpc.StatusCode.NOT_FOUND,
    StatusCode.QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.RESOURCE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.FAIL_HOST_MEM_ALLOC: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.LOAD_NOT_ENOUGH_NC: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.EXEC_NC_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    StatusCode.CLOSED: grpc.StatusCode.UNAVAILABLE,
    StatusCode.UNINITIALIZED: grpc.StatusCode.UNAVAILABLE,
    StatusCode.DEVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    StatusCode.DRIVER_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    StatusCode.OPERATION_FORBIDDEN: grpc.StatusCode.FAILED_PRECONDITION,
    StatusCode.UNSUPPORTED_OPERATOR: grpc.StatusCode.UNIMPLEMENTED,
    StatusCode.COMPILE_ERROR: grpc.StatusCode.INTERNAL,
}
"""Each :class:`StatusCode` a client can meet; any other is ``INTERNAL``."""


class ServiceError(Exception):
    """A refusal with its gRPC status, for what crossrt's own codes do not name (another
    user's region, a missing token, a daemon shutting down)."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


MAX_MESSAGE = 4096
"""Characters of an error message a client gets; the rest is cut. Messages echo what the
client sent (names, shapes): whole, a long one passed gRPC's 16 KiB limit on metadata, and
the client saw RESOURCE_EXHAUSTED instead of its error."""


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client gets for ``exc`` (at most :data:`MAX_MESSAGE`
    characters)."""
    code, message = _status_of(exc)
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE} characters cut)"
    return code, message


def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServiceError):
        return exc.status, exc.message
    if isinstance(exc, CrossrtError):
        return GRPC_STATUS.get(exc.code, grpc.StatusCode.INTERNAL), str(exc)
    if isinstance(exc, CancelledError):  # the client went away first: nobody reads this
        return grpc.StatusCode.CANCELLED, "the request was cancelled: its client went away"
    return grpc.StatusCode.INTERNAL, (
        f"internal error ({type(exc).__name__}: {exc}); the daemon's log has the traceback"
    )


_FROM_GRPC: dict[grpc.StatusCode, type[CrossrtError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: ModelNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OutOfResourcesError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: ClosedError,
    grpc.StatusCode.CANCELLED: ClosedError,
    grpc.StatusCode.FAILED_PRECONDITION: OperationForbiddenError,
    grpc.StatusCode.PERMISSION_DENIED: OperationForbiddenError,
    grpc.StatusCode.UNAUTHENTICATED: OperationForbiddenError,
    grpc.StatusCode.UNIMPLEMENTED: UnsupportedError,
}
"""A client's error for a gRPC status whose message carries no crossrt code."""

_CODE_PREFIX = re.compile(r"^\[([A-Z_0-9]+) \((\d+)\)\] ")


def error_of(exc: grpc.RpcError, endpoint: str) -> CrossrtError:
    """The crossrt error a client raises for a failed call: the daemon's own code when its
    message starts with one (``[EXEC_BAD_INPUT (1002)] ...``), else one for the status."""
    return error_from(exc.code(), exc.details() or "", endpoint)


def error_from(code: grpc.StatusCode, message: str, endpoint: str) -> CrossrtError:
    """:func:`error_of` for a status and message however they came (a lane answer too)."""
    found = _CODE_PREFIX.match(message)
    if found and found.group(1) in StatusCode.__members__:
        status = StatusCode[found.group(1)]
        return error_class(status)(message[found.end() :], code=status)
    cls = _FROM_GRPC.get(code, ExecutionError)
    if cls is ClosedError:
        message = f"the daemon at {endpoint} is not answering ({message}); start it, or retry"
    return cls(f"{message} (gRPC {code.name})")
