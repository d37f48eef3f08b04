"""gRPC over the daemon's Unix socket against gRPC over loopback TCP (issue 28, point 3).

The Unix socket's relay learns who connected (``SO_PEERCRED``) and copies the bytes to gRPC's
own socket; this measures what that costs, paired: the same tiny ``ModelInfer`` (KServe's
gRPC stub, as tritonclient sends it) on each of

- **TCP**: gRPC over loopback TCP, no relay (the target: Unix within 20 us of it);
- **Unix, pump process**: the daemon's Unix socket, the bytes copied by the relay's pump
  process (``server/pump.py``: today's design);
- **Unix, daemon threads**: a second daemon whose pump process is kept from starting, so its
  relay copies in the daemon's own threads (its fallback, and the design before the pump
  process);
- **inner socket**: gRPC's own socket behind the relay, reached directly (only the daemon's
  user can): gRPC over a Unix socket with no relay, the floor;
- **direct socket, ticket**: the daemon's direct socket (``server/tickets.py``), the stub
  sending the ticket a connection to the main socket got in its user agent, as crossrt's
  client does;
- **private socket**: a socket of the client's own (``server/private_sockets.py``), which a
  connection to the main socket asked for and only its user may open: gRPC's own socket
  again, nothing sent with the calls;
- **tritonclient, TCP** and **tritonclient, private socket**: ``tritonclient.grpc``'s
  ``InferenceServerClient.infer`` on loopback TCP and on a private socket (``crossrt socket``
  / ``crossrt.private_socket()``), the second against the first;
- **crossrt client, TCP** and **crossrt client, direct socket with ticket**: ``connect(...,
  lane=False)`` and its ``RemoteRuntime.infer`` (the gRPC path of ``RemoteModel.run``) on
  loopback TCP and on the Unix socket, where it takes a ticket and calls the direct socket;
  the second against the first.

Rounds alternate the order; each round runs ``--calls`` calls per variant from 1 client and
from ``--clients`` threads (a client each). p50 and throughput per variant, and each
variant's p50 minus that of its TCP row of the same daemon: the median over the rounds of
the two p50s' difference in each round (both measured within seconds of each other, so
load from other work that drifts between rounds mostly cancels), beside the difference of
the pooled p50s; the load average at the start
and the end.

Then, interleaved: each client alternates, call by call, between a variant and its TCP row
(the order swapped every call), so both see the same moment's load; p50 of each over
``--paired-calls`` calls per client, and the median of the per-call differences. A pair of
two TCP clients of the same daemon shows what the machine can resolve.

    python benchmarks/relay.py                 # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
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

import grpc
import numpy as np
import tritonclient.grpc as tritonclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

import crossrt
from crossrt.server.client import RemoteRuntime, connect
from crossrt.server.private_sockets import private_socket
from crossrt.server.tickets import AGENT, request_ticket

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"
NO_PUMPS = (
    "import runpy, sys; import crossrt.server.pump as p\n"
    "def refuse(*a, **k): raise OSError('pump process left out by benchmarks/relay.py')\n"
    "p.Pumps.__init__ = refuse; sys.argv[0] = 'crossrt'\n"
    "runpy.run_module('crossrt', run_name='__main__')"
)
"""The daemon, with its relay's pump process kept from starting (it copies in its threads)."""


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def start(folder: Path, tag: str, pumps: bool) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A daemon on ``folder/tag.sock`` and loopback TCP; its targets by variant."""
    tcp = free_address()
    run = folder / f"run-{tag}"
    run.mkdir()
    head = ["-m", "crossrt"] if pumps else ["-c", NO_PUMPS]
    command = [sys.executable, *head, "serve", "-x", "-g", f"unix:{folder}/{tag}.sock", "-g", tcp]
    command += ["--model-repository", str(folder / "models")]
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(run), TMPDIR=str(run))
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.rstrip().endswith(" INFO ready"):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            break
    else:
        raise SystemExit(f"crossrt serve did not start (exit {proc.wait()})")
    unix = "Unix, pump process" if pumps else "Unix, daemon threads"
    targets = {f"TCP ({tag})": tcp, unix: f"unix:{folder}/{tag}.sock"}
    inner = glob.glob(f"{run}/crossrt-serve-*/grpc.sock")
    if pumps and inner:
        targets["inner socket, no relay"] = f"unix:{inner[0]}"
    if pumps:
        targets[DIRECT] = f"unix:{folder}/{tag}.sock"
        targets[PRIVATE] = f"unix:{folder}/{tag}.sock"
        targets[TRITON_TCP] = tcp
        targets[TRITON_PRIVATE] = f"unix:{folder}/{tag}.sock"
        targets[CROSSRT_TCP] = tcp
        targets[CROSSRT_DIRECT] = f"unix:{folder}/{tag}.sock"
    return proc, targets


DIRECT = "direct socket, ticket"
PRIVATE = "private socket"
TRITON_TCP = "tritonclient, TCP"
TRITON_PRIVATE = "tritonclient, private socket"
CROSSRT_TCP = "crossrt client, TCP"
CROSSRT_DIRECT = "crossrt client, direct socket with ticket"
BASELINE = {
    CROSSRT_DIRECT: CROSSRT_TCP,
    CROSSRT_TCP: CROSSRT_TCP,
    TRITON_PRIVATE: TRITON_TCP,
    TRITON_TCP: TRITON_TCP,
    "Unix, daemon threads": "TCP (b)",
}
"""The row each variant is compared with (else TCP (a))."""


class Caller:
    """One client of a variant: :meth:`call` sends the request once."""

    def __init__(self, variant: str, target: str, request: pb.ModelInferRequest) -> None:
        self._request = request
        self._close: list[Any] = []
        self.call: Callable[[], Any]
        if variant.startswith("crossrt client"):
            remote: RemoteRuntime = connect(target, lane=False, shm_threshold=None)
            assert (variant == CROSSRT_DIRECT) == (remote._ticket is not None), variant
            self._close.append(remote)
            self.call = lambda: remote.infer(request)
            return
        if variant in (PRIVATE, TRITON_PRIVATE):  # held while this client lives
            held = private_socket(target)
            self._close.append(held)
            target = held.url
        if variant.startswith("tritonclient"):  # its own channel per client object
            client = tritonclient.InferenceServerClient(target)
            self._close.append(client)
            x = tritonclient.InferInput("x", [1, 16], "FP32")
            x.set_data_from_numpy(
                np.frombuffer(request.raw_input_contents[0], np.float32).reshape(1, 16)
            )
            self.call = lambda: client.infer("tiny", [x])
            return
        options: list[tuple[str, int | str]] = [("grpc.use_local_subchannel_pool", 1)]
        if variant == DIRECT:  # the ticket in the user agent, as crossrt's client sends it
            ticket = request_ticket(target.removeprefix("unix:"), None, target)
            assert ticket is not None, "the daemon issued no ticket"
            self._close.append(ticket)
            target = f"unix:{ticket.direct}"
            options.append(("grpc.primary_user_agent", f"{AGENT}{ticket.value}"))
        channel = grpc.insecure_channel(target, options=options)  # a connection per client
        self._close.append(channel)
        stub = pbg.GRPCInferenceServiceStub(channel)
        self.call = lambda: stub.ModelInfer(request)

    def close(self) -> None:
        for thing in self._close:
            thing.close()


def request() -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="tiny")
    t = r.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend([1, 16])
    r.raw_input_contents.append(np.random.default_rng(0).random((1, 16), np.float32).tobytes())
    return r


def run_all(rounds: int, calls: int, clients: int, paired_calls: int) -> dict[str, Any]:
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-relay-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        crossrt.compile(models.build_tiny(), "cpu").save(folder / "models" / "tiny.crm")
        procs, targets = [], {}
        try:
            for tag, pumps in (("a", True), ("b", False)):
                proc, found = start(folder, tag, pumps)
                procs.append(proc)
                targets.update(found)
            rows = measure(targets, rounds, calls, clients) if rounds else []
            paired = interleave(targets, paired_calls, clients)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    return {
        "benchmark": "relay",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
            "load_at_start": load_at_start,
        },
        "rounds": rounds,
        "calls": calls,
        "rows": rows,
        "paired_calls": paired_calls,
        "interleaved": paired,
    }


def measure(targets: dict[str, str], rounds: int, calls: int, clients: int) -> list[dict[str, Any]]:
    req = request()
    rows = []
    for n in sorted({1, clients}):
        callers = {k: [Caller(k, v, req) for _ in range(n)] for k, v in targets.items()}
        for group in callers.values():
            for caller in group:
                for _ in range(100):
                    caller.call()
        times: dict[str, list[int]] = {k: [] for k in callers}
        rates: dict[str, list[float]] = {k: [] for k in callers}
        medians: dict[str, list[float]] = {k: [] for k in callers}  # each round's p50
        names = list(callers)
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                got = times[k]
                first = len(got)

                def loop(caller: Caller, got: list[int] = got, each: int = calls // n) -> None:
                    call = caller.call
                    for _ in range(each):
                        t = time.perf_counter_ns()
                        call()
                        got.append(time.perf_counter_ns() - t)

                threads = [threading.Thread(target=loop, args=(c,)) for c in callers[k]]
                started = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                rates[k].append(n * (calls // n) / (time.perf_counter() - started))
                medians[k].append(float(np.percentile(got[first:], 50) / 1e3))
        p50 = {k: float(np.percentile(v, 50) / 1e3) for k, v in times.items()}
        for k in names:
            tcp = BASELINE.get(k, "TCP (a)")
            rows.append({
                "variant": k, "clients": n, "baseline": tcp, "p50_us": p50[k],
                "p99_us": float(np.percentile(times[k], 99) / 1e3),
                "throughput": float(np.median(rates[k])),
                "p50_minus_tcp_us": float(np.median(np.subtract(medians[k], medians[tcp]))),
                "pooled_p50_minus_tcp_us": p50[k] - p50[tcp],
                "throughput_vs_tcp": float(np.median(rates[k]) / np.median(rates[tcp])),
            })  # fmt: skip
            print(_row(rows[-1]), flush=True)
        for group in callers.values():
            for caller in group:
                caller.close()
    return rows


SAME_TCP = "TCP (a), a second client"
PAIRS = [
    (SAME_TCP, "TCP (a)"),
    ("Unix, pump process", "TCP (a)"),
    ("inner socket, no relay", "TCP (a)"),
    (DIRECT, "TCP (a)"),
    (PRIVATE, "TCP (a)"),
    (PRIVATE, "inner socket, no relay"),
    (TRITON_PRIVATE, TRITON_TCP),
    (CROSSRT_DIRECT, CROSSRT_TCP),
]
"""(variant, its TCP row) measured call by call, interleaved."""


def interleave(targets: dict[str, str], calls: int, clients: int) -> list[dict[str, Any]]:
    """Each pair of :data:`PAIRS`, each client alternating between the two call by call."""
    req = request()
    targets = {**targets, SAME_TCP: targets["TCP (a)"]}
    rows = []
    for n in sorted({1, clients}):
        for variant, tcp in PAIRS:
            if variant not in targets:
                continue
            pairs = [
                (Caller(variant, targets[variant], req), Caller(tcp, targets[tcp], req))
                for _ in range(n)
            ]
            got: list[tuple[int, int]] = []

            def loop(pair: tuple[Caller, Caller], got: list[tuple[int, int]] = got) -> None:
                one, other = pair[0].call, pair[1].call
                for _ in range(100):
                    one()
                    other()
                for i in range(calls):
                    first, second = (one, other) if i % 2 else (other, one)
                    t0 = time.perf_counter_ns()
                    first()
                    t1 = time.perf_counter_ns()
                    second()
                    t2 = time.perf_counter_ns()
                    a, b = (t1 - t0, t2 - t1) if i % 2 else (t2 - t1, t1 - t0)
                    got.append((a, b))  # (variant, TCP)

            threads = [threading.Thread(target=loop, args=(pair,)) for pair in pairs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for pair in pairs:
                for caller in pair:
                    caller.close()
            mine, theirs = np.array(got, dtype=np.float64).T / 1e3
            rows.append({
                "variant": variant, "baseline": tcp, "clients": n,
                "p50_us": float(np.median(mine)), "tcp_p50_us": float(np.median(theirs)),
                "p50_minus_tcp_us": float(np.median(mine) - np.median(theirs)),
                "median_difference_us": float(np.median(mine - theirs)),
            })  # fmt: skip
            print(_paired_row(rows[-1]), flush=True)
    return rows


def _paired_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['variant']} | {r['clients']} | {r['baseline']} | {r['p50_us']:.0f} | "
        f"{r['tcp_p50_us']:.0f} | {r['p50_minus_tcp_us']:+.0f} | "
        f"{r['median_difference_us']:+.0f} |"
    )


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['variant']} | {r['clients']} | {r['baseline']} | {r['p50_us']:.0f} | "
        f"{r['p99_us']:.0f} | "
        f"{r['throughput']:.0f} | {r['p50_minus_tcp_us']:+.0f} | "
        f"{r['pooled_p50_minus_tcp_us']:+.0f} | {r['throughput_vs_tcp']:.2f} |"
    )


def markdown(report: dict[str, Any]) -> str:
    host = report["host"]
    lines = [
        f"# gRPC over the Unix socket vs loopback TCP ({report['date']}, {host['cpus']} CPUs, "
        f"{host['machine']})",
        "",
        f"{report['rounds']} alternating rounds of {report['calls']} tiny ModelInfer calls per "
        "variant; medians of the rounds' throughput; each row against the TCP row named (the "
        "same daemon, the same client code): p50 - TCP paired is the median over the rounds of "
        "each round's difference, pooled the difference of all calls' p50s. Load average (1 min) "
        f"{host.get('load_at_start', host['load'])[0]:.1f} at the start, "
        f"{host['load'][0]:.1f} at the end.",
        "",
        "| variant | clients | against | p50 us | p99 us | req/s | p50 - TCP us (paired) | "
        "p50 - TCP us (pooled) | req/s vs TCP |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_row(r) for r in report["rows"]]
    if not report["rows"]:  # --rounds 0
        lines[2:] = [f"Interleaved rows only. Load average (1 min) {lines[2].split('(1 min) ')[1]}"]
    if report.get("interleaved"):
        lines += [
            "",
            f"Interleaved: each client alternates call by call between the variant and its TCP "
            f"row, {report['paired_calls']} pairs of calls per client; p50 of each side, their "
            "difference, and the median of the per-call differences.",
            "",
            "| variant | clients | against | p50 us | TCP p50 us | p50 - TCP us | "
            "median of differences us |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_paired_row(r) for r in report["interleaved"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=6, help="0: the interleaved rows only")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--paired-calls", type=int, default=2000)
    p.add_argument("--out", type=Path, default=RESULTS / "relay.json")
    args = p.parse_args(argv)
    report = run_all(args.rounds, args.calls, args.clients, args.paired_calls)
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
