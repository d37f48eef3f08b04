"""``bm_status_t`` as bmlib numbers it, and its mapping to and from crossrt's StatusCode.

The C-style functions of this layer never raise: each catches the crossrt error of the call
it translates, logs its message (which says what to do) on the ``crossrt.compat.bmruntime``
logger, and returns the ``bm_status_t`` (or ``False`` / ``None`` where the seed's function
returns a bool or a pointer) that :func:`status_of` gives.
"""

from __future__ import annotations

import logging
from enum import IntEnum

from ...errors import CrossrtError, InvalidContainerError, InvalidModelError, StatusCode

__all__ = [
    "BM_ERR_BUSY",
    "BM_ERR_DATA",
    "BM_ERR_DEVNOTREADY",
    "BM_ERR_FAILURE",
    "BM_ERR_NOFEATURE",
    "BM_ERR_NOMEM",
    "BM_ERR_PARAM",
    "BM_ERR_TIMEOUT",
    "BM_NOT_SUPPORTED",
    "BM_SUCCESS",
    "FROM_BM",
    "TO_BM",
    "NoFeatureError",
    "bm_status_t",
    "crossrt_status",
    "failed",
    "status_of",
]

log = logging.getLogger("crossrt.compat.bmruntime")


class bm_status_t(IntEnum):
    """bmlib's status values (``bmlib_runtime.h``)."""

    BM_SUCCESS = 0
    BM_ERR_DEVNOTREADY = 1
    BM_ERR_FAILURE = 2
    BM_ERR_TIMEOUT = 3
    BM_ERR_PARAM = 4
    BM_ERR_NOMEM = 5
    BM_ERR_DATA = 6
    BM_ERR_BUSY = 7
    BM_ERR_NOFEATURE = 8
    BM_NOT_SUPPORTED = 9


BM_SUCCESS = bm_status_t.BM_SUCCESS
BM_ERR_DEVNOTREADY = bm_status_t.BM_ERR_DEVNOTREADY
BM_ERR_FAILURE = bm_status_t.BM_ERR_FAILURE
BM_ERR_TIMEOUT = bm_status_t.BM_ERR_TIMEOUT
BM_ERR_PARAM = bm_status_t.BM_ERR_PARAM
BM_ERR_NOMEM = bm_status_t.BM_ERR_NOMEM
BM_ERR_DATA = bm_status_t.BM_ERR_DATA
BM_ERR_BUSY = bm_status_t.BM_ERR_BUSY
BM_ERR_NOFEATURE = bm_status_t.BM_ERR_NOFEATURE
BM_NOT_SUPPORTED = bm_status_t.BM_NOT_SUPPORTED

_S = StatusCode
TO_BM: dict[StatusCode, bm_status_t] = {
    _S.SUCCESS: BM_SUCCESS,
    _S.FAILURE: BM_ERR_FAILURE,
    _S.INVALID: BM_ERR_PARAM,
    _S.INVALID_HANDLE: BM_ERR_PARAM,
    _S.INVALID_OPTION: BM_ERR_PARAM,
    _S.NOT_FOUND: BM_ERR_PARAM,
    _S.EXEC_BAD_INPUT: BM_ERR_PARAM,
    _S.EXEC_OOB: BM_ERR_PARAM,
    _S.RESOURCE: BM_ERR_NOMEM,
    _S.FAIL_HOST_MEM_ALLOC: BM_ERR_NOMEM,
    _S.TIMEOUT: BM_ERR_TIMEOUT,
    _S.QUEUE_FULL: BM_ERR_BUSY,
    _S.EXEC_NC_BUSY: BM_ERR_BUSY,
    _S.LOAD_NOT_ENOUGH_NC: BM_ERR_BUSY,
    _S.UNINITIALIZED: BM_ERR_DEVNOTREADY,
    _S.CLOSED: BM_ERR_DEVNOTREADY,
    _S.DEVICE_UNAVAILABLE: BM_ERR_DEVNOTREADY,
    _S.DRIVER_UNAVAILABLE: BM_ERR_DEVNOTREADY,
    _S.INVALID_MODEL: BM_ERR_DATA,
    _S.EXEC_COMPLETED_WITH_NUM_ERR: BM_ERR_DATA,
    _S.EXEC_COMPLETED_WITH_ERR: BM_ERR_DATA,
    _S.UNSUPPORTED_OPERATOR: BM_NOT_SUPPORTED,
    _S.UNSUPPORTED_NEFF_VERSION: BM_NOT_SUPPORTED,
}
"""crossrt's codes that have a bmlib counterpart; every other code is BM_ERR_FAILURE."""

FROM_BM: dict[bm_status_t, StatusCode] = {
    BM_SUCCESS: _S.SUCCESS,
    BM_ERR_DEVNOTREADY: _S.DEVICE_UNAVAILABLE,
    BM_ERR_FAILURE: _S.FAILURE,
    BM_ERR_TIMEOUT: _S.TIMEOUT,
    BM_ERR_PARAM: _S.INVALID,
    BM_ERR_NOMEM: _S.RESOURCE,
    BM_ERR_DATA: _S.INVALID_MODEL,
    BM_ERR_BUSY: _S.EXEC_NC_BUSY,
    BM_ERR_NOFEATURE: _S.UNSUPPORTED_OPERATOR,
    BM_NOT_SUPPORTED: _S.UNSUPPORTED_OPERATOR,
}
"""Each bm_status_t as the crossrt code of the same meaning."""


class NoFeatureError(CrossrtError, NotImplementedError):
    """A feature of the seed that this layer does not provide (BM_ERR_NOFEATURE)."""

    default_code = StatusCode.UNSUPPORTED_OPERATOR


def status_of(exc: BaseException) -> bm_status_t:
    """The bm_status_t of an error a translated call raised."""
    if isinstance(exc, NoFeatureError):
        return BM_ERR_NOFEATURE
    if isinstance(exc, InvalidContainerError | InvalidModelError):
        return BM_ERR_DATA  # a corrupt bmodel: data, not a parameter
    if isinstance(exc, CrossrtError):
        return TO_BM.get(exc.code, BM_ERR_FAILURE)
    if isinstance(exc, MemoryError):
        return BM_ERR_NOMEM
    if isinstance(exc, TypeError | ValueError):
        return BM_ERR_PARAM
    return BM_ERR_FAILURE


ERRORS = (CrossrtError, TypeError, ValueError)
"""What a translated call turns into its status (:func:`failed`); anything else is a bug and
propagates."""


def failed(what: str, exc: BaseException) -> bm_status_t:
    """Log why ``what`` failed and return its status."""
    status = status_of(exc)
    log.warning("%s: %s (%s)", what, exc, status.name)
    return status


def crossrt_status(status: int) -> StatusCode:
    """The crossrt StatusCode of a bm_status_t."""
    return FROM_BM[bm_status_t(status)]
