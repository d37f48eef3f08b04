"""``OH_NN_ReturnCode`` as NNRt's API reference numbers it, and its mapping to and from
crossrt's StatusCode.

The C-style functions of this layer never raise: each catches the error of the crossrt call
it translates, logs its message (which says what to do) on the ``crossrt.compat.nnrt``
logger, and returns the OH_NN_ReturnCode :func:`status_of` gives, ``(code, None)`` for a
function with an out-parameter, or ``None`` where the C function returns a pointer.
"""

from __future__ import annotations

import logging
from enum import IntEnum
from typing import ParamSpec

from ...errors import (
    ClosedError,
    CrossrtError,
    InvalidContainerError,
    InvalidModelError,
    StatusCode,
)
from ..guard import never_raises

__all__ = [
    "FROM_NN",
    "TO_NN",
    "NNError",
    "OH_NN_ReturnCode",
    "crossrt_status",
    "guarded",
    "status_of",
]

log = logging.getLogger("crossrt.compat.nnrt")
P = ParamSpec("P")


class OH_NN_ReturnCode(IntEnum):  # the seed's name
    """The return codes of ``neural_network_runtime_type.h`` (9-14 were added in API 11)."""

    OH_NN_SUCCESS = 0
    OH_NN_FAILED = 1
    OH_NN_INVALID_PARAMETER = 2
    OH_NN_MEMORY_ERROR = 3
    OH_NN_OPERATION_FORBIDDEN = 4
    OH_NN_NULL_PTR = 5
    OH_NN_INVALID_FILE = 6
    OH_NN_UNAVALIDABLE_DEVICE = 7  # upstream's spelling; deprecated in API 11
    OH_NN_INVALID_PATH = 8
    OH_NN_TIMEOUT = 9
    OH_NN_UNSUPPORTED = 10
    OH_NN_CONNECTION_EXCEPTION = 11
    OH_NN_SAVE_CACHE_EXCEPTION = 12
    OH_NN_DYNAMIC_SHAPE = 13
    OH_NN_UNAVAILABLE_DEVICE = 14


_R = OH_NN_ReturnCode
_S = StatusCode

TO_NN: dict[StatusCode, OH_NN_ReturnCode] = {
    _S.SUCCESS: _R.OH_NN_SUCCESS,
    _S.FAILURE: _R.OH_NN_FAILED,
    _S.INVALID: _R.OH_NN_INVALID_PARAMETER,
    _S.INVALID_HANDLE: _R.OH_NN_INVALID_PARAMETER,
    _S.INVALID_OPTION: _R.OH_NN_INVALID_PARAMETER,
    _S.EXEC_BAD_INPUT: _R.OH_NN_INVALID_PARAMETER,
    _S.EXEC_OOB: _R.OH_NN_INVALID_PARAMETER,
    _S.NOT_FOUND: _R.OH_NN_INVALID_PATH,
    _S.RESOURCE: _R.OH_NN_MEMORY_ERROR,
    _S.FAIL_HOST_MEM_ALLOC: _R.OH_NN_MEMORY_ERROR,
    _S.TIMEOUT: _R.OH_NN_TIMEOUT,
    _S.OPERATION_FORBIDDEN: _R.OH_NN_OPERATION_FORBIDDEN,
    _S.UNINITIALIZED: _R.OH_NN_OPERATION_FORBIDDEN,
    _S.CLOSED: _R.OH_NN_CONNECTION_EXCEPTION,
    _S.QUEUE_FULL: _R.OH_NN_UNAVAILABLE_DEVICE,
    _S.EXEC_NC_BUSY: _R.OH_NN_UNAVAILABLE_DEVICE,
    _S.LOAD_NOT_ENOUGH_NC: _R.OH_NN_UNAVAILABLE_DEVICE,
    _S.DEVICE_UNAVAILABLE: _R.OH_NN_UNAVAILABLE_DEVICE,
    _S.DRIVER_UNAVAILABLE: _R.OH_NN_UNAVAILABLE_DEVICE,
    _S.INVALID_MODEL: _R.OH_NN_INVALID_FILE,
    _S.UNSUPPORTED_NEFF_VERSION: _R.OH_NN_INVALID_FILE,
    _S.UNSUPPORTED_OPERATOR: _R.OH_NN_UNSUPPORTED,
}
"""crossrt's codes that have an NNRt counterpart; every other code is OH_NN_FAILED."""

