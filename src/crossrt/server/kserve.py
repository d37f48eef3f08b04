"""The KServe v2 ``inference.GRPCInferenceService``, with Triton's model repository,
statistics and system shared-memory extensions, over a :class:`Repository`.

The protocol's messages and servicer base come from ``tritonclient.grpc`` (generated from
the KServe and Triton ``.proto`` files); nothing of the protocol is written out here.
Errors are raised (:class:`ServiceError`, ``CrossrtError``); the gate (:mod:`.gate`) turns
them into gRPC statuses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from ..drivers.base import CancelToken
from ..errors import OperationForbiddenError
from .peers import Peer, need_operator, need_owner
from .regions import Regions
from .repository import Entry, Repository
from .response_cache import ResponseCache
from .status import ServiceError, status_of
from .tensors import (
    bound_outputs,
    decode_inputs,
    encode_outputs,
    metadata_tensor,
    requested_outputs,
)

log = logging.getLogger("crossrt.serve")

EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    "statistics",
    "binary_tensor_data",
)

try:
    VERSION = version("crossrt")
except PackageNotFoundError:  # a source tree
    VERSION = "0.0.0+source"


def model_statistics(entry: Entry) -> pb.ModelStatistics:
    """A loaded model's statistics in Triton's fields, from those the daemon serves
    (:meth:`Entry.statistics`: the runtime's, docs/statistics.md, with the response cache's
    answers as successes and the requests refused before the model as failures), and its
    response cache's hits and misses."""

    def duration(count: int, ns: int) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=count, ns=ns)

    s, cache = entry.statistics(), entry.cache
    infer = pb.InferStatistics(
        success=duration(s.success, s.latency.ns),
        cache_hit=duration(cache.hits, cache.hit_ns),
        cache_miss=duration(cache.misses, cache.miss_ns),
        fail=duration(s.failure, 0),
        queue=duration(s.queue.count, s.queue.ns),
        compute_input=duration(s.compute_input.count, s.compute_input.ns),
        compute_infer=duration(s.compute_infer.count, s.compute_infer.ns),
        compute_output=duration(s.compute_output.count, s.compute_output.ns),
    )
    return pb.ModelStatistics(
        name=entry.name,
        version=entry.version,
        last_inference=s.last_inference_ms,
        inference_count=s.success,
        execution_count=sum(d.count for d in s.instances),
        inference_stats=infer,
    )


