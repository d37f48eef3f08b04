"""Finding drivers: the ``crossrt.drivers`` entry-point group, imported lazily.

A driver whose engine is missing (its import fails) is reported unavailable with the reason;
the others keep working. ``crossrt ls`` prints this table. A driver asked for by name
(:func:`get_driver`, loading a compiled model) is imported alone: the others may be slow to
import and are not needed.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points

from ..config import settings
from ..errors import DeviceUnavailableError, InvalidArgumentError, InvalidOptionError
from .base import DeviceInfo, Driver

ENTRY_POINT_GROUP = "crossrt.drivers"

# The drivers that ship with crossrt, so they are found even when the package metadata is not
# installed (running from a source tree).
_BUILTIN = {
    "onnxruntime": "crossrt.drivers.onnxruntime:OnnxRuntimeDriver",
    "openvino": "crossrt.drivers.openvino:OpenVinoDriver",
    "reference": "crossrt.drivers.reference:ReferenceDriver",
    "sim": "crossrt.drivers.sim:SimDriver",
}


@dataclass(frozen=True)
class DriverStatus:
    """Whether a driver could be loaded, and why not.

    Attributes:
        name: the registry name.
        target: ``module:Class`` of its entry point.
        driver: the driver instance, or ``None`` when unavailable.
        reason: why it is unavailable (empty when it is available).
        install_hint: what to install for it: the driver's own ``install_hint``, else, when
            its engine's module is missing, ``pip install <that module>``, else how to find the
            package that registers it.
        error: the error of a malformed ``CROSSRT_*`` variable that stopped the driver from
            being made (it is not unavailable: the setting is wrong). Such a status is not
            kept, so that fixing the variable is enough; using the driver raises the error.
    """

    name: str
    target: str
    driver: Driver | None
    reason: str = ""
    install_hint: str = ""
    error: InvalidOptionError | None = None

    @property
    def available(self) -> bool:
        """Whether the driver loaded."""
        return self.driver is not None


_lock = threading.Lock()
_statuses: dict[str, DriverStatus] | None = None  # the drivers loaded so far, by name
_complete: dict[str, DriverStatus] | None = None  # the table that holds every registered one


def _targets() -> dict[str, str]:
    targets = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        targets[ep.name] = ep.value
    return targets


def _load(name: str, target: str) -> DriverStatus:
    if name in settings().disabled_drivers:
        hint = f"remove {name!r} from CROSSRT_DISABLE_DRIVERS"
        return DriverStatus(name, target, None, "disabled by CROSSRT_DISABLE_DRIVERS", hint)
    module_name, _, attr = target.partition(":")
    hint = f"install the package that registers the {name!r} crossrt.drivers entry point"
    try:
        cls = getattr(importlib.import_module(module_name), attr)
        hint = getattr(cls, "install_hint", "") or hint
        driver = cls()
    except InvalidOptionError as exc:  # a CROSSRT_* variable the driver reads is malformed
        setting = exc.details.get("setting", "the CROSSRT_* variable it names")
        return DriverStatus(name, target, None, exc.message, f"fix {setting}", exc)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing and not missing.startswith("crossrt"):
            hint = f"pip install {missing.partition('.')[0]}"
        return DriverStatus(name, target, None, f"engine not installed: {exc}", hint)
    except Exception as exc:  # a broken driver must not take the others down
        return DriverStatus(name, target, None, f"{type(exc).__name__}: {exc}", hint)
    if not isinstance(driver, Driver):
        return DriverStatus(name, target, None, f"{target} is not a crossrt Driver", hint)
    return DriverStatus(name, target, driver, "", hint)


def _table() -> dict[str, DriverStatus]:
    global _statuses
    if _statuses is None:
        _statuses = {}
    return _statuses


def driver_statuses() -> list[DriverStatus]:
    """Every registered driver with its availability, by name, loading each once."""
    global _complete
    with _lock:
        table = _table()
        found = dict(table)
        if table is not _complete:
            for name, target in _targets().items():
                if name not in table:
                    found[name] = status = _load(name, target)
                    if status.error is None:
                        table[name] = status
            if found.keys() == table.keys():
                _complete = table
        return [found[name] for name in sorted(found)]


def driver_status(name: str) -> DriverStatus | None:
    """The driver called ``name`` with its availability, loading that driver only (once).

    Returns:
        Its status, or ``None`` when no driver of that name is registered.
    """
    with _lock:
        table = _table()
        status = table.get(name)
        if status is None and table is not _complete:
            target = _targets().get(name)
            if target is not None:
                status = _load(name, target)
                if status.error is None:
                    table[name] = status
        return status


def loaded_driver(name: str) -> Driver | None:
    """The driver called ``name`` if it is loaded and available, else ``None``; loads
    nothing and takes no lock (a dict lookup), for checks on every allocation."""
    table = _statuses
    status = None if table is None else table.get(name)
    return None if status is None else status.driver


def driver_names() -> list[str]:
    """The names of the registered drivers, without loading any."""
    with _lock:
        return sorted(_targets().keys() | _table().keys())


def get_driver(name: str) -> Driver:
    """The driver called ``name``, loading no other.

    Raises:
        DeviceUnavailableError: it is not registered or its engine could not be loaded.
        InvalidOptionError: a ``CROSSRT_*`` variable it reads is malformed.
    """
    status = driver_status(name)
    if status is None:
        raise DeviceUnavailableError(
            f"no driver called {name!r}; registered drivers: {', '.join(driver_names())}",
            details={"driver": name},
        )
    if status.error is not None:
        raise status.error
    if status.driver is None:
        raise DeviceUnavailableError(
            f"driver {name!r} is unavailable: {status.reason}",
            code=None,
            details={"driver": name},
        )
    return status.driver


def available_drivers() -> list[Driver]:
    """The drivers that loaded, most preferred first.

    Raises:
        InvalidOptionError: a ``CROSSRT_*`` variable some driver reads is malformed: rather
            than leave that driver out (and quietly choose another for a device), say so.
    """
    statuses = driver_statuses()
    for status in statuses:
        if status.error is not None:
            raise status.error
    found = [s.driver for s in statuses if s.driver is not None]
    return sorted(found, key=lambda d: -d.preference)


def parse_device(device: str) -> tuple[str, int | None]:
    """Split ``"cpu:0"`` into ``("cpu", 0)``; ``"cpu"`` gives ``("cpu", None)``."""
    kind, sep, index = device.strip().lower().partition(":")
    if not kind or (sep and not index.isdigit()):
        raise InvalidArgumentError(
            f"bad device {device!r}; write it as KIND or KIND:INDEX, e.g. 'cpu' or 'cpu:0'",
            details={"device": device},
        )
    return kind, int(index) if sep else None


def device_order(device: str) -> tuple[str, int]:
    """A sort key that orders device ids naturally: ``sim:2`` before ``sim:10``."""
    kind, _, index = device.partition(":")
    return kind, int(index) if index.isdigit() else -1


def describe_devices(ids: Iterable[str]) -> str:
    """Device ids in natural order, runs of one kind collapsed: ``"cpu:0, sim:0-15"``."""
    runs: list[tuple[str, int, int]] = []
    others: list[str] = []
    for device in sorted(set(ids), key=device_order):
        kind, index = device_order(device)
        if index < 0:
            others.append(device)
        elif runs and runs[-1][0] == kind and runs[-1][2] == index - 1:
            runs[-1] = (kind, runs[-1][1], index)
        else:
            runs.append((kind, index, index))
    spans = [f"{k}:{a}" if a == b else f"{k}:{a}-{b}" for k, a, b in runs]
    return ", ".join(spans + others)


def resolve_device(device: str, driver: str | None = None) -> tuple[Driver, DeviceInfo]:
    """Find the driver and device for a device string such as ``"cpu"`` or ``"cpu:0"``.

    Args:
        device: ``KIND`` (the first device of that kind) or ``KIND:INDEX``.
        driver: use this driver; by default the most preferred driver serving the device.

    Raises:
        DeviceUnavailableError: no available driver serves that device.
    """
    kind, index = parse_device(device)
    candidates = [get_driver(driver)] if driver else available_drivers()
    for drv in candidates:
        for info in drv.devices():
            info_kind, info_index = parse_device(info.id)
            if info_kind == kind and (index is None or index == info_index):
                return drv, info
    served = describe_devices(d.id for drv in candidates for d in drv.devices())
    who = f"driver {driver!r}" if driver else "the available drivers"
    hint = _INSTALL_HINTS.get(kind, "")
    raise DeviceUnavailableError(
        f"no device {device!r} on {who}; devices: {served or 'none'} "
        f"(run `crossrt ls` to see drivers and why some are unavailable){hint}",
        details={"device": device, "driver": driver},
    )


_INSTALL_HINTS = {
    "cuda": "; NVIDIA GPUs are served by onnxruntime-gpu: `pip uninstall -y onnxruntime && pip "
    "install onnxruntime-gpu` (the cuda extra; docs/drivers.md), on a machine with the NVIDIA "
    "driver",
}
