"""``NRT_STATUS`` as ``nrt_status.h`` numbers it, its mapping to crossrt's StatusCode, and the
guard that keeps every exception on this side of the API.

crossrt's own StatusCode takes its first numbers from NRT_STATUS, so most codes map to the
value of the same name; crossrt's own codes (2000 and up) map to the NRT_STATUS a Neuron
program expects for the same failure (a model that does not validate is ``NRT_INVALID``, a
name missing from a tensor set ``NRT_FAILURE``, as the seed says).
"""

from __future__ import annotations

import logging
from enum import IntEnum

from ...errors import CrossrtError, StatusCode
from ..guard import never_raises

__all__ = [
    "FROM_NRT",
    "NRT_CLOSED",
    "NRT_COLL_PENDING",
    "NRT_EXEC_BAD_INPUT",
    "NRT_EXEC_COMPLETED_WITH_ERR",
    "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
    "NRT_EXEC_HW_ERR_COLLECTIVES",
    "NRT_EXEC_HW_ERR_DMA_ABORT",
    "NRT_EXEC_HW_ERR_HBM_UE",
    "NRT_EXEC_HW_ERR_NC_UE",
    "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE",
    "NRT_EXEC_NC_BUSY",
    "NRT_EXEC_OOB",
    "NRT_EXEC_SW_NQ_OVERFLOW",
    "NRT_EXEC_UNIT_UNRECOVERABLE",
    "NRT_FAILURE",
    "NRT_FAIL_HOST_MEM_ALLOC",
    "NRT_HW_ERROR",
    "NRT_INVALID",
    "NRT_INVALID_HANDLE",
    "NRT_LOAD_NOT_ENOUGH_NC",
    "NRT_NETWORK_PROXY_FAILURE",
    "NRT_OOB",
    "NRT_QUEUE_EMPTY",
    "NRT_QUEUE_FULL",
    "NRT_RESOURCE",
    "NRT_STATUS",
    "NRT_SUCCESS",
    "NRT_TIMEOUT",
    "NRT_UNINITIALIZED",
    "NRT_UNSUPPORTED_NEFF_VERSION",
    "TO_NRT",
    "NrtError",
    "crossrt_status",
    "guarded",
    "nrt_get_status_as_str",
    "status_of",
]


log = logging.getLogger("crossrt.compat.neuron")


class NRT_STATUS(IntEnum):  # the seed's name
    """The status values of ``nrt_status.h``."""

    NRT_SUCCESS = 0
    NRT_FAILURE = 1
    NRT_INVALID = 2
    NRT_INVALID_HANDLE = 3
    NRT_RESOURCE = 4
    NRT_TIMEOUT = 5
    NRT_HW_ERROR = 6
    NRT_QUEUE_FULL = 7
    NRT_LOAD_NOT_ENOUGH_NC = 9
    NRT_UNSUPPORTED_NEFF_VERSION = 10
    NRT_FAIL_HOST_MEM_ALLOC = 11
    NRT_UNINITIALIZED = 13
    NRT_CLOSED = 14
    NRT_QUEUE_EMPTY = 15
    NRT_EXEC_UNIT_UNRECOVERABLE = 101
    NRT_EXEC_BAD_INPUT = 1002
    NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003
    NRT_EXEC_COMPLETED_WITH_ERR = 1004
    NRT_EXEC_NC_BUSY = 1005
    NRT_EXEC_OOB = 1006
    NRT_COLL_PENDING = 1100
    NRT_EXEC_HW_ERR_COLLECTIVES = 1200
    NRT_EXEC_HW_ERR_HBM_UE = 1201
    NRT_EXEC_HW_ERR_NC_UE = 1202
    NRT_EXEC_HW_ERR_DMA_ABORT = 1203
    NRT_EXEC_SW_NQ_OVERFLOW = 1204
    NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE = 1205
    NRT_NETWORK_PROXY_FAILURE = 1206


