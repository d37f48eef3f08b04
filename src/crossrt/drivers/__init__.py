"""The driver layer, and the API for driver authors (``crossrt.drivers``).

A driver implements :class:`Driver` and :class:`Program` and is found through the
``crossrt.drivers`` entry-point group (``docs/writing-a-driver.md``; ``drivers/sim.py`` is the
worked example). Everything a driver needs from crossrt is named here; the rest of crossrt
reaches drivers only through this package (``base`` and ``registry``), never a driver's own
modules.
"""

from .base import (
    ArtifactFile,
    CancelToken,
    Capabilities,
    CompileOptions,
    CoreSet,
    DeviceArray,
    DeviceInfo,
    DeviceKind,
    Driver,
    PerformanceMode,
    Priority,
    Program,
    Residence,
    check_range,
    copy_into,
    host_cpu,
)
from .boundary import program_error, unguarded
from .registry import (
    DriverStatus,
    available_drivers,
    describe_devices,
    device_order,
    driver_statuses,
    get_driver,
    parse_device,
    resolve_device,
)

__all__ = [
    "ArtifactFile",
    "CancelToken",
    "Capabilities",
    "CompileOptions",
    "CoreSet",
    "DeviceArray",
    "DeviceInfo",
    "DeviceKind",
    "Driver",
    "DriverStatus",
    "PerformanceMode",
    "Priority",
    "Program",
    "Residence",
    "available_drivers",
    "check_range",
    "copy_into",
    "describe_devices",
    "device_order",
    "driver_statuses",
    "get_driver",
    "host_cpu",
    "parse_device",
    "program_error",
    "resolve_device",
    "unguarded",
]
