"""The driver layer, and the API for driver authors (``crossrt.drivers``).

A driver implements :class:`Driver` and :class:`Program` and is found through the
``crossrt.drivers`` entry-point group (``docs/writing-a-driver.md``; ``drivers/sim.py`` is the
worked example). This package names the contract and nothing else: the classes a driver
implements or receives (``Driver``, ``Program``, ``DeviceInfo``, ``Capabilities``,
``CompileOptions``, ``CoreSet``, ``ArtifactFile``, the memory hooks' ``DeviceArray`` and
``Residence``, the ``CancelToken`` a run is given), the helpers a driver may call
(``check_range``, ``copy_into``, ``host_cpu``) and the registry's lookups (``get_driver``,
``available_drivers``, ``driver_statuses``, and ``parse_device`` / ``resolve_device``, which
turn ``"cpu:0"`` into a driver and its device). What only the runtime uses lives in
``registry`` (``device_order``, ``describe_devices``: ordering and listing devices) and
``boundary`` (``program_error``, ``unguarded``: the guard around driver calls); the rest of crossrt
reaches drivers only through this package, ``registry`` and ``boundary``, never a driver's own
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
from .registry import (
    DriverStatus,
    available_drivers,
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
    "driver_statuses",
    "get_driver",
    "host_cpu",
    "parse_device",
    "resolve_device",
]
