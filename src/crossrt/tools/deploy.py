"""``crossrt deploy``: serve models on a fleet through the serving system that runs it
(docs/scale-out.md). ``crossrt deploy ray REPO_OR_CRM --replicas N|auto
--cores-per-replica K [--address ADDR]`` deploys crossrt on Ray Serve: on the cluster at
ADDR (it goes on serving after this command ends), or on a local cluster this command starts
and keeps until SIGINT or SIGTERM.

Exit status 0 once deployed (or, on a local cluster, after a signal), 1 when the deployment
fails, 2 for bad options.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CrossrtError, InvalidOptionError
from .common import fail, say

READY_SECONDS = 300.0
"""How long ``serve.run`` may take to bring every replica up."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt deploy",
        description="Deploy crossrt on a serving system that scales out. 'ray': a Ray Serve "
        "application whose replicas are crossrt runtimes with exclusive pinned cores, "
        "speaking KServe v2 over Serve's gRPC proxy (tritonclient, perf_analyzer) and HTTP "
        "(crossrt serve --http's routes).",
    )
    p.add_argument("system", choices=("ray",), help="the serving system")
    p.add_argument(
        "source",
        metavar="REPO_OR_CRM",
        help="a .crm (or .onnx) file, served under its name without the suffix, or a model "
        "repository folder; every node that runs a replica must read it at this path",
    )
    p.add_argument(
        "--replicas", default="1", metavar="N|auto",
        help="replicas (default 1); auto: between --min-replicas and --max-replicas on "
        "crossrt's requests in flight (--target-in-flight per replica)",
    )  # fmt: skip
    p.add_argument("--cores-per-replica", type=int, default=1, metavar="K",
                   help="host CPUs each replica reserves for itself (default 1)")  # fmt: skip
    p.add_argument(
        "--address", metavar="ADDR",
        help="the Ray cluster (ray://host:10001, host:6379, or auto); default: start a local "
        "one and serve until SIGINT or SIGTERM",
    )  # fmt: skip
    p.add_argument("--name", default="crossrt", help="the Serve application's name")
    p.add_argument("--route-prefix", default="/", help="its HTTP route prefix (default /)")
    p.add_argument("--http", default="127.0.0.1:8000", metavar="HOST:PORT",
                   help="Serve's HTTP proxy (default 127.0.0.1:8000)")  # fmt: skip
    p.add_argument("--grpc-port", type=int, default=9000, metavar="PORT",
                   help="Serve's gRPC proxy, KServe v2 (default 9000)")  # fmt: skip
    p.add_argument("--min-replicas", type=int, default=1, metavar="N")
    p.add_argument("--max-replicas", type=int, default=4, metavar="N")
    p.add_argument("--target-in-flight", type=float, default=2.0, metavar="N")
    p.add_argument("--upscale-delay", type=float, default=5.0, metavar="S")
    p.add_argument("--downscale-delay", type=float, default=60.0, metavar="S")
    p.add_argument(
        "--max-models", type=int, default=0, metavar="N",
        help="multiplex: load models on demand, at most N per replica (least recently used "
        "unloaded first); 0 (default): load every model in every replica",
    )  # fmt: skip
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="instances of each model in a replica")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=0, metavar="N",
                   help="dynamic batching inside each replica (0: off)")  # fmt: skip
    p.add_argument("--batch-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--response-cache-bytes", type=int, default=0, metavar="N",
                   help="each replica's response cache (0: none)")  # fmt: skip
    p.add_argument("--drain", type=float, default=30.0, metavar="S",
                   help="seconds a replica going away has for its requests")  # fmt: skip
    return p


