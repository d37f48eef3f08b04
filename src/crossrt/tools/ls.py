"""``crossrt ls``: the drivers (PASS/FAIL and why), their devices, cores and who owns them,
the crossrt processes with models loaded; ``--topology``: how the devices of each driver are
linked, drawn as ``neuron-ls --topology`` draws a trn1.32xlarge. A malformed ``CROSSRT_*``
variable is one error line on stderr, and exit status 1, after which everything that does
not need it is still listed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ..config import problems, settings, simulated_devices_asked
from ..drivers import driver_statuses
from ..drivers.registry import describe_devices, device_order, parse_device
from ..errors import CrossrtError
from ..host import format_cpus, host_cpus
from ..runtime.cores.reservation import core_owners
from ..runtime.observer import processes
from . import flags
from .common import fail, human_bytes, say


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt ls",
        description="List the registered drivers with PASS/FAIL and the reason a driver is "
        "unavailable, then every device they serve with its cores and memory, then the host "
        "CPUs and the process owning each (CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES).",
    )
    flags.add(p, "--json")
    p.add_argument(
        "--topology",
        action="store_true",
        help="also show which devices link to which, and draw the links of each driver whose "
        "devices form a grid, a torus or a ring",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also list simulated devices (the sim driver's sim:N, a test and template device; "
        "listed without --all when CROSSRT_SIM is set)",
    )
    return p


def collect(show_simulated: bool = True) -> dict[str, Any]:
    """Drivers and devices as one JSON-friendly document.

    Args:
        show_simulated: list the devices of simulated drivers too; when false they are left
            out and their ids summed up under ``"hidden_devices"``.
    """
    drivers, devices, hidden = [], [], []
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
                served = [d.to_dict() for d in status.driver.devices()]
                if status.driver.simulated and not show_simulated:
                    hidden += [d["id"] for d in served]
                else:
                    devices += served
            except CrossrtError as exc:
                entry.update(status="FAIL", reason=str(exc))
        drivers.append(entry)
    devices.sort(key=lambda d: device_order(d["id"]))  # stable: drivers keep their order
    return {
        "drivers": drivers,
        "devices": devices,
        "hidden_devices": describe_devices(hidden),
        "cores": core_table(),
        "processes": process_table(),
    }


def process_table() -> list[dict[str, Any]]:
    """The crossrt processes that answer on their observation sockets (``neuron-ls
    --wide``'s PID, COMMAND and RUNTIME VERSION): each with the devices its models use."""
    rows = []
    for found in processes():
        if "error" in found:
            rows.append({"pid": found["pid"], "error": found["error"]})
            continue
        models = found["models"]
        rows.append(
            {
                "pid": found["pid"],
                "tag": found["tag"],
                "version": found["version"],
                "command": found["command"],
                "devices": sorted({d for m in models for d in m["devices"]}),
                "models": [m["served_as"] or m["name"] for m in models],
            }
        )
    return rows


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


def topologies(devices: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per driver whose devices report links: its devices in index order, and the grid their
    links form (``rows``, ``cols``, ``wraps``: a torus or a ring), ``None`` when they form none.
    """
    result = []
    for driver in sorted({d["driver"] for d in devices if d["links"]}):
        mine = sorted((d for d in devices if d["driver"] == driver), key=lambda d: _index(d["id"]))
        shape = grid_of(mine)
        rows, cols, wraps = shape or (None, None, None)
        result.append(
            {
                "driver": driver,
                "devices": [d["id"] for d in mine],
                "rows": rows,
                "cols": cols,
                "wraps": wraps,
            }
        )
    return result


def grid_of(devices: Sequence[dict[str, Any]]) -> tuple[int, int, bool] | None:
    """``(rows, cols, wraps)`` of the grid in which device ``i`` (in the order given) is linked
    exactly to its neighbours up, down, left and right (across the edges when ``wraps``), the
    most nearly square first; ``None`` when the links form no such grid."""
    n = len(devices)
    position = {d["id"]: i for i, d in enumerate(devices)}
    actual = [{position.get(link, -1) for link in d["links"]} for d in devices]
    shapes = sorted(
        ((r, n // r) for r in range(1, n + 1) if n % r == 0),
        key=lambda rc: (abs(rc[0] - rc[1]), rc[0] > rc[1]),
    )
    for rows, cols in shapes:
        for wraps in (True, False):
            if all(actual[i] == _neighbours(i, rows, cols, wraps) for i in range(n)):
                return rows, cols, wraps
    return None


def _neighbours(i: int, rows: int, cols: int, wraps: bool) -> set[int]:
    r, c = divmod(i, cols)
    found = set()
    for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
        if wraps:
            nr, nc = nr % rows, nc % cols
        if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) != (r, c):
            found.add(nr * cols + nc)
    return found


def draw(labels: Sequence[str], rows: int, cols: int, wraps: bool) -> list[str]:
    """The grid as ``neuron-ls --topology`` draws it: ``[ 5 ]`` cells joined by ``◄––►`` and
    ``▲│▼``; a ``*`` marks a link that wraps around to the other end of its row or column."""
    width = max(2, *(len(label) for label in labels))
    link, (left, right) = "◄––►", (("*––►", "◄––*") if wraps else ("    ", ""))
    size = width + 3  # "[", the label, " ]"
    centres = [len(left) + j * (size + len(link)) + size // 2 for j in range(cols)]

    def column(mark: str) -> str:
        line = [" "] * (centres[-1] + 1)
        for centre in centres:
            line[centre] = mark
        return "".join(line)

    wrap_columns = wraps and rows > 1
    lines = [column("*"), column("│"), column("▼")] if wrap_columns else []
    for r in range(rows):
        if r:
            lines += [column("▲"), column("│"), column("▼")]
        cells = (f"[{labels[r * cols + j]:>{width}} ]" for j in range(cols))
        lines.append(left + link.join(cells) + right)
    if wrap_columns:
        lines += [column("▲"), column("│"), column("*")]
    return lines


def _describe(rows: int, cols: int, wraps: bool) -> str:
    if rows == 1 or cols == 1:
        return "a ring" if wraps else "a line"
    return f"a {rows}x{cols} {'torus' if wraps else 'mesh'}"


def _index(device: str) -> int:
    try:
        return parse_device(device)[1] or 0
    except CrossrtError:
        return 0


def _print_topology(info: dict[str, Any]) -> None:
    by_id = {(d["driver"], d["id"]): d for d in info["devices"]}
    if not info["topology"]:
        say("", "TOPOLOGY: no driver reports links between its devices")
    for topo in info["topology"]:
        ids = topo["devices"]
        rows, cols, wraps = topo["rows"], topo["cols"], topo["wraps"]
        shape = _describe(rows, cols, wraps) if rows else "links that form no grid"
        say("", f"TOPOLOGY of {topo['driver']}: {len(ids)} devices, {shape}")
        say(f"  {'device':<8} {'cores':>5} {'memory':>10}  connected devices")
        for device in ids:
            d = by_id[(topo["driver"], device)]
            say(
                f"  {device:<8} {d['cores']:>5} {human_bytes(d['memory_bytes']):>10}  "
                f"{', '.join(d['links']) or '-'}"
            )
        if rows:
            labels = [str(_index(device)) for device in ids]
            say("")
            for line in draw(labels, rows, cols, wraps):
                say(f"  {line}".rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt ls``.

    Returns:
        0; 1 when a ``CROSSRT_*`` variable is malformed (one line on stderr each, and what
        can be listed without it is listed) or nothing can be listed.
    """
    args = parser().parse_args(argv)
    bad = problems()
    for exc in bad:
        fail("ls", exc)
    try:
        info = collect(show_simulated=args.all or bool(simulated_devices_asked()))
    except CrossrtError as exc:
        return fail("ls", exc)
    status = 1 if bad else 0
    info["settings_errors"] = [
        {"setting": exc.details.get("setting"), "message": exc.message} for exc in bad
    ]
    if args.topology:
        info["topology"] = topologies(info["devices"])
    if args.json:
        print(json.dumps(info, indent=2))  # JSON escapes control characters itself
        return status
    say("DRIVERS")
    say(f"  {'name':<13} {'status':<6} {'version':<10} reason")
    for d in info["drivers"]:
        say(f"  {d['name']:<13} {d['status']:<6} {d['version'] or '-':<10} {d['reason']}")
    say("", "DEVICES")
    say(f"  {'device':<8} {'driver':<13} {'kind':<11} {'cores':>5} {'memory':>10}  name")
    for d in info["devices"]:
        say(
            f"  {d['id']:<8} {d['driver']:<13} {d['kind']:<11} {d['cores']:>5} "
            f"{human_bytes(d['memory_bytes']):>10}  {d['name']}"
        )
    if info["hidden_devices"]:
        say(f"  (simulated devices {info['hidden_devices']} not shown: crossrt ls --all)")
    cores = info["cores"]
    usable = [row["host_cpu"] for row in cores["host_cpus"] if row["usable"]]
    say(
        "",
        f"CORES of {cores['device']}: host CPUs {format_cpus(usable)}, {cores['limit']} at once; "
        f"lock files in {cores['runtime_dir']}",
    )
    say(f"  {'cpu':>4}  {'owner pid':<9}  command")
    for row in cores["host_cpus"]:
        owner = row["owner"]
        note = "" if row["usable"] else "  (not usable by this process)"
        who = f"{owner['pid'] or '?':<9}  {owner['cmdline'] or owner['name']}" if owner else "free"
        say(f"  {row['host_cpu']:>4}  {who}{note}")
    say("", "PROCESSES with models loaded (crossrt top shows them live)")
    say(f"  {'pid':>7}  {'tag':<16} {'version':<8} {'devices':<16} models")
    for row in info["processes"]:
        if "error" in row:
            say(f"  {row['pid']:>7}  {row['error']}")
            continue
        say(
            f"  {row['pid']:>7}  {row['tag'][:16]:<16} {row['version']:<8} "
            f"{', '.join(row['devices']) or '-':<16} {', '.join(row['models']) or '-'}"
        )
    if not info["processes"]:
        say("  none")
    if args.topology:
        _print_topology(info)
    return status
