"""``OH_NNDevice_*``: the devices of every available crossrt driver, by ``size_t`` ID.

ID 0 is the machine's default device with the driver crossrt prefers for it
(``CROSSRT_DEFAULT_DEVICE``, ``onnxruntime/cpu:0`` when unset: compat/device0.py), as NNRt's
"0 means the first device" says and as the other seed layers number it. Every other device's
ID is derived from the device itself, as NNRt hashes a device's name: the first 31 bits of
the SHA-256 of ``"<driver>/<device id>"`` (never 0), so installing or removing a driver does
not change another device's ID, across processes too. They are listed drivers most preferred
first. A device two drivers serve (``cpu:0`` of onnxruntime and of reference) has one ID per
driver: the ID chooses the driver too. Its name is ``"<driver>/<device id>"``.
"""

from __future__ import annotations

import hashlib

from ...drivers import DeviceInfo, DeviceKind, available_drivers
from ..device0 import default_device_info
from .status import OH_NN_ReturnCode, guarded, invalid, log
from .types import OH_NN_DeviceType

__all__ = [
    "OH_NNDevice_GetAllDevicesID",
    "OH_NNDevice_GetName",
    "OH_NNDevice_GetType",
    "device_id",
]

_KINDS = {
    DeviceKind.CPU: OH_NN_DeviceType.OH_NN_CPU,
    DeviceKind.GPU: OH_NN_DeviceType.OH_NN_GPU,
    DeviceKind.ACCELERATOR: OH_NN_DeviceType.OH_NN_ACCELERATOR,
}


def _devices() -> list[DeviceInfo]:
    # Asked each time: a driver's devices can change (a sim device count, a GPU lost).
    first = default_device_info()
    rest = [info for drv in available_drivers() for info in drv.devices()]
    return [first, *(i for i in rest if (i.driver, i.id) != (first.driver, first.id))]


def stable_id(info: DeviceInfo) -> int:
    """The ID of a device other than the default: from its driver and name, never 0."""
    digest = hashlib.sha256(f"{info.driver}/{info.id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1 or 1


def _ids() -> dict[int, DeviceInfo]:
    """Every device by ID, the default (0) first. Two devices whose IDs collide (a chance
    of about 1 in 10**7 for 20 devices) keep the first; the other is reached through 0 or
    not at all, which the log says."""
    found = _devices()
    table = {0: found[0]}
    for info in found[1:]:
        key = stable_id(info)
        if key in table:
            log.warning("NNRt device %s/%s has the ID of another; skipped", info.driver, info.id)
            continue
        table[key] = info
    return table


def device(device_id: int) -> DeviceInfo:
    """The device of an NNRt device ID (INVALID_PARAMETER for an unknown one)."""
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise invalid(f"device ID {device_id!r} is not a size_t")
    table = _ids()
    if device_id not in table:
        listed = ", ".join(f"{i} ({d.driver}/{d.id})" for i, d in list(table.items())[:4])
        raise invalid(
            f"no device has ID {device_id}; OH_NNDevice_GetAllDevicesID lists {len(table)}: "
            f"{listed}{', ...' if len(table) > 4 else ''}"
        )
    return table[device_id]


def device_id(driver: str, device_name: str = "cpu:0") -> int:
    """The NNRt ID of ``device_name`` (``"cpu:0"``) served by ``driver`` (crossrt's own
    helper: NNRt has no look-up by name): 0 for the default device, else its stable ID.

    Raises:
        KeyError: no such device.
    """
    for i, info in _ids().items():
        if info.driver == driver and info.id == device_name:
            return i
    raise KeyError(f"no device {device_name!r} of driver {driver!r}")


@guarded("pair")
def OH_NNDevice_GetAllDevicesID() -> tuple[OH_NN_ReturnCode, list[int] | None]:
    """Every device ID (``allDevicesID``; its length is ``deviceCount``)."""
    return OH_NN_ReturnCode.OH_NN_SUCCESS, list(_ids())


@guarded("pair")
def OH_NNDevice_GetName(deviceID: int) -> tuple[OH_NN_ReturnCode, str | None]:
    """The device's name: ``"<driver>/<device>"``, e.g. ``"reference/cpu:0"``."""
    info = device(deviceID)
    return OH_NN_ReturnCode.OH_NN_SUCCESS, f"{info.driver}/{info.id}"


@guarded("pair")
def OH_NNDevice_GetType(deviceID: int) -> tuple[OH_NN_ReturnCode, OH_NN_DeviceType | None]:
    """The device's type (a crossrt ``other`` device is OH_NN_OTHERS)."""
    kind = device(deviceID).kind
    return OH_NN_ReturnCode.OH_NN_SUCCESS, _KINDS.get(kind, OH_NN_DeviceType.OH_NN_OTHERS)