def options(args: argparse.Namespace) -> tuple[Any, Any, tuple[str, int]]:
    """The replicas' configuration, the scaling, and the HTTP address the arguments ask.

    Raises:
        InvalidOptionError: a value out of range, or a source that does not exist.
    """
    from ..scaleout.ray import ReplicaConfig, Scaling

    if args.replicas != "auto" and not (args.replicas.isdigit() and int(args.replicas) >= 1):
        raise InvalidOptionError(f"--replicas {args.replicas!r}: give a count >= 1, or auto")
    for flag, value in (
        ("--cores-per-replica", args.cores_per_replica),
        ("--min-replicas", args.min_replicas),
        ("--max-replicas", args.max_replicas),
        ("--instances", args.instances),
    ):
        if value < 1:
            raise InvalidOptionError(f"{flag} {value}: give a whole number >= 1")
    if args.min_replicas > args.max_replicas:
        raise InvalidOptionError("--min-replicas is over --max-replicas")
    source = Path(args.source)
    if not source.exists():
        raise InvalidOptionError(
            f"{source}: no such model file or repository folder; give a .crm file (crossrt "
            "compile writes one) or a folder of them"
        )
    host, _, port = args.http.rpartition(":")
    if not port.isdigit():
        raise InvalidOptionError(f"--http {args.http!r}: give HOST:PORT")
    load: dict[str, Any] = {"instances": args.instances}
    if args.max_batch_size:
        load.update(max_batch_size=args.max_batch_size, batch_delay=args.batch_delay)
    if args.response_cache_bytes:
        load["response_cache"] = True
    config = ReplicaConfig(
        str(source.resolve()),
        cores=args.cores_per_replica,
        load=load,
        max_models=args.max_models,
        response_cache_bytes=args.response_cache_bytes,
    )
    scaling = Scaling(
        replicas=args.replicas if args.replicas == "auto" else int(args.replicas),
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_in_flight=args.target_in_flight,
        upscale_delay_s=args.upscale_delay,
        downscale_delay_s=args.downscale_delay,
        graceful_shutdown_timeout_s=args.drain,
    )
    return config, scaling, (host or "127.0.0.1", int(port))


LOCAL_NODE_ADDRESS = "127.0.0.2"
"""The address of the local cluster's node: loopback, so that the cluster's own traffic stays
on this host. Not 127.0.0.1, which Ray 2.60 rewrites to the host's routable address before a
driver connects (docs/scale-out.md)."""


def start_local_cluster(ray: Any) -> None:
    """A Ray cluster of this command's own, its node on loopback, with Serve's proxy switches
    (:data:`crossrt.scaleout.ray.app.SERVE_ENV`) in the environment its processes inherit."""
    from ..scaleout.ray.app import serve_env

    # "local": a cluster of its own, even where RAY_ADDRESS names one (ray.init sets it for
    # its children). Without Ray's dashboard: its head starts some ten Python processes at
    # once, which on a busy 2-core host held up the cluster's start for minutes (workers
    # that did not register in time); `ray start --head` and --address give a cluster with one.
    with serve_env():
        ray.init(
            address="local",
            _node_ip_address=LOCAL_NODE_ADDRESS,
            include_dashboard=False,
            log_to_driver=False,
        )
    gcs = ray.get_runtime_context().gcs_address
    say(f"local Ray cluster: node {LOCAL_NODE_ADDRESS}, GCS {gcs}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``crossrt deploy``."""
    args = parser().parse_args(argv)
    try:
        config, scaling, http = options(args)
    except CrossrtError as exc:
        fail("deploy", exc)
        return 2
    try:
        import ray
    except ImportError:
        say(
            "crossrt deploy: error: Ray is not installed; pip install 'crossrt[ray]'",
            file=sys.stderr,
        )
        return 1
    from ..scaleout.ray import deploy

    local = args.address is None
    if local:
        start_local_cluster(ray)
    else:
        ray.init(address=args.address, log_to_driver=False)
    try:
        handle = deploy(
            config,
            scaling,
            name=args.name,
            http=http,
            grpc_port=args.grpc_port,
            route_prefix=args.route_prefix,
        )
        placement = handle.options(method_name="placement").remote().result(timeout_s=READY_SECONDS)
    except Exception as exc:  # Serve's own errors: the replica's failure is in its message
        say(f"crossrt deploy: error: the deployment failed: {exc}", file=sys.stderr)
        ray.shutdown()
        return 1
    prefix = args.route_prefix.rstrip("/")
    say(
        f"deployed {args.name}: {scaling.replicas} replica(s) of {config.cores} core(s), "
        f"models {', '.join(placement['models']) or '(on demand)'}",
        f"  KServe v2 gRPC: {http[0]}:{args.grpc_port} (header application={args.name} when "
        "the cluster has other applications)",
        f"  HTTP: http://{http[0]}:{http[1]}{prefix}/v2",
    )
    if not local:
        ray.shutdown()  # the application goes on serving in the cluster
        return 0
    say("serving on a local Ray cluster until SIGINT or SIGTERM")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    from ray import serve

    serve.shutdown()  # type: ignore[no-untyped-call]  # the drain: each replica finishes what it holds
    ray.shutdown()
    return 0
