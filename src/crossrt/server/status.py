"""gRPC status codes for crossrt's errors, in one table, and the error the server raises
for what only the protocol knows (a region of another user, a token missing)."""

from __future__ import annotations

import grpc

from ..errors import CrossrtError, StatusCode

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


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client gets for ``exc``."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.message
    if isinstance(exc, CrossrtError):
        return GRPC_STATUS.get(exc.code, grpc.StatusCode.INTERNAL), str(exc)
    return grpc.StatusCode.INTERNAL, (
        f"internal error ({type(exc).__name__}: {exc}); the daemon's log has the traceback"
    )
