"""crossrt on Ray Serve against what a user writes on Ray Serve, and against ``crossrt serve``.

On one host (a local Ray cluster), for each model (tiny: ``x[1,16] @ W + b``; resnet50: the
ResNet-50-like model of models.py), three servers, each given one core, and the same client
(tritonclient gRPC, KServe v2; the header ``application`` picks the Serve application):

- **crossrt on Ray**: ``crossrt.scaleout.ray``, one replica reserving one core (its requests
  through Serve's gRPC proxy into the replica's KServe service, crossrt's run path inside);
- **plain Ray + ORT**: a Serve deployment a user writes: an ``onnxruntime.InferenceSession``
  (one intra-op thread, ``num_cpus=1``) behind a ``ModelInfer`` that reads the raw input bytes
  with NumPy and answers raw output bytes, on the same gRPC proxy;
- **crossrt serve**: the daemon on loopback TCP with ``--cores`` one core, no Ray.

Rounds alternate (every server once per round, ``--rounds``), ``--seconds`` each, with 1 and
``--clients`` client threads: p50/p99 and throughput (per core: per serving core reserved,
one each), the serving process's CPU time per request (the replica's, or the daemon's: read
from /proc, so it counts what that process adds, and not Serve's proxy or the client), each
round's paired ratio and the host's load average (other work on a shared host).
The Ray hop's added p50 is crossrt on Ray's less ``crossrt serve``'s at one client.
Then scaling: crossrt on Ray with 1 and with 2 replicas of one core each on resnet50 (a
compute-bound model), ``--clients`` clients, throughput ratio. Outputs are checked against
raw onnxruntime once per server and model.

    python benchmarks/ray_serve.py            # ~5 min on 2 cores
    python benchmarks/ray_serve.py --models tiny --seconds 1 --rounds 1

Writes ``results/ray_serve.json`` (``--out``) and a Markdown table next to it. Targets (issue
26): throughput per core >= 1.2x plain Ray + ORT on tiny, >= 1.0x on resnet50; 1 -> 2
replicas >= 1.6x on a compute-bound model with 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import crossrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models
import reporting
from serve import measure

RESULTS = Path(__file__).resolve().parent / "results"
SERVERS = ("crossrt on Ray", "plain Ray + ORT", "crossrt serve")


class PlainOrt:
    """What a user writes to serve an ONNX model over KServe v2 gRPC on Ray Serve."""

    def __init__(self, onnx_path: str) -> None:
        import onnxruntime as ort
        from tritonclient.grpc import service_pb2

        # Serve unpickles each request by its class's module name, which tritonclient's
        # generated code gives as grpc_service_pb2: a user meets this trap too.
        sys.modules.setdefault("grpc_service_pb2", service_pb2)

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # num_cpus=1: one core's worth, as the others
        self.session = ort.InferenceSession(onnx_path, options)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def pid(self) -> int:
        """The replica's process (the benchmark reads its CPU time; not on the request path)."""
        return os.getpid()

    def ModelInfer(self, request: Any) -> Any:
        from tritonclient.grpc import service_pb2 as pb

        feed = {
            t.name: np.frombuffer(request.raw_input_contents[i], np.float32).reshape(t.shape)
            for i, t in enumerate(request.inputs)
        }
        results = self.session.run(None, feed)
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        for name, value in zip(self.outputs, results, strict=True):
            response.outputs.add(name=name, datatype="FP32", shape=value.shape)
            response.raw_output_contents.append(np.ascontiguousarray(value).tobytes())
        return response


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, all its threads) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_of(app: str, method: str) -> int:
    """The process of Serve application ``app``'s replica (asked through ``method``)."""
    from ray import serve

    answer = serve.get_app_handle(app).options(method_name=method).remote().result()
    return int(answer["pid"] if isinstance(answer, dict) else answer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(folder: Path, port: int, core: int) -> subprocess.Popen[str]:
    """``crossrt serve`` on loopback TCP ``port``, on host CPU ``core``, once ready."""
    command = [sys.executable, "-m", "crossrt", "serve", "-x", "-g", f"unix:{folder}/d.sock"]
    command += ["-g", f"127.0.0.1:{port}", "--model-repository", str(folder / "models")]
    command += ["--cores", str(core)]
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(folder / "run"))
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.rstrip().endswith(" INFO ready"):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc
    raise SystemExit(f"crossrt serve did not start (exit {proc.wait()})")