NRT_SUCCESS = NRT_STATUS.NRT_SUCCESS
NRT_FAILURE = NRT_STATUS.NRT_FAILURE
NRT_INVALID = NRT_STATUS.NRT_INVALID
NRT_INVALID_HANDLE = NRT_STATUS.NRT_INVALID_HANDLE
NRT_RESOURCE = NRT_STATUS.NRT_RESOURCE
NRT_TIMEOUT = NRT_STATUS.NRT_TIMEOUT
NRT_HW_ERROR = NRT_STATUS.NRT_HW_ERROR
NRT_QUEUE_FULL = NRT_STATUS.NRT_QUEUE_FULL
NRT_LOAD_NOT_ENOUGH_NC = NRT_STATUS.NRT_LOAD_NOT_ENOUGH_NC
NRT_UNSUPPORTED_NEFF_VERSION = NRT_STATUS.NRT_UNSUPPORTED_NEFF_VERSION
NRT_FAIL_HOST_MEM_ALLOC = NRT_STATUS.NRT_FAIL_HOST_MEM_ALLOC
NRT_UNINITIALIZED = NRT_STATUS.NRT_UNINITIALIZED
NRT_CLOSED = NRT_STATUS.NRT_CLOSED
NRT_QUEUE_EMPTY = NRT_STATUS.NRT_QUEUE_EMPTY
NRT_EXEC_UNIT_UNRECOVERABLE = NRT_STATUS.NRT_EXEC_UNIT_UNRECOVERABLE
NRT_EXEC_BAD_INPUT = NRT_STATUS.NRT_EXEC_BAD_INPUT
NRT_EXEC_COMPLETED_WITH_NUM_ERR = NRT_STATUS.NRT_EXEC_COMPLETED_WITH_NUM_ERR
NRT_EXEC_COMPLETED_WITH_ERR = NRT_STATUS.NRT_EXEC_COMPLETED_WITH_ERR
NRT_EXEC_NC_BUSY = NRT_STATUS.NRT_EXEC_NC_BUSY
NRT_EXEC_OOB = NRT_STATUS.NRT_EXEC_OOB
NRT_COLL_PENDING = NRT_STATUS.NRT_COLL_PENDING
NRT_EXEC_HW_ERR_COLLECTIVES = NRT_STATUS.NRT_EXEC_HW_ERR_COLLECTIVES
NRT_EXEC_HW_ERR_HBM_UE = NRT_STATUS.NRT_EXEC_HW_ERR_HBM_UE
NRT_EXEC_HW_ERR_NC_UE = NRT_STATUS.NRT_EXEC_HW_ERR_NC_UE
NRT_EXEC_HW_ERR_DMA_ABORT = NRT_STATUS.NRT_EXEC_HW_ERR_DMA_ABORT
NRT_EXEC_SW_NQ_OVERFLOW = NRT_STATUS.NRT_EXEC_SW_NQ_OVERFLOW
NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE = NRT_STATUS.NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE
NRT_NETWORK_PROXY_FAILURE = NRT_STATUS.NRT_NETWORK_PROXY_FAILURE

NRT_OOB = NRT_STATUS.NRT_EXEC_OOB
"""The developer guide's name for 1006."""

_DESCRIPTIONS = {
    NRT_STATUS.NRT_SUCCESS: "Call was successful",
    NRT_STATUS.NRT_FAILURE: "Generic failure",
    NRT_STATUS.NRT_INVALID: (
        "Invalid NEFF, bad instruction, bad DMA descriptor, input tensor name/size does not "
        "match the model, etc."
    ),
    NRT_STATUS.NRT_INVALID_HANDLE: "Invalid handle (e.g. an invalid model handle)",
    NRT_STATUS.NRT_RESOURCE: "Failed to allocate a resource for the requested operation",
    NRT_STATUS.NRT_TIMEOUT: "Operation timed out",
    NRT_STATUS.NRT_HW_ERROR: "Hardware failure",
    NRT_STATUS.NRT_QUEUE_FULL: "Too many pending nrt_execute() requests",
    NRT_STATUS.NRT_LOAD_NOT_ENOUGH_NC: (
        "The number of available NeuronCores is insufficient for the requested operation"
    ),
    NRT_STATUS.NRT_UNSUPPORTED_NEFF_VERSION: "NEFF version unsupported",
    NRT_STATUS.NRT_FAIL_HOST_MEM_ALLOC: "Failed to allocate host memory",
    NRT_STATUS.NRT_UNINITIALIZED: "The library is not initialized (call nrt_init first)",
    NRT_STATUS.NRT_CLOSED: "The library was closed by nrt_close()",
    NRT_STATUS.NRT_QUEUE_EMPTY: "No request is pending",
    NRT_STATUS.NRT_EXEC_BAD_INPUT: "Invalid input has been submitted to nrt_execute()",
    NRT_STATUS.NRT_EXEC_COMPLETED_WITH_NUM_ERR: (
        "Execution completed with numerical errors (produced NaN)"
    ),
    NRT_STATUS.NRT_EXEC_COMPLETED_WITH_ERR: "Execution was completed with other errors",
    NRT_STATUS.NRT_EXEC_NC_BUSY: "The neuron core is locked (in use) by another model/thread",
    NRT_STATUS.NRT_EXEC_OOB: "One or more indirect memcopies are out of bound",
}

