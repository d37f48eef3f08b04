"""The one rule of every seed API layer: no exception crosses it.

A translated C function returns its seed's status (or a ``(status, None)`` pair, ``None`` for
a pointer, 0 for a size) where crossrt raises; the error's message, which says what to do,
goes to the layer's logger. Each layer gives the mapping from exception to status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any, ParamSpec, Protocol

P = ParamSpec("P")

FAILURE_SHAPES = ("status", "pair", "value", "handle", "void")
"""What a failed call returns: the status; ``(status, None)`` for a function with an
out-parameter; 0 for one that returns a number in C; ``None`` for one that returns a handle
(C's NULL) or nothing."""


class Wrap(Protocol):
    """What ``guarded(shape)`` returns: the decorator itself."""

    def __call__(self, function: Callable[P, Any], /) -> Callable[P, Any]: ...


class Guard(Protocol):
    """A layer's ``guarded``: ``@guarded()`` or ``@guarded("pair")``."""

    def __call__(self, shape: str = "status") -> Wrap: ...


def never_raises(
    status_of: Callable[[BaseException], IntEnum],
    log: logging.Logger,
    spoken: Mapping[str, str] | None = None,
) -> Guard:
    """A decorator factory for one layer: ``guarded(shape)`` wraps a function so that any
    exception becomes ``status_of(exc)`` in the form ``shape`` says (:data:`FAILURE_SHAPES`),
    logged on ``log``; ``spoken``: crossrt's words in messages -> the layer's (a setting's
    crossrt name -> the seed's variable), so a port reads the names it knows."""

    def said(exc: Exception) -> str:
        text = str(exc)
        for crossrt_words, seed_words in (spoken or {}).items():
            text = text.replace(crossrt_words, seed_words)
        return text

    def guarded(shape: str = "status") -> Wrap:
        if shape not in FAILURE_SHAPES:
            raise ValueError(f"failure shape {shape!r}: one of {FAILURE_SHAPES}")

        def wrap(function: Callable[P, Any]) -> Callable[P, Any]:
            @functools.wraps(function)
            def call(*args: P.args, **kwargs: P.kwargs) -> Any:
                try:
                    return function(*args, **kwargs)
                except Exception as exc:  # the seed's API returns statuses, never raises
                    status = status_of(exc)
                    log.error("%s: %s (%s)", function.__name__, said(exc), status.name)
                    if shape == "pair":
                        return status, None
                    if shape == "value":
                        return 0
                    if shape in ("handle", "void"):
                        return None
                    return status

            return call

        return wrap

    return guarded
