"""A Ray Serve replica that is a crossrt runtime: the daemon's repository, KServe v2 service
and REST routes in a Serve deployment (:mod:`.app` deploys it).

Each replica owns ``cores`` host CPUs of its node exclusively (``Runtime(num_cores=...)``:
lock files in the node's runtime directory), so replicas on one node run on disjoint pinned
cores; Ray's ``num_cpus`` only counts them. Requests reach the replica's models the way they
reach ``crossrt serve``'s: the same :class:`~crossrt.server.kserve.InferenceService` (its
request checks, conversions, response cache, statistics), with each model's instances and
dynamic batching inside the replica. What needs the caller's host (system shared memory, the
direct lane, a peer's credentials) does not cross Serve's hop and is refused, saying so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from ...drivers.base import CancelToken
from ...host import usable_cores
from ...runtime import Runtime
from ...runtime.cores.pinning import own_thread
from ...server.kserve import InferenceService
from ...server.regions import Regions
from ...server.repository import Entry, LoadOptions, Repository
from ...server.response_cache import ResponseCache
from ...server.rest import RestRoutes
from ...server.status import ServiceError, error_from, status_of
from . import protos  # noqa: F401  (the KServe classes' pickle names, in this process)
from .calls import ANONYMOUS, SAME_HOST_ONLY, model_id
from .http import answer_http
from .inline import Inline
from .statistics import RayStatistics

log = logging.getLogger("crossrt.ray")


@dataclass(frozen=True)
class ReplicaConfig:
    """What one replica serves and how (``crossrt deploy ray``'s options).

    Attributes:
        source: a ``.crm`` (or ``.onnx``) file, served under its stem, or a model
            repository folder (server/repository.py's layouts).
        cores: host CPUs each replica reserves (0: share every usable one, no lock).
        load: load parameters for every model (``instances``, ``max_batch_size``,
            ``batch_delay``, ``response_cache``, ...: ``crossrt serve``'s names).
        max_models: with multiplexing, the models one replica holds at once (least recently
            used unloaded first); 0: no multiplexing, every model loaded at start.
        response_cache_bytes: each replica's response cache (0: none).
        threads: requests one replica works on at once.
    """

    source: str
    cores: int = 1
    load: dict[str, Any] = field(default_factory=dict)
    max_models: int = 0
    response_cache_bytes: int = 0
    threads: int = 32


class Replica:
    """One replica: a Runtime with its cores, the models, and the KServe service over them.

    Its methods named as ``inference.GRPCInferenceService``'s are what Serve's gRPC proxy
    calls; ``__call__`` answers HTTP with ``crossrt serve --http``'s routes; ``infer``,
    ``check_health``, ``record_autoscaling_stats`` and ``__del__`` are Serve's hooks.
    """

    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        self._draining = False
        self.runtime = Runtime(num_cores=config.cores) if config.cores else Runtime()
        try:
            self.repository = _repository(self.runtime, config)
            cache = (
                ResponseCache(config.response_cache_bytes) if config.response_cache_bytes else None
            )
            self.repository.caches = cache is not None
            self.service = InferenceService(
                self.repository, Regions(), lambda _: ANONYMOUS, self._ready, cache
            )
            self.routes = RestRoutes(self.service)
            # The threads that call the models run on the replica's own cores (a run() on
            # one core computes in its caller's thread, which crossrt never pins itself).
            cores = self.runtime.cores if self.runtime.exclusive else None
            self._pool = ThreadPoolExecutor(
                config.threads, "crossrt-ray", initializer=own_thread, initargs=(cores,)
            )
            self._inline = Inline(cores)  # a model of a few microseconds runs on the loop
            self._get_model: Callable[[str], Awaitable[Any]] | None = None
            if config.max_models:
                from ray import serve

                async def load(model_id: str) -> _Held:
                    return await self._load(model_id)

                self._get_model = serve.multiplexed(max_num_models_per_replica=config.max_models)(
                    load
                )
            else:
                for entry in self.repository.entries():
                    self.repository.load(entry.name)  # a model that fails fails the replica
            self.statistics = RayStatistics(self.repository)
        except BaseException:
            self.runtime.close()  # its models with it, and its cores go back
            raise
        log.info("crossrt replica %d on cores %s", os.getpid(), self.runtime.cores)

    # -- Serve's hooks -------------------------------------------------------------------

    def check_health(self) -> None:
        """Serve's health check: every model this replica serves is loaded and READY (with
        multiplexing: the runtime is open; models come and go)."""
        if self.runtime.closed:
            raise RuntimeError("the replica's crossrt runtime is closed")
        if not self.config.max_models:
            for entry in self.repository.entries():
                if entry.model is None or entry.state != "READY":
                    raise RuntimeError(f"model {entry.name} is {entry.state}: {entry.reason}")
        self.statistics.export()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """crossrt's own count of requests in flight (queued or running) on this replica, for
        :class:`.autoscale.InFlightPolicy` (Serve asks several times a second: the Ray
        metrics are left to the health check)."""
        return {"crossrt_in_flight": float(self.statistics.in_flight())}

    def metric_samples(self) -> list[tuple[str, dict[str, str], float]]:
        """The samples this replica exports as Ray metrics (the names and labels of
        ``crossrt serve --metrics``)."""
        return self.statistics.samples()

    def __del__(self) -> None:
        # Serve calls this after the drain (graceful_shutdown_timeout_s: the requests under
        # way have finished, or run out of time); the cores go back with the runtime.
        self._draining = True
        repository = getattr(self, "repository", None)
        if repository is not None:
            repository.close()
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()

    # -- placement, for tests and `crossrt deploy` --------------------------------------

    def placement(self) -> dict[str, Any]:
        """This replica's process, its reserved cores, the CPUs the process may use, the CPUs
        each of its threads may run on (those that run requests: the reserved cores only),
        the models it holds now and the requests in flight on them (queued or running)."""
        threads: dict[int, list[int]] = {}
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            try:
                threads[int(tid)] = sorted(os.sched_getaffinity(int(tid)))
            except OSError:  # the thread ended
                continue
        return {
            "pid": os.getpid(),
            "cores": list(self.runtime.cores),
            "exclusive": self.runtime.exclusive,
            "usable": sorted(usable_cores()),
            "threads": threads,
            "models": [e.name for e in self.repository.loaded()],
            "in_flight": self.statistics.in_flight(),
        }

    # -- the Runtime API over a handle (handle.py) -----------------------------------------

    async def infer(
        self,
        name: str,
        inputs: dict[str, Any],
        outputs: list[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run model ``name`` on ``inputs`` (name -> NumPy array) within ``timeout`` seconds;
        the outputs by name. Cancelled by Serve (the caller cancelled or went away), the
        request is dropped where it waits and stopped where the engine can."""
        try:
            model = await self.model(name)
        except ServiceError as exc:  # as the client of `crossrt serve` raises it (picklable)
            raise error_from(exc.status, exc.message, "ray serve") from None
        gone = CancelToken()
        deadline = None if timeout is None else time.monotonic() + timeout

        def run() -> dict[str, Any]:
            kwargs: dict[str, Any] = {"deadline": deadline, "cancel": gone}
            if outputs:
                kwargs["output_names"] = outputs
            return dict(model.run(inputs, **kwargs))

        outputs_by_name: dict[str, Any] = await self.offload(run, gone, self._entry(name))
        return outputs_by_name

    # -- KServe v2 over Serve's gRPC proxy ----------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, grpc_context: Any = None) -> Any:
        gone = CancelToken()

        async def call() -> Any:
            await self.model(model_id(request.model_name))
            return await self.offload(
                lambda: self.service.infer(request, lambda: ANONYMOUS, None, gone),
                gone,
                self._entry(request.model_name),
            )

        return await self._answer(call, grpc_context, pb.ModelInferResponse)

    async def ServerLive(self, request: Any, grpc_context: Any = None) -> Any:
        return pb.ServerLiveResponse(live=not self.runtime.closed)

    async def ServerReady(self, request: Any, grpc_context: Any = None) -> Any:
        return self.service.ServerReady(request, None)

    async def ServerMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        return self.service.ServerMetadata(request, None)

    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:
        if self._get_model is not None and request.name in self._names():
            await self.model(request.name)
        return self.service.ModelReady(request, None)

    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("ModelMetadata", request, grpc_context, request.name)

    async def ModelConfig(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("ModelConfig", request, grpc_context, request.name)

    async def ModelStatistics(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("ModelStatistics", request, grpc_context, None)

    async def RepositoryIndex(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("RepositoryIndex", request, grpc_context, None)

    async def RepositoryModelLoad(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("RepositoryModelLoad", request, grpc_context, None)

    async def RepositoryModelUnload(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._service("RepositoryModelUnload", request, grpc_context, None)

    async def SystemSharedMemoryStatus(self, request: Any, grpc_context: Any = None) -> Any:
        return pb.SystemSharedMemoryStatusResponse()  # none registered, as over HTTP

    async def SystemSharedMemoryRegister(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._refuse(grpc_context, SAME_HOST_ONLY)

    async def SystemSharedMemoryUnregister(self, request: Any, grpc_context: Any = None) -> Any:
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, grpc_context: Any = None) -> Any:
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, grpc_context: Any = None) -> Any:
        return await self._refuse(grpc_context, SAME_HOST_ONLY)

    async def CudaSharedMemoryUnregister(self, request: Any, grpc_context: Any = None) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- KServe v2 over Serve's HTTP proxy ----------------------------------------------

    async def __call__(self, request: Any) -> Any:
        """An HTTP request (a starlette ``Request``): ``crossrt serve --http``'s routes
        (:mod:`.http`), under the application's route prefix."""
        return await answer_http(self.routes, request, self.model, self.offload)

    # -- the parts -------------------------------------------------------------------------

    def _ready(self) -> bool:
        return not self._draining and not self.runtime.closed

    def _names(self) -> set[str]:
        return {e.name for e in self.repository.entries()}

    async def model(self, name: str) -> Any:
        """Model ``name`` loaded in this replica (with multiplexing: loaded now if it is not,
        through Serve's LRU, which unloads the least recently used beyond ``max_models``)."""
        if self._get_model is not None:
            if name not in self._names():
                self.repository.scan()
            if name in self._names():
                await self._get_model(name)
        return self.repository.get(name)[1]

    async def _load(self, name: str) -> _Held:
        entry = await asyncio.get_running_loop().run_in_executor(
            self._pool, self.repository.load, name
        )
        return _Held(self.repository, entry)

    def _entry(self, name: str) -> Entry | None:
        try:
            return self.repository.get(name)[0]
        except ServiceError:  # the service says why, in its own words
            return None

    async def offload(
        self, work: Callable[[], Any], gone: CancelToken | None, entry: Entry | None = None
    ) -> Any:
        """``work`` for model ``entry``: inline when the model takes a few microseconds
        (:mod:`.inline`), else on the replica's threads (an engine call blocks); cancelled
        by Serve, the request is dropped where it waits and stopped where the engine can."""
        if self._inline.fits(entry):
            return self._inline.run(entry, work)
        timed = work if entry is None else partial(self._inline.run, entry, work)
        future = asyncio.get_running_loop().run_in_executor(self._pool, timed)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if gone is not None:
                gone.cancel()
            raise

    async def _service(self, method: str, request: Any, grpc_context: Any, name: Any) -> Any:
        async def call() -> Any:
            if name:
                await self.model(model_id(name))
            return getattr(self.service, method)(request, None)

        empty = getattr(pb, f"{method}Response")
        return await self._answer(call, grpc_context, empty)

    async def _answer(
        self, call: Callable[[], Awaitable[Any]], grpc_context: Any, empty: type
    ) -> Any:
        """``call``'s answer; an error becomes its gRPC status on Serve's context (the
        daemon's table: server/status.py), as ``crossrt serve`` answers it."""
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("a request failed")
            if grpc_context is None:
                raise
            grpc_context.set_code(code)
            grpc_context.set_details(message)
            return empty()

    async def _refuse(self, grpc_context: Any, message: str) -> Any:
        async def call() -> Any:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, message)

        return await self._answer(call, grpc_context, pb.ServerLiveResponse)


@dataclass
class _Held:
    """A model loaded through Serve's multiplexing; Serve calls ``__del__`` when it evicts
    it, which unloads it (its cores' instances and memory go back)."""

    repository: Repository
    entry: Entry

    def __del__(self) -> None:
        if self.entry.model is None:
            return
        try:
            self.repository.unload(self.entry.name)
        except Exception as exc:  # unloaded already (the replica is shutting down)
            log.debug("model %s already unloaded: %s", self.entry.name, exc)


def _repository(runtime: Runtime, config: ReplicaConfig) -> Repository:
    source = Path(config.source)
    options = LoadOptions().with_values(config.load)
    if source.is_dir():
        return Repository(runtime, source, options)
    if not source.is_file():
        raise FileNotFoundError(
            f"{source}: no such model file or repository folder on node {os.uname().nodename}; "
            "every node that runs a replica reads it (a shared filesystem, or the same path "
            "on each node)"
        )
    return Repository(runtime, None, options, [Entry(source.stem, "1", source, options)])