def client_call(
    address: str, app: str, model: str, feed: dict[str, np.ndarray]
) -> Callable[[], Any]:
    """A request of ``model`` through tritonclient, one client per calling thread."""
    import tritonclient.grpc as tc

    local = threading.local()
    ((name, value),) = feed.items()
    headers = {"application": app} if app else None

    def run() -> Any:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = tc.InferenceServerClient(address)
        given = tc.InferInput(name, list(value.shape), "FP32")
        given.set_data_from_numpy(value)
        return client.infer(model, [given], headers=headers)

    return run


def output_of(address: str, app: str, model: str, feed: dict[str, np.ndarray]) -> np.ndarray:
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(address)
    ((name, value),) = feed.items()
    given = tc.InferInput(name, list(value.shape), "FP32")
    given.set_data_from_numpy(value)
    answer = client.infer(model, [given], headers={"application": app} if app else None)
    out = answer.get_response().outputs[0].name
    return answer.as_numpy(out)


def run_all(names: list[str], clients: int, seconds: float, rounds: int) -> dict[str, Any]:
    import onnxruntime as ort

    import ray
    from crossrt.scaleout.ray import ReplicaConfig, Scaling, application, start_serve
    from ray import serve

    folder = Path(tempfile.mkdtemp(prefix="crossrt-bench-ray-"))
    (folder / "models").mkdir()
    os.environ["CROSSRT_RUNTIME_DIR"] = str(folder / "run")  # the replicas' core locks
    paths = {n: models.get(n) for n in names}
    feeds = {n: models.example_input(n) for n in names}
    for n in names:
        crossrt.compile(crossrt.load_model(str(paths[n])), "cpu").save(
            folder / "models" / f"{n}.crm"
        )
    rows: list[dict[str, Any]] = []
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    grpc_port, daemon_port = free_port(), free_port()
    start_serve(("127.0.0.1", free_port()), grpc_port)
    proxy = f"127.0.0.1:{grpc_port}"
    daemon = start_daemon(folder, daemon_port, core=1)
    try:
        for n in names:
            on_ray = application(
                ReplicaConfig(str(folder / "models"), cores=1), Scaling(1), f"crossrt-{n}"
            )
            serve.run(on_ray, name=f"crossrt-{n}", route_prefix=f"/crossrt-{n}")
            plain = serve.deployment(PlainOrt, name=f"plain-{n}", ray_actor_options={"num_cpus": 1},
                                     max_ongoing_requests=32).bind(str(paths[n]))  # fmt: skip
            serve.run(plain, name=f"plain-{n}", route_prefix=f"/plain-{n}")
            targets = {
                "crossrt on Ray": (proxy, f"crossrt-{n}"),
                "plain Ray + ORT": (proxy, f"plain-{n}"),
                "crossrt serve": (f"127.0.0.1:{daemon_port}", ""),
            }
            pids = {  # the process that serves: each replica, the daemon
                "crossrt on Ray": pid_of(f"crossrt-{n}", "placement"),
                "plain Ray + ORT": pid_of(f"plain-{n}", "pid"),
                "crossrt serve": daemon.pid,
            }
            want = ort.InferenceSession(str(paths[n])).run(None, feeds[n])[0]
            for server, (address, app) in targets.items():
                got = output_of(address, app, n, feeds[n])
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=server)
            for k in range(rounds):
                for c in (1, clients):
                    for server, (address, app) in targets.items():
                        used = cpu_seconds(pids[server])
                        m = measure(client_call(address, app, n, feeds[n]), c, seconds)
                        m["server_cpu_us"] = (
                            (cpu_seconds(pids[server]) - used) / m["requests"] * 1e6
                        )
                        m["load"] = os.getloadavg()[0]  # other work on this host, stated
                        rows.append({"model": n, "server": server, "clients": c, "round": k, **m})
                        print(
                            f"{n:9} {server:16} c={c} {m['p50_us']:9.0f} us "
                            f"{m['throughput']:8.1f}/s {m['server_cpu_us']:6.0f} us CPU/req",
                            flush=True,
                        )
            serve.delete(f"crossrt-{n}")
            serve.delete(f"plain-{n}")
    finally:
        daemon.terminate()
        daemon.wait(60)
    scaling: dict[str, Any] = {}
    heavy = "resnet50" if "resnet50" in names else names[-1]
    try:
        for replicas in (1, 2):
            app = application(
                ReplicaConfig(str(folder / "models"), cores=1), Scaling(replicas), "scale"
            )
            serve.run(app, name="scale", route_prefix="/scale")
            got = [measure(client_call(proxy, "scale", heavy, feeds[heavy]), clients, seconds)
                   for _ in range(rounds)]  # fmt: skip
            scaling[str(replicas)] = max(got, key=lambda m: m["throughput"])
            print(
                f"scale {heavy} {replicas} replica(s): "
                f"{scaling[str(replicas)]['throughput']:.1f}/s",
                flush=True,
            )
            serve.delete("scale")
    finally:
        serve.shutdown()
        ray.shutdown()
    return {
        "benchmark": "ray_serve",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "ray": ray.__version__},
        "seconds": seconds,
        "clients": clients,
        "rows": rows,
        "scaling": {"model": heavy, "clients": clients, **scaling},
        "summary": summary(rows, names, clients, scaling),
    }


