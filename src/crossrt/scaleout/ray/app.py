"""The crossrt application on Ray Serve: its deployment options, and deploying it on a
cluster (``crossrt deploy ray``, docs/scale-out.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .autoscale import POLICY
from .protos import SERVICER
from .replica import Replica, ReplicaConfig

ROUTER = "crossrt.scaleout.ray.router:FewestInFlight"
"""The deployments' request router (:mod:`.router`, which imports Ray: named, not imported)."""

REPLICA_ENV = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
"""The replicas' environment: the replica's methods run on Serve's own event loop rather
than on a second loop in a thread of its own, which cost every request two hops between the
loops. A replica never blocks its loop for longer than a model of a few microseconds
(:mod:`.inline`); anything longer runs on its request threads."""

SERVE_ENV = {
    "RAY_SERVE_PROXY_USE_GRPC": "1",
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
}
"""Serve's switches for its proxies, which every request crosses: the proxy sends a request to
its replica over Serve's gRPC transport rather than as a Ray actor call, and buffers its
request logs rather than writing each line to a file and to stderr. On a tiny model they cut
the proxy's CPU per request and raised the throughput of every deployment behind it
(docs/scale-out.md, "Throughput on Ray"). Over the gRPC transport a replica's queue length
reaches the proxy only when a request ends, so Serve's own router misjudges the replicas;
crossrt's deployments route with :data:`ROUTER`, which counts requests itself. And Serve's
controller gives a starting proxy 60 s to say it is ready, not 5: on a busy 2-core host a
proxy took longer, the controller killed it, and ``serve.start`` failed with it. Serve's
processes read them from their environment, so they must be set where the cluster starts:
``crossrt deploy ray`` sets them for the local cluster it starts (:func:`serve_env`); on a
cluster of your own, set them in the environment of ``ray start`` on every node. (Left
out: ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``, which would save the proxy a hop between
event loops too, but in every other process of the cluster breaks a handle called outside
an event loop: a Ray task's ``RayModel.run``. And ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` does
not switch the proxy to gRPC in Ray 2.60: the setting is derived before that flag is
read.)"""


@contextmanager
def serve_env() -> Iterator[None]:
    """Within: :data:`SERVE_ENV` in this process's environment (where it does not set a
    variable already: an operator's choice wins), for the processes of a cluster started
    then, which inherit it. After: the environment as before, since in a driver the same
    switches change its own handles (one whose router runs on the caller's event loop cannot
    be called outside one)."""
    before = {key: os.environ.get(key) for key in SERVE_ENV}
    os.environ.update({key: os.environ.get(key, value) for key, value in SERVE_ENV.items()})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class Scaling:
    """How many replicas, and how they come and go.

    Attributes:
        replicas: a fixed count, or ``"auto"``: between ``min_replicas`` and
            ``max_replicas`` on crossrt's in-flight counts (:mod:`.autoscale`).
        target_in_flight: with ``auto``, requests in flight one replica should hold.
        upscale_delay_s, downscale_delay_s: how long the wish for more (fewer) replicas
            must last before Serve acts on it.
        max_ongoing_requests: requests Serve's router sends one replica at once.
        graceful_shutdown_timeout_s: how long a replica going away has to finish the
            requests it holds (the drain).
        health_check_period_s: how often Serve asks each replica whether its models are
            ready.
    """

    replicas: int | str = 1
    min_replicas: int = 1
    max_replicas: int = 4
    target_in_flight: float = 2.0
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0
    max_ongoing_requests: int = 32
    graceful_shutdown_timeout_s: float = 30.0
    health_check_period_s: float = 5.0


def application(config: ReplicaConfig, scaling: Scaling = Scaling(), name: str = "crossrt") -> Any:
    """The Serve application: the :class:`Replica` deployment bound to ``config``."""
    from ray import serve

    options: dict[str, Any] = {
        "name": name,
        # Accounting only (Ray neither pins nor confines a replica): the cores are the
        # replica's own through crossrt's reservation.
        "ray_actor_options": {"num_cpus": config.cores or 1, "runtime_env": REPLICA_ENV},
        # crossrt counts every request itself (statistics, metrics); Serve's access log
        # line per request was a formatted record and a file write in the replica
        "logging_config": {"enable_access_log": False},
        "max_ongoing_requests": scaling.max_ongoing_requests,
        # each request to the replica holding the fewest in flight (router.py: Serve's own
        # router leaves pinned replicas idle over its gRPC transport)
        "request_router_config": {"request_router_class": ROUTER},
        "graceful_shutdown_timeout_s": scaling.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.1,
        "health_check_period_s": scaling.health_check_period_s,
    }
    if scaling.replicas == "auto":
        options["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "upscale_delay_s": scaling.upscale_delay_s,
            "downscale_delay_s": scaling.downscale_delay_s,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 2.0,
            "policy": {
                "policy_function": POLICY,
                "policy_kwargs": {"target": scaling.target_in_flight},
            },
        }
    else:
        options["num_replicas"] = int(scaling.replicas)
    make: Any = serve.deployment  # typed for its decorator forms only
    return make(Replica, **options).bind(config)


def build(args: dict[str, Any]) -> Any:
    """The application from a Serve config file's ``args`` (``import_path:
    crossrt.scaleout.ray.app:build``, as KubeRay's ``serveConfigV2`` gives it): ``source``,
    and optionally ``cores``, ``load``, ``max_models``, ``response_cache_bytes``, ``name``
    and :class:`Scaling`'s fields (``replicas``, ``max_replicas``, ...).

    Raises:
        InvalidOptionError: an argument neither names.
    """
    from ...errors import InvalidOptionError

    given = dict(args)
    name = str(given.pop("name", "crossrt"))
    replica_fields = {"source", "cores", "load", "max_models", "response_cache_bytes", "threads"}
    scaling_fields = set(Scaling.__dataclass_fields__)
    unknown = set(given) - replica_fields - scaling_fields
    if unknown or "source" not in given:
        known = sorted((replica_fields | scaling_fields) - {"source"})
        raise InvalidOptionError(
            f"crossrt application args: unknown {sorted(unknown)}; give source (a .crm or a "
            f"repository folder) and any of {known}"
        )
    config = ReplicaConfig(**{k: v for k, v in given.items() if k in replica_fields})
    scaling = Scaling(**{k: v for k, v in given.items() if k in scaling_fields})
    return application(config, scaling, name)


def start_serve(http: tuple[str, int] | None, grpc_port: int | None) -> None:
    """Start Serve's proxies on this cluster: HTTP on ``http`` and KServe v2 gRPC on
    ``grpc_port`` (tritonclient and perf_analyzer talk to it unchanged)."""
    from ray.serve.config import HTTPOptions, gRPCOptions

    from ray import serve

    kwargs: dict[str, Any] = {}
    if http is not None:
        kwargs["http_options"] = HTTPOptions(host=http[0], port=http[1])
    if grpc_port is not None:
        kwargs["grpc_options"] = gRPCOptions(port=grpc_port, grpc_servicer_functions=[SERVICER])
    serve.start(**kwargs)


def deploy(
    config: ReplicaConfig,
    scaling: Scaling = Scaling(),
    *,
    name: str = "crossrt",
    http: tuple[str, int] | None = ("127.0.0.1", 8000),
    grpc_port: int | None = 9000,
    route_prefix: str = "/",
) -> Any:
    """Deploy crossrt on the Ray cluster this process is connected to (``ray.init``); the
    application's ``DeploymentHandle`` once every replica is ready."""
    from ray import serve

    start_serve(http, grpc_port)
    return serve.run(application(config, scaling, name), name=name, route_prefix=route_prefix)
