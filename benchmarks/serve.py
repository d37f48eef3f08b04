"""The daemon against in-process: what ``crossrt serve`` costs per request.

For each model (tiny, the ResNet-50-like model of models.py with its 600 KB input, and a
16 MB-input ``x + 1``), three ways of running the same ``.crm``:

- **in-process**: ``Runtime().load(exe).run(feed)``;
- **daemon lane, protobuf**: ``crossrt serve`` on a Unix socket, ``connect(shm_threshold=None)``:
  the default client, its requests on the daemon's direct lane (``crossrt.server.lane``:
  ModelInfer messages without HTTP/2), tensors inside the messages;
- **daemon lane, shm**: ``connect(shm_threshold=0)``: inputs and static outputs through a
  shared-memory segment: a sealed memfd passed over the lane, which the daemon maps (inputs
  read where the client wrote them);
- **daemon gRPC, protobuf / shm**: the same two with ``lane=False``: every request a gRPC
  call, as any KServe client makes it (shm: a POSIX segment registered by name, which the
  daemon reads and writes with pread/pwrite);
- **daemon TCP, protobuf / shm**: gRPC over loopback TCP with a per-user token (a TCP client
  is anonymous without one, and only a proven user may name shared memory: issue 24's target,
  shm no slower than the tensor in the message at 16 MB).

Each with 1 client and with N client threads (``--clients``, default 4), for ``--seconds``
each (every request's latency recorded): p50/p99 latency and throughput. Outputs are checked
against in-process ones once per variant. With Triton's ``perf_analyzer`` (``make
perf-analyzer`` fetches it), the same daemon driven by it too, over gRPC and HTTP
(``--http``), protobuf and system shared memory, at concurrency 1 and N. Before all that,
the floors of this machine: a Unix-socket round trip to another process, and an empty gRPC
call (ServerReady) to the daemon; then the daemon's RSS over three windows of 10,000 tiny
requests after a warm-up.

    python benchmarks/serve.py                       # ~3 min on 2 cores
    python benchmarks/serve.py --models tiny --seconds 1

Writes ``results/serve.json`` (``--out``) and a Markdown table next to it, and prints it.
Targets from issue 11: shm >= 3x protobuf throughput at 16 MB; p50 added latency <= 150 us
over in-process on tiny; daemon throughput with N clients >= 0.9x in-process on ResNet-50.
"""

from __future__ import annotations

import argparse
import os
import platform
import pwd
import signal
import socket
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
import reporting

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


PERF_ANALYZER = Path(__file__).resolve().parent / ".perf_analyzer" / "perf_analyzer"
"""Where ``make perf-analyzer`` puts Triton's perf_analyzer (benchmarks/tools/)."""


