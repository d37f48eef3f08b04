"""The daemon: a Runtime, its repository and regions, behind a gRPC server on its endpoints.

Lifecycle: :meth:`Daemon.start` listens (ServerLive answers at once), loads each ``--model``
(one that fails stops the daemon), then the repository (unless model control is explicit),
then ServerReady says true, while every ``--model`` stays loaded. SIGTERM (or SIGINT) drains:
new calls get UNAVAILABLE, those under way have ``drain_seconds`` to finish, then models are
unloaded (their cores released), regions closed, sockets removed. SIGHUP rescans the
repository: new models are loaded, changed ones reloaded, removed ones unloaded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import socket
import tempfile
import threading
from collections import ChainMap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc as pbg

from ..compiler.cache import cache_stats
from ..errors import InvalidOptionError, OutOfResourcesError
from ..host import give_back_memory, owned_name, remove_orphans, resident_bytes
from ..runtime import Runtime
from ..runtime.cores.pinning import own_thread
from ..runtime.statistics import ModelStatistics
from .extension import RuntimeService
from .gate import Gate, authorization
from .kserve import InferenceService
from .lane import LaneServer
from .neuron_rtd import NEURON_RTD, nc_busy
from .peers import Peer, identify
from .private_sockets import MAGIC as PRIVATE
from .private_sockets import PrivateSockets, holder_of, remove_stale
from .proto import runtime_pb2_grpc as v1_grpc
from .regions import Regions
from .relay import UnixRelay
from .repository import LoadOptions, Repository
from .response_cache import CacheCounts, ResponseCache
from .rest import HttpFront
from .settings import ServeOptions, default_profile_dir
from .tickets import MAGIC as TICKET
from .tickets import TicketGate, Tickets, listen_direct
from .tokens import load_tokens

log = logging.getLogger("crossrt.serve")
_INNER_PREFIX = "crossrt-serve-"
SWEEP_SECONDS = 5.0
"""How often the regions and models of dead clients are looked for."""
TRIM_AFTER = 64 * 2**20
"""RSS grown by this much since the last trim is given back at the next sweep at rest."""


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as Go programs do at
    start): each client connection holds up to seven descriptors, and the usual soft limit of
    1024 would run out near 150 gRPC clients. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as exc:  # a kernel cap below the hard limit
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, want, exc)
    return soft


def tls_credentials(options: ServeOptions) -> Any:
    """gRPC server credentials for the TCP endpoints when a certificate is configured (a
    client certificate signed by ``tls_client_ca`` required when one is); else ``None``.
    The Unix socket needs none: the kernel says who is at the other end."""
    if options.tls_cert is None or options.tls_key is None:
        return None
    try:
        pair = (Path(options.tls_key).read_bytes(), Path(options.tls_cert).read_bytes())
        ca = Path(options.tls_client_ca).read_bytes() if options.tls_client_ca else None
    except OSError as exc:
        raise InvalidOptionError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=bool(ca))


class Daemon:
    """One ``crossrt serve``.

    Raises:
        OutOfResourcesError: an endpoint cannot be listened on.
    """

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self._ready = False
        self._required = frozenset(options.named)  # needed for readiness
        grants = load_tokens(options.tokens) if options.tokens else None
        files = raise_file_limit()
        if files < 8 * options.max_connections:
            log.warning(
                "the open-file limit (%d) may run out before max_connections (%d) clients are "
                "connected: each may hold 7 files; raise it (ulimit -n), or lower "
                "max_connections",
                files,
                options.max_connections,
            )
        self.runtime = Runtime(visible_cores=options.cores) if options.cores else Runtime()
        self.regions = Regions(max_bytes=options.max_region_bytes)
        directory = Path(options.model_repository) if options.model_repository else None
        self.repository = Repository(self.runtime, directory, LoadOptions(), options.models)
        self.gate = Gate(options.token, grants)
        self.relays: list[UnixRelay] = []
        self.addresses: list[str] = []
        self._metrics: Any = None
        remove_orphans(_INNER_PREFIX, [tempfile.gettempdir()])
        self._inner_dir = tempfile.mkdtemp(prefix=owned_name(_INNER_PREFIX))  # 0700
        inner = os.path.join(self._inner_dir, "grpc.sock")
        # Its threads call the models: each run on the cores of the instance it takes.
        executor = ThreadPoolExecutor(
            options.threads, thread_name_prefix="crossrt-serve", initializer=own_thread
        )
        limits = [
            # Refused by gRPC from the message's length prefix, before it is read.
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ]
        self.server = grpc.server(executor, interceptors=[self.gate], options=limits)
        # crossrt's own clients, with a ticket, call this one's sockets without the relay.
        self.tickets = Tickets(self.gate)
        mains = [e.address for e in options.endpoints() if e.kind == "unix"]
        gate = TicketGate(self.tickets, self.gate, mains)
        self.direct = grpc.server(executor, interceptors=[gate], options=limits)
        # Any gRPC client, on a socket only its user may open (a server per holder).
        self._executor, self._limits = executor, limits
        self.private = PrivateSockets(self.gate, self._private_server)
        self._direct_paths: list[str] = []
        cache = (
            ResponseCache(options.response_cache_bytes) if options.response_cache_bytes else None
        )
        self.repository.caches = cache is not None
        service = InferenceService(
            self.repository,
            self.regions,
            self.identify,
            self.ready,
            cache,
            explicit=options.model_control == "explicit",
            busy=nc_busy if options.semantics == NEURON_RTD else None,
        )
        self.service = service
        self._http: HttpFront | None = None
        self.lane = LaneServer(
            service.infer, self.gate, self.regions.register_sealed, options.max_message_bytes
        )
        self.extension = RuntimeService(
            self.runtime,
            self.repository,
            self.regions,
            self.identify,
            options.max_posted_bytes,
            semantics=options.semantics,
            profile_dir=options.profile_dir or str(default_profile_dir()),
        )
        for server in (self.server, self.direct):
            self._serving(server)
        self._stopping = threading.Event()
        self._trimmed = 0  # RSS after the last trim (give_back_memory)
        self._previous: dict[int, Any] = {}
        self._previous_wakeup = -1
        self._sweeper = threading.Thread(target=self._sweep, name="crossrt-sweep", daemon=True)
        try:
            self._listen(inner)
        except BaseException:
            self._close_sockets()
            self.runtime.close()
            raise

    def _serving(self, server: grpc.Server) -> grpc.Server:
        """``server`` with the daemon's two services."""
        pbg.add_GRPCInferenceServiceServicer_to_server(self.service, server)
        v1_grpc.add_RuntimeServicer_to_server(self.extension, server)  # type: ignore[no-untyped-call]
        return server

    def _private_server(self, interceptor: Any) -> grpc.Server:
        """A private socket's gRPC server: the daemon's services, threads and limits."""
        server = grpc.server(self._executor, interceptors=[interceptor], options=self._limits)
        return self._serving(server)

    def _listen(self, inner: str) -> None:
        endpoints = self.options.endpoints()
        credentials = tls_credentials(self.options)
        if any(e.kind == "unix" for e in endpoints):
            self.server.add_insecure_port(f"unix:{inner}")
        for endpoint in endpoints:
            if endpoint.kind == "unix":
                try:
                    relay = UnixRelay(
                        endpoint.address,
                        inner,
                        self.options.socket_mode,
                        self.lane.serve,
                        self.options.max_connections,
                        self.options.user_share,
                        self.options.idle_timeout,
                        self.gate.busy,
                    )
                except OSError as exc:
                    raise OutOfResourcesError(
                        f"cannot listen on unix:{endpoint.address}: {exc}"
                    ) from None
                self.relays.append(relay)
                self.addresses.append(f"unix:{endpoint.address}")
                direct = listen_direct(self.direct, endpoint.address, self.options.socket_mode)
                if direct is not None:
                    served = functools.partial(self.tickets.serve, direct=direct)
                    relay.served[TICKET] = ("ticket", served)
                    self._direct_paths.append(direct)
                remove_stale(endpoint.address)
                private = functools.partial(self.private.serve, main=endpoint.address)
                relay.served[PRIVATE] = ("private", private)
                continue
            why = "in use, or not an address of this host"
            try:
                if credentials is None:
                    port = self.server.add_insecure_port(endpoint.address)
                else:
                    port = self.server.add_secure_port(endpoint.address, credentials)
            except RuntimeError as exc:
                port, why = 0, str(exc)
            if not port:
                raise OutOfResourcesError(f"cannot listen on {endpoint.address} ({why})")
            host = endpoint.address.rpartition(":")[0]
            self.addresses.append(f"{host}:{port}")

    def identify(self, context: Any) -> Peer:
        """Who is behind a gRPC call: its connection (``context.peer()``) and its token (the
        gate has checked it already)."""
        # A view of every relay's table, not a copy of them all on each call.
        relayed = ChainMap(*(relay.peers for relay in self.relays))
        metadata = context.invocation_metadata()
        grant = self.gate.grant(authorization(metadata))
        address = context.peer()
        # A private socket's call is its holder; one with a ticket, the ticket's (the
        # direct socket lets in no other).
        bearer = holder_of(context)
        if bearer is None and address.startswith("unix"):
            bearer = self.tickets.bearer(metadata)
        return identify(address, relayed, grant, bearer)

    def ready(self) -> bool:
        """Whether the daemon takes requests: started, not draining, and every ``--model``
        loaded (a KServe pod is sent requests only then)."""
        if not self._ready or self.gate.closing:
            return False
        return not self._required or self._required <= {e.name for e in self.repository.loaded()}

    def statistics(self) -> list[tuple[dict[str, str], ModelStatistics]]:
        """(its model and version labels, statistics as served: ``Entry.statistics``) of
        every loaded model."""
        return [
            ({"model": e.name, "version": e.version}, e.statistics())
            for e in self.repository.loaded()
            if e.model is not None
        ]

    def response_caches(self) -> list[tuple[dict[str, str], CacheCounts]]:
        """(its model and version labels, its response cache counts) of every loaded model
        that uses the response cache."""
        return [
            ({"model": e.name, "version": e.version}, e.cache)
            for e in self.repository.loaded()
            if e.model is not None and e.options.response_cache
        ]

    def connections(self) -> list[tuple[str, int, int]]:
        """(socket path, connections open, connections refused) of each Unix socket."""
        return [(r.path, r.connections, r.refused) for r in self.relays]

    def start(self) -> None:
        """Listen, load the repository (unless explicit), then be ready."""
        self.server.start()
        if self._direct_paths:
            self.direct.start()
        for relay in self.relays:
            relay.start()
        for address in self.addresses:
            lane = " and the direct lane" if address.startswith("unix:") else ""
            log.info("serving KServe v2 gRPC%s on %s", lane, address)
        for path in self._direct_paths:
            log.info("serving gRPC with a ticket (crossrt clients) on unix:%s", path)
        if self.options.metrics:
            from .metrics import (
                CacheCollector,
                ConnectionCollector,
                ModelCollector,
                ResponseCacheCollector,
                serve_metrics,
            )

            try:
                self._metrics = serve_metrics(
                    self.options.metrics,
                    ModelCollector(self.statistics),
                    ConnectionCollector(self.connections),
                    CacheCollector(lambda: [({}, cache_stats())]),
                    ResponseCacheCollector(self.response_caches),
                )
            except OSError as exc:
                raise OutOfResourcesError(
                    f"cannot serve metrics on {self.options.metrics}: {exc.strerror}; choose "
                    "another --metrics HOST:PORT"
                ) from None
            log.info("serving Prometheus metrics on http://%s/metrics", self.options.metrics)
        if self.options.http is not None:
            host, _, port = self.options.http.rpartition(":")
            try:
                self._http = HttpFront(
                    (host.strip("[]") or "127.0.0.1", int(port)),
                    self.service,
                    self.gate,
                    max_body=self.options.max_message_bytes,
                    max_json=self.options.max_json_bytes,
                    connections=self.options.http_connections,
                    timeout=self.options.http_timeout,
                )
            except OSError as exc:
                raise OutOfResourcesError(
                    f"cannot serve HTTP on {self.options.http}: {exc.strerror}; choose another "
                    "--http HOST:PORT"
                ) from None
            log.info("serving KServe v2 HTTP/REST on http://%s/v2", self.options.http)
        # Explicit model control loads only the config file's [[models]] at start, and
        # those --load-model names (Triton's option; "*": all).
        explicit = self.options.model_control == "explicit"
        everything = not explicit or "*" in self.options.load_model
        if self.options.load_model and not explicit:
            log.warning("--load-model applies to --model-control explicit: every model loads")
        for name in self.options.named:
            # A --model that cannot be loaded stops the daemon with its own error: under
            # KServe the pod restarts and its log says why, as Triton's --exit-on-error.
            self.repository.load(name)
        self.repository.load_all(pinned_only=not everything)
        for name in () if everything else self.options.load_model:
            self.repository.try_load(name)
        for entry in self.repository.loaded():
            if entry.model is not None:
                log.info("model %s version %s is ready", entry.name, entry.version)
        self._sweeper.start()
        self._ready = True
        log.info("ready")

    def _sweep(self) -> None:
        """Every few seconds: release the regions, models and posted requests of clients that
        have died, and give memory freed back to the system at rest after RSS grew."""
        while not self._stopping.wait(SWEEP_SECONDS):
            for name in self.regions.sweep():
                log.info("released region %s: its process has died", name)
            for name in self.repository.release_orphans():
                log.info("unloaded model %s: the process that sent it has died", name)
            if dropped := self.extension.release_orphans():
                log.info("dropped %d posted requests of processes that have died", dropped)
            resident = resident_bytes()
            if not self.gate.in_flight and resident > self._trimmed + TRIM_AFTER:
                # At rest after RSS grew, what was freed goes back to the system: glibc's
                # heaps would keep it (16 MiB requests left RSS at 509 MiB from 102; 264
                # after a trim). Not while calls run: a trim holds the heaps' locks, up to
                # 190 ms here. Not at every sweep either: trimming every 5 s cost tiny HTTP
                # requests 12-35 µs at p50 (pages given back, then taken again).
                give_back_memory()
                self._trimmed = resident_bytes()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop, SIGHUP rescans; call from the main thread.

        The kernel gives a process's signal to any of its threads (gRPC's among them), and
        Python runs handlers only when the main thread gets round to it: the main thread
        would sleep on through a SIGTERM. Each signal's number is written to a socket the
        main thread reads instead (``signal.set_wakeup_fd``), whichever thread took it.
        """
        self._wakeup, writer = socket.socketpair()
        writer.setblocking(False)
        self._wakeup_writer = writer
        self._previous_wakeup = signal.set_wakeup_fd(writer.fileno())
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            # the wakeup socket carries it; stop() puts the caller's handlers back
            self._previous[signum] = signal.signal(signum, lambda *_: None)

    def wait(self) -> None:
        """Serve until SIGTERM or SIGINT (or :meth:`request_stop`); rescan on SIGHUP."""
        while True:
            for signum in self._wakeup.recv(64):
                if signum == signal.SIGHUP:
                    log.info("SIGHUP: rescanning the model repository")
                    self.repository.refresh(self.options.model_control != "explicit")
                elif signum in (signal.SIGTERM, signal.SIGINT):
                    log.info("%s received", signal.Signals(signum).name)
                    return

    def request_stop(self) -> None:
        """Make :meth:`wait` return, as SIGTERM does."""
        self._wakeup_writer.send(bytes([signal.SIGTERM]))

    def stop(self) -> None:
        """Drain, then release everything (models, cores, regions, sockets)."""
        log.info("stopping: draining %d calls under way", self.gate.in_flight)
        for relay in self.relays:
            relay.stop_accepting()
        self._stopping.set()
        left = self.gate.drain(self.options.drain_seconds)
        if left:
            log.warning("%d calls still running after %.0f s; cutting them", left,
                        self.options.drain_seconds)  # fmt: skip
        self.server.stop(grace=1.0).wait()
        if self._direct_paths:
            self.direct.stop(grace=1.0).wait()
            self._direct_paths = []  # gRPC removed them
        if self._http is not None:
            self._http.close()
        self._close_sockets()
        if self._metrics is not None:
            server, _ = self._metrics
            server.shutdown()
        self.repository.close()
        self.regions.close()
        self.runtime.close()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._previous:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._wakeup.close()
            self._wakeup_writer.close()
        log.info("stopped")

    def _close_sockets(self) -> None:
        for relay in self.relays:
            relay.close()
        self.lane.close()
        for path in self._direct_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            shutil.rmtree(self._inner_dir)
