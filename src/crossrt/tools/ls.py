"""``crossrt ls``: the drivers (PASS/FAIL and why), their devices, cores and who owns them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ..config import settings
from ..drivers import driver_statuses
from ..drivers.host import format_cpus, host_cpus
from ..errors import CrossrtError
from ..runtime.cores import core_owners
from .common import fail, human_bytes


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt ls",
        description="List the registered drivers with PASS/FAIL and the reason a driver is "
        "unavailable, then every device they serve with its cores and memory, then the host "
        "CPUs and the process owning each (CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES).",
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
    return {"drivers": drivers, "devices": devices, "cores": core_table()}


def core_table() -> dict[str, Any]:
    """The host CPUs of ``cpu:0``: usable by this process or not, and the owner of each.

    Owners come from probing the lock files in the runtime directory, without taking them.
    """
    directory = settings().runtime_dir
    host = host_cpus()
    owners = core_owners(directory)
    rows = [
        {
            "host_cpu": cpu,
            "usable": cpu in host.cpus,
            "owner": owners[cpu].to_dict() if cpu in owners else None,
        }
        for cpu in sorted(set(host.cpus) | set(owners))
    ]
    return {"device": "cpu:0", "runtime_dir": directory, "limit": host.limit, "host_cpus": rows}


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
    cores = info["cores"]
    usable = [row["host_cpu"] for row in cores["host_cpus"] if row["usable"]]
    print(
        f"\nCORES of {cores['device']}: host CPUs {format_cpus(usable)}, {cores['limit']} at once; "
        f"lock files in {cores['runtime_dir']}"
    )
    print(f"  {'cpu':>4}  {'owner pid':<9}  command")
    for row in cores["host_cpus"]:
        owner = row["owner"]
        note = "" if row["usable"] else "  (not usable by this process)"
        who = f"{owner['pid'] or '?':<9}  {owner['cmdline'] or owner['name']}" if owner else "free"
        print(f"  {row['host_cpu']:>4}  {who}{note}")
    return 0
