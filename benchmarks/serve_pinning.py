"""The daemon's request threads pinned to their instance's cores, or not (issue 28.4 and the
HTTP rows of 28.1): ``crossrt serve`` with two instances of one ORT thread each, driven by
h2load over gRPC and HTTP with 1 and 4 clients, against the same daemon whose request
threads are left where the OS puts them (``own_thread`` made a no-op: the daemon before
issue 28.4). Paired rounds, the order rotated each round; per cell: requests/s, p50, the
daemon's CPU time per request and the engine's time per request (``compute_infer`` of the
model's statistics), medians over the rounds.

ONNX Runtime with one intra-op thread computes in the thread that calls it: unpinned, the
two instances' computations go wherever the OS puts the request threads, which JSON decoding
(HTTP) keeps moving; pinned, each stays on its own core.

    python benchmarks/serve_pinning.py                  # ~4 min on 2 cores
    python benchmarks/serve_pinning.py --models tiny --rounds 2 --seconds 2

``--nice N`` (root): the servers' scheduling group (``/proc/PID/autogroup``) gets nice N,
so that other sessions' load on a shared machine takes less of their CPU (both servers
alike). Writes ``results/serve_pinning.json`` (``--out``) and the table next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting
from serve_peers import MODELS, cpu_model, h2load, requests_for

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from launch import Server, free_address

RESULTS = Path(__file__).resolve().parent / "results"
UNPINNED = (
    "import sys, crossrt.runtime.cores.pinning as p; p.own_thread = lambda: None; "
    "from crossrt.tools.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""The daemon with its request threads left unpinned: ``own_thread`` replaced before the
server modules import it."""


def start(kind: str, paths: dict[str, Path], folder: Path) -> Server:
    http, grpc_at = free_address(), free_address()
    head = ["-m", "crossrt"] if kind == "pinned" else ["-c", UNPINNED]
    command = [sys.executable, *head, "serve", "-x", "-l", "warning", "-g", grpc_at]
    command += ["-g", f"unix:{folder}/{kind}.sock", "--http", http]
    command += ["--load-parameter", "instances=2"]
    for name, path in paths.items():
        command += ["--model", f"{name}={path}"]
    env = {"CROSSRT_RUNTIME_DIR": str(folder / f"{kind}-run")}
    return Server(kind, command, http, grpc_at, env)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine(server: Server, model: str) -> tuple[int, int]:
    """(runs, nanoseconds) of the model's compute_infer so far."""
    with urllib.request.urlopen(f"http://{server.http}/v2/models/{model}/stats") as answer:
        stats = json.load(answer)["model_stats"][0]["inference_stats"]
    return stats["compute_infer"]["count"], stats["compute_infer"]["ns"]


def measure(
    server: Server, model: str, protocol: str, clients: int, seconds: float, body: Path
) -> dict[str, Any]:
    """One h2load run (:func:`serve_peers.h2load`) with the daemon's CPU time and the
    engine's time per request over it."""
    cpu, (runs, ns) = cpu_seconds(server.proc.pid), engine(server, model)
    got = h2load(server, model, protocol, clients, seconds, body)
    if "error" not in got:
        runs2, ns2 = engine(server, model)
        n = max(runs2 - runs, 1)
        got["cpu_ms_per_request"] = (cpu_seconds(server.proc.pid) - cpu) / n * 1e3
        got["engine_ms_per_request"] = (ns2 - ns) / n / 1e6
    return got


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    names = [m for m in args.models.split(",") if m]
    paths = {name: MODELS[name][0]() for name in names}
    requests = {name: requests_for(name, paths[name], MODELS[name][1]) for name in names}
    load_before = os.getloadavg()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-pinning-") as tmp:
        folder = Path(tmp)
        bodies = {}
        for name, req in requests.items():
            for protocol, key in (("HTTP", "json"), ("gRPC", "grpc")):
                bodies[name, protocol] = folder / f"{name}.{key}"
                bodies[name, protocol].write_bytes(req[key])
        servers: dict[str, Server] = {}
        try:
            for kind in ("pinned", "unpinned"):
                servers[kind] = start(kind, paths, folder)
                servers[kind].wait_ready(requests, 300)
                if args.nice is not None:
                    Path(f"/proc/{servers[kind].proc.pid}/autogroup").write_text(str(args.nice))
            order = list(servers)
            grid = [(m, p, c) for m in names for p in ("gRPC", "HTTP") for c in (1, 4)]
            for m, p, c in grid:
                cell: dict[str, Any] = {"model": m, "protocol": p, "clients": c, "rounds": []}
                seconds = args.seconds if m == "tiny" else args.long_seconds
                for r in range(args.rounds):
                    turn = order[r % 2 :] + order[: r % 2]
                    cell["rounds"].append(
                        {k: measure(servers[k], m, p, c, seconds, bodies[m, p]) for k in turn}
                    )
                summarise(cell, order)
                cells.append(cell)
                print(_line(cell), flush=True)
        finally:
            for server in servers.values():
                server.stop()
    return {
        "benchmark": "serve_pinning",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load": os.getloadavg(),
        },
        "settings": {
            "instances": 2,
            "ort_threads_per_instance": 1,
            "rounds": args.rounds,
            "seconds": {"tiny": args.seconds, "others": args.long_seconds},
            "nice": args.nice,
        },
        "cells": cells,
    }