def perf_analyzer(
    binary: Path,
    socket: str,
    name: str,
    clients: int,
    shm: bool,
    seconds: float,
    http: str | None = None,
) -> list[dict[str, Any]]:
    """Triton's ``perf_analyzer`` against the daemon: one row per concurrency (1 and
    ``clients``), with its throughput, latency percentiles and the server-side times it reads
    from ModelStatistics (us). ``shm``: inputs and outputs through system shared memory.
    ``http``: the daemon's HOST:PORT, driven over HTTP instead of gRPC on ``socket``."""
    with tempfile.TemporaryDirectory(prefix="crossrt-pa-") as tmp:
        csv_path = Path(tmp) / "pa.csv"
        where = ["-i", "http", "-u", http] if http else ["-i", "grpc", "-u", f"unix:{socket}"]
        command = [str(binary), "-m", name, *where]
        command += ["--concurrency-range", f"1:{max(clients, 1)}:{max(clients - 1, 1)}"]
        command += ["--measurement-interval", str(int(seconds * 1000))]
        command += ["--stability-percentage", "50", "--max-trials", "6", "-f", str(csv_path)]
        if shm:
            command += ["--shared-memory", "system", "--output-shared-memory-size", str(1 << 24)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not csv_path.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            print(f"perf_analyzer {name} failed (exit {done.returncode}): {tail}", flush=True)
            return []
        header, *lines = csv_path.read_text().strip().splitlines()
    keys = header.split(",")
    rows = []
    for line in sorted(lines, key=lambda line: int(line.split(",")[0])):
        values = dict(zip(keys, line.split(","), strict=False))
        rows.append({
            "model": name,
            "variant": f"perf_analyzer{' HTTP' if http else ''} {'shm' if shm else 'protobuf'}",
            "clients": int(values["Concurrency"]),
            "p50_us": float(values["p50 latency"]),
            "p99_us": float(values["p99 latency"]),
            "throughput": float(values["Inferences/Second"]),
            "requests": None,
            "server_queue_us": float(values["Server Queue"]),
            "server_compute_us": sum(float(values[f"Server Compute {k}"])
                                     for k in ("Input", "Infer", "Output")),
        })  # fmt: skip
    return rows


def unix_round_trip_us(count: int = 20_000) -> float:
    """p50 of 32 bytes sent to a forked process over a Unix socket pair and echoed back: the
    floor of any request to a daemon on this machine (a few us on bare metal, tens in VMs)."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo
        a.close()
        while data := b.recv(64):
            b.sendall(data)
        os._exit(0)
    b.close()
    times = []
    for _ in range(count):
        t = time.perf_counter_ns()
        a.sendall(b"x" * 32)
        a.recv(64)
        times.append(time.perf_counter_ns() - t)
    a.close()
    os.waitpid(pid, 0)
    return float(np.percentile(times[count // 10 :], 50) / 1e3)


def free_address() -> str:
    """A free loopback ``HOST:PORT``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def rss_kib(pid: int) -> int:
    """A process's resident memory (``VmRSS``), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


TOKEN = "bench-" + os.urandom(12).hex()
"""This user's per-user token (a tokens file the daemon reads): over TCP a client is anonymous
without one, and shared memory is a proven local user's (docs/security.md)."""


def start_daemon(folder: Path, http: str, tcp: str) -> subprocess.Popen[str]:
    """``crossrt serve`` on ``folder/d.sock``, loopback TCP ``tcp`` (and HTTP on ``http``)
    serving ``folder/models``; once it is ready."""
    tokens = folder / "tokens.toml"
    user = pwd.getpwuid(os.getuid()).pw_name
    tokens.write_text(f'[[tokens]]\ntoken = "{TOKEN}"\nuser = "{user}"\n')
    tokens.chmod(0o600)
    command = [sys.executable, "-m", "crossrt", "serve", "-x", "-g", f"unix:{folder}/d.sock"]
    command += ["-g", tcp, "--tokens", str(tokens)]
    command += ["--model-repository", str(folder / "models"), "--http", http]
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(folder / "run"))
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.rstrip().endswith(" INFO ready"):  # not a model's "... is ready"
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc
    raise SystemExit(f"crossrt serve did not start (exit {proc.wait()})")


def rss_soak(remote: Any, feed: dict[str, np.ndarray], pid: int) -> dict[str, Any]:
    """The daemon's RSS growth over three windows of 10,000 tiny requests from ``remote``,
    after 1,000 to warm up: the first window settles allocator pools, the rest stay flat."""
    model = remote.load("tiny")
    for _ in range(1000):
        model.run(feed)
    before = rss_kib(pid)
    windows = []
    for _ in range(3):
        start = rss_kib(pid)
        for _ in range(10_000):
            model.run(feed)
        windows.append(rss_kib(pid) - start)
    return {"requests": 10_000, "rss_before_kib": before,
            "rss_growth_kib": windows[0], "later_windows_kib": windows[1:]}  # fmt: skip


