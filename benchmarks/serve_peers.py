"""crossrt serve against the other model servers: KServe, MLServer, Ray Serve (issue 28).

Each peer runs in its own virtualenv under ``benchmarks/.peers/NAME`` (git-ignored), built on
first use from ``benchmarks/peers/NAME.txt`` (exact ``==`` pins, pip from PyPI) and reused
afterwards; each wraps onnxruntime the way its docs show (``benchmarks/peers/``):

- **KServe**: its Python model server, a ``kserve.Model`` subclass (``kserve_server.py``);
- **MLServer**: a custom ``MLModel`` runtime (``mlserver_runtime.py``; MLServer ships no
  ONNX runtime), ``parallel_workers`` = instances;
- **Ray Serve**: a deployment with ``num_replicas`` = instances (``ray_server.py``), HTTP and
  its gRPC proxy with the KServe v2 service (``grpc_service_v2.proto``);
- **crossrt**: ``crossrt serve --model NAME=PATH --load-parameter instances=N`` with ``--http``
  and a loopback TCP gRPC endpoint.

Every server gets the same ``.onnx`` files (the tiny MLP and the ResNet-50-like model of
models.py, and rapidocr's PP-OCRv4 text detector, a real CNN from its wheel, at 1x3x320x320)
and the same settings: ``--instances`` copies (default 2) of one ORT intra-op thread each. One
client drives them all: ``h2load`` (nghttp2) sending identical bytes to each: the KServe v2
JSON body over HTTP/1.1 (``POST /v2/models/NAME/infer``) and the ModelInfer message, inputs in
``raw_input_contents`` as tritonclient sends them, over gRPC (h2c). Each server's answer to
those bytes is checked against onnxruntime's once before it is measured. Rows: model x
protocol x 1 and 4 concurrent clients; each row runs ``--rounds`` paired rounds, every server
once per round for ``--seconds``, the order rotated each round, so that a shared machine's
noise falls on all alike. Reported per server and row: throughput and p50 (medians over the
rounds), and crossrt/peer ratios (the median of the per-round ratios); plus each server's
memory (PSS of its process tree) after the run, and the CPU model.

    python benchmarks/serve_peers.py                          # ~10 min on 2 cores
    python benchmarks/serve_peers.py --models tiny --peers kserve --seconds 1 --rounds 1

Writes ``results/serve_peers.json`` (``--out``) and the Markdown table next to it. Target
(issue 28): crossrt throughput >= 1.0x and p50 <= 1.0x every peer in every row.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from launch import INFER, PEERS, PEERS_SRC, Server, start

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# -- models and requests -------------------------------------------------------------------


def real_cnn() -> Path:
    """rapidocr's PP-OCRv4 text detector, from the installed wheel's file list."""
    dist = importlib.metadata.distribution("rapidocr-onnxruntime")
    for f in dist.files or ():
        if str(f).endswith("ch_PP-OCRv4_det_infer.onnx"):
            return Path(str(dist.locate_file(f)))
    raise SystemExit("rapidocr-onnxruntime has no det model: pip install --no-deps it")


MODELS = {  # name: (path getter, input shape)
    "tiny": (lambda: models.get("tiny"), (1, 16)),
    "cnn": (real_cnn, (1, 3, 320, 320)),
    "resnet50": (lambda: models.get("resnet50"), (1, 3, 224, 224)),
}


def requests_for(name: str, path: Path, shape: tuple[int, ...]) -> dict[str, Any]:
    """The input (pixel-like values k/256: short in JSON, exact in float32), the two request
    bodies every server gets, and onnxruntime's outputs for them."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    rng = np.random.default_rng(1)
    x = (rng.integers(0, 256, size=shape) / 256).astype(np.float32)
    body = {
        "inputs": [
            {
                "name": input_name,
                "shape": list(shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    message = pb.ModelInferRequest(model_name=name)
    message.inputs.add(name=input_name, datatype="FP32", shape=list(shape))
    message.raw_input_contents.append(x.tobytes())
    wire = message.SerializeToString()
    outputs = [o.name for o in session.get_outputs()]
    expected = dict(zip(outputs, session.run(outputs, {input_name: x}), strict=True))
    return {
        "json": json.dumps(body).encode(),
        "grpc": b"\0" + len(wire).to_bytes(4, "big") + wire,  # gRPC's length-prefixed frame
        "expected": expected,
    }


# -- the client ----------------------------------------------------------------------------


def h2load(
    server: Server, model: str, protocol: str, clients: int, seconds: float, body: Path
) -> dict[str, Any]:
    """One h2load run: ``clients`` connections of one request at a time for ``seconds``
    (after 0.5 s of warm-up): requests/s and the p50 of the logged latencies (us)."""
    with tempfile.TemporaryDirectory(prefix="peers-h2load-") as tmp:
        log = Path(tmp) / "log"
        command = [
            "h2load",
            "-t",
            "1",
            "-c",
            str(clients),
            "-m",
            "1",
            "-D",
            f"{int(seconds * 1000)}ms",
            "--warm-up-time",
            "500ms",
            "-d",
            str(body),
            "--log-file",
            str(log),
        ]
        if protocol == "HTTP":
            command += ["--h1", "-H", "content-type: application/json"]
            command.append(f"http://{server.http}/v2/models/{model}/infer")
        else:
            command += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
            command += ["-H", f"application: {model}"]  # Ray's gRPC proxy: which app
            command.append(f"http://{server.grpc}{INFER}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
        rate = re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", done.stdout)
        status = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", done.stdout)
        latencies = (
            [
                int(line.split("\t")[2])
                for line in log.read_text().splitlines()
                if line.split("\t")[1] == "200"
            ]
            if log.exists()
            else []
        )
    if rate is None or status is None or not latencies:
        tail = (done.stdout + done.stderr).strip().splitlines()[-4:]
        return {"error": f"h2load exit {done.returncode}: {tail}"}
    return {
        "throughput": float(rate.group(1)),
        "p50_us": float(np.percentile(latencies, 50)),
        "p99_us": float(np.percentile(latencies, 99)),
        "succeeded": int(status.group(1)),
        "failed": int(status.group(2)) + int(status.group(3)),
    }


# -- the run -------------------------------------------------------------------------------


def pins(peer: str) -> list[str]:
    """The ``==`` pins of a peer's requirements file."""
    lines = (PEERS_SRC / f"{peer}.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_all(
    names: Sequence[str],
    peers: Sequence[str],
    protocols: Sequence[str],
    clients: Sequence[int],
    seconds: tuple[float, float],
    rounds: int,
    instances: int,
    ready_timeout: float,
    nice: int | None = None,
) -> dict[str, Any]:
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client")
    short, long = seconds
    load_before = os.getloadavg()
    paths = {name: MODELS[name][0]() for name in names}
    requests = {name: requests_for(name, paths[name], MODELS[name][1]) for name in names}
    servers: dict[str, Server] = {}
    cells: list[dict[str, Any]] = []
    memory: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-peers-") as tmp:
        folder = Path(tmp)
        bodies = {}
        for name, req in requests.items():
            for protocol, key in (("HTTP", "json"), ("gRPC", "grpc")):
                bodies[name, protocol] = folder / f"{name}.{key}"
                bodies[name, protocol].write_bytes(req[key])
        try:
            for who in ("crossrt", *peers):  # started one after another: all up together
                t = time.monotonic()
                servers[who] = start(who, paths, instances, folder)
                servers[who].wait_ready(requests, ready_timeout)
                if nice is not None:
                    for pid in servers[who].tree():  # each scheduling group of its tree
                        with contextlib.suppress(OSError):
                            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
                print(f"{who}: ready in {time.monotonic() - t:.0f} s, outputs checked", flush=True)
            order = list(servers)
            for name in names:
                for protocol in protocols:
                    for n in clients:
                        cell: dict[str, Any] = {
                            "model": name,
                            "protocol": protocol,
                            "clients": n,
                            "rounds": [],
                        }
                        for r in range(rounds):
                            turn = order[r % len(order) :] + order[: r % len(order)]
                            cell["rounds"].append(
                                {
                                    who: h2load(
                                        servers[who],
                                        name,
                                        protocol,
                                        n,
                                        short if name == "tiny" else long,
                                        bodies[name, protocol],
                                    )
                                    for who in turn
                                }
                            )
                        summarise(cell, order)
                        cells.append(cell)
                        print(_line(cell, order), flush=True)
            memory = {who: server.pss_mib() for who, server in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
    return {
        "benchmark": "serve_peers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpu": cpu_model(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load": os.getloadavg(),
        },
        "client": subprocess.run(
            ["h2load", "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "pins": {p: pins(p) for p in peers},
        "settings": {
            "nice": nice,
            "instances": instances,
            "ort_threads_per_instance": 1,
            "seconds": {"tiny": short, "others": long},
            "rounds": rounds,
        },
        "servers": list(servers),
        "cells": cells,
        "memory_pss_mib": memory,
    }


def summarise(cell: dict[str, Any], order: Sequence[str]) -> None:
    """Per server: medians over rounds; per peer: median of the per-round crossrt/peer
    ratios (throughput: above 1, crossrt serves more; p50: below 1, crossrt answers sooner)."""
    ok = [r for r in cell["rounds"] if all("error" not in r[w] for w in order)] or cell["rounds"]
    cell["servers"] = {}
    for who in order:
        good = [r[who] for r in cell["rounds"] if "error" not in r[who]]
        cell["servers"][who] = (
            {
                "throughput": median(g["throughput"] for g in good),
                "p50_us": median(g["p50_us"] for g in good),
            }
            if good
            else {"error": cell["rounds"][-1][who]["error"]}
        )
    cell["ratios"] = {}
    for who in order[1:]:
        paired = [r for r in ok if "error" not in r[who] and "error" not in r["crossrt"]]
        if paired:
            cell["ratios"][who] = {
                "throughput": median(
                    r["crossrt"]["throughput"] / r[who]["throughput"] for r in paired
                ),
                "p50": median(r["crossrt"]["p50_us"] / r[who]["p50_us"] for r in paired),
            }


def _fmt(server: dict[str, Any]) -> str:
    if "error" in server:
        return "failed"
    return f"{server['throughput']:.1f} / {server['p50_us'] / 1000:.2f}"


def _ratio(ratio: dict[str, float] | None) -> str:
    if not ratio:
        return "n/a"
    text = f"{ratio['throughput']:.2f} / {ratio['p50']:.2f}"
    return f"**{text}**" if ratio["throughput"] < 1 or ratio["p50"] > 1 else text


def _line(cell: dict[str, Any], order: Sequence[str]) -> str:
    return (
        "| "
        + " | ".join(
            [
                cell["model"],
                cell["protocol"],
                str(cell["clients"]),
                *(_fmt(cell["servers"][w]) for w in order),
                *(_ratio(cell["ratios"].get(w)) for w in order[1:]),
            ]
        )
        + " |"
    )


def markdown(report: dict[str, Any]) -> str:
    order = report["servers"]
    host = report["host"]
    before = f"{host['load_before'][0]:.1f} at start, " if "load_before" in host else ""
    s = report["settings"]
    lines = [
        f"# crossrt serve against other model servers ({report['date']})",
        "",
        f"{host['cpu']}, {host['cpus']} CPUs, load {before}"
        f"{host['load'][0]:.1f} at end; "
        f"{s['instances']} instances of {s['ort_threads_per_instance']} ORT thread each; "
        f"client {report['client']}; {s['rounds']} paired rounds of {s['seconds']['tiny']} s "
        f"(tiny) or {s['seconds']['others']} s, "
        "order rotated. Cells: req/s / p50 ms (medians over rounds); ratios crossrt/peer: "
        "throughput / p50 (median of per-round ratios; **bold**: crossrt behind, "
        "throughput < 1 or p50 > 1)." + _nice(s.get("nice")),
        "",
        *_merged_note(report),
        "| "
        + " | ".join(["model", "protocol", "clients", *order, *(f"crossrt/{w}" for w in order[1:])])
        + " |",
        "|" + " --- |" * (3 + 2 * len(order) - 1),
        *(_line(cell, order) for cell in report["cells"]),
        "",
        "Memory after the run (PSS of each server's process tree, MiB): "
        + ", ".join(f"{w} {v:.0f}" for w, v in report["memory_pss_mib"].items()),
        "",
        "Pins: " + "; ".join(f"{p}: {' '.join(v)}" for p, v in report["pins"].items()),
        "",
    ]
    return "\n".join(lines)


def merge(previous: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with the rows ``report`` measured replaced by its own (same servers),
    each replaced row marked with the run it comes from; the header stays ``previous``'s."""
    if list(previous["servers"]) != list(report["servers"]):
        raise SystemExit(f"--merge: the runs served {previous['servers']} and {report['servers']}")
    key = lambda c: (c["model"], c["protocol"], c["clients"])  # noqa: E731
    new = {key(c): dict(c, run=report["date"]) for c in report["cells"]}
    merged = dict(previous)
    merged["cells"] = [new.pop(key(c), c) for c in previous["cells"]] + list(new.values())
    merged.setdefault("runs", []).append(
        {k: report[k] for k in ("date", "host", "settings", "memory_pss_mib")}
    )
    return merged


def _nice(nice: int | None) -> str:
    return "" if nice is None else f" Servers' scheduling groups at nice {nice}."


def _merged_note(report: dict[str, Any]) -> list[str]:
    """Which rows come from a later run (``--merge``), with that run's host and load."""
    lines = []
    for run in report.get("runs", []):
        rows = [
            f"{c['model']} {c['protocol']} {c['clients']}"
            for c in report["cells"]
            if c.get("run") == run["date"]
        ]
        host, nice = run["host"], run["settings"].get("nice")
        lines += [
            f"Rows {', '.join(rows)}: from the run of {run['date']} (load "
            f"{host['load_before'][0]:.1f} at start, {host['load'][0]:.1f} at end"
            + f").{_nice(nice)} The others from the run above.",
            "",
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--protocols", default="gRPC,HTTP")
    p.add_argument("--clients", default="1,4")
    p.add_argument("--seconds", type=float, default=2.0, help="per run, tiny model")
    p.add_argument(
        "--long-seconds",
        type=float,
        default=4.0,
        help="per run, the CNN and ResNet-50 (a few requests/s: more to count)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=RESULTS / "serve_peers.json")
    p.add_argument("--nice", type=int, default=None, help="servers' autogroup nice (root)")
    p.add_argument(
        "--merge",
        action="store_true",
        help="replace only the rows measured in the --out JSON, the others kept",
    )
    args = p.parse_args(argv)
    # SIGTERM (timeout, an impatient operator) unwinds like Ctrl-C: the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    split = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    report = run_all(
        split(args.models),
        split(args.peers),
        split(args.protocols),
        [int(c) for c in split(args.clients)],
        (args.seconds, args.long_seconds),
        args.rounds,
        args.instances,
        args.ready_timeout,
        args.nice,
    )
    if args.merge and args.out.exists():
        report = merge(json.loads(args.out.read_text()), report)
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
