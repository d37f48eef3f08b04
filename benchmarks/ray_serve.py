"""crossrt on Ray Serve against what a user writes on Ray Serve, and against ``crossrt serve``.

On one host (a local Ray cluster with Serve's proxy switches, ``crossrt.scaleout.ray.app.
SERVE_ENV``, as ``crossrt deploy ray`` starts it; ``--serve-defaults``: Serve as shipped), for
each model (tiny: ``x[1,16] @ W + b``; resnet50: the ResNet-50-like model of models.py), the
same client (tritonclient gRPC, KServe v2; the header ``application`` picks the Serve
application) against:

- **crossrt on Ray**: ``crossrt.scaleout.ray``, replicas reserving one core each (requests
  through Serve's gRPC proxy into the replica's KServe service, crossrt's run path inside);
  with ``--drivers openvino``, the same replicas also serve the model compiled for OpenVINO
  (**crossrt on Ray (openvino)**);
- **plain Ray + ORT**: a Serve deployment a user writes: an ``onnxruntime.InferenceSession``
  (one intra-op thread, ``num_cpus=1``) behind a ``ModelInfer`` that reads the raw input bytes
  with NumPy and answers raw output bytes, on the same gRPC proxy;
- **crossrt serve**: the daemon on loopback TCP with ``--cores`` one core, no Ray.

Two layouts: one replica of each Ray deployment beside ``crossrt serve`` (1 and ``--clients``
client threads), then the packed node: as many replicas of each as the host has CPUs
(``num_cpus=1`` each; ``--packed-clients``). Rounds alternate (every server once per round,
``--rounds``), ``--seconds`` each: p50/p99, throughput per nominal core (the cores the replicas
declare), per node core (packed) and per CPU-second, the CPU time per request of the serving
processes (all of a deployment's replicas, or the daemon) and of Serve's proxy (from /proc),
each round's paired ratio and the host's load average (other work on a shared host;
``--nice -15`` puts the benchmark's processes in autogroups ahead of it). The Ray hop's
added p50 is crossrt on Ray's less ``crossrt serve``'s at one client; scaling is crossrt on
Ray's packed node over one replica. ``--profile-proxy``: py-spy on the proxy under each Ray
deployment. Outputs are checked against raw onnxruntime once per server and layout.

    python benchmarks/ray_serve.py --models tiny --seconds 3 --rounds 3 --nice -15
    python benchmarks/ray_serve.py --models resnet50 --seconds 8 --rounds 3 --drivers openvino

Writes ``results/ray_serve.json`` (``--out``) and a Markdown table next to it. Targets (issue
26): throughput per core >= 1.2x plain Ray + ORT on tiny, >= 1.0x on resnet50; 1 -> 2
replicas >= 1.6x on a compute-bound model with 2 cores (docs/scale-out.md says which cores
the targets count).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
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
from crossrt.scaleout.ray.app import ROUTER

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models
import reporting
from serve import measure

RESULTS = Path(__file__).resolve().parent / "results"
SERVE_ROUTER = "Serve's power of two choices"
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


def compile_models(folder: Path, names: list[str], drivers: list[str]) -> dict[str, Path]:
    """Each model's ONNX file; its ``.crm`` in ``folder/models`` (the default driver, under
    the model's name, and each of ``drivers`` beyond it under ``NAME_DRIVER``: the same
    replicas serve both, so the engines share the replica's core and the rounds)."""
    (folder / "models").mkdir(parents=True, exist_ok=True)
    paths = {n: models.get(n) for n in names}
    for n in names:
        crossrt.compile(crossrt.load_model(str(paths[n])), "cpu").save(
            folder / "models" / f"{n}.crm"
        )
        for driver in drivers:
            exe = crossrt.compile(crossrt.load_model(str(paths[n])), "cpu", driver=driver)
            exe.save(folder / "models" / f"{n}_{driver}.crm")
    return paths


