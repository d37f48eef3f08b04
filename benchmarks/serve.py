"""The daemon against in-process: what ``crossrt serve`` costs per request.

For each model (tiny, the ResNet-50-like model of models.py with its 600 KB input, and a
16 MB-input ``x + 1``), three ways of running the same ``.crm``:

- **in-process**: ``Runtime().load(exe).run(feed)``;
- **daemon, protobuf**: ``crossrt serve`` on a Unix socket, ``connect(shm_threshold=None)``:
  tensors inside the gRPC messages;
- **daemon, shm**: the same daemon, ``connect(shm_threshold=0)``: inputs and static outputs
  through a registered POSIX shared-memory segment.

Each with 1 client and with N client threads (``--clients``, default 4), for ``--seconds``
each (every request's latency recorded): p50/p99 latency and throughput. Outputs are checked
against in-process ones once per variant. Then the daemon's RSS over 10,000 tiny requests.

    python benchmarks/serve.py                       # ~1.5 min on 2 cores
    python benchmarks/serve.py --models tiny --seconds 1

Writes ``results/serve.json`` (``--out``) and a Markdown table next to it, and prints it.
Targets from issue 11: shm >= 3x protobuf throughput at 16 MB; p50 added latency <= 150 us
over in-process on tiny; daemon throughput with N clients >= 0.9x in-process on ResNet-50.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import crossrt
from crossrt.server.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path

RESULTS = Path(__file__).resolve().parent / "results"
BIG = 4 * 2**20  # floats: 16 MB


def build_big() -> crossrt.Model:
    """y = x + 1 on float32[4 Mi]: 16 MB in, 16 MB out."""
    b = crossrt.GraphBuilder("big")
    x = b.input("x", "float32", [BIG])
    b.output(b.op("Add", [x, b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


MODELS: dict[str, tuple[Callable[[], crossrt.Model], tuple[int, ...]]] = {
    "tiny": (models.build_tiny, (1, 16)),
    "resnet50": (lambda: models.build_resnet(batch=1), (1, 3, 224, 224)),
    "big": (build_big, (BIG,)),
}


def measure(run: Callable[[], Any], clients: int, seconds: float) -> dict[str, float]:
    """``run`` from ``clients`` threads for ``seconds``: p50/p99 (us) and requests/s."""
    for _ in range(3):
        run()
    latencies: list[list[int]] = [[] for _ in range(clients)]
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        own = latencies[k]
        while time.perf_counter() < stop:
            t = time.perf_counter_ns()
            run()
            own.append(time.perf_counter_ns() - t)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    every = np.array(sorted(x for own in latencies for x in own), np.float64)
    return {
        "requests": len(every),
        "p50_us": float(np.percentile(every, 50) / 1e3),
        "p99_us": float(np.percentile(every, 99) / 1e3),
        "throughput": len(every) / elapsed,
    }


def rss_kib(pid: int) -> int:
    """A process's resident memory (``VmRSS``), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def start_daemon(folder: Path) -> subprocess.Popen[str]:
    """``crossrt serve`` on ``folder/d.sock`` serving ``folder/models``; once it is ready."""
    command = [sys.executable, "-m", "crossrt", "serve", "-x", "-g", f"unix:{folder}/d.sock"]
    command += ["--model-repository", str(folder / "models")]
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(folder / "run"))
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.rstrip().endswith(" ready"):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc
    raise SystemExit(f"crossrt serve did not start (exit {proc.wait()})")


def run_all(names: Sequence[str], clients: int, seconds: float) -> dict[str, Any]:
    rows = []
    soak = None
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-serve-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        inputs = {}
        for name in names:
            build, shape = MODELS[name]
            crossrt.compile(build(), "cpu").save(folder / "models" / f"{name}.crm")
            inputs[name] = np.random.default_rng(0).random(shape, dtype=np.float32)
        daemon = start_daemon(folder)
        try:
            protobuf = connect(f"unix:{folder}/d.sock", shm_threshold=None)
            shared = connect(f"unix:{folder}/d.sock", shm_threshold=0)
            with crossrt.Runtime() as rt:
                for name in names:
                    x = inputs[name]
                    local = rt.load(crossrt.load_executable(folder / "models" / f"{name}.crm"))
                    feed = {local.inputs[0].name: x}
                    expected = local.run(feed)
                    variants = {
                        "in-process": local.run,
                        "daemon protobuf": protobuf.load(name).run,
                        "daemon shm": shared.load(name).run,
                    }
                    for variant, fn in variants.items():
                        got = fn(feed)
                        for key, want in expected.items():
                            np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6)
                        for n in sorted({1, clients}):
                            result = measure(lambda fn=fn, feed=feed: fn(feed), n, seconds)
                            rows.append({"model": name, "variant": variant, "clients": n, **result})
                            print(_row(rows[-1]), flush=True)
                    local.unload()
            soak = None
            if "tiny" in names:  # the daemon's memory over 10,000 requests, after warm-up
                tiny_model = protobuf.load("tiny")
                x = {"x": inputs["tiny"]}
                for _ in range(1000):
                    tiny_model.run(x)
                before = rss_kib(daemon.pid)
                for _ in range(10_000):
                    tiny_model.run(x)
                soak = {"requests": 10_000, "rss_before_kib": before,
                        "rss_growth_kib": rss_kib(daemon.pid) - before}  # fmt: skip
                print(f"daemon RSS over 10,000 requests: {soak}", flush=True)
            protobuf.close()
            shared.close()
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    return {
        "benchmark": "serve",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "seconds": seconds,
        "rows": rows,
        "ratios": ratios(rows, clients),
        "soak": soak,
    }


def ratios(rows: list[dict[str, Any]], clients: int) -> dict[str, float]:
    """The issue's three targets, as measured."""
    by = {(r["model"], r["variant"], r["clients"]): r for r in rows}
    out = {}
    if ("big", "daemon shm", 1) in by:
        out["big shm/protobuf throughput (target >= 3)"] = (
            by["big", "daemon shm", 1]["throughput"] / by["big", "daemon protobuf", 1]["throughput"]
        )
    if ("tiny", "in-process", 1) in by:
        out["tiny p50 added over in-process, us (target <= 150)"] = (
            by["tiny", "daemon protobuf", 1]["p50_us"] - by["tiny", "in-process", 1]["p50_us"]
        )
    if ("resnet50", "in-process", clients) in by:
        out[f"resnet50 daemon/in-process throughput, {clients} clients (target >= 0.9)"] = (
            by["resnet50", "daemon shm", clients]["throughput"]
            / by["resnet50", "in-process", clients]["throughput"]
        )
    return out


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['model']} | {r['variant']} | {r['clients']} | {r['p50_us']:.0f} | "
        f"{r['p99_us']:.0f} | {r['throughput']:.1f} | {r['requests']} |"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# crossrt serve vs in-process ({report['date']}, {report['host']['cpus']} CPUs, "
        f"load {report['host']['load'][0]:.1f})",
        "",
        "| model | variant | clients | p50 us | p99 us | req/s | requests |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(_row(r) for r in report["rows"]),
        "",
        *(f"- {k}: {v:.2f}" for k, v in report["ratios"].items()),
        *(
            [
                f"- daemon RSS growth over {report['soak']['requests']:,} tiny requests after "
                f"warm-up: {report['soak']['rss_growth_kib']} KiB"
            ]
            if report.get("soak")
            else []
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="tiny,resnet50,big")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out", type=Path, default=RESULTS / "serve.json")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    report = run_all(names, args.clients, args.seconds)
    text = markdown(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
