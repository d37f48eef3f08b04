"""StatusCode numbers and the CrossrtError hierarchy (crossrt.errors)."""

from __future__ import annotations

import copy
import pickle

import pytest

import crossrt
from crossrt.errors import (
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
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
    UnsupportedError,
)

# The numbers of Neuron's NRT_STATUS (nrt_status.h); the compat layer maps them one to one.
NRT_STATUS = {
    "SUCCESS": 0,
    "FAILURE": 1,
    "INVALID": 2,
    "INVALID_HANDLE": 3,
    "RESOURCE": 4,
    "TIMEOUT": 5,
    "HW_ERROR": 6,
    "QUEUE_FULL": 7,
    "LOAD_NOT_ENOUGH_NC": 9,
    "UNSUPPORTED_NEFF_VERSION": 10,
    "FAIL_HOST_MEM_ALLOC": 11,
    "UNINITIALIZED": 13,
    "CLOSED": 14,
    "QUEUE_EMPTY": 15,
    "EXEC_BAD_INPUT": 1002,
    "EXEC_COMPLETED_WITH_NUM_ERR": 1003,
    "EXEC_COMPLETED_WITH_ERR": 1004,
    "EXEC_NC_BUSY": 1005,
    "EXEC_OOB": 1006,
}

# class, the builtin it must also be, its default code.
HIERARCHY = [
    (InvalidArgumentError, ValueError, StatusCode.INVALID),
    (InvalidContainerError, ValueError, StatusCode.INVALID),
    (InvalidOptionError, ValueError, StatusCode.INVALID_OPTION),
    (InvalidInputError, ValueError, StatusCode.EXEC_BAD_INPUT),
    (InvalidModelError, ValueError, StatusCode.INVALID_MODEL),
    (ModelNotFoundError, FileNotFoundError, StatusCode.NOT_FOUND),
    (UnsupportedError, NotImplementedError, StatusCode.UNSUPPORTED_OPERATOR),
    (DeviceUnavailableError, RuntimeError, StatusCode.DEVICE_UNAVAILABLE),
    (CompileError, RuntimeError, StatusCode.COMPILE_ERROR),
    (OperationForbiddenError, RuntimeError, StatusCode.OPERATION_FORBIDDEN),
    (ClosedError, RuntimeError, StatusCode.CLOSED),
    (InvalidHandleError, RuntimeError, StatusCode.INVALID_HANDLE),
    (OutOfResourcesError, MemoryError, StatusCode.RESOURCE),
    (ExecutionError, RuntimeError, StatusCode.FAILURE),
    (DeadlineExceededError, TimeoutError, StatusCode.TIMEOUT),
]
CLASSES = [cls for cls, _, _ in HIERARCHY]


@pytest.mark.parametrize(("name", "number"), sorted(NRT_STATUS.items(), key=lambda kv: kv[1]))
def test_status_code_matches_nrt_status(name: str, number: int) -> None:
    assert StatusCode[name] == number
    assert StatusCode(number).name == name


def test_status_codes_are_unique_and_crossrt_codes_start_at_2000() -> None:
    values = [c.value for c in StatusCode]
    assert len(values) == len(set(values)), "two StatusCode names share a number (an alias)"
    nrt_numbers = set(NRT_STATUS.values())
    own = [c for c in StatusCode if c.name not in NRT_STATUS and c.value >= 2000]
    assert {c.name for c in own} >= {
        "UNSUPPORTED_OPERATOR",
        "COMPILE_ERROR",
        "INVALID_MODEL",
        "DEVICE_UNAVAILABLE",
        "OPERATION_FORBIDDEN",
        "INVALID_OPTION",
        "NOT_FOUND",
        "DRIVER_UNAVAILABLE",
    }
    assert not nrt_numbers & {c.value for c in own}


def test_status_code_describe() -> None:
    assert StatusCode.EXEC_BAD_INPUT.describe() == "EXEC_BAD_INPUT (1002)"
    assert StatusCode.SUCCESS.describe() == "SUCCESS (0)"


@pytest.mark.parametrize(
    ("cls", "builtin", "code"), HIERARCHY, ids=lambda v: getattr(v, "__name__", None)
)
def test_subclass_is_crossrt_error_and_its_builtin(
    cls: type[CrossrtError], builtin: type[Exception], code: StatusCode
) -> None:
    err = cls("something is wrong; do this", details={"input": "x"})
    assert isinstance(err, CrossrtError)
    assert isinstance(err, builtin)
    assert err.code is code
    assert cls.default_code is code
    assert err.message == "something is wrong; do this"
    assert err.details == {"input": "x"}
    assert str(err) == f"[{code.name} ({code.value})] something is wrong; do this"
    # Code that only knows the builtin still catches it.
    with pytest.raises(builtin):
        raise err


def test_every_public_error_class_is_covered() -> None:
    """Every error lives in crossrt.errors (the root re-exports only those users catch most)."""
    public = {
        name
        for name, value in vars(crossrt.errors).items()
        if isinstance(value, type)
        and issubclass(value, CrossrtError)
        and value is not CrossrtError
        and value.__module__ == "crossrt.errors"
        and not name.startswith("_")
    }
    assert public == {cls.__name__ for cls in CLASSES}
    root = {n for n in crossrt.__all__ if isinstance(getattr(crossrt, n), type)}
    assert all(getattr(crossrt, n) is getattr(crossrt.errors, n) for n in root & public)


def test_explicit_code_overrides_default_and_str_uses_it() -> None:
    err = OutOfResourcesError("need 8 cores, have 2", code=StatusCode.LOAD_NOT_ENOUGH_NC)
    assert err.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert str(err).startswith("[LOAD_NOT_ENOUGH_NC (9)] ")


def test_base_error_defaults() -> None:
    err = CrossrtError("boom")
    assert err.code is StatusCode.FAILURE
    assert err.details == {}
    assert str(err) == "[FAILURE (1)] boom"


def test_details_are_copied_not_aliased() -> None:
    given = {"nodes": ["a"]}
    err = InvalidModelError("bad", details=given)
    given["extra"] = 1
    assert err.details == {"nodes": ["a"]}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip_keeps_code_message_details(
    cls: type[CrossrtError], protocol: int
) -> None:
    err = cls("it broke", code=StatusCode.EXEC_OOB, details={"input": "x", "shape": [1, 2]})
    back = pickle.loads(pickle.dumps(err, protocol=protocol))
    assert type(back) is cls
    assert back.code is StatusCode.EXEC_OOB
    assert back.message == "it broke"
    assert back.details == {"input": "x", "shape": [1, 2]}
    assert str(back) == str(err)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_pickle_round_trip_with_default_code(cls: type[CrossrtError]) -> None:
    back = pickle.loads(pickle.dumps(cls("plain")))
    assert back.code is cls.default_code
    assert back.details == {}


def test_copy_keeps_code_and_details() -> None:
    err = DeadlineExceededError("too slow", details={"timeout_s": 1.5})
    for clone in (copy.copy(err), copy.deepcopy(err)):
        assert type(clone) is DeadlineExceededError
        assert clone.code is StatusCode.TIMEOUT
        assert clone.details == {"timeout_s": 1.5}


def test_os_error_subclasses_keep_the_message_as_their_only_argument() -> None:
    # ModelNotFoundError and DeadlineExceededError are OSErrors: their extra constructor
    # arguments must not be read as errno/strerror/filename.
    err = ModelNotFoundError("no such model", code=StatusCode.NOT_FOUND, details={"path": "/x"})
    assert err.args == ("no such model",)
    assert err.errno is None
    assert err.filename is None
    assert str(err) == "[NOT_FOUND (2007)] no such model"