def proxy_pid() -> int | None:
    """Serve's proxy on this host (the process ``ray::ProxyActor``), if it runs."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if any("ProxyActor" in part for part in proc.info["cmdline"] or ()):
            return int(proc.pid)
    return None


def renice(nice: int | None) -> None:
    """Put this process and every process it started (the cluster's: GCS, raylet, Serve's
    proxy, the replicas; the daemon) in scheduling groups at autogroup nice ``nice`` (root),
    so that other work on a shared host takes less of the cores the servers are measured on,
    alike for every server (as benchmarks/serve_peers.py --nice)."""
    if nice is None:
        return
    import psutil

    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(OSError):
            Path(f"/proc/{proc.pid}/autogroup").write_text(str(nice))


def pids_of(app: str, method: str, count: int, tries: int = 200) -> list[int]:
    """The processes of Serve application ``app``'s ``count`` replicas (asked through
    ``method`` until that many answered)."""
    found: set[int] = set()
    for _ in range(tries):
        found.add(pid_of(app, method))
        if len(found) == count:
            return sorted(found)
    raise SystemExit(f"only replicas {sorted(found)} of {app} answered")


def deploy_pair(
    folder: Path, path: Path, n: str, replicas: int, max_ongoing: int = 32
) -> tuple[dict[str, str], dict[str, list[int]]]:
    """crossrt on Ray and plain Ray + ORT, ``replicas`` each (one core each, declared as
    ``num_cpus=1``): the Serve application of each, and its replicas' processes."""
    from crossrt.scaleout.ray import ReplicaConfig, Scaling, application
    from ray import serve

    tag = f"{n}-{replicas}"
    scaling = Scaling(replicas, max_ongoing_requests=max_ongoing)
    on_ray = application(ReplicaConfig(str(folder / "models"), cores=1), scaling, f"crossrt-{tag}")
    serve.run(on_ray, name=f"crossrt-{tag}", route_prefix=f"/crossrt-{tag}")
    plain = serve.deployment(PlainOrt, name=f"plain-{tag}", num_replicas=replicas,
                             ray_actor_options={"num_cpus": 1},
                             max_ongoing_requests=32).bind(str(path))  # fmt: skip
    serve.run(plain, name=f"plain-{tag}", route_prefix=f"/plain-{tag}")
    apps = {"crossrt": f"crossrt-{tag}", "plain": f"plain-{tag}"}
    pids = {
        "crossrt": pids_of(apps["crossrt"], "placement", replicas),
        "plain": pids_of(apps["plain"], "pid", replicas),
    }
    return apps, pids


def servers_of(
    n: str, apps: dict[str, str], pids: dict[str, list[int]], proxy: str, drivers: list[str]
) -> dict[str, tuple[str, str, str, list[int]]]:
    """What the rounds alternate: server -> (address, Serve application, model, processes)."""
    targets = {"crossrt on Ray": (proxy, apps["crossrt"], n, pids["crossrt"])}
    for driver in drivers:  # the same replicas, the model compiled for another engine
        targets[f"crossrt on Ray ({driver})"] = (proxy, apps["crossrt"], f"{n}_{driver}",
                                                 pids["crossrt"])  # fmt: skip
    targets["plain Ray + ORT"] = (proxy, apps["plain"], n, pids["plain"])
    return targets


def rounds_of(
    targets: dict[str, tuple[str, str, str, list[int]]],
    n: str,
    feed: dict[str, np.ndarray],
    section: dict[str, Any],
) -> list[dict[str, Any]]:
    """``section["rounds"]`` rounds, each every server once at each client count; per row the
    serving processes' CPU per request (all its replicas together) and Serve's proxy's."""
    rows = []
    proxy = proxy_pid()
    renice(section["nice"])  # the replicas just deployed too
    for k in range(section["rounds"]):
        for c in section["clients"]:
            for server, (address, app, model, pids) in targets.items():
                watched = pids + ([proxy] if proxy and app else [])
                used = [cpu_seconds(p) for p in watched]
                host, client = host_times(), resource.getrusage(resource.RUSAGE_SELF)
                m = measure(client_call(address, app, model, feed), c, section["seconds"])
                m["host_idle"] = idle_between(host, host_times())
                m["client_cpu_us"] = client_cpu_us(client, m["requests"])
                spent = [
                    (cpu_seconds(p) - u) / m["requests"] * 1e6
                    for p, u in zip(watched, used, strict=True)
                ]
                m["server_cpu_us"] = sum(spent[: len(pids)])
                m["proxy_cpu_us"] = spent[len(pids)] if len(spent) > len(pids) else None
                m["load"] = os.getloadavg()[0]  # other work on this host, stated
                row = {"model": n, "server": server, "clients": c, "round": k, **m}
                rows.append({**row, "replicas": section["replicas"]})
                print(
                    f"{n:9} x{section['replicas']} {server:26} c={c} {m['p50_us']:9.0f} us "
                    f"{m['throughput']:8.1f}/s {m['server_cpu_us']:6.0f} us CPU/req "
                    f"idle {m['host_idle']:.0%} client {m['client_cpu_us']:6.0f} us/req",
                    flush=True,
                )
    return rows


