"""Compile options: parsed and validated before any driver sees them."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

from ..drivers.base import CompileOptions, PerformanceMode, Priority
from ..errors import InvalidOptionError

KNOWN_OPTIONS = {
    "performance_mode": "NONE, LOW, MEDIUM, HIGH or EXTREME (OH_NN_PerformanceMode)",
    "priority": "NONE, LOW, MEDIUM or HIGH (OH_NN_Priority)",
    "fp16": "True to allow reduced-precision arithmetic",
    "portable": "True to compile for any device of the kind, not only this one (slower loads)",
    "extensions": "a dict of driver-specific settings",
}

_E = TypeVar("_E", bound=enum.IntEnum)


def parse_options(**options: Any) -> CompileOptions:
    """Turn ``compile(**options)`` into :class:`CompileOptions`, refusing unknown names.

    Raises:
        InvalidOptionError: an unknown option (the message lists the known ones), or a bad
            value (the message says what the option takes).
    """
    unknown = sorted(set(options) - set(KNOWN_OPTIONS))
    if unknown:
        known = "; ".join(f"{k}: {v}" for k, v in KNOWN_OPTIONS.items())
        raise InvalidOptionError(
            f"unknown compile option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; known options are {known}",
            details={"unknown": unknown, "known": list(KNOWN_OPTIONS)},
        )
    fp16 = options.get("fp16", False)
    if not isinstance(fp16, bool):
        raise _bad("fp16", fp16)
    portable = options.get("portable", False)
    if not isinstance(portable, bool):
        raise _bad("portable", portable)
    extensions = options.get("extensions")
    if extensions is None:
        extensions = {}
    if not isinstance(extensions, Mapping) or not all(isinstance(k, str) for k in extensions):
        raise _bad("extensions", extensions)
    return CompileOptions(
        performance_mode=_enum(PerformanceMode, "performance_mode", options),
        priority=_enum(Priority, "priority", options),
        fp16=fp16,
        portable=portable,
        extensions=dict(extensions),
    )


def _enum(cls: type[_E], key: str, options: Mapping[str, Any]) -> _E:
    value = options.get(key, cls(0))
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and value.upper() in cls.__members__:
        return cls[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    raise _bad(key, value)


def _bad(key: str, value: Any) -> InvalidOptionError:
    return InvalidOptionError(
        f"compile option {key}={value!r} is not valid; {key} takes {KNOWN_OPTIONS[key]}",
        details={"option": key},
    )
