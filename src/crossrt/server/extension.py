"""The ``crossrt.v1.Runtime`` service (``proto/runtime.proto``): what KServe lacks, served
beside it: devices and core owners, loading a model sent in the request (owned by the
sending user, and unloaded when the sending process dies), core groups with start and stop,
neuron-rtd's infer_post / infer_wait with a cookie, and cancellation; with
``--semantics neuron-rtd``, seed 003's core groups, load modes and codes (:mod:`.neuron_rtd`).

Ownership (docs/security.md): a model sent with Load and a core group belong to the user
who made them (:attr:`peers.Peer.principal`); only that user or the operator may unload,
start, stop or destroy them. The repository's models are the operator's. Core group ids and
cookies are random 63-bit numbers, checked against their owner as well.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..compiler import compile_for_device, load_executable
from ..compiler.layout import MAGIC
from ..errors import CrossrtError, OperationForbiddenError, OutOfResourcesError, StatusCode
from ..host import give_back_memory, process_alive
from ..runtime import LoadedModel, Runtime
from ..runtime.cores.groups import CoreGroup
from ..runtime.cores.reservation import core_owners
from .neuron_rtd import NEURON_RTD, Profiles, nc_busy, place, split_parameters
from .peers import Peer, need_owner, need_principal
from .proto import runtime_pb2 as v1
from .proto import runtime_pb2_grpc as v1_grpc
from .regions import Regions
from .repository import LoadOptions, Repository
from .status import ServiceError
from .tensors import decode_inputs, encode_outputs, requested_outputs

log = logging.getLogger("crossrt.serve")

MAX_POSTED = 4096
"""Requests posted and not yet waited for, over all clients."""

MAX_POSTED_BYTES = 256 * 2**20
"""The bytes a client may hold posted, unless the daemon says otherwise (``max_posted_bytes``)."""

ANONYMOUS_SECONDS = 300.0
"""How long the answer of a client whose process the daemon cannot know (pid 0: another
user over TCP) is kept once done, not waited for: its going away cannot be seen."""


@dataclass
class Posted:
    """A request posted with InferPost, until InferWait hands its answer over."""

    future: Future[Any]
    request: pb.ModelInferRequest
    chosen: Any
    version: str
    peer: Peer
    nbytes: int = 0
    """The bytes it holds: its request, and its answer once done."""
    done_at: float = 0.0


class RuntimeService(v1_grpc.RuntimeServicer):
    """``crossrt.v1.Runtime`` over the daemon's runtime, repository and regions."""

    def __init__(
        self,
        runtime: Runtime,
        repository: Repository,
        regions: Regions,
        identify: Any,
        max_posted_bytes: int = MAX_POSTED_BYTES,
        *,
        semantics: str = "crossrt",
        profile_dir: str | None = None,
    ) -> None:
        self._runtime = runtime
        self._rtd = semantics == NEURON_RTD
        self._profiles = Profiles(Path(profile_dir or "profiles"))
        self._max_posted_bytes = max_posted_bytes
        self._held: dict[int | str, int] = {}  # bytes posted, by client (_client)
        self._repository = repository
        self._regions = regions
        self._identify = identify
        self._lock = threading.Lock()
        self._groups: dict[int, tuple[CoreGroup, str, int]] = {}
        """id -> (the group, its owner's principal, the process that made it: 0 unknown)."""
        self._posted: dict[int, Posted] = {}

    def Devices(self, request: Any, context: Any) -> v1.DevicesResponse:
        owners = {cpu: f"{o.pid} {o.name}".strip() for cpu, o in core_owners().items()}
        return v1.DevicesResponse(
            devices_json=[json.dumps(d.to_dict()) for d in self._runtime.devices()],
            core_owners=owners,
            daemon_cores=list(self._runtime.cores),
        )

    def Load(self, request: Any, context: Any) -> v1.LoadResponse:
        peer = self._identify(context)
        user = need_principal(peer, "loading a model")
        if not request.name:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "Load needs a model name")
        parameters, params = split_parameters(dict(request.parameters))
        if params.profiled:
            self._profiles.check()  # before the load: a refusal leaves nothing loaded
        options = LoadOptions().with_values(parameters)
        kwargs: dict[str, Any] = {
            "instances": options.instances,
            "queue_depth": options.queue_depth,
            "exec_timeout": options.timeout,
        }
        data = bytes(request.model)
        if data.startswith(MAGIC):  # a .crm; else an ONNX model, compiled here
            source: Any = load_executable(data)
        elif self._rtd:  # the cores it needs are known once it is compiled
            precision: dict[str, Any] = {}
            if options.precision is not None:
                precision["precision"] = options.precision
            source = compile_for_device(data, options.device, **precision)
        else:
            source = data
            if options.precision is not None:
                kwargs["precision"] = options.precision
        made = None
        group = self._group(request.core_group, peer) if request.core_group else None
        if self._rtd:
            kwargs["group"], kwargs["mode"], made = place(
                self._runtime, source, request.name, group, options.cores, options.instances
            )
        elif group is not None:
            kwargs["group"] = group
        elif options.cores is not None:
            kwargs["cores"] = options.cores
        try:
            # Its errors name it as its clients know it (an empty name is refused by adopt).
            model: LoadedModel = self._runtime.load(
                source, options.device, name=request.name or None, **kwargs
            )
        except BaseException:
            if made is not None:
                made.destroy()
            raise
        if made is not None:
            made.dissolve_when_empty()  # gone with its model, however that is unloaded
        try:
            if made is not None:
                model.start()  # seed 003: an implicit load starts at once
            entry = self._repository.adopt(request.name, model, peer.pid, user)
        except BaseException:
            model.unload()
            raise
        profile = self._profiles.start(model, params, peer.uid) if params.profiled else ""
        mode = "normal" if kwargs.get("mode") == "normal" else "shared"
        return v1.LoadResponse(name=entry.name, version=entry.version, mode=mode, profile=profile)

    def Unload(self, request: Any, context: Any) -> v1.Empty:
        self._mine_to_change(request.name, context, "unloading")
        self._repository.unload(request.name)
        return v1.Empty()

    def Start(self, request: Any, context: Any) -> v1.Empty:
        self._mine_to_change(request.name, context, "starting")
        model = self._repository.get(request.name)[1]
        try:
            model.start()
        except OperationForbiddenError:
            if self._rtd and (busy := nc_busy(model, "start")) is not None:
                raise busy from None  # seed 003: the cores are busy with another model
            raise
        return v1.Empty()

    def Stop(self, request: Any, context: Any) -> v1.Empty:
        self._mine_to_change(request.name, context, "stopping")
        self._repository.get(request.name)[1].stop()
        return v1.Empty()

    def _mine_to_change(self, name: str, context: Any, doing: str) -> None:
        """Refuse ``doing`` model ``name`` to a caller that neither owns it nor is the
        operator."""
        owner = self._repository.owner_of(name)
        need_owner(self._identify(context), owner, f"{doing} model {name!r}")

    def CreateCoreGroup(self, request: Any, context: Any) -> v1.CoreGroup:
        peer = self._identify(context)
        user = need_principal(peer, "creating a core group")
        indices = list(request.indices) or None
        group = self._runtime.create_core_group(request.cores or None, indices=indices)
        with self._lock:
            number = _random_id(self._groups)
            self._groups[number] = (group, user, peer.pid)
        return v1.CoreGroup(id=number, indices=list(group.indices))

    def DestroyCoreGroup(self, request: Any, context: Any) -> v1.Empty:
        self._group(request.id, self._identify(context)).destroy()
        with self._lock:
            self._groups.pop(request.id, None)
        return v1.Empty()

    def _group(self, number: int, peer: Peer) -> CoreGroup:
        """Core group ``number``, if it is the peer's (or the peer is the operator)."""
        with self._lock:
            found = self._groups.get(number)
        if found is None or not (peer.operator or found[1] == peer.principal):
            # Another user's group is not told apart from none.
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"you have no core group {number}; create one with CreateCoreGroup",
            )
        return found[0]

    def InferPost(self, request: Any, context: Any) -> v1.InferPostResponse:
        if dropped := self.release_orphans():  # what the dead held is freed first
            log.info("dropped %d posted requests of processes that have died", dropped)
        peer = self._identify(context)
        client = _client(peer)
        size = len(request.model_infer_request)
        self._check_held(client, size)  # before the request is deserialized
        infer = pb.ModelInferRequest.FromString(request.model_infer_request)
        entry, model = self._repository.get(infer.model_name, infer.model_version)
        try:
            feed = decode_inputs(
                infer, model.inputs, lambda n, o, s: self._regions.read(n, o, s, peer)
            )
            chosen = requested_outputs(infer, model.outputs)
        except Exception:
            entry.count_refused()
            raise
        with self._lock:
            self._check_held(client, size)  # again: the same client may post in parallel
            if len(self._posted) >= MAX_POSTED:
                raise ServiceError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{MAX_POSTED} requests are posted and not waited for; InferWait for some",
                )
            cookie = _random_id(self._posted)
            future = self._post(model, feed)
            posted = Posted(future, infer, chosen, entry.version, peer, size)
            self._posted[cookie] = posted
            self._held[client] = self._held.get(client, 0) + size
        future.add_done_callback(lambda f: self._done(cookie, f))
        return v1.InferPostResponse(cookie=cookie)

    def _post(self, model: LoadedModel, feed: Any) -> Future[Any]:
        """``model.run_async`` without waiting for room: QUEUE_FULL past its ninfer
        (queue_depth); under neuron-rtd semantics EXEC_NC_BUSY when its group runs another."""
        if self._rtd and not model.running and (busy := nc_busy(model, "infer with")):
            raise busy
        try:
            return model.run_async(feed, block=False)
        except OutOfResourcesError as exc:
            if exc.code is not StatusCode.QUEUE_FULL:
                raise
            raise OutOfResourcesError(
                f"model {model.name!r} has {model.instances.queue_depth} requests in flight, the "
                "most its load allows (ninfer, or queue_depth); InferWait for some first, or load "
                "it with a larger ninfer",
                code=StatusCode.QUEUE_FULL,
                details=exc.details,
            ) from None

    def _check_held(self, client: int | str, size: int) -> None:
        held = self._held.get(client, 0)
        if held + size > self._max_posted_bytes:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this client holds {held} bytes of posted requests and answers not waited "
                f"for, and this one would take it past the daemon's limit of "
                f"{self._max_posted_bytes} (max_posted_bytes); InferWait for some first",
            )

    def _done(self, cookie: int, future: Future[Any]) -> None:
        """Count a posted request's answer against its client until it is waited for."""
        try:
            results = future.result(timeout=0) if not future.cancelled() else {}
        except BaseException:
            results = {}
        nbytes = sum(getattr(a, "nbytes", 0) for a in results.values())
        with self._lock:
            posted = self._posted.get(cookie)
            if posted is None:
                return  # waited for, or dropped, already
            posted.done_at = time.monotonic()
            posted.nbytes += nbytes
            client = _client(posted.peer)
            self._held[client] = self._held.get(client, 0) + nbytes

    def InferWait(self, request: Any, context: Any) -> v1.InferWaitResponse:
        posted = self._mine(request.cookie, context)
        try:
            results = posted.future.result(timeout=request.timeout or None)
        except FutureTimeout:
            return v1.InferWaitResponse(done=False)
        except CancelledError:
            self._forget(request.cookie)
            raise ServiceError(grpc.StatusCode.CANCELLED, "the request was cancelled") from None
        except BaseException:
            self._forget(request.cookie)
            raise
        self._forget(request.cookie)
        infer = posted.request
        response = pb.ModelInferResponse(
            model_name=infer.model_name, model_version=posted.version, id=infer.id
        )
        peer = posted.peer
        encode_outputs(
            response, results, posted.chosen, lambda n, o, a: self._regions.write(n, o, a, peer)
        )
        return v1.InferWaitResponse(done=True, model_infer_response=response.SerializeToString())

    def Cancel(self, request: Any, context: Any) -> v1.CancelResponse:
        posted = self._mine(request.cookie, context)
        return v1.CancelResponse(cancelled=posted.future.cancel())

    def Statistics(self, request: Any, context: Any) -> v1.StatisticsResponse:
        entry = self._repository.get(request.name)[0]
        return v1.StatisticsResponse(statistics_json=json.dumps(entry.statistics().to_dict()))

    def _mine(self, cookie: int, context: Any) -> Posted:
        with self._lock:
            posted = self._posted.get(cookie)
        if posted is None or posted.peer.principal != self._identify(context).principal:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"no request posted with cookie {cookie} (waited for already, or not yours)",
            )
        return posted

    def release_orphans(self) -> int:
        """Drop the posted requests of processes that have died (cancelled if still
        queued), and the answers of anonymous clients done long ago, and destroy the core
        groups dead processes made, once empty (the repository unloads their models first);
        how many requests."""
        with self._lock:
            pids = {p.peer.pid for p in self._posted.values() if p.peer.pid}
            dead = {pid for pid in pids if not process_alive(pid)}
            old = time.monotonic() - ANONYMOUS_SECONDS
            gone = [
                c
                for c, p in self._posted.items()
                if p.peer.pid in dead or (not p.peer.pid and p.done_at and p.done_at < old)
            ]
            for cookie in gone:
                self._drop(cookie).future.cancel()
            groups = [
                (n, g) for n, (g, _, pid) in self._groups.items() if pid and not process_alive(pid)
            ]
        for number, group in groups:
            try:
                group.destroy()
            except CrossrtError:
                continue  # another client's model is on it: kept until that one goes
            with self._lock:
                self._groups.pop(number, None)
        if gone:
            give_back_memory()  # their buffers, freed: glibc would keep them
        return len(gone)

    def _forget(self, cookie: int) -> None:
        with self._lock:
            if cookie in self._posted:
                self._drop(cookie)

    def _drop(self, cookie: int) -> Posted:
        """Forget a posted request, and the bytes its client held for it (under the lock)."""
        posted = self._posted.pop(cookie)
        client = _client(posted.peer)
        left = self._held.get(client, 0) - posted.nbytes
        if left > 0:
            self._held[client] = left
        else:
            self._held.pop(client, None)
        return posted


def _client(peer: Peer) -> int | str:
    """Whose posted requests these are: its process, or (unknown) its connection's address."""
    return peer.pid or peer.address


def _random_id(taken: dict[int, Any]) -> int:
    """A random 63-bit number not in ``taken``, never 0 (a request's "none"): an id one
    client cannot guess of another's."""
    while True:
        number = secrets.randbits(63)
        if number and number not in taken:
            return number
