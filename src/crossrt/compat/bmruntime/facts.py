"""BMLIB's device facts and logging: ``bm_dev_query``, ``bm_get_chipid``, ``bm_get_misc_info``,
``bm_get_card_num`` / ``bm_get_card_id``, ``bm_get_stat`` (``bm_dev_stat_t``),
``bmlib_log_set_level`` / ``bmlib_log_get_level`` / ``bmlib_log_set_callback`` and
``bm_set_debug_mode``.

The answers come from what crossrt's driver knows of the device (``DeviceInfo``: its memory,
cores, driver, vendor) and from its allocator's books. What a CPU or ``sim`` device cannot
know is synthetic, and says so: the chip id is :data:`CROSSRT_CHIPID` (no Sophgo chip's), a
card is one device (card ``i`` is ``devid`` ``i``), DDR ECC is off, there is no on-card
A53 and no PCIe address. ``tpu_util`` is 100 while a launch through a handle on the device
is running, else 0 (an instant figure, as ``bm-smi``'s).

Logging: bmlib's levels (``BMLIB_LOG_*``, from -8 quietest to 56 most verbose, as ``bmlib_log.h``)
set the level of the ``crossrt`` logger, so they quieten or open crossrt's own messages as
well as this layer's; a callback set with ``bmlib_log_set_callback`` receives every record
of the ``crossrt`` loggers at or above that level as ``(level, message)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import InvalidArgumentError
from .contract import seed_call
from .device import bm_dev_request, bm_devices, bm_handle_t, handles_on
from .status import BM_SUCCESS, bm_status_t

__all__ = [
    "BMLIB_LOG_DEBUG",
    "BMLIB_LOG_ERROR",
    "BMLIB_LOG_FATAL",
    "BMLIB_LOG_INFO",
    "BMLIB_LOG_PANIC",
    "BMLIB_LOG_QUIET",
    "BMLIB_LOG_TRACE",
    "BMLIB_LOG_VERBOSE",
    "BMLIB_LOG_WARNING",
    "CROSSRT_CHIPID",
    "bm_dev_query",
    "bm_dev_stat_t",
    "bm_get_card_id",
    "bm_get_card_num",
    "bm_get_chipid",
    "bm_get_misc_info",
    "bm_get_stat",
    "bm_heap_stat_t",
    "bm_misc_info",
    "bm_set_debug_mode",
    "bmlib_log_get_level",
    "bmlib_log_set_callback",
    "bmlib_log_set_level",
]

CROSSRT_CHIPID = 0xC055
"""The chip id crossrt's devices report: no Sophgo chip has it (those are 0x1682, 0x1684,
0x1686...), so a program that switches on the chip takes its generic path."""

# bmlib_log.h's levels (the FFmpeg scale): the lower, the quieter.
BMLIB_LOG_QUIET = -8
BMLIB_LOG_PANIC = 0
BMLIB_LOG_FATAL = 8
BMLIB_LOG_ERROR = 16
BMLIB_LOG_WARNING = 24
BMLIB_LOG_INFO = 32
BMLIB_LOG_VERBOSE = 40
BMLIB_LOG_DEBUG = 48
BMLIB_LOG_TRACE = 56

_TO_PY = (  # (bmlib level at or above, Python level) from the most verbose down
    (BMLIB_LOG_DEBUG, logging.DEBUG),
    (BMLIB_LOG_INFO, logging.INFO),
    (BMLIB_LOG_WARNING, logging.WARNING),
    (BMLIB_LOG_ERROR, logging.ERROR),
    (BMLIB_LOG_PANIC, logging.CRITICAL),
)
_CROSSRT = logging.getLogger("crossrt")


@dataclass
class bm_misc_info:
    """``struct bm_misc_info``, as :func:`bm_get_misc_info` fills it.

    ``ddr0a_size`` holds the device's usable memory (the other DDR sizes 0), ``chipid``
    :data:`CROSSRT_CHIPID`, ``driver_version`` 0, ``driver`` / ``device`` crossrt's names
    (crossrt's additions). ``pcie_soc_mode`` is 1 (SoC: memory the host reaches) on a
    host-coherent device, else 0 (PCIe).
    """

    pcie_soc_mode: int = 0
    ddr_ecc_enable: int = 0
    ddr0a_size: int = 0
    ddr0b_size: int = 0
    ddr1_size: int = 0
    ddr2_size: int = 0
    chipid: int = CROSSRT_CHIPID
    chipid_bit_mask: int = 0xFFFF
    driver_version: int = 0
    domain_bdf: int = -1
    board_version: int = 0
    a53_enable: int = 0
    dyn_enable: int = 0
    driver: str = ""
    device: str = ""


@dataclass
class bm_heap_stat_t:
    """One heap of :class:`bm_dev_stat_t` (MB, as bmlib counts): crossrt has one heap."""

    mem_total: int = 0
    mem_avail: int = 0
    mem_used: int = 0


@dataclass
class bm_dev_stat_t:
    """``bm_dev_stat_t``: ``mem_total`` / ``mem_used`` in MB (bmlib's unit; rounded up, so
    a byte in use shows), ``tpu_util`` in percent, and the heaps."""

    mem_total: int = 0
    mem_used: int = 0
    tpu_util: int = 0
    heap_num: int = 0
    heap_stat: list[bm_heap_stat_t] = field(default_factory=list)


@seed_call
def bm_dev_query(devid: int) -> bm_status_t:
    """BM_SUCCESS when device ``devid`` exists and can be opened, else BM_ERR_DEVNOTREADY
    (logged with what there is)."""
    status, handle = bm_dev_request(devid)
    if handle is not None:
        handle.freed = True  # a query holds nothing
    return status


@seed_call
def bm_get_chipid(handle: bm_handle_t) -> tuple[bm_status_t, int]:
    """``(BM_SUCCESS, CROSSRT_CHIPID)``: synthetic, no Sophgo chip's id."""
    handle.check()
    return BM_SUCCESS, CROSSRT_CHIPID


@seed_call
def bm_get_misc_info(handle: bm_handle_t) -> tuple[bm_status_t, bm_misc_info]:
    """The device's :class:`bm_misc_info`, from its ``DeviceInfo``."""
    device = handle.check()
    info = device.info
    return BM_SUCCESS, bm_misc_info(
        pcie_soc_mode=1 if device.coherent else 0,
        ddr0a_size=info.memory_bytes,
        driver=info.driver,
        device=info.id,
    )


@seed_call
def bm_get_card_num() -> tuple[bm_status_t, int]:
    """How many cards: each device is a card of one chip (synthetic), so ``bm_dev_getcount``."""
    return BM_SUCCESS, len(bm_devices())


@seed_call
def bm_get_card_id(handle: bm_handle_t) -> tuple[bm_status_t, int]:
    """The card of the handle's device: its index among :func:`bm_devices` (one chip a card)."""
    device = handle.check()
    devices = bm_devices()
    if device.id not in devices:  # a device named by string that the list orders elsewhere
        raise InvalidArgumentError(f"{device.id} is not one of the devices {devices}")
    return BM_SUCCESS, devices.index(device.id)


@seed_call
def bm_get_stat(handle: bm_handle_t) -> tuple[bm_status_t, bm_dev_stat_t]:
    """The device's memory in MB and its utilisation: :class:`bm_dev_stat_t`."""
    device = handle.check()
    stats = device.stats()
    mb = 1 << 20
    total = -(-stats.limit_bytes // mb)
    used = -(-stats.bytes_in_use // mb)
    busy = any(
        not launch.future.done() for h in handles_on(device.id) for launch in h.outstanding()
    )
    heap = bm_heap_stat_t(mem_total=total, mem_avail=max(0, total - used), mem_used=used)
    return BM_SUCCESS, bm_dev_stat_t(
        mem_total=total, mem_used=used, tpu_util=100 if busy else 0, heap_num=1, heap_stat=[heap]
    )


def _py_level(level: int) -> int:
    for at_least, py in _TO_PY:
        if level >= at_least:
            return py
    return logging.CRITICAL + 10  # BMLIB_LOG_QUIET: nothing


def _bm_level(py: int) -> int:
    for bm, at in _TO_PY:
        if py <= at:
            return bm
    return BMLIB_LOG_QUIET


@seed_call
def bmlib_log_set_level(level: int) -> bm_status_t:
    """Set the ``crossrt`` loggers' level from a bmlib level (``BMLIB_LOG_ERROR``...):
    messages less severe than it are dropped, crossrt's own included."""
    if isinstance(level, bool) or not isinstance(level, int):
        raise InvalidArgumentError(f"log level {level!r} is not an int; give BMLIB_LOG_*")
    _CROSSRT.setLevel(_py_level(level))
    return BM_SUCCESS


@seed_call
def bmlib_log_get_level() -> int:
    """The ``crossrt`` loggers' level as bmlib's (``BMLIB_LOG_WARNING`` when unset)."""
    return _bm_level(_CROSSRT.getEffectiveLevel())


class _Callback(logging.Handler):
    def __init__(self, callback: Callable[[int, str], object]) -> None:
        super().__init__()
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.callback(_bm_level(record.levelno), record.getMessage())
        except Exception:  # a callback's failure must not break the call that logged
            self.handleError(record)


@seed_call
def bmlib_log_set_callback(callback: Callable[[int, str], object]) -> bm_status_t:
    """Send every ``crossrt`` log record at or above the level to ``callback(level,
    message)`` (bmlib's level); another call replaces it, ``None`` is refused
    (BM_ERR_PARAM)."""
    if not callable(callback):
        raise InvalidArgumentError(f"callback {callback!r} is not callable")
    for old in [h for h in _CROSSRT.handlers if isinstance(h, _Callback)]:
        _CROSSRT.removeHandler(old)
    _CROSSRT.addHandler(_Callback(callback))
    return BM_SUCCESS


@seed_call
def bm_set_debug_mode(handle: bm_handle_t, mode: int) -> bm_status_t:
    """``mode`` 1 logs crossrt at DEBUG (bmlib's firmware log: crossrt has no firmware, so its
    own debug messages stand for it), 0 back to WARNING."""
    handle.check()
    if isinstance(mode, bool) or mode not in (0, 1):
        raise InvalidArgumentError(f"debug mode {mode!r}: give 0 (off) or 1 (on)")
    _CROSSRT.setLevel(logging.DEBUG if mode else logging.WARNING)
    return BM_SUCCESS
