"""``crossrt top``: a live view of every crossrt process on this machine, as ``neuron-top``
or ``nvtop`` show theirs.

A header (host, vCPUs and their use, memory, how many crossrt processes answer), a table of
the processes (CPU %, resident memory, models) and one of their models (device, drivers,
instances, requests per second, p50 and p99 latency over the period, failures), redrawn
every ``--period`` seconds (default 1) with ``rich``. The numbers are those of ``crossrt
monitor``, from the same :class:`~crossrt.tools.monitor.Sampler`. ``q`` or Ctrl-C quits.
``--once`` takes two snapshots a period apart, prints the view once (plain text when stdout
is not a terminal) and exits: how scripts and tests read it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CrossrtError
from ..host import format_cpus
from ..runtime import observer
from .common import TOOLS_EXTRA, fail, human_bytes, printable
from .monitor import Sampler, diff_processes, pauses, positive_seconds

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.table import Table

DEFAULT_PERIOD = 1.0
"""Seconds between redraws when ``--period`` is not given."""

PIPE_WIDTH = 200
"""Columns of the view when stdout is not a terminal and ``COLUMNS`` does not say."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt top",
        description="A live view of every crossrt process on this machine: CPU, memory and "
        "per model the requests per second, latency percentiles and failures. q or Ctrl-C "
        "quits.",
        epilog="example: crossrt top --once --period 2",
    )
    p.add_argument(
        "--period",
        type=positive_seconds,
        default=DEFAULT_PERIOD,
        metavar="S",
        help=f"seconds between redraws, and over which rates are measured (default "
        f"{DEFAULT_PERIOD:g})",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="measure one period, print the view once as text and exit",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt top``."""
    args = parser().parse_args(argv)
    try:
        from rich.console import Console
    except ImportError as exc:
        return fail(
            "top", CrossrtError(f"rich is missing ({exc}); install the tools extra: {TOOLS_EXTRA}")
        )
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped, rich would assume 80 columns and fold the models table: a script (or a
        # file) gets whole lines instead.
        console = Console(width=PIPE_WIDTH)
    try:
        sampler = Sampler()
        directory = observer.observe_directory()
        if args.once:
            time.sleep(args.period)
            console.print(view(sampler.sample(), directory, args.period))
            return 0
        _live(console, sampler, directory, args.period)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is one of the two ways out
    except CrossrtError as exc:
        return fail("top", exc)
    return 0


def _live(console: Console, sampler: Sampler, directory: Path, period: float) -> None:
    """Redraw the view every ``period`` seconds until ``q`` is pressed (or Ctrl-C)."""
    from rich.live import Live

    # The first frame is drawn at once, its rates unknown ("-") until a period has passed.
    processes = diff_processes([], sampler.before, 0.0)
    for process in processes:
        process["rss_bytes"] = sampler.rss_bytes(process["pid"])
    first = {"time": time.time(), "period": 0.0, "processes": processes}
    first["system"] = sampler.system()
    with _keys() as pressed, Live(view(first, directory, period), console=console) as live:
        for pause in pauses(period):
            if pressed(pause) == "q":
                return
            live.update(view(sampler.sample(), directory, period), refresh=True)


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A function waiting up to N seconds for a key; returns it, or ``""`` when none came.

    On a terminal, stdin is put in cbreak mode (keys arrive unbuffered and unechoed) and
    restored on exit; elsewhere the function only sleeps, and Ctrl-C is the way out.
    """
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else -1
    if fd < 0:

        def sleep(seconds: float) -> str:
            time.sleep(max(0.0, seconds))
            return ""

        yield sleep
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    def wait(seconds: float) -> str:
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                key = os.read(fd, 1).decode(errors="replace").lower()
                if key == "q":
                    return key

    try:
        tty.setcbreak(fd)
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# -- drawing ----------------------------------------------------------------------------------


def view(document: Mapping[str, Any], directory: Path, period: float) -> Group:
    """The screen for one ``crossrt monitor`` document: header, processes, models."""
    from rich.console import Group
    from rich.text import Text

    system = document["system"]
    processes = document["processes"]
    usage = system["vcpu_usage_percent"]
    busy = 100.0 - usage["idle"] if "idle" in usage else None
    count = len(processes)
    header = Text(overflow="fold")
    header.append("crossrt top", style="bold")
    header.append(f"  {printable(socket.gethostname())}  every {period:g} s\n")
    header.append(
        f"vCPUs {system['vcpu_count']} ({_number(busy, '.1f')}% used)   memory "
        f"{human_bytes(system['memory_used_bytes'])} / {human_bytes(system['memory_total_bytes'])}"
        f"   {count} crossrt process{'' if count == 1 else 'es'}"
    )
    if not processes:
        return Group(header, Text(f"no crossrt process answers in {directory}"))

    # Busiest first, as top sorts: processes by CPU, models by requests per second.
    processes = sorted(processes, key=lambda p: -_cpu_percent(p))

    table = _table("processes")
    for name in ("PID", "TAG", "CPU %", "RSS"):
        table.add_column(name, justify="left" if name == "TAG" else "right", overflow="fold")
    table.add_column("MODELS", overflow="fold")
    for p in processes:
        if p["error"] is not None:
            table.add_row(str(p["pid"]), "-", "-", "-", Text(printable(p["error"]), style="red"))
            continue
        total = _cpu_percent(p) if p["cpu"]["user_percent"] is not None else None
        rss = p["rss_bytes"]
        table.add_row(
            str(p["pid"]),
            Text(printable(p["tag"] or "")),
            _number(total, ".1f"),
            "-" if rss is None else human_bytes(rss),
            Text(printable(", ".join(shown_name(m) for m in p["models"]) or "-")),
        )

    # Compact (no vertical rules, two-line headers) so that the thirteen columns fit in about
    # 100 columns; on a narrower terminal every column folds a little rather than some
    # vanishing.
    models = _table("models")
    for name in (
        "PID",
        "MODEL",
        "DEVICE",
        "DRIVER(S)",
        "INSTANCES",
        "CORES",
        "RUNNING",
        "IN\nFLIGHT",
    ):
        text = name in ("MODEL", "DEVICE", "DRIVER(S)", "CORES")
        models.add_column(name, justify="left" if text else "right", overflow="fold")
    for name in ("BUSY\n%", "REQ/S", "P50\nms", "P99\nms", "FAILED"):
        models.add_column(name, justify="right", overflow="fold")
    rows = [(p, m) for p in processes for m in p["models"]]
    rows.sort(key=lambda row: -(row[1]["throughput"] or 0.0))
    for p, m in rows:
        latency = m["latency_us"] or {}
        failed = Text(str(m["failure"]), style="red" if m["failure"] else "")
        models.add_row(
            str(p["pid"]),
            Text(printable(shown_name(m)) + _batching(m)),
            Text(printable(m["device"])),
            Text(printable(", ".join(m["drivers"]))),
            str(m["instances"]),
            Text(printable(_cores(m.get("cores") or []))),
            "yes" if m["running"] else "no",
            str(m["in_flight"]),
            _number(_mean(m["busy_percent"]), ".0f"),
            _number(m["throughput"], ".1f"),
            _number(_ms(latency.get("p50")), ".3f"),
            _number(_ms(latency.get("p99")), ".3f"),
            failed,
        )
    return Group(header, table, models)


def _table(title: str) -> Table:
    from rich import box
    from rich.table import Table

    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )


def _batching(model: dict[str, Any]) -> str:
    """A second line under a batched model's name: its mean batch over the period, of at
    most ``max_batch_size``."""
    most = model.get("max_batch_size") or 0
    if not most:
        return ""
    return f"\nbatch {_number(model.get('mean_batch'), '.1f')}/{most}"


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def _number(value: float | None, form: str) -> str:
    """``value`` formatted, ``-`` when unknown."""
    return "-" if value is None else format(value, form)


def shown_name(model: Mapping[str, Any]) -> str:
    """A model as top shows it: the name a daemon serves it under (``tiny:1``) when it is
    served, else its own."""
    return str(model.get("served_as") or model["name"])


def _mean(values: Sequence[float] | None) -> float | None:
    """The mean of ``values`` (``None`` for none): BUSY is the instances' mean."""
    return sum(values) / len(values) if values else None


def _cores(instances: Sequence[Sequence[int]]) -> str:
    """Each instance's cores on its device, ``0-1 2-3`` (``-`` for none)."""
    return " ".join(format_cpus(list(cores)) for cores in instances) or "-"


def _cpu_percent(process: Mapping[str, Any]) -> float:
    """User and system CPU % of a process over the period (0 when unknown)."""
    cpu = process["cpu"]
    return float((cpu["user_percent"] or 0.0) + (cpu["system_percent"] or 0.0))