def host_times() -> Any:
    """The host's CPU times (psutil: user, nice, system, idle, iowait, ...)."""
    import psutil

    return psutil.cpu_times()


def idle_between(before: Any, after: Any) -> float:
    """The share of the host's CPU time left idle (idle and iowait) between two readings:
    what no process used, where pinned replicas may leave their cores waiting. (Guest time
    is counted in user time already.)"""
    fields = [f for f in before._fields if not f.startswith("guest")]
    spent = {f: getattr(after, f) - getattr(before, f) for f in fields}
    return (spent["idle"] + spent.get("iowait", 0.0)) / max(sum(spent.values()), 1e-9)


def client_cpu_us(before: resource.struct_rusage, requests: int) -> float:
    """CPU the client (this process's threads) used per request since ``before``."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    used = now.ru_utime + now.ru_stime - before.ru_utime - before.ru_stime
    return used / max(requests, 1) * 1e6


def profile_proxy(call: Callable[[], Any], clients: int, seconds: float) -> dict[str, Any]:
    """Where Serve's proxy spends its time while ``clients`` threads send ``call``: py-spy's
    samples of the proxy process, and the top functions' shares of them (inclusive: the
    function and what it calls; own: its own lines)."""
    import shutil

    spy, proxy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), proxy_pid()
    if proxy is None or not Path(spy).exists():
        return {"error": "no Serve proxy, or no py-spy (pip install py-spy)"}
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        command = [spy, "record", "-p", str(proxy), "-d", str(max(1, int(seconds) - 1))]
        command += ["-r", "200", "--format", "raw", "--nonblocking", "-o", out.name]
        recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        measured = measure(call, clients, seconds)
        recorder.wait(60)
        lines = Path(out.name).read_text().splitlines()
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] for f in stack.split(";")]
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for name in set(frames):
            inclusive[name] = inclusive.get(name, 0) + int(count)

    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:30]
    return {
        "samples": total,
        "throughput": measured["throughput"],
        "functions": [
            (name, n / max(total, 1), own.get(name, 0) / max(total, 1)) for name, n in ranked
        ],
    }


def check_outputs(
    targets: dict[str, tuple[str, str, str, list[int]]], path: Path, feed: dict[str, np.ndarray]
) -> None:
    import onnxruntime as ort

    want = ort.InferenceSession(str(path)).run(None, feed)[0]
    for server, (address, app, model, _) in targets.items():
        got = output_of(address, app, model, feed)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=server)


def one_model(
    folder: Path,
    path: Path,
    n: str,
    proxy: str,
    args: argparse.Namespace,
    profiles: dict[str, Any],
) -> list[dict[str, Any]]:
    """One model's rows: one replica of each deployment beside ``crossrt serve`` (one core
    each), then the packed node (as many replicas of each as the host has CPUs); with
    ``--profile-proxy``, the proxy's profile under each Ray deployment into ``profiles``."""
    from ray import serve

    feed = models.example_input(n)
    rows: list[dict[str, Any]] = []
    daemon_port = free_port()
    daemon = start_daemon(folder, daemon_port, core=1)
    try:
        apps, pids = deploy_pair(folder, path, n, 1, args.max_ongoing)
        targets = servers_of(n, apps, pids, proxy, args.drivers)
        targets["crossrt serve"] = (f"127.0.0.1:{daemon_port}", "", n, [daemon.pid])
        check_outputs(targets, path, feed)
        single = {"replicas": 1, "clients": (1, args.clients), "seconds": args.seconds,
                  "rounds": args.rounds, "nice": args.nice}  # fmt: skip
        rows += rounds_of(targets, n, feed, single)
        if args.profile_proxy:
            for server in ("crossrt on Ray", "plain Ray + ORT"):
                address, app, model, _ = targets[server]
                profiles[f"{n} | {server}"] = profile_proxy(
                    client_call(address, app, model, feed), args.clients, args.seconds
                )
        for app in apps.values():
            serve.delete(app)
    finally:
        daemon.terminate()  # its core goes back, for the packed node's replicas
        daemon.wait(60)
    packed = os.cpu_count() or 1
    if packed > 1 and args.packed_clients:
        apps, pids = deploy_pair(folder, path, n, packed, args.max_ongoing)
        targets = servers_of(n, apps, pids, proxy, args.drivers)
        check_outputs(targets, path, feed)
        section = {"replicas": packed, "clients": args.packed_clients,
                   "seconds": args.seconds, "rounds": args.rounds, "nice": args.nice}  # fmt: skip
        rows += rounds_of(targets, n, feed, section)
        for app in apps.values():
            serve.delete(app)
    return rows