KEYS = ("throughput", "p50_us", "cpu_ms_per_request", "engine_ms_per_request")


def summarise(cell: dict[str, Any], order: Sequence[str]) -> None:
    """Medians over the rounds per server, and the median per-round pinned/unpinned ratio
    of throughput."""
    cell["servers"] = {}
    for kind in order:
        good = [r[kind] for r in cell["rounds"] if "error" not in r[kind]]
        cell["servers"][kind] = {k: median(g[k] for g in good) for k in KEYS} if good else {}
    paired = [r for r in cell["rounds"] if all("error" not in r[k] for k in order)]
    cell["pinned_over_unpinned"] = (
        median(r["pinned"]["throughput"] / r["unpinned"]["throughput"] for r in paired)
        if paired
        else None
    )


def _fmt(s: dict[str, float]) -> str:
    if not s:
        return "failed"
    return (
        f"{s['throughput']:.1f} / {s['p50_us'] / 1000:.1f} / "
        f"{s['cpu_ms_per_request']:.1f} / {s['engine_ms_per_request']:.1f}"
    )


def _line(cell: dict[str, Any]) -> str:
    ratio = cell["pinned_over_unpinned"]
    parts = [cell["model"], cell["protocol"], str(cell["clients"])]
    parts += [_fmt(cell["servers"]["pinned"]), _fmt(cell["servers"]["unpinned"])]
    parts.append("n/a" if ratio is None else f"{ratio:.2f}")
    return "| " + " | ".join(parts) + " |"


def scaling(cells: list[dict[str, Any]]) -> list[str]:
    """4 clients over 1, per model, protocol and server (medians' ratio)."""
    by = {(c["model"], c["protocol"], c["clients"]): c["servers"] for c in cells}
    out = []
    for (m, p, c), servers in by.items():
        one = by.get((m, p, 1))
        if c == 4 and one:
            ratios = [
                f"{k} {servers[k]['throughput'] / one[k]['throughput']:.2f}x"
                for k in servers
                if servers[k] and one[k]
            ]
            out.append(f"- {m} {p}, 4 clients over 1: " + ", ".join(ratios))
    return out


def markdown(report: dict[str, Any]) -> str:
    host, s = report["host"], report["settings"]
    nice = f"; servers' autogroup nice {s['nice']}" if s["nice"] is not None else ""
    lines = [
        f"# crossrt serve: request threads pinned or not ({report['date']})",
        "",
        f"{host['cpu']}, {host['cpus']} CPUs, load {host['load_before'][0]:.1f} at start, "
        f"{host['load'][0]:.1f} at end{nice}; {s['instances']} instances of "
        f"{s['ort_threads_per_instance']} ORT thread each; h2load; {s['rounds']} paired "
        "rounds, order rotated. Cells: req/s / p50 ms / daemon CPU ms per request / engine "
        "ms per request (medians over rounds); pinned/unpinned: median per-round throughput "
        "ratio. Unpinned: the same daemon with its request threads left where the OS puts "
        "them (before issue 28.4).",
        "",
        "| model | protocol | clients | pinned | unpinned | pinned/unpinned |",
        "| --- | --- | --- | --- | --- | --- |",
        *(_line(cell) for cell in report["cells"]),
        "",
        *scaling(report["cells"]),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="resnet50")
    p.add_argument("--seconds", type=float, default=2.0, help="per run, tiny model")
    p.add_argument("--long-seconds", type=float, default=4.0, help="per run, other models")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--nice", type=int, default=None, help="the servers' autogroup nice (root)")
    p.add_argument("--out", type=Path, default=RESULTS / "serve_pinning.json")
    args = p.parse_args(argv)
    # SIGTERM (timeout, an impatient operator) unwinds like Ctrl-C: the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run_all(args)
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
