"""Facts about the host CPU that CPU drivers report: usable cores, memory, model name."""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

from .base import Capabilities, DeviceInfo, DeviceKind


def usable_cores() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def usable_memory() -> int:
    """Bytes of memory this process may use: the cgroup limit or the machine's total."""
    total = 0
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = int(pages) * int(size)
    except (ValueError, OSError, AttributeError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or 1 << 62):
            return int(text)
    return total


@cache
def cpu_model() -> tuple[str, str]:
    """``(model name, vendor)`` of the host CPU."""
    name, vendor = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            if name and vendor and key.strip() == "model name":
                break
    except OSError:
        pass
    return name, vendor or "unknown"


def host_cpu(driver: str, capabilities: Capabilities) -> DeviceInfo:
    """The host CPU as device ``cpu:0`` of ``driver``."""
    name, vendor = cpu_model()
    return DeviceInfo(
        id="cpu:0",
        name=name,
        vendor=vendor,
        kind=DeviceKind.CPU,
        driver=driver,
        cores=len(usable_cores()),
        memory_bytes=usable_memory(),
        capabilities=capabilities,
    )
