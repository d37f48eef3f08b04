"""The contract of every C-style function of this layer: it returns a ``bm_status_t`` (or the
value its C counterpart returns on failure), never raises.

``@seed_call`` wraps a function so that

- each argument annotated with one of this layer's handle classes (``bm_handle_t``,
  ``Bmruntime``, ``bm_device_mem_t``, ``bm_tensor_t``...) is checked to be one before the body
  runs: NULL (None) or a handle of another kind is BM_ERR_PARAM, with a message naming the
  argument and the call that makes such a handle;
- any exception the body raises becomes its status (:func:`.status.status_of`), logged.

What a failure returns follows the function's return annotation, as in C: ``bm_status_t`` the
status; ``tuple[bm_status_t, ...]`` ``(status, None)``; ``bool`` False; ``int`` 0; anything
else (a pointer, ``void``) None.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import InvalidArgumentError
from .status import log, status_of

__all__ = ["seed_call"]

F = TypeVar("F", bound=Callable[..., Any])

MAKERS = {
    "bm_handle_t": "bm_dev_request",
    "Bmruntime": "bmrt_create",
    "DeviceMemory": "bm_malloc_device_byte",
    "bm_tensor_t": "bm_tensor_t() and bmrt_tensor",
    "bm_shape_t": "bm_shape_t() and bmrt_shape",
    "bm_net_info_t": "bmrt_get_network_info",
    "mem_info_t": "mem_info_t()",
}
"""The classes an argument is checked against, by annotation, and where a program gets one."""


def _failure_value(annotation: str, status: Any) -> Any:
    if annotation == "bm_status_t":
        return status
    if annotation.startswith("tuple[bm_status_t"):
        return status, None
    if annotation == "bool":
        return False
    if annotation == "int":
        return 0
    return None


def _checks(function: Callable[..., Any]) -> list[tuple[int, str, type]]:
    """(position, name, class) of each argument annotated with a handle class."""
    checks = []
    for index, param in enumerate(inspect.signature(function).parameters.values()):
        if param.annotation in MAKERS:
            cls = function.__globals__.get(param.annotation)
            if isinstance(cls, type):
                checks.append((index, param.name, cls))
    return checks


def seed_call(function: F) -> F:
    """Make ``function`` keep the layer's contract (module docstring)."""
    name = function.__name__
    returns = str(inspect.signature(function).return_annotation)
    checks: list[tuple[int, str, type]] | None = None  # resolved at the first call

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal checks
        try:
            if checks is None:
                checks = _checks(function)  # the classes exist once every module is imported
            for index, param, cls in checks:
                if index < len(args):
                    value = args[index]
                elif param in kwargs:
                    value = kwargs[param]
                else:
                    continue  # its default
                if not isinstance(value, cls):
                    raise InvalidArgumentError(
                        f"{name}: {param} is {value!r}, not a {cls.__name__}; give what "
                        f"{MAKERS[cls.__name__]} returned"
                    )
            return function(*args, **kwargs)
        except Exception as exc:  # the seed's API returns statuses, never raises
            status = status_of(exc)
            log.warning("%s: %s: %s (%s)", name, type(exc).__name__, exc, status.name)
            return _failure_value(returns, status)

    return call  # type: ignore[return-value]
