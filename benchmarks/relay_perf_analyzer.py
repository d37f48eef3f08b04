"""perf_analyzer over gRPC on loopback TCP, on the daemon's Unix socket (through the relay)
and on a private socket (``crossrt socket``), issue 28 point 3.

One daemon (``relay.start``, its relay's pump process on), a tiny model; each round runs
perf_analyzer once per target (``-i grpc``, concurrency 1, ``--measurement-request-count``
requests per window), the order rotated every round; perf_analyzer's own p50 and throughput
per run, and per target the median over the rounds of its p50 minus TCP's of the same round.
Runs of a few seconds each, not interleaved call by call as ``relay.py``'s rows are: a
difference under what two TCP runs differ by says nothing.

    python benchmarks/relay_perf_analyzer.py            # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import crossrt
from crossrt.server.private_sockets import private_socket

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting
from relay import RESULTS, start

PERF_ANALYZER = Path(__file__).resolve().parent / ".perf_analyzer" / "perf_analyzer"
TCP = "TCP"
TCP_AGAIN = "TCP, a second run"
RELAY = "Unix socket, relay"
PRIVATE = "private socket (crossrt socket)"


def run_once(binary: Path, url: str, requests: int) -> tuple[float, float]:
    """perf_analyzer on ``url``: its p50 (µs) and throughput (infer/s)."""
    command = [str(binary), "-m", "tiny", "-i", "grpc", "-u", url]
    command += ["--measurement-mode", "count_windows"]
    command += ["--measurement-request-count", str(requests)]
    command += ["--max-trials", "3", "--stability-percentage", "1000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    p50 = re.findall(r"p50 latency: (\d+) usec", out)
    rate = re.findall(r"Throughput: ([0-9.]+) infer/sec", out)
    if done.returncode or not p50 or not rate:
        raise SystemExit(f"perf_analyzer failed on {url} (exit {done.returncode}):\n{out}")
    return float(p50[-1]), float(rate[-1])


def measure(binary: Path, rounds: int, requests: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-relay-pa-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        crossrt.compile(models.build_tiny(), "cpu").save(folder / "models" / "tiny.crm")
        proc, targets = start(folder, "a", True)
        try:
            with private_socket(targets["Unix, pump process"]) as held:
                urls = {TCP: targets["TCP (a)"], TCP_AGAIN: targets["TCP (a)"]}
                urls |= {RELAY: targets["Unix, pump process"], PRIVATE: held.url}
                names = list(urls)
                got: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
                for r in range(rounds):
                    for k in names[r % len(names) :] + names[: r % len(names)]:
                        got[k].append(run_once(binary, urls[k], requests))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    tcp = np.array(got[TCP])
    rows = []
    for k in names:
        mine = np.array(got[k])
        rows.append({
            "variant": k, "p50_us": float(np.median(mine[:, 0])),
            "p50_minus_tcp_us": float(np.median(mine[:, 0] - tcp[:, 0])),
            "throughput": float(np.median(mine[:, 1])),
            "throughput_vs_tcp": float(np.median(mine[:, 1] / tcp[:, 1])),
            "rounds_p50_us": [float(x) for x in mine[:, 0]],
        })  # fmt: skip
        print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['variant']} | {r['p50_us']:.0f} | {r['p50_minus_tcp_us']:+.0f} | "
        f"{r['throughput']:.0f} | {r['throughput_vs_tcp']:.2f} |"
    )


def markdown(report: dict[str, Any]) -> str:
    host = report["host"]
    lines = [
        f"# perf_analyzer over gRPC: TCP, the relay, a private socket ({report['date']}, "
        f"{host['cpus']} CPUs, {host['machine']})",
        "",
        f"{report['rounds']} rounds; in each, one perf_analyzer run per target (tiny model, "
        f"concurrency 1, {report['requests']} requests per window, order rotated). perf_analyzer's "
        "p50 and throughput, medians over the rounds; p50 - TCP is the median of each round's "
        "difference. Load average (1 min) "
        f"{host['load_at_start'][0]:.1f} at the start, {host['load'][0]:.1f} at the end.",
        "",
        "| target | p50 us | p50 - TCP us | infer/s | infer/s vs TCP |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [_row(r) for r in report["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--perf-analyzer", type=Path, default=PERF_ANALYZER)
    p.add_argument("--out", type=Path, default=RESULTS / "relay_perf_analyzer.json")
    args = p.parse_args(argv)
    if not os.access(args.perf_analyzer, os.X_OK):
        raise SystemExit(f"no perf_analyzer at {args.perf_analyzer}: make perf-analyzer")
    load_at_start = os.getloadavg()
    rows = measure(args.perf_analyzer, args.rounds, args.requests)
    report = {
        "benchmark": "relay_perf_analyzer",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
            "load_at_start": load_at_start,
        },
        "rounds": args.rounds,
        "requests": args.requests,
        "rows": rows,
    }
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
