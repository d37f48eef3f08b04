"""What "device 0" is in every seed layer: the machine's default device, the one crossrt
itself picks for ``device=None`` (``CROSSRT_DEFAULT_DEVICE``, ``cpu`` when unset; ``auto``
picks per model, so here it is ``cpu``).

BMRuntime's ``devid`` 0 and NNRt's device ID 0 are it, served by the driver crossrt prefers
for it, and the Neuron layer's DEVICE tensors live on it: a ``.crm`` built with the CLI's
defaults loads on device 0 of every layer. The other devices follow in each layer's own
order. docs/compat.md says so for the users.
"""

from __future__ import annotations

from ..config import default_device
from ..drivers import DeviceInfo, resolve_device

__all__ = ["default_device_info"]


def default_device_info() -> DeviceInfo:
    """The default device (its driver: ``.driver``).

    Raises:
        DeviceUnavailableError: ``CROSSRT_DEFAULT_DEVICE`` names a device no driver serves.
    """
    name = default_device()
    _, info = resolve_device("cpu" if name == "auto" else name)
    return info
