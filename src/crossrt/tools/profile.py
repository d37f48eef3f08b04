"""``crossrt profile``: where a model's time goes, as a Chrome trace and a table.

Two ways in:

- ``crossrt profile MODEL``: load MODEL here, feed it random inputs as ``crossrt bench``
  does, and record ``--seconds`` of ``--clients`` callers;
- ``crossrt profile --pid PID``: record ``--seconds`` of what a running process's models do
  (an application, or the daemon ``crossrt serve``), asked over its observation socket
  (``runtime/observer.py``). Nothing in that process changes but the keeping of numbers.

Either way the trace (``-o``, default ``profile.json``) opens in Perfetto
(https://ui.perfetto.dev) or ``chrome://tracing``, and the table printed says, per model,
how long requests spent checking inputs, queued, in the engines and handing outputs back
(mean, p50, p99), and per node of a multi-node executable.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CrossrtError, InvalidArgumentError
from ..runtime import Profile, Runtime
from ..runtime.observer import MAX_PROFILE_SECONDS, ask
from ..runtime.profiler import save_trace
from . import flags
from .bench import add_model_arguments, load_warm, measure
from .common import fail, parse_shapes, say

PHASES = ("latency", "input", "queue", "infer", "output")
"""The rows of the table: the whole request, then its phases in order."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt profile",
        description="Record where requests' time goes, as a Chrome trace (Perfetto opens "
        "it) and a table: either load MODEL here and run it on random inputs, or record a "
        "running crossrt process (--pid), such as `crossrt serve`.",
        epilog="examples: crossrt profile model.onnx --clients 2 -o trace.json; "
        "crossrt profile --pid 4242 --seconds 10",
    )
    add_model_arguments(p, required=False)
    p.add_argument(
        "--pid", type=int, metavar="PID", help="record this crossrt process instead of MODEL"
    )
    p.add_argument(
        "--model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="with --pid: only this loaded model (repeat for several; default all)",
    )
    flags.add(p, "--seconds", "--clients")
    p.add_argument(
        "--output",
        "-o",
        default="profile.json",
        metavar="FILE",
        help="where to write the trace (default profile.json)",
    )
    flags.add(p, "--json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt profile``."""
    p = parser()
    args = p.parse_args(argv)
    if (args.model is None) == (args.pid is None):
        p.error("give MODEL or --pid PID, one of them")
    if args.pid is not None and (args.shape or args.device or args.driver or args.network):
        p.error("--shape, --device, --driver and --network describe a MODEL to load, not --pid")
    try:
        if not 0 < args.seconds <= MAX_PROFILE_SECONDS or args.clients < 1:
            raise InvalidArgumentError(
                f"--seconds {args.seconds} and --clients {args.clients}: give seconds above 0 "
                f"(at most {MAX_PROFILE_SECONDS:g}) and at least 1 client"
            )
        folder = Path(args.output).resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):  # said before, not after
            raise InvalidArgumentError(
                f"cannot write {args.output!r}: {folder} is not a folder this user can write; "
                "give another --output"
            )
        if args.pid is not None:
            trace = record_process(args.pid, args.model_name, args.seconds)
            save_trace(trace, args.output)
        else:
            trace = record_model(args)
    except CrossrtError as exc:
        return fail("profile", exc)
    except OSError as exc:
        return fail(
            "profile",
            InvalidArgumentError(f"cannot write {args.output!r}: {exc.strerror or exc}"),
        )
    summary: list[dict[str, Any]] = trace["otherData"]["summary"]
    if args.json:
        print(json.dumps({"trace": str(Path(args.output)), "models": summary}, indent=2))
    else:
        say(*table(summary), f"trace: {args.output} (open it in https://ui.perfetto.dev)")
    return 0


def record_model(args: argparse.Namespace) -> dict[str, Any]:
    """Load MODEL, warm it up and record ``--seconds`` of ``--clients`` callers."""
    shapes = parse_shapes(args.shape, "--shape")
    with Runtime() as rt:
        model, feed = load_warm(rt, args, shapes)
        with Profile(model, args.output) as profile:
            measure(model, feed, args.seconds, args.clients)
    return profile.stop()


def record_process(pid: int, models: Sequence[str], seconds: float) -> dict[str, Any]:
    """Ask process ``pid`` for a trace of ``seconds``."""
    request = {"op": "profile", "seconds": seconds, "models": list(models)}
    return ask(pid, request, timeout=seconds + 30)


def table(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The summary as text: per model a line, then microseconds per phase, per node and per
    direction of copies."""
    lines = []
    for entry in summary:
        name = repr(entry["model"])
        if entry.get("served_as"):
            name = f"{entry['served_as']!r} ({name})"
        lines.append(
            f"{name}: {entry['requests']} requests in {entry['seconds']:.2f} s "
            f"({entry['throughput']:.1f}/s), {entry['failed']} failed"
            + (f", {entry['dropped']} not kept" if entry["dropped"] else "")
        )
        rows = [(phase, entry[f"{phase}_us"]) for phase in PHASES]
        rows += [(f"node {n['node']} ({n['driver']})", n["us"]) for n in entry.get("nodes", [])]
        rows += [
            (f"copy {direction.replace('_', ' ')} ({c['count']}x, {c['bytes']} B)", c["us"])
            for direction, c in entry.get("copies", {}).items()
        ]
        width = max(10, *(len(label) + 2 for label, _ in rows))
        lines.append(f"  {'us':<{width}}{'mean':>12}{'p50':>12}{'p99':>12}")
        lines += [_row(label, spread, width) for label, spread in rows]
    return lines


def _row(name: str, spread: dict[str, float | None], width: int) -> str:
    cells = "".join(
        f"{'-' if spread[k] is None else format(spread[k], '.1f'):>12}"
        for k in ("mean", "p50", "p99")
    )
    return f"  {name:<{width}}{cells}"