FROM_NN: dict[OH_NN_ReturnCode, StatusCode] = {
    _R.OH_NN_SUCCESS: _S.SUCCESS,
    _R.OH_NN_FAILED: _S.FAILURE,
    _R.OH_NN_INVALID_PARAMETER: _S.INVALID,
    _R.OH_NN_MEMORY_ERROR: _S.RESOURCE,
    _R.OH_NN_OPERATION_FORBIDDEN: _S.OPERATION_FORBIDDEN,
    _R.OH_NN_NULL_PTR: _S.INVALID,
    _R.OH_NN_INVALID_FILE: _S.INVALID_MODEL,
    _R.OH_NN_UNAVALIDABLE_DEVICE: _S.DEVICE_UNAVAILABLE,
    _R.OH_NN_INVALID_PATH: _S.NOT_FOUND,
    _R.OH_NN_TIMEOUT: _S.TIMEOUT,
    _R.OH_NN_UNSUPPORTED: _S.UNSUPPORTED_OPERATOR,
    _R.OH_NN_CONNECTION_EXCEPTION: _S.CLOSED,
    _R.OH_NN_SAVE_CACHE_EXCEPTION: _S.FAILURE,
    _R.OH_NN_DYNAMIC_SHAPE: _S.INVALID,
    _R.OH_NN_UNAVAILABLE_DEVICE: _S.DEVICE_UNAVAILABLE,
}
"""Each OH_NN_ReturnCode as the crossrt code of the same meaning."""


class NNError(CrossrtError):
    """An error this layer raises itself, with the OH_NN_ReturnCode the call returns."""

    def __init__(self, nn_code: OH_NN_ReturnCode, message: str) -> None:
        super().__init__(message, FROM_NN[nn_code])
        self.nn_code = nn_code


def status_of(exc: BaseException) -> OH_NN_ReturnCode:
    """The OH_NN_ReturnCode of an error a translated call raised."""
    if isinstance(exc, NNError):
        return exc.nn_code
    if isinstance(exc, InvalidContainerError | InvalidModelError):
        return _R.OH_NN_INVALID_FILE  # an offline model or cache that does not read
    if isinstance(exc, ClosedError):
        return _R.OH_NN_CONNECTION_EXCEPTION
    if isinstance(exc, CrossrtError):
        return TO_NN.get(exc.code, _R.OH_NN_FAILED)
    if isinstance(exc, MemoryError):
        return _R.OH_NN_MEMORY_ERROR
    if isinstance(exc, TypeError | ValueError | IndexError | KeyError | OverflowError):
        return _R.OH_NN_INVALID_PARAMETER
    return _R.OH_NN_FAILED


def crossrt_status(code: int) -> StatusCode:
    """The crossrt StatusCode of an OH_NN_ReturnCode value."""
    return FROM_NN[OH_NN_ReturnCode(code)]


guarded = never_raises(status_of, log)
"""``@guarded(shape)``: the ``OH_NN*`` function returns its code in that shape
(``compat.guard``), never raises."""


def invalid(message: str) -> NNError:
    """OH_NN_INVALID_PARAMETER with ``message``."""
    return NNError(_R.OH_NN_INVALID_PARAMETER, message)


def forbidden(message: str) -> NNError:
    """OH_NN_OPERATION_FORBIDDEN with ``message``."""
    return NNError(_R.OH_NN_OPERATION_FORBIDDEN, message)
