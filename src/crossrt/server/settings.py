"""The daemon's settings: the config file (TOML) and the command line, checked in one place.

Every command-line option has a key of the same name in the file (``model_repository``,
``model_control``, ``load_model``, ``model``, ``load_parameter``, ``kserve``, ``metrics``,
``token``, ``tokens``, ``cores``, ``log_level``, ``console``, ``endpoint``,
``max_connections``, ``user_connections``, ``idle_timeout``, the bounds of :data:`BOUNDS`,
``http_timeout``, ``drain_seconds`` and ``semantics``), plus
``threads``, ``socket_mode``, ``profile_dir``,
``tls_cert`` / ``tls_key`` / ``tls_client_ca`` (PEM files: TLS on the TCP endpoints, client
certificates required when a CA is given) and ``[[models]]`` tables (``name``, ``path`` and
the load parameters) loaded at start. The command line wins; ``kserve`` (``--kserve``) fills
in :data:`KSERVE` for the keys neither gives.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..config import settings
from ..errors import InvalidOptionError
from ..runtime.cores.reservation import runtime_directory
from .model_path import model_name, parse_model
from .repository import Entry, LoadOptions

LOG_LEVELS = {
    "critical": 50, "error": 40, "warning": 30, "info": 20, "debug": 10, "trace": 5,
    # neuron-rtd's -l numbers (syslog levels): 6 debug, 7 trace
    "0": 50, "1": 50, "2": 50, "3": 40, "4": 30, "5": 20, "6": 10, "7": 5,
}  # fmt: skip


MiB = 2**20

BOUNDS = {
    "max_message_bytes": "the largest request a client may send: a gRPC message, a lane "
    "frame, an HTTP body",
    "max_json_bytes": "the largest JSON part of an HTTP request",
    "max_region_bytes": "the largest shared-memory region a client may register",
    "max_posted_bytes": "the bytes of requests and answers a client process may hold posted "
    "(InferPost) and not waited for",
    "http_connections": "HTTP connections served at once",
}
"""The daemon's bounds on what one request or client may cost (docs/daemon.md, "Bounds")."""

KSERVE = {
    "http": "0.0.0.0:8080",
    "endpoint": ("0.0.0.0:8081",),
    "metrics": "0.0.0.0:8082",
    "console": True,
    "drain_seconds": 20.0,
}
"""What ``--kserve`` sets where neither the command line nor the config file does: the ports
a KServe ServingRuntime declares (HTTP 8080, gRPC 8081 as its ``h2c`` port, Prometheus 8082),
logs on stderr (a container has no syslog), and a drain that ends inside Kubernetes' default
grace period of 30 s with time left to unload (deploy/kserve/, docs/scale-out.md)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon listens: a Unix socket path, or a TCP host and port."""

    kind: str  # "unix" or "tcp"
    address: str  # the path, or host:port as gRPC takes it

    def __str__(self) -> str:
        return f"unix:{self.address}" if self.kind == "unix" else self.address


def parse_endpoint(text: str) -> Endpoint:
    """``unix:/path``, ``unix:///path`` (tritonclient's spelling), ``/path``: a Unix socket;
    else a TCP address as :func:`tcp_address` reads it."""
    text = text.strip()
    if text.startswith("unix:") or text.startswith(("/", "./", "../")):
        path = text.removeprefix("unix://") if text.startswith("unix://") else text
        path = path.removeprefix("unix:")
        if not path:
            raise InvalidOptionError("-g unix: needs a path: -g unix:/run/crossrt/crossrt.sock")
        return Endpoint("unix", str(Path(path).absolute()))
    return Endpoint("tcp", tcp_address(text, "endpoint"))


def tcp_address(text: str, option: str) -> str:
    """The one form of every TCP option (``-g``, ``--http``, ``--metrics``): ``HOST:PORT``,
    ``[::1]:PORT``, or ``PORT`` / ``:PORT`` for 127.0.0.1 (loopback unless an address is
    named); returned as ``HOST:PORT`` (``[HOST]:PORT`` for IPv6).

    Raises:
        InvalidOptionError: neither a port nor an IP address and port.
    """
    text = str(text).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or int(port) > 65535:
        raise InvalidOptionError(
            f"{option} {text!r}: give HOST:PORT, :PORT or PORT (127.0.0.1)"
            + (", or a socket path (unix:/path)" if option == "endpoint" else "")
        )
    host = host.strip("[]") or "127.0.0.1"
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidOptionError(
                f"{option} {text!r}: {host!r} is not an IP address; give one (0.0.0.0 for "
                "every interface, 127.0.0.1 for this host only)"
            ) from None
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{int(port)}"


def default_endpoint() -> Endpoint:
    """``crossrt.sock`` in the runtime directory (``CROSSRT_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/crossrt``, ``/run/crossrt`` for root, ``/tmp/crossrt-<uid>``, or
    ``~/.cache/crossrt/run`` when another user made that one first)."""
    config = settings()
    folder = runtime_directory(Path(config.runtime_dir), config.runtime_dir_is_default)
    return Endpoint("unix", str(folder / "crossrt.sock"))


