"""``crossrt serve``: the runtime daemon, speaking KServe v2 gRPC (docs/daemon.md).

Logs to syslog (``/dev/log``) unless ``-x`` sends them to the console (or there is no
syslog, then stderr). Exit status 0 after a SIGTERM, 1 when it cannot start, 2 for bad
options."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import CrossrtError
from .common import fail


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt serve",
        description="Serve models over gRPC (KServe v2 inference protocol, with Triton's "
        "model repository, statistics and system shared-memory extensions), so tritonclient "
        "works unchanged, and with --http over HTTP/REST too. Default endpoint: crossrt.sock "
        "in the runtime directory. SIGTERM drains and stops; SIGHUP rescans the model "
        "repository. As a KServe runtime: crossrt serve --kserve --model NAME=/mnt/models.",
    )
    # Added group by group, in the order --help lists them.
    _add_daemon(p)
    _add_repository(p)
    _add_serving_runtime(p)
    _add_listeners(p)
    _add_limits(p)
    _add_security(p)
    return p


def _add_daemon(p: argparse.ArgumentParser) -> None:
    """Where the daemon listens, its config file, its logs and its CPUs."""
    p.add_argument(
        "-g", dest="endpoint", action="append", metavar="ENDPOINT",
        help="listen here: unix:/path (or /path) for a Unix socket in place of the default "
        "one, HOST:PORT for TCP besides it (PORT or :PORT: 127.0.0.1); repeat for several",
    )  # fmt: skip
    p.add_argument(
        "-c", "--config-file", dest="config", metavar="CONFIG.toml", help="config file (TOML)"
    )
    p.add_argument(
        "-l", dest="log_level", metavar="LEVEL",
        help="log level: critical, error, warning, info (default), debug, trace, or 0-7",
    )  # fmt: skip
    p.add_argument("-x", dest="console", action="store_true", default=None,
                   help="log to the console instead of syslog")  # fmt: skip
    p.add_argument("--cores", metavar="LIST", help="reserve these host CPUs ('0-3', '4,5')")


def _add_repository(p: argparse.ArgumentParser) -> None:
    """The models served: a model repository, and models named on the command line."""
    p.add_argument(
        "--model-repository",
        metavar="DIR",
        help="serve DIR/NAME/VERSION/model.{crm,onnx} and DIR/NAME.{crm,onnx}",
    )
    p.add_argument(
        "--model-control", choices=("none", "explicit"),
        help="none (default): load every model of the repository at start; explicit: only "
        "those RepositoryModelLoad asks for",
    )  # fmt: skip
    p.add_argument(
        "--load-model", action="append", metavar="NAME",
        help="with --model-control explicit, load this repository model at start (repeat "
        "for several; '*': every one), as Triton's --load-model",
    )  # fmt: skip
    p.add_argument(
        "--model", action="append", metavar="NAME=PATH",
        help="serve the model at PATH under NAME, loaded at start (repeat for several): a "
        ".crm or .onnx file, or a folder holding one as KServe downloads it to /mnt/models "
        "(or VERSION/model.onnx, or NAME/VERSION/model.onnx). Ready only when every one is "
        "loaded; one that cannot be loaded stops the daemon (exit status 1)",
    )  # fmt: skip
    p.add_argument(
        "--load-parameter", action="append", metavar="KEY=VALUE",
        help="load every --model with this load parameter (repeat for several): instances, "
        "cores, queue_depth, timeout, precision, max_batch_size, batch_delay, "
        "response_cache, device; e.g. instances=2, max_batch_size=8",
    )  # fmt: skip


def _add_serving_runtime(p: argparse.ArgumentParser) -> None:
    """Running as a KServe runtime, what the daemon's calls mean, and how it stops."""
    p.add_argument(
        "--kserve", action="store_true", default=None,
        help="run as a KServe serving runtime: where not set otherwise, HTTP/REST on "
        "0.0.0.0:8080, gRPC on 0.0.0.0:8081 (the h2c port), metrics on 0.0.0.0:8082, logs on "
        "stderr, and a 20 s drain on SIGTERM (Kubernetes' grace period is 30 s)",
    )  # fmt: skip
    p.add_argument(
        "--semantics", choices=("crossrt", "neuron-rtd"),
        help="what crossrt.v1's core groups, load modes and status codes mean: crossrt's "
        "(default), or neuron-rtd's (seed 003): a load without a group holds its cores "
        "alone, a group smaller than the model runs one request at a time, a second model "
        "started on a busy group gets EXEC_NC_BUSY (1005)",
    )  # fmt: skip
    p.add_argument(
        "--drain-seconds", type=float, metavar="S",
        help="on SIGTERM, the seconds the calls under way get to finish before the daemon "
        "cuts them and exits (default 30; --kserve: 20)",
    )  # fmt: skip


def _add_listeners(p: argparse.ArgumentParser) -> None:
    """The Prometheus metrics and HTTP/REST endpoints served besides gRPC."""
    p.add_argument(
        "--metrics", metavar="HOST:PORT",
        help="serve Prometheus metrics here (PORT or :PORT: 127.0.0.1)",
    )  # fmt: skip
    p.add_argument(
        "--http", metavar="HOST:PORT",
        help="serve KServe v2 HTTP/REST here too (health, metadata, config, infer, "
        "statistics, repository, shared memory; PORT or :PORT: 127.0.0.1)",
    )  # fmt: skip