def run_all(
    names: Sequence[str], clients: int, seconds: float, analyzer: Path | None = None
) -> dict[str, Any]:
    rows = []
    soak = None
    floors = {"unix socket round trip p50 us": unix_round_trip_us()}  # before any thread
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-serve-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        inputs = {}
        for name in names:
            build, shape = MODELS[name]
            crossrt.compile(build(), "cpu").save(folder / "models" / f"{name}.crm")
            inputs[name] = np.random.default_rng(0).random(shape, dtype=np.float32)
        http, tcp = free_address(), free_address()
        daemon = start_daemon(folder, http, tcp)
        try:
            sock = f"unix:{folder}/d.sock"
            clients_by_variant = {  # the default client (the direct lane), and gRPC's
                "daemon lane protobuf": connect(sock, shm_threshold=None),
                "daemon lane shm": connect(sock, shm_threshold=0),
                "daemon gRPC protobuf": connect(sock, shm_threshold=None, lane=False),
                "daemon gRPC shm": connect(sock, shm_threshold=0, lane=False),
                # Loopback TCP, as a proven user (a per-user token): shared memory by name.
                "daemon TCP protobuf": connect(tcp, token=TOKEN, shm_threshold=None),
                "daemon TCP shm": connect(tcp, token=TOKEN, shm_threshold=0),
            }
            # What the machine and gRPC cost before crossrt does anything: a message to
            # another process and back over a Unix socket, and an empty call (ServerReady)
            # to the daemon.
            grpc_client = clients_by_variant["daemon gRPC protobuf"]
            floors["empty gRPC call (ServerReady) p50 us"] = measure(grpc_client.ready, 1, seconds)[
                "p50_us"
            ]
            print(f"floors: {floors}", flush=True)
            if "tiny" in names:  # the daemon's memory over 10,000 requests, after warm-up
                soak = {
                    transport: rss_soak(clients_by_variant[f"daemon {transport} protobuf"],
                                        {"x": inputs["tiny"]}, daemon.pid)
                    for transport in ("lane", "gRPC")
                }  # fmt: skip
                print(f"daemon RSS over 10,000 requests: {soak}", flush=True)
            with crossrt.Runtime() as rt:
                for name in names:
                    x = inputs[name]
                    local = rt.load(crossrt.load_executable(folder / "models" / f"{name}.crm"))
                    feed = {local.inputs[0].name: x}
                    expected = local.run(feed)
                    variants = {"in-process": local.run}
                    for variant, remote in clients_by_variant.items():
                        variants[variant] = remote.load(name).run
                    for variant, fn in variants.items():
                        got = fn(feed)
                        for key, want in expected.items():
                            np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6)
                        for n in sorted({1, clients}):
                            result = measure(lambda fn=fn, feed=feed: fn(feed), n, seconds)
                            rows.append({"model": name, "variant": variant, "clients": n, **result})
                            print(_row(rows[-1]), flush=True)
                    local.unload()
                    for over, shm in ((None, False), (None, True), (http, False), (http, True)):
                        if analyzer is None:
                            break
                        for row in perf_analyzer(
                            analyzer, f"{folder}/d.sock", name, clients, shm, seconds, over
                        ):
                            rows.append(row)
                            print(_row(row), flush=True)
            for remote in clients_by_variant.values():
                remote.close()
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
        "floors": floors,
    }


def ratios(rows: list[dict[str, Any]], clients: int) -> dict[str, float]:
    """The issue's three targets, as measured."""
    by = {(r["model"], r["variant"], r["clients"]): r for r in rows}
    out = {}
    if ("big", "daemon TCP shm", 1) in by:  # issue 24: no slower than the tensor sent
        out["big shm/protobuf throughput, TCP, a proven user (target >= 1)"] = (
            by["big", "daemon TCP shm", 1]["throughput"]
            / by["big", "daemon TCP protobuf", 1]["throughput"]
        )
    for transport in ("lane", "gRPC"):
        if ("big", f"daemon {transport} shm", 1) in by:
            out[f"big shm/protobuf throughput, {transport} (target >= 3)"] = (
                by["big", f"daemon {transport} shm", 1]["throughput"]
                / by["big", f"daemon {transport} protobuf", 1]["throughput"]
            )
    for transport in ("lane", "gRPC"):
        if ("tiny", "in-process", 1) in by:
            out[f"tiny p50 added over in-process, {transport}, us (target <= 150)"] = (
                by["tiny", f"daemon {transport} protobuf", 1]["p50_us"]
                - by["tiny", "in-process", 1]["p50_us"]
            )
    for transport in ("lane", "gRPC"):
        if ("resnet50", "in-process", clients) in by:
            key = f"resnet50 daemon/in-process throughput, {transport} shm, {clients} clients"
            out[f"{key} (target >= 0.9)"] = (
                by["resnet50", f"daemon {transport} shm", clients]["throughput"]
                / by["resnet50", "in-process", clients]["throughput"]
            )
    return out


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['model']} | {r['variant']} | {r['clients']} | {r['p50_us']:.0f} | "
        f"{r['p99_us']:.0f} | {r['throughput']:.1f} | {r['requests'] or ''} |"
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
        *(f"- floor, {k}: {v:.0f}" for k, v in report.get("floors", {}).items()),
        *(
            f"- daemon RSS growth over {soak['requests']:,} tiny requests ({transport}) after "
            f"warm-up: {soak['rss_growth_kib']} KiB, then over two more 10,000s: "
            f"{soak['later_windows_kib']} KiB"
            for transport, soak in (report.get("soak") or {}).items()
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
    p.add_argument(
        "--perf-analyzer",
        type=Path,
        default=PERF_ANALYZER if PERF_ANALYZER.exists() else None,
        help="Triton's perf_analyzer binary (default: the one `make perf-analyzer` fetched)",
    )
    p.add_argument("--no-perf-analyzer", action="store_true")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    analyzer = None if args.no_perf_analyzer else args.perf_analyzer
    if analyzer is None and not args.no_perf_analyzer:
        print("perf_analyzer: not found (make perf-analyzer fetches it): left out", flush=True)
    report = run_all(names, args.clients, args.seconds, analyzer)
    text = markdown(report)
    reporting.save(args.out, report, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
