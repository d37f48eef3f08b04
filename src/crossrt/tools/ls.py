"""``crossrt ls``: the drivers (PASS/FAIL and why), their devices, cores and memory."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ..drivers import driver_statuses
from ..errors import CrossrtError
from .common import fail, human_bytes


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt ls",
        description="List the registered drivers with PASS/FAIL and the reason a driver is "
        "unavailable, then every device they serve with its cores and memory.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    return p


def collect() -> dict[str, Any]:
    """Drivers and devices as one JSON-friendly document."""
    drivers, devices = [], []
    for status in driver_statuses():
        entry: dict[str, Any] = {
            "name": status.name,
            "status": "PASS" if status.available else "FAIL",
            "reason": status.reason,
            "version": None,
            "entry_point": status.target,
        }
        if status.driver is not None:
            try:
                entry["version"] = status.driver.version
                devices += [d.to_dict() for d in status.driver.devices()]
            except CrossrtError as exc:
                entry.update(status="FAIL", reason=str(exc))
        drivers.append(entry)
    return {"drivers": drivers, "devices": devices}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt ls``."""
    args = parser().parse_args(argv)
    try:
        info = collect()
    except CrossrtError as exc:
        return fail("ls", exc)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print("DRIVERS")
    print(f"  {'name':<13} {'status':<6} {'version':<10} reason")
    for d in info["drivers"]:
        print(f"  {d['name']:<13} {d['status']:<6} {d['version'] or '-':<10} {d['reason']}")
    print("\nDEVICES")
    print(f"  {'device':<8} {'driver':<13} {'kind':<5} {'cores':>5} {'memory':>10}  name")
    for d in info["devices"]:
        print(
            f"  {d['id']:<8} {d['driver']:<13} {d['kind']:<5} {d['cores']:>5} "
            f"{human_bytes(d['memory_bytes']):>10}  {d['name']}"
        )
    return 0