def run_all(names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from crossrt.scaleout.ray import start_serve
    from crossrt.scaleout.ray.app import SERVE_ENV
    from ray import serve

    folder = Path(tempfile.mkdtemp(prefix="crossrt-bench-ray-"))
    os.environ["CROSSRT_RUNTIME_DIR"] = str(folder / "run")  # the replicas' core locks
    paths = compile_models(folder, names, args.drivers)
    cpus = os.cpu_count() or 1
    # Serve's proxy switches, as `crossrt deploy ray` sets them for its cluster (both
    # deployments sit behind the same proxy), unless --serve-defaults; and any --serve-env
    env = {} if args.serve_defaults else dict(SERVE_ENV)
    env.update(setting.partition("=")[::2] for setting in args.serve_env)
    before = dict(os.environ)
    os.environ.update(env)  # the cluster's processes inherit it; this driver's handles not
    # Both deployments of a section stay deployed side by side so the rounds alternate:
    # declare twice the node's CPUs (num_cpus is Ray's accounting only; each deployment alone
    # fits the node: one replica per CPU, num_cpus=1 each).
    ray.init(address="local", num_cpus=2 * cpus, include_dashboard=False, log_to_driver=False)
    os.environ.clear()
    os.environ.update(before)
    grpc_port = free_port()
    start_serve(("127.0.0.1", free_port()), grpc_port)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    try:
        for n in names:
            rows += one_model(folder, paths[n], n, f"127.0.0.1:{grpc_port}", args, profiles)
    finally:
        serve.shutdown()
        ray.shutdown()
    return {
        "benchmark": "ray_serve",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": cpus, "machine": platform.machine(), "ray": ray.__version__},
        "seconds": args.seconds,
        "clients": args.clients,
        "packed_clients": list(args.packed_clients),
        "serve_env": [f"{k}={v}" for k, v in env.items()],
        "nice": args.nice,
        "max_ongoing": args.max_ongoing,
        "router": ROUTER,
        "rows": rows,
        "proxy_profile": profiles,
        "summary": summary(rows, names, cpus),
    }


def _best(
    rows: list[dict[str, Any]], model: str, server: str, clients: int, replicas: int = 1
) -> dict[str, Any] | None:
    """The median round's numbers (by throughput) of one server, model, client count and
    replica count (None when not measured)."""
    key = (model, server, clients, replicas)
    got = sorted(
        (r for r in rows if (r["model"], r["server"], r["clients"], r["replicas"]) == key),
        key=lambda r: r["throughput"],
    )
    return got[len(got) // 2] if got else None


def paired(
    rows: list[dict[str, Any]], model: str, clients: int, replicas: int, server: str,
    value: Callable[[dict[str, Any]], float] = lambda r: r["throughput"],
) -> list[float]:  # fmt: skip
    """``server``'s ``value`` over plain Ray + ORT's in each round (measured one after the
    other, so under the same load of the host)."""
    ratios = []
    for k in sorted({r["round"] for r in rows}):
        got = {
            r["server"]: value(r)
            for r in rows
            if (r["model"], r["clients"], r["round"], r["replicas"])
            == (model, clients, k, replicas)
        }
        if server in got and "plain Ray + ORT" in got:
            ratios.append(got[server] / got["plain Ray + ORT"])
    return ratios


def per_cpu_second(row: dict[str, Any]) -> float:
    """Requests per CPU-second of the serving processes (the replicas, or the daemon)."""
    return 1e6 / row["server_cpu_us"] if row.get("server_cpu_us") else float("nan")


def summary(rows: list[dict[str, Any]], names: list[str], cpus: int) -> dict[str, Any]:
    """Per model, replica count and client count: each crossrt server's throughput over plain
    Ray + ORT's (the median of the rounds' paired ratios, each round's, and per CPU-second);
    the Ray hop's added p50; crossrt on Ray's scaling from one replica to the packed node."""
    out: dict[str, Any] = {}
    for n in names:
        found = sorted({(r["replicas"], r["clients"]) for r in rows if r["model"] == n})
        servers = sorted({r["server"] for r in rows if r["model"] == n and "on Ray" in r["server"]})
        ratios = {}
        for replicas, c in found:
            for server in servers:
                each = paired(rows, n, c, replicas, server)
                if each:
                    cpu = paired(rows, n, c, replicas, server, per_cpu_second)
                    ratios[f"{server} | {replicas} | {c}"] = {
                        "per_core": float(np.median(each)),
                        "rounds": each,
                        "per_cpu_second": float(np.median(cpu)),
                    }
        ray_1, serve_1 = _best(rows, n, "crossrt on Ray", 1), _best(rows, n, "crossrt serve", 1)
        out[n] = {"ratios": ratios}
        if ray_1 and serve_1:
            out[n]["ray_hop_added_p50_us"] = ray_1["p50_us"] - serve_1["p50_us"]
        for replicas, c in found:
            one, more = (
                _best(rows, n, "crossrt on Ray", c),
                _best(rows, n, "crossrt on Ray", c, replicas),
            )
            if replicas > 1 and one and more:
                out[n][f"scaling_1_to_{replicas}_at_{c}"] = more["throughput"] / one["throughput"]
    return out


def _row_line(r: dict[str, Any], cpus: int) -> str:
    cores = r["replicas"]  # one core each (crossrt serve: --cores one)
    node = f"{r['throughput'] / cpus:.1f}" if r["replicas"] == cpus else "-"
    proxy = r.get("proxy_cpu_us")
    return (
        f"| {r['model']} | {r['replicas']} | {r['server']} | {r['clients']} | {r['p50_us']:.0f} "
        f"| {r['p99_us']:.0f} | {r['throughput']:.1f} | {r['throughput'] / cores:.1f} | {node} "
        f"| {per_cpu_second(r):.1f} | {r['server_cpu_us']:.0f} "
        f"| {'-' if proxy is None else f'{proxy:.0f}'} "
        f"| {_maybe(r, 'client_cpu_us', '{:.0f}')} | {_maybe(r, 'host_idle', '{:.0%}')} |"
    )


def _maybe(row: dict[str, Any], key: str, form: str) -> str:
    """``row[key]`` in ``form``, or ``-`` in a row measured before it was."""
    return "-" if row.get(key) is None else form.format(row[key])


def markdown(report: dict[str, Any]) -> str:
    cpus = report["host"]["cpus"]
    names = list(dict.fromkeys(r["model"] for r in report["rows"]))
    loads = [r["load"] for r in report["rows"] if "load" in r]
    lines = [
        f"# crossrt on Ray Serve ({report['date']}, {cpus} CPUs, Ray {report['host']['ray']}; "
        "tritonclient gRPC; median round of each)",
        "",
        f"Load average of the host during the rounds: {min(loads):.1f}-{max(loads):.1f} (other "
        "work on it; the rounds alternate the servers, so each round's servers share the load)."
        + (
            f" Cluster environment (Serve's proxy switches): {', '.join(report['serve_env'])}."
            if report["serve_env"]
            else " Serve as shipped (no proxy switches)."
        )
        + (
            f" The benchmark's processes (cluster, servers, client) in scheduling groups at "
            f"autogroup nice {report['nice']}."
            if report.get("nice") is not None
            else ""
        )
        + f" crossrt's max_ongoing_requests: {report.get('max_ongoing', 32)} (plain: 32)."
        + f" crossrt's request router: {report.get('router', SERVE_ROUTER)}"
        + f" (plain: {SERVE_ROUTER}).",
        "",
        "Replicas: 1 = one replica of each Ray deployment (and `crossrt serve` on one core); "
        f"{cpus} = the packed node: as many replicas of each as the node's CPUs allow by their "
        "`num_cpus=1`. Per nominal core: req/s over the cores the replicas declare; per node "
        "core: req/s over the node's CPUs (packed rows); per CPU-second: requests per second of "
        "CPU the serving processes (all replicas, or the daemon) used. Proxy CPU: Serve's "
        "proxy process per request; client CPU: the benchmark's client threads per request; "
        "host idle: the share of the host's CPU time no process used during the row.",
        "",
        "| model | replicas | server | clients | p50 us | p99 us | req/s | per nominal core "
        "| per node core | per CPU-second | server CPU us/req | proxy CPU us/req "
        "| client CPU us/req | host idle |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    for n in names:
        for replicas, c in sorted(
            {(r["replicas"], r["clients"]) for r in report["rows"] if r["model"] == n}
        ):
            for server in dict.fromkeys(r["server"] for r in report["rows"]):
                r = _best(report["rows"], n, server, c, replicas)
                if r is not None:
                    lines.append(_row_line(r, cpus))
    lines += [
        "",
        "| model | server / plain Ray + ORT | replicas | clients | per core (median of rounds) "
        "| each round | per CPU-second |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for n in names:
        for key, ratio in report["summary"][n]["ratios"].items():
            server, replicas, c = key.split(" | ")
            rounds = ", ".join(f"{x:.2f}" for x in ratio["rounds"])
            lines.append(
                f"| {n} | {server} | {replicas} | {c} | {ratio['per_core']:.2f}x | {rounds} "
                f"| {ratio['per_cpu_second']:.2f}x |"
            )
    for n in names:
        s = report["summary"][n]
        if "ray_hop_added_p50_us" in s:
            lines.append(f"\n{n}: the Ray hop's added p50 (crossrt on Ray less crossrt serve, "
                         f"1 client): {s['ray_hop_added_p50_us']:.0f} us")  # fmt: skip
        for key, value in s.items():
            if key.startswith("scaling_"):
                lines.append(f"\n{n}: crossrt on Ray {key.replace('_', ' ')} clients: {value:.2f}x")
    for key, profile in report.get("proxy_profile", {}).items():
        if "error" in profile:
            lines.append(f"\nProxy profile, {key}: {profile['error']}")
            continue
        lines += [
            f"\nServe's proxy, {key}, {report['clients']} clients (py-spy, {profile['samples']} "
            "samples; inclusive share, own share):",
            "",
            "| function | inclusive | own |",
            "| --- | ---: | ---: |",
        ]
        lines += [f"| `{name}` | {share:.1%} | {mine:.1%} |"
                  for name, share, mine in profile["functions"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="tiny,resnet50")
    p.add_argument("--clients", type=int, default=4, help="client threads beside 1 (1 replica)")
    p.add_argument("--packed-clients", default="4,8",
                   help="client threads on the packed node ('' to skip it)")  # fmt: skip
    p.add_argument(
        "--drivers", default="",
        help="crossrt engines beside the default, in the same replicas (openvino)",
    )  # fmt: skip
    p.add_argument(
        "--serve-env", action="append", default=[], metavar="KEY=VALUE",
        help="an environment variable of the cluster (Serve's proxy, replicas)",
    )  # fmt: skip
    p.add_argument(
        "--serve-defaults",
        action="store_true",
        help="Serve as shipped: without crossrt's proxy switches (app.SERVE_ENV)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="the servers' and client's autogroup nice (root; e.g. -15 on a shared host)",
    )
    p.add_argument(
        "--profile-proxy",
        action="store_true",
        help="py-spy on Serve's proxy under each Ray deployment (--clients, --seconds)",
    )
    p.add_argument(
        "--max-ongoing",
        type=int,
        default=32,
        help="crossrt's deployments' max_ongoing_requests (Scaling; the plain one keeps 32)",
    )
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "ray_serve.json")
    args = p.parse_args(argv)
    args.packed_clients = tuple(int(c) for c in args.packed_clients.split(",") if c)
    args.drivers = [d for d in args.drivers.split(",") if d]
    report = run_all([n for n in args.models.split(",") if n], args)
    reporting.save(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
