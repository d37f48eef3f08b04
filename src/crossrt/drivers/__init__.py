"""The driver layer: engine adapters behind one small interface (see ``base``)."""

from .base import (
    Capabilities,
    CompileOptions,
    DeviceInfo,
    DeviceKind,
    Driver,
    PerformanceMode,
    Priority,
    Program,
)
from .registry import (
    DriverStatus,
    available_drivers,
    driver_statuses,
    get_driver,
    parse_device,
    resolve_device,
)

__all__ = [
    "Capabilities",
    "CompileOptions",
    "DeviceInfo",
    "DeviceKind",
    "Driver",
    "DriverStatus",
    "PerformanceMode",
    "Priority",
    "Program",
    "available_drivers",
    "driver_statuses",
    "get_driver",
    "parse_device",
    "resolve_device",
]