def _add_limits(p: argparse.ArgumentParser) -> None:
    """Connection, size and time limits, and the response cache's budget."""
    p.add_argument(
        "--max-connections", type=int, metavar="N",
        help="connections a Unix socket keeps open at once (default 1024); one more is "
        "refused, and logged",
    )  # fmt: skip
    p.add_argument(
        "--user-connections", type=int, metavar="N",
        help="connections one user (but root and the daemon's own) may hold open on a Unix "
        "socket (default half of --max-connections)",
    )  # fmt: skip
    p.add_argument(
        "--idle-timeout", type=float, metavar="S",
        help="close a Unix-socket connection idle this many seconds, with no call under way "
        "(default 300; 0: never)",
    )  # fmt: skip
    p.add_argument(
        "--response-cache-bytes", type=int, metavar="N",
        help="keep up to N bytes of answers for the models loaded with response_cache "
        "(default 0: no response cache)",
    )  # fmt: skip
    for flag, what in (
        (
            "--max-message-bytes",
            "the largest request: gRPC message, lane frame, HTTP body (default 256 MiB)",
        ),
        ("--max-json-bytes", "the largest JSON part of an HTTP request (default 32 MiB)"),
        ("--max-region-bytes", "the largest shared-memory region (default 1 GiB)"),
        (
            "--max-posted-bytes",
            "the bytes a client process may hold posted with InferPost "
            "and not waited for (default 256 MiB)",
        ),
        ("--http-connections", "HTTP connections served at once (default 64)"),
    ):
        p.add_argument(flag, type=int, metavar="N", help=what)
    p.add_argument(
        "--http-timeout", type=float, metavar="S",
        help="the time an HTTP client has to send a request's headers, and may stay idle "
        "between requests (default 30)",
    )  # fmt: skip


def _add_security(p: argparse.ArgumentParser) -> None:
    """Bearer tokens: one for every call, or one per user with a role."""
    p.add_argument(
        "--token", metavar="T",
        help="require the metadata 'authorization: Bearer T' on every call (or set "
        "CROSSRT_SERVE_TOKEN, which keeps it out of the process list)",
    )  # fmt: skip
    p.add_argument(
        "--tokens", metavar="FILE",
        help="per-user tokens (TOML: [[tokens]] token, user, role), readable by the daemon's "
        "user only: a TCP or HTTP client sending one is that user, with that role",
    )  # fmt: skip


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (``None``: not given), as :func:`build` takes
    them over the config file's."""
    return {
        "endpoint": tuple(args.endpoint or ()),
        "log_level": args.log_level,
        "console": args.console,
        "cores": args.cores,
        "model_repository": args.model_repository,
        "model_control": args.model_control,
        "load_model": tuple(args.load_model or ()),
        "model": tuple(args.model or ()),
        "load_parameter": tuple(args.load_parameter or ()),
        "kserve": args.kserve,
        "drain_seconds": args.drain_seconds,
        "semantics": args.semantics,
        "metrics": args.metrics,
        "http": args.http,
        "max_connections": args.max_connections,
        "user_connections": args.user_connections,
        "idle_timeout": args.idle_timeout,
        "tokens": args.tokens,
        "response_cache_bytes": args.response_cache_bytes,
        "max_message_bytes": args.max_message_bytes,
        "max_json_bytes": args.max_json_bytes,
        "max_region_bytes": args.max_region_bytes,
        "max_posted_bytes": args.max_posted_bytes,
        "http_connections": args.http_connections,
        "http_timeout": args.http_timeout,
        "token": args.token or os.environ.get("CROSSRT_SERVE_TOKEN") or None,
    }


def configure_logging(level: int, console: bool) -> logging.Handler:
    """A console or syslog handler on the ``crossrt`` logger (returned, to remove)."""
    logger = logging.getLogger("crossrt")
    logger.setLevel(level)
    handler: logging.Handler
    if not console and os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler("/dev/log")
        handler.setFormatter(logging.Formatter("crossrt-serve[%(process)d]: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s crossrt serve %(levelname)s %(message)s")
        )
    logger.addHandler(handler)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon until SIGTERM."""
    args = parser().parse_args(argv)
    try:
        from ..server.daemon import Daemon
        from ..server.settings import build
    except ImportError as exc:
        print(
            f"crossrt serve: error: {exc}; install the serve extra: pip install 'crossrt[serve]'",
            file=sys.stderr,
        )
        return 1
    try:
        options = build(args.config, given(args))
    except CrossrtError as exc:
        return fail("serve", exc)
    handler = configure_logging(options.level, options.console)
    try:
        return serve(Daemon, options)
    finally:
        logging.getLogger("crossrt").removeHandler(handler)


def serve(make: Any, options: Any) -> int:
    """Start a daemon, serve until SIGTERM, stop it; the exit status."""
    log = logging.getLogger("crossrt.serve")
    try:
        daemon = make(options)
    except CrossrtError as exc:
        log.error("cannot start: %s", exc)
        return fail("serve", exc)
    daemon.install_signals()
    try:
        daemon.start()
        daemon.wait()
    except CrossrtError as exc:
        log.error("cannot serve: %s", exc)
        return fail("serve", exc)
    finally:
        daemon.stop()
    return 0