def default_profile_dir() -> Path:
    """``profiles`` in the runtime directory (beside the default socket)."""
    return Path(default_endpoint().address).parent / "profiles"


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``crossrt serve`` is told."""

    endpoint: tuple[str, ...] = ()
    log_level: str = "info"
    console: bool = False
    cores: str | None = None
    model_repository: str | None = None
    model_control: str = "none"
    load_model: tuple[str, ...] = ()
    """Under explicit model control, the repository's models loaded at start (Triton's
    ``--load-model``; ``*``: every one)."""
    model: tuple[str, ...] = ()
    """``NAME=PATH`` of each model served under NAME (``--model``): loaded at start, and the
    daemon is ready only while every one is loaded (:mod:`.model_path` reads PATH)."""
    load_parameter: tuple[str, ...] = ()
    """``KEY=VALUE`` load parameters of every ``--model`` model (``instances=2``)."""
    kserve: bool = False
    """The :data:`KSERVE` preset was asked for."""
    metrics: str | None = None
    http: str | None = None
    token: str | None = None
    tokens: str | None = None
    """The per-user tokens file (:mod:`.tokens`)."""
    drain_seconds: float = 30.0
    threads: int = 16
    max_connections: int = 1024
    user_connections: int = 0
    """Connections one user (but the operator) may hold on a Unix socket; 0: half of
    ``max_connections`` (see :attr:`user_share`)."""
    idle_timeout: float = 300.0
    """Seconds a Unix-socket connection may stay idle (no bytes, no call under way) before
    the daemon closes it; 0: never."""
    response_cache_bytes: int = 0
    max_message_bytes: int = 256 * MiB
    max_json_bytes: int = 32 * MiB
    max_region_bytes: int = 1024 * MiB
    max_posted_bytes: int = 256 * MiB
    http_connections: int = 64
    http_timeout: float = 30.0
    socket_mode: int = 0o660
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    models: tuple[Entry, ...] = field(default_factory=tuple)
    semantics: str = "crossrt"
    """What crossrt.v1's core groups, load modes and codes mean: ``crossrt`` (its own), or
    ``neuron-rtd`` (seed 003's: :data:`SEMANTICS`, docs/daemon.md)."""
    profile_dir: str | None = None
    """Where the profiles of loads with ``enable_tracing`` / ``enable_node_profiling`` are
    written; default ``profiles`` in the runtime directory (:func:`default_profile_dir`)."""

    def endpoints(self) -> list[Endpoint]:
        """The endpoints: those named, and the default Unix socket unless one of them is a
        Unix socket (TCP endpoints are added to it, as docs/cli.md says)."""
        named = [parse_endpoint(e) for e in self.endpoint]
        if any(e.kind == "unix" for e in named):
            return named
        return [default_endpoint(), *named]

    @property
    def named(self) -> list[str]:
        """The names of the ``--model`` models, in their order."""
        return [model_name(text) for text in self.model]

    @property
    def user_share(self) -> int:
        """The connections one user may hold: ``user_connections``, else half of
        ``max_connections`` (at least 1)."""
        return self.user_connections or max(1, self.max_connections // 2)

    @property
    def level(self) -> int:
        """The ``logging`` level."""
        return LOG_LEVELS[self.log_level.lower()]


SEMANTICS = {
    "crossrt": "crossrt's: implicit core groups share cores, multi-node models pipelined",
    "neuron-rtd": "neuron-rtd's (seed 003): implicit core groups hold their cores alone, "
    "shared NC mode runs one request at a time, EXEC_NC_BUSY on a busy group",
}
"""The meanings crossrt.v1 may be served with (``--semantics``)."""


def build(file: str | None, given: Mapping[str, Any]) -> ServeOptions:
    """Options from the config ``file`` (if any), overridden by the command line's
    ``given`` values (those not ``None``)."""
    values: dict[str, Any] = {}
    if file is not None:
        try:
            with open(file, "rb") as f:
                values = tomllib.load(f)
        except OSError as exc:
            raise InvalidOptionError(f"cannot read config file {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidOptionError(f"config file {file} is not valid TOML: {exc}") from None
    values = {k.replace("-", "_"): v for k, v in values.items()}
    values.update({k: v for k, v in given.items() if v is not None and v != ()})
    if values.get("kserve"):
        for key, value in KSERVE.items():
            values.setdefault(key, value)
    known = {f.name for f in fields(ServeOptions)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidOptionError(
            f"unknown setting(s) {unknown} in {file or 'the options'}; known: {sorted(known)}"
        )
    if isinstance(values.get("load_model"), str):
        values["load_model"] = (values["load_model"],)
    values["load_model"] = tuple(values.get("load_model", ()))
    if isinstance(values.get("endpoint"), str):
        values["endpoint"] = (values["endpoint"],)
    values["endpoint"] = tuple(values.get("endpoint", ()))
    if isinstance(values.get("model"), str):
        values["model"] = (values["model"],)
    values["model"] = tuple(str(m) for m in values.get("model", ()))
    values["models"] = tuple(_model(m, file) for m in values.get("models", ()))
    if isinstance(values.get("load_parameter"), str):
        values["load_parameter"] = (values["load_parameter"],)
    values["load_parameter"] = tuple(str(p) for p in values.get("load_parameter", ()))
    if values["load_parameter"] and not values["model"]:
        raise InvalidOptionError(
            "--load-parameter applies to the --model models: give --model NAME=PATH (the "
            "repository's models take load parameters from RepositoryModelLoad, the config "
            "file's from their [[models]] table)"
        )
    values["models"] += tuple(parse_model(m, values["load_parameter"]) for m in values["model"])
    names = [m.name for m in values["models"]]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise InvalidOptionError(
            f"model(s) {twice} given more than once (--model and [[models]]): serve each name once"
        )
    if isinstance(values.get("socket_mode"), str):
        values["socket_mode"] = int(values["socket_mode"], 8)
    for key in ("metrics", "http"):  # one form for every TCP option, as -g takes it
        if values.get(key) is not None:
            values[key] = tcp_address(values[key], f"--{key}")
    if values.get("cores") is not None:
        values["cores"] = str(values["cores"])
    options = ServeOptions(**values)
    _check(options)
    return options


def _model(table: Any, file: str | None) -> Entry:
    if not isinstance(table, dict) or "name" not in table or "path" not in table:
        raise InvalidOptionError(
            f"each [[models]] table of {file} needs name and path (and may give "
            "device, instances, cores, queue_depth, timeout, precision, max_batch_size, "
            "batch_delay, response_cache)"
        )
    rest = {k: v for k, v in table.items() if k not in ("name", "path")}
    path = Path(table["path"])
    if file is not None and not path.is_absolute():
        path = Path(file).parent / path
    version = "1"
    if path.parent.name.isdigit() and path.stem == "model":
        version = path.parent.name
    return Entry(str(table["name"]), version, path, LoadOptions().with_values(rest))


def _check(options: ServeOptions) -> None:
    if options.log_level.lower() not in LOG_LEVELS:
        raise InvalidOptionError(
            f"log level {options.log_level!r}: give one of {', '.join(list(LOG_LEVELS)[:6])} "
            "or 0-7 (6 debug, 7 trace)"
        )
    if options.semantics not in SEMANTICS:
        raise InvalidOptionError(
            f"semantics {options.semantics!r}: give "
            + " or ".join(f"'{name}' ({what})" for name, what in SEMANTICS.items())
        )
    if options.model_control not in ("none", "explicit"):
        raise InvalidOptionError(
            f"model control {options.model_control!r}: give 'none' (load the repository at "
            "start) or 'explicit' (load with RepositoryModelLoad)"
        )
    if (options.tls_cert is None) != (options.tls_key is None) or (
        options.tls_client_ca and not options.tls_cert
    ):
        raise InvalidOptionError(
            "TLS needs both tls_cert and tls_key (PEM files), and tls_client_ca only with them"
        )
    if not options.drain_seconds >= 0 or options.threads < 1:
        raise InvalidOptionError("drain_seconds must be >= 0 and threads >= 1")
    if not isinstance(options.max_connections, int) or options.max_connections < 1:
        raise InvalidOptionError(
            f"max_connections {options.max_connections!r}: give the number of connections a "
            "Unix socket may keep open at once, 1 or more (default 1024)"
        )
    share = options.user_connections
    if isinstance(share, bool) or not isinstance(share, int) or share < 0:
        raise InvalidOptionError(
            f"user_connections {share!r}: give the connections one user may hold open on a "
            "Unix socket, 1 or more (0, the default: half of max_connections)"
        )
    idle = options.idle_timeout
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0 <= idle < 1e9:
        raise InvalidOptionError(
            f"idle_timeout {idle!r}: give the seconds a connection may stay idle before the "
            "daemon closes it (default 300; 0: never)"
        )
    cache = options.response_cache_bytes
    if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
        raise InvalidOptionError(
            f"response_cache_bytes {cache!r}: give the bytes of answers the response cache "
            "may keep, 0 (the default) for none"
        )
    for name, what in BOUNDS.items():
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidOptionError(
                f"{name} {value!r}: give {what}, a whole number of 1 or more (default "
                f"{getattr(ServeOptions, name)})"
            )
    if options.max_message_bytes >= 2**31:
        raise InvalidOptionError(
            f"max_message_bytes {options.max_message_bytes}: protobuf messages stop below "
            f"2 GiB; give less than {2**31}"
        )
    timeout = options.http_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidOptionError(
            f"http_timeout {timeout!r}: give the seconds an HTTP client has to send a "
            "request's headers, or to stay idle between requests, more than 0 (default 30)"
        )
    options.endpoints()  # each one checked now