def _best(rows: list[dict[str, Any]], model: str, server: str, clients: int) -> dict[str, Any]:
    """The median round's numbers (by throughput) of one server, model and client count."""
    got = sorted(
        (r for r in rows if (r["model"], r["server"], r["clients"]) == (model, server, clients)),
        key=lambda r: r["throughput"],
    )
    return got[len(got) // 2]


def paired(rows: list[dict[str, Any]], model: str, clients: int) -> list[float]:
    """crossrt on Ray's throughput over plain Ray + ORT's in each round (measured one after
    the other, so under the same load of the host)."""
    ratios = []
    for k in sorted({r["round"] for r in rows}):
        got = {
            r["server"]: r["throughput"]
            for r in rows
            if (r["model"], r["clients"], r["round"]) == (model, clients, k)
        }
        if "crossrt on Ray" in got and "plain Ray + ORT" in got:
            ratios.append(got["crossrt on Ray"] / got["plain Ray + ORT"])
    return ratios


def summary(
    rows: list[dict[str, Any]], names: list[str], clients: int, scaling: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in names:
        ray_n = _best(rows, n, "crossrt on Ray", clients)
        plain = _best(rows, n, "plain Ray + ORT", clients)
        out[n] = {
            "per_core_vs_plain_ray_ort": ray_n["throughput"] / plain["throughput"],
            "paired_ratios": paired(rows, n, clients),
            "ray_hop_added_p50_us": _best(rows, n, "crossrt on Ray", 1)["p50_us"]
            - _best(rows, n, "crossrt serve", 1)["p50_us"],
        }
    if "1" in scaling and "2" in scaling:
        out["scaling_1_to_2"] = scaling["2"]["throughput"] / scaling["1"]["throughput"]
    return out


def markdown(report: dict[str, Any]) -> str:
    clients = report["clients"]
    names = list(dict.fromkeys(r["model"] for r in report["rows"]))
    loads = [r["load"] for r in report["rows"] if "load" in r]
    lines = [
        f"# crossrt on Ray Serve ({report['date']}, {report['host']['cpus']} CPUs, Ray "
        f"{report['host']['ray']}; tritonclient gRPC; median round; one serving core each)",
        "",
    ]
    if loads:
        lines += [
            f"Load average of the host during the rounds: {min(loads):.1f}-{max(loads):.1f} "
            "(other work on it; the rounds alternate the servers, so each round's servers "
            "share the load).",
            "",
        ]
    lines += [
        "| model | server | clients | p50 us | p99 us | req/s | req/s per core "
        "| server CPU us/req |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        for c in (1, clients):
            for server in SERVERS:
                r = _best(report["rows"], n, server, c)
                lines.append(
                    f"| {n} | {server} | {c} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | "
                    f"{r['throughput']:.1f} | {r['throughput']:.1f} | "
                    f"{r.get('server_cpu_us', float('nan')):.0f} |"
                )
    lines += [
        "",
        f"| model | crossrt on Ray / plain Ray + ORT (per core, {clients} clients) | each round "
        "| Ray hop's added p50 (us) |",
        "| --- | ---: | --- | ---: |",
    ]
    for n in names:
        s = report["summary"][n]
        rounds = ", ".join(f"{r:.2f}" for r in s.get("paired_ratios", []))
        lines.append(
            f"| {n} | {s['per_core_vs_plain_ray_ort']:.2f}x | {rounds} "
            f"| {s['ray_hop_added_p50_us']:.0f} |"
        )
    sc = report["scaling"]
    if "scaling_1_to_2" in report["summary"]:
        lines += [
            "",
            f"Scaling on {sc['model']} ({sc['clients']} clients): 1 replica "
            f"{sc['1']['throughput']:.1f}/s, 2 replicas {sc['2']['throughput']:.1f}/s: "
            f"{report['summary']['scaling_1_to_2']:.2f}x",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="tiny,resnet50")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "ray_serve.json")
    args = p.parse_args(argv)
    report = run_all(
        [n for n in args.models.split(",") if n], args.clients, args.seconds, args.rounds
    )
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
