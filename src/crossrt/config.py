"""``CROSSRT_*`` environment settings, parsed and validated in one place.

Settings are read when asked for (not at import), so tests and tools can set the environment
first. Later capabilities add their variables here, never by reading ``os.environ`` elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidOptionError

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Settings:
    """The process-wide settings.

    Attributes:
        default_device: device used when a call names none (``CROSSRT_DEFAULT_DEVICE``, "cpu").
        log_level: level of the ``crossrt`` logger (``CROSSRT_LOG_LEVEL``, "WARNING").
        disabled_drivers: drivers not to use even when installed (``CROSSRT_DISABLE_DRIVERS``,
            a comma-separated list).
    """

    default_device: str = "cpu"
    log_level: str = "WARNING"
    disabled_drivers: frozenset[str] = frozenset()


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings from ``environ`` (default: ``os.environ``)."""
    env = os.environ if environ is None else environ
    level = env.get("CROSSRT_LOG_LEVEL", "WARNING").strip().upper()
    if level not in _LOG_LEVELS:
        raise InvalidOptionError(
            f"CROSSRT_LOG_LEVEL={level!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}"
        )
    device = env.get("CROSSRT_DEFAULT_DEVICE", "cpu").strip() or "cpu"
    disabled = frozenset(
        name.strip() for name in env.get("CROSSRT_DISABLE_DRIVERS", "").split(",") if name.strip()
    )
    return Settings(default_device=device, log_level=level, disabled_drivers=disabled)