def _value(param: pb.InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


class InferenceService(pbg.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """KServe v2 over the daemon's repository and shared-memory regions.

    Args:
        repository: the models.
        regions: the registered system shared-memory regions.
        identify: who is behind a call (its gRPC context: its peer and its token); asked
            only when shared memory or the repository is used.
        ready: whether the daemon takes requests (false while it drains).
        cache: the daemon's response cache, if it has one (:mod:`.response_cache`).
        explicit: model control is explicit: RepositoryModelLoad and Unload drive the
            repository (with ``none``, refused as Triton refuses them).
    """

    def __init__(
        self,
        repository: Repository,
        regions: Regions,
        identify: Callable[[Any], Peer],
        ready: Callable[[], bool],
        cache: ResponseCache | None = None,
        explicit: bool = True,
        busy: Callable[[Any, str], Exception | None] | None = None,
    ) -> None:
        self.repository = repository
        # --semantics neuron-rtd: a model stopped while another runs on its group is
        # EXEC_NC_BUSY (1005, seed 003), the error it says (server/neuron_rtd.py's nc_busy)
        self._busy = busy
        self.regions = regions
        self._identify = identify
        self._ready = ready
        self.cache = cache
        self.explicit = explicit
        """The response cache (``response_cache_bytes``), for models loaded with
        ``response_cache``."""

    # -- health and metadata ---------------------------------------------------------

    def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._ready())

    def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        try:
            self.repository.get(request.name, request.version)
        except ServiceError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._ready())

    def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="crossrt", version=VERSION, extensions=EXTENSIONS)

    def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        entry, model = self.repository.get(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=entry.name,
            versions=[entry.version],
            platform="crossrt",
            inputs=[
                pb.ModelMetadataResponse.TensorMetadata(**metadata_tensor(s)) for s in model.inputs
            ],
            outputs=[
                pb.ModelMetadataResponse.TensorMetadata(**metadata_tensor(s)) for s in model.outputs
            ],
        )

    def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        entry, model = self.repository.get(request.name, request.version)

        def io(spec: Any, kind: Any, batch: int) -> Any:
            meta = metadata_tensor(spec)
            name = "TYPE_STRING" if meta["datatype"] == "BYTES" else f"TYPE_{meta['datatype']}"
            known = name in mc.DataType.DESCRIPTOR.values_by_name
            data_type = mc.DataType.Value(name if known else "TYPE_INVALID")
            dims = meta["shape"][1:] if batch else meta["shape"]
            return kind(name=spec.name, data_type=data_type, dims=dims)

        cpu = model.device.kind.name == "CPU"
        # Triton's convention: with batching on, max_batch_size > 0 and the config's dims
        # leave out the batch dimension (dynamic: batching needs it), which ModelMetadata
        # keeps as -1 and clients send; without batching, dims are the whole shapes.
        batch = model.instances.batching.max_size if model.instances.batching is not None else 0
        config = mc.ModelConfig(
            name=entry.name,
            platform="crossrt",
            backend="crossrt",
            max_batch_size=batch,
            input=[io(s, mc.ModelInput, batch) for s in model.inputs],
            output=[io(s, mc.ModelOutput, batch) for s in model.outputs],
            instance_group=[
                mc.ModelInstanceGroup(
                    name=model.device.id,
                    count=len(model.instances),
                    kind=mc.ModelInstanceGroup.KIND_CPU
                    if cpu
                    else mc.ModelInstanceGroup.KIND_MODEL,
                )
            ],
            default_model_filename=entry.path.name if entry.path else "",
        )
        if model.instances.batching is not None:
            config.dynamic_batching.CopyFrom(
                mc.ModelDynamicBatching(
                    preferred_batch_size=[model.instances.batching.max_size],
                    max_queue_delay_microseconds=round(model.instances.batching.delay * 1e6),
                )
            )
        return pb.ModelConfigResponse(config=config)

    # -- inference -----------------------------------------------------------------------

    def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        # The client's gRPC deadline: without one, gRPC answers a huge number of seconds
        # (infinity less now), which must not become a deadline.
        remaining = context.time_remaining()
        deadline = None
        if remaining is not None and remaining < NO_DEADLINE_S:
            deadline = time.monotonic() + remaining
        # gRPC calls this when the call ends: at once when the client goes away (its
        # request is then dropped, or stopped where the engine can), or after the answer
        # (then there is nothing left to stop).
        gone = CancelToken()
        context.add_callback(gone.cancel)
        return self.infer(request, lambda: self._identify(context), deadline, gone)

    def ModelStreamInfer(
        self, request_iterator: Iterator[pb.ModelInferRequest], context: Any
    ) -> Iterator[pb.ModelStreamInferResponse]:
        def caller() -> Peer:
            return self._identify(context)

        for request in request_iterator:
            try:
                response = self.infer(request, caller)
            except Exception as exc:  # the stream goes on; the error is this request's
                code, message = status_of(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log.exception("stream request to %s failed", request.model_name)
                error = f"[{code.name}] {message}"
                yield pb.ModelStreamInferResponse(
                    error_message=error,
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name, id=request.id
                    ),
                )
                continue
            yield pb.ModelStreamInferResponse(infer_response=response)

    def infer(
        self,
        request: pb.ModelInferRequest,
        caller: Callable[[], Peer],
        deadline: float | None = None,
        gone: CancelToken | None = None,
        kept: dict[str, np.ndarray] | None = None,
    ) -> pb.ModelInferResponse:
        """Serve one ModelInfer request (gRPC's, the direct lane's (:mod:`.lane`), or the HTTP
        front's).

        Args:
            caller: who sent it; asked at most once, and only when the request names a
                shared-memory region (looking a TCP peer up reads the kernel's tables).
            deadline: the client's deadline (``time.monotonic()``), from gRPC; the
                request's ``timeout`` parameter (microseconds, as tritonclient sends it)
                gives one too, the earlier winning. A request still queued then is not
                run, one still running is stopped where the engine can: DEADLINE_EXCEEDED.
            gone: cancelled when the client goes away (gRPC's ``add_callback``): the request
                is dropped if it waits, stopped where the engine can if it runs.
            kept: where the numeric outputs' arrays go instead of the answer's raw contents
                (:func:`.tensors.encode_outputs`), unless the answer is cached.
        """
        deadline = _earlier(deadline, request_deadline(request))
        entry, model = self.repository.get(request.model_name, request.model_version)
        peer: list[Peer] = []

        def who() -> Peer:
            if not peer:
                peer.append(caller())
            return peer[0]

        try:
            feed = decode_inputs(
                request, model.inputs, lambda n, o, s: self.regions.read(n, o, s, who())
            )
            chosen = requested_outputs(request, model.outputs)
        except Exception:
            entry.count_refused()
            raise
        # Static outputs asked for in a mapped region are written there by the model itself.
        bound = bound_outputs(request, chosen, lambda n, o, s: self.regions.mapped(n, o, s, who()))
        key = None
        if (
            self.cache is not None
            and entry.options.response_cache
            and all(region is None for _, region in chosen)  # else written there, not carried
        ):
            began = time.perf_counter_ns()
            key = self.cache.key(model.memory.owner, feed, [spec.name for spec, _ in chosen])
            cached = None if key is None else self.cache.get(key)
            if cached is not None:
                hit = pb.ModelInferResponse.FromString(cached)
                hit.id = request.id
                entry.count_cache(True, time.perf_counter_ns() - began)
                return hit
        if self._busy is not None and not model.running:
            refused = self._busy(model, "run")
            if refused is not None:
                entry.count_refused()
                raise refused
        if self._busy is not None:
            # neuron-rtd: a synchronous infer is one of the model's requests in flight, as an
            # InferPost is: past ninfer (the queue's depth) it is QUEUE_FULL, never a wait
            results = self._queued(model, feed, bound or None, deadline, gone)
        elif request.outputs:  # only those outputs asked of the engine (model.run's output_names)
            names = list(dict.fromkeys(spec.name for spec, _ in chosen))  # once each
            results = model.run(
                feed, bound or None, deadline=deadline, cancel=gone, output_names=names
            )
        elif deadline is None and gone is None:
            results = model.run(feed, bound) if bound else model.run(feed)
        else:
            results = model.run(feed, bound or None, deadline=deadline, cancel=gone)
        response = pb.ModelInferResponse(
            model_name=entry.name, model_version=entry.version, id=request.id
        )
        encode_outputs(
            response,
            results,
            chosen,
            lambda n, o, a: self.regions.write(n, o, a, who()),
            bound,
            kept if key is None else None,  # a cached answer holds its bytes
        )
        if key is not None and self.cache is not None:
            began = time.perf_counter_ns()
            self.cache.put(key, response.SerializeToString())
            entry.count_cache(False, time.perf_counter_ns() - began)
        return response

    # -- statistics and the repository ---------------------------------------------------

    def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        if request.name:
            entries = [self.repository.get(request.name, request.version)[0]]
        else:
            entries = self.repository.loaded()
        stats = [model_statistics(e) for e in entries if e.model is not None]
        return pb.ModelStatisticsResponse(model_stats=stats)

    def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"no repository {request.repository_name!r}: this daemon has one; leave the "
                "name empty",
            )
        self.repository.release_orphans()  # models sent by clients that have died
        index = [
            pb.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in self.repository.entries()
            if not request.ready or e.model is not None
        ]
        return pb.RepositoryIndexResponse(models=index)

    def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:
        values = {k: _value(v) for k, v in request.parameters.items()}
        self.load_model(request.model_name, values, self._identify(context))
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:
        self.unload_model(request.model_name, self._identify(context))
        return pb.RepositoryModelUnloadResponse()

    def load_model(self, name: str, values: dict[str, Any], peer: Peer) -> None:
        """RepositoryModelLoad (gRPC's and HTTP's): the operator's, under explicit model
        control only."""
        self._controlled()
        need_operator(peer, f"loading model {name!r} of the repository")
        if "config" in values or any(k.startswith("file:") for k in values):
            raise ServiceError(
                grpc.StatusCode.UNIMPLEMENTED,
                "loading with a config override or model files in the request is not served; "
                "put the model in the repository and give load parameters (device, instances, "
                "cores, queue_depth, timeout, precision)",
            )
        self.repository.load(name, values)

    @staticmethod
    def _queued(
        model: Any, feed: dict[str, Any], bound: Any, deadline: float | None, gone: Any
    ) -> Any:
        """One run through the model's queue (QUEUE_FULL when it holds ``ninfer`` already),
        dropped or stopped when the client goes away."""
        future = model.run_async(feed, bound, deadline=deadline, block=False)
        if gone is not None:
            gone.on_cancel(future.cancel)
        return future.result()

    def unload_model(self, name: str, peer: Peer) -> None:
        """RepositoryModelUnload (gRPC's and HTTP's): a model of the repository, by the
        operator under explicit model control; a model a client sent (crossrt.v1 Load), by
        its owner or the operator under any."""
        owner = self.repository.owner_of(name) if self.repository.known(name) else None
        if owner is None:
            self._controlled()
        need_owner(peer, owner, f"unloading model {name!r}")
        self.repository.unload(name)

    def _controlled(self) -> None:
        if not self.explicit:
            # Triton's answer under --model-control-mode=none (UNAVAILABLE, its words); the
            # code in front makes it OperationForbiddenError for crossrt's client, not the
            # "daemon gone" of a plain UNAVAILABLE.
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                str(
                    OperationForbiddenError(
                        "explicit model load / unload is not allowed if polling is enabled: "
                        "this daemon runs with --model-control none; restart it with "
                        "--model-control explicit (and --load-model), or change the repository "
                        "and send it SIGHUP"
                    )
                ),
            )

    # -- system shared memory ------------------------------------------------------------

    def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        peer = self._identify(context)
        self.regions.register(request.name, request.key, request.offset, request.byte_size, peer)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self.regions.status(request.name, self._identify(context))
        response = pb.SystemSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return response

    def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.regions.unregister(request.name, self._identify(context))
        return pb.SystemSharedMemoryUnregisterResponse()

    # No CUDA region is ever registered here: the status lists none and unregistering finds
    # nothing to do, as Triton answers when there are none (perf_analyzer unregisters every
    # CUDA region at the end of each run, and reported UNIMPLEMENTED as a failure).

    def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        if request.name:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, NO_CUDA_REGIONS)
        return pb.CudaSharedMemoryStatusResponse()

    def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, NO_CUDA_REGIONS)

    def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()


NO_CUDA_REGIONS = (
    "this daemon registers no CUDA shared-memory regions (none is registered); use system "
    "shared memory (/dev/shm) instead"
)


NO_DEADLINE_S = 1e7
"""gRPC time remaining beyond this many seconds (about 4 months) means no deadline."""


def request_deadline(request: pb.ModelInferRequest) -> float | None:
    """The deadline a request's ``timeout`` parameter sets (microseconds from now, as
    Triton's clients send it; 0 or absent: none).

    Raises:
        ServiceError: INVALID_ARGUMENT, a timeout that is not a whole number >= 0.
    """
    if "timeout" not in request.parameters:
        return None
    parameter = request.parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, kind) if kind in ("int64_param", "uint64_param") else None
    if value is None or value < 0:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request parameter timeout={_value(parameter)!r}: give microseconds as an "
            "int64 >= 0 (0: no timeout)",
        )
    return time.monotonic() + value / 1e6 if value else None


def _earlier(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)