_S = StatusCode
_NRT_VALUES = {s.value for s in NRT_STATUS}
_CODE_VALUES = {c.value for c in StatusCode}
_OWN: dict[StatusCode, NRT_STATUS] = {
    _S.UNSUPPORTED_OPERATOR: NRT_STATUS.NRT_INVALID,
    _S.COMPILE_ERROR: NRT_STATUS.NRT_INVALID,
    _S.INVALID_MODEL: NRT_STATUS.NRT_INVALID,
    _S.INVALID_OPTION: NRT_STATUS.NRT_INVALID,
    _S.DEVICE_UNAVAILABLE: NRT_STATUS.NRT_RESOURCE,
    _S.DRIVER_UNAVAILABLE: NRT_STATUS.NRT_RESOURCE,
    _S.OPERATION_FORBIDDEN: NRT_STATUS.NRT_FAILURE,
    _S.NOT_FOUND: NRT_STATUS.NRT_FAILURE,
}
TO_NRT: dict[StatusCode, NRT_STATUS] = {
    **{code: NRT_STATUS(code.value) for code in StatusCode if code.value in _NRT_VALUES},
    **_OWN,
}
"""Every crossrt StatusCode as the NRT_STATUS a Neuron program gets for it."""

FROM_NRT: dict[NRT_STATUS, StatusCode] = {
    status: StatusCode(status.value) for status in NRT_STATUS if status.value in _CODE_VALUES
}
"""Every NRT_STATUS as the crossrt StatusCode of the same meaning."""
FROM_NRT[NRT_STATUS.NRT_EXEC_HW_ERR_HBM_UE] = StatusCode.HW_ERR_HBM_UE
FROM_NRT[NRT_STATUS.NRT_EXEC_HW_ERR_NC_UE] = StatusCode.HW_ERR_NC_UE
FROM_NRT[NRT_STATUS.NRT_EXEC_HW_ERR_DMA_ABORT] = StatusCode.HW_ERR_DMA_ABORT
FROM_NRT[NRT_STATUS.NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE] = StatusCode.HW_ERR_REPAIRABLE_HBM_UE


class NrtError(Exception):
    """A failure this layer finds itself (a bad argument, a call out of order), with the
    NRT_STATUS the seed gives for it. Never leaves the layer: the guard returns its status."""

    def __init__(self, status: NRT_STATUS, message: str) -> None:
        super().__init__(message)
        self.status = status


def status_of(exc: BaseException) -> NRT_STATUS:
    """The NRT_STATUS of an exception a translated call raised."""
    if isinstance(exc, NrtError):
        return exc.status
    if isinstance(exc, CrossrtError):
        return TO_NRT.get(exc.code, NRT_STATUS.NRT_FAILURE)
    if isinstance(exc, MemoryError):
        return NRT_STATUS.NRT_FAIL_HOST_MEM_ALLOC
    if isinstance(exc, TypeError | ValueError | BufferError):
        return NRT_STATUS.NRT_INVALID
    return NRT_STATUS.NRT_FAILURE


SPOKEN = {
    "exec_timeout (or CROSSRT_EXEC_TIMEOUT)": "NEURON_RT_EXEC_TIMEOUT",
    "load without check_numerics": "unset NEURON_FAIL_ON_NAN and "
    "NEURON_RT_NUMERICAL_ERRORS_VERIFICATION",
    "CROSSRT_VISIBLE_CORES": "NEURON_RT_VISIBLE_CORES",
    "CROSSRT_NUM_CORES": "NEURON_RT_NUM_CORES",
}
"""crossrt's names for settings, in messages, -> Neuron's: what a Neuron program reads."""

guarded = never_raises(status_of, log, SPOKEN)
"""``@guarded(shape)``: the ``nrt_*`` function returns its NRT_STATUS in that shape
(``compat.guard``), never raises."""


def nrt_get_status_as_str(status: int) -> str:
    """The description of an NRT_STATUS value (``nrt_get_status_as_str``); an unknown value
    says so."""
    try:
        known = NRT_STATUS(status)
    except ValueError:
        return f"Unknown status {status}"
    return _DESCRIPTIONS.get(known, known.name.removeprefix("NRT_").replace("_", " ").lower())


def crossrt_status(status: int) -> StatusCode:
    """The crossrt StatusCode of an NRT_STATUS value."""
    return FROM_NRT[NRT_STATUS(status)]
