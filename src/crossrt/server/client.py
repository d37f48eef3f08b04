"""``connect(endpoint) -> RemoteRuntime``: a daemon's models behind the Runtime API.

Code moves between in-process and daemon by changing the line that makes the runtime (and
naming the model as the daemon's repository does)::

    rt = crossrt.Runtime()                             # in-process
    model = rt.load("models/mymodel.crm")

    rt = connect("unix:/run/crossrt/crossrt.sock")     # through crossrt serve
    model = rt.load("mymodel")                         # DIR/mymodel.crm of its repository

    outputs = model.run({"x": x})                      # the same dict of NumPy arrays

On a ``unix:`` endpoint, :meth:`RemoteModel.run` goes through the daemon's direct lane
(:mod:`.lane`: the same ModelInfer messages without HTTP/2, about 120 µs a call on the
project's VM where gRPC takes 900 µs); ``connect(..., lane=False)`` keeps everything on gRPC,
``run_async``/``infer`` too, from a pool of client threads. gRPC calls on a ``unix:``
endpoint go to the daemon's direct socket with a ticket (:mod:`.tickets`), which skips the
relay's two hops, where the daemon issues tickets; to the main socket otherwise.

From ``shm_threshold`` bytes (inputs and static outputs together), a request's inputs, and
its outputs when their shapes are static, travel through a shared-memory segment of this
process (reused) when the daemon is on this host, instead of inside the messages: on the
lane a sealed memfd passed to the daemon, which maps it; else a POSIX segment (0600)
registered by name. Errors are the runtime's (``CrossrtError`` with its status
code): the daemon sends the code in its message, and a gRPC status without one maps through
``status.error_from``. A call pending on a daemon that dies fails at once with CLOSED; the
next call reconnects when the daemon is back.

What KServe lacks comes through the daemon's ``crossrt.v1`` service: ``load`` of a file or
bytes (the model then belongs to this process), ``devices``, ``core_owners``, core groups
with ``start``/``stop``, and ``post``/``wait``/``cancel`` (neuron-rtd's infer_post and
infer_wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from ..drivers.base import CancelToken
from ..errors import ClosedError, CrossrtError, DeadlineExceededError
from .lane_client import LaneClient, LaneUnavailable
from .proto import runtime_pb2 as v1
from .proto import runtime_pb2_grpc as v1_grpc
from .remote_model import RemoteCoreGroup, RemoteModel
from .settings import parse_endpoint
from .status import error_of
from .tickets import AGENT, ENDED, Ticket, request_ticket

ASYNC_LANES = 16
"""Requests of ``run_async``/``infer`` under way at once on the direct lane (threads of the
client, connections to the daemon); more wait their turn in the client."""
SHM_THRESHOLD = 64 << 10
"""Tensors of this many bytes or more go through shared memory when the daemon is local:
on the lane, shared memory was 9% faster than the message at 64 KiB, 10% slower at 16 KiB
and 2.7x faster from 512 KiB (an ``x + 1`` model, 2-core VM)."""


def connect(
    endpoint: str | None = None,
    *,
    token: str | None = None,
    shm_threshold: int | None = SHM_THRESHOLD,
    timeout: float | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    lane: bool = True,
) -> RemoteRuntime:
    """A :class:`RemoteRuntime` on the daemon at ``endpoint`` (as ``crossrt serve -g`` takes
    it; default the daemon's default Unix socket).

    Args:
        token: the daemon's ``--token``.
        shm_threshold: bytes from which a request's tensors go through shared memory on a
            local daemon; ``None`` never.
        timeout: seconds each call may take.
        tls_ca: for a daemon serving TLS on TCP, the CA certificate (PEM file) to check its
            certificate against.
        lane: on a ``unix:`` endpoint, run requests through the daemon's direct lane
            (:mod:`.lane`) rather than gRPC; gRPC is used anyway with a daemon that lacks it.

    Raises:
        ClosedError: no daemon answers there.
    """
    from .settings import default_endpoint

    where = parse_endpoint(endpoint) if endpoint else default_endpoint()
    credentials = None
    if tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(Path(tls_ca).read_bytes())
    return RemoteRuntime(str(where), token, shm_threshold, timeout, credentials, lane)


def _why_refused(target: str, token: str | None, timeout: float | None) -> None:
    """Raise the reason the daemon at a ``unix:`` ``target`` gives on the direct lane for
    refusing connections (as many open as it allows: a gRPC client only sees its connection
    closed); return when it gives none."""
    lane = LaneClient(target.removeprefix("unix:"), token, timeout, target)
    try:
        lane.prepare()
    except (LaneUnavailable, ClosedError):
        return  # not there, or not the lane's to say
    finally:
        lane.close()


def _ticket_refused(exc: grpc.RpcError) -> bool:
    """Whether the daemon refused a call for its ticket (dropped since it was sent)."""
    code = exc.code() if hasattr(exc, "code") else None
    return code is grpc.StatusCode.UNAUTHENTICATED and ENDED in (exc.details() or "")


def _unsent(request: pb.ModelInferRequest) -> DeadlineExceededError:
    """TIMEOUT for a request whose deadline passed before it could be sent."""
    return DeadlineExceededError(
        f"model {request.model_name!r}: its deadline passed before it was sent; give a "
        "later deadline"
    )


class RemoteRuntime:
    """The daemon's models with :class:`crossrt.Runtime`'s calls (made by :func:`connect`)."""

    def __init__(
        self,
        target: str,
        token: str | None,
        shm_threshold: int | None,
        timeout: float | None,
        credentials: Any = None,
        lane: bool = True,
    ) -> None:
        self.endpoint = target
        local = target.startswith("unix:") or target.split(":")[0] in (
            "127.0.0.1",
            "localhost",
            "[::1]",
        )
        self.shm_threshold = shm_threshold if local else None
        self._token = token
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = timeout
        self._credentials = credentials
        self._channel: Any = None
        self._retired: Any = None
        self._target = ""
        self._ticket: Ticket | None = None
        self._models: list[RemoteModel] = []
        self._lane = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        try:
            if target.startswith("unix:"):
                # connect() names it as settings.Endpoint writes it: unix:/absolute/path
                with contextlib.suppress(OSError):  # no daemon: ServerLive below says so
                    self._ticket = request_ticket(target.removeprefix("unix:"), token, target)
            self._use(self._ticket)
            if lane and target.startswith("unix:"):
                self._lane = LaneClient(target.removeprefix("unix:"), token, timeout, target)
            self._greet(target, token, timeout)
        except BaseException:
            self.close()  # a channel left open would keep reconnecting, holding a connection
            raise

    def _use(self, ticket: Ticket | None) -> None:
        """Call gRPC on ``ticket``'s direct socket with it, or on the endpoint without one.

        The ticket rides in the channel's user agent (:data:`.tickets.AGENT`), which gRPC
        sends with every call anyway: as metadata of its own it cost ~9 µs a call. A new
        ticket is a new channel; the one before stays open for the calls still on it, until
        the next change (a ticket lasts at least the daemon's idle timeout)."""
        target = self.endpoint if ticket is None else f"unix:{ticket.direct}"
        self._ticket = ticket
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if ticket is not None:
            options.append(("grpc.primary_user_agent", f"{AGENT}{ticket.value}"))
        if self._retired is not None:
            self._retired.close()
        self._retired, self._target = self._channel, target
        self._channel = (
            grpc.insecure_channel(target, options=options)
            if self._credentials is None
            else grpc.secure_channel(target, self._credentials, options=options)
        )
        self._stub = pbg.GRPCInferenceServiceStub(self._channel)
        self._v1 = v1_grpc.RuntimeStub(self._channel)  # type: ignore[no-untyped-call]

    def _current(self) -> Any:
        """The KServe stub for the next call: with a ticket the daemon still holds (one it
        dropped, at its idle timeout or a restart, is replaced first)."""
        ticket = self._ticket
        if ticket is not None and not ticket.alive():
            self._renew(ticket)
        return self._stub

    def _renew(self, ticket: Ticket) -> None:
        """Replace ``ticket``, which the daemon no longer holds (unless another thread did)."""
        with self._lock:
            if self._ticket is not ticket:
                return
            ticket.close()
            path = self.endpoint.removeprefix("unix:")
            try:
                fresh = request_ticket(path, self._token, self.endpoint)
            except OSError:
                return  # no daemon there now: the call fails as it would have; tried again
            self._use(fresh)  # None: a daemon that issues no tickets, the main socket

    def _greet(self, target: str, token: str | None, timeout: float | None) -> None:
        """Check the daemon answers, and whether it speaks the lane."""
        try:
            self.call("ServerLive", pb.ServerLiveRequest())
        except ClosedError:
            if target.startswith("unix:"):
                _why_refused(target, token, timeout)  # a daemon that refused says why
            raise
        if self._lane is not None:
            try:
                self._lane.prepare()
            except LaneUnavailable:  # a daemon without the lane
                self._lane.close()
                self._lane = None

    @property
    def lane(self) -> bool:
        """Whether :meth:`RemoteModel.run` goes through the daemon's direct lane (a ``unix:``
        endpoint, ``lane=True``, and a daemon that has it) rather than gRPC."""
        return self._lane is not None

    def register_sealed(self, name: str, fd: int, byte_size: int) -> bool:
        """Register a sealed memfd as a region through the direct lane, passing the descriptor
        (the daemon maps it: no copies of inputs); ``False`` where there is no lane or the
        daemon does not take descriptors (register a named segment over gRPC instead)."""
        if self._lane is None:
            return False
        try:
            self._lane.register(name, fd, byte_size)
        except (LaneUnavailable, CrossrtError):
            return False
        return True

    def infer(
        self,
        request: pb.ModelInferRequest,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
    ) -> pb.ModelInferResponse:
        """One ModelInfer: through the direct lane when there is one, else gRPC.

        The daemon stops waiting for (or running) the request at the earlier of
        ``deadline`` (``time.monotonic()``) and the client's ``timeout``: gRPC carries the
        deadline, and on the lane the request's ``timeout`` parameter does. ``cancel``
        ends the call at once (``CancelledError``): gRPC cancels it, the lane hangs up; the
        daemon drops or stops the request either way.
        """
        seconds = self._seconds(deadline)
        if seconds is not None and seconds <= 0:
            raise _unsent(request)
        if self._lane is not None:
            if seconds is not None and "timeout" not in request.parameters:
                request.parameters["timeout"].int64_param = max(1, int(seconds * 1e6))
            try:
                # The socket waits the client's own timeout unless a deadline comes first.
                return self._lane.infer(request, None if deadline is None else seconds, cancel)
            except LaneUnavailable:  # a daemon without the lane: gRPC from now on
                self._lane.close()
                self._lane = None
        if cancel is None:
            return self._unary("ModelInfer", request, seconds)
        stub = self._current()
        call = stub.ModelInfer.future(request, timeout=seconds, metadata=self._metadata)
        if cancel is not None:
            cancel.on_cancel(call.cancel)
        try:
            return call.result()
        except grpc.FutureCancelledError:
            raise CancelledError from None
        except grpc.RpcError as exc:
            raise error_of(exc, self.endpoint) from None

    def _seconds(self, deadline: float | None) -> float | None:
        """Seconds a call may take: to ``deadline`` or the client's timeout, the earlier."""
        if deadline is None:
            return self._timeout
        left = deadline - time.monotonic()
        return left if self._timeout is None else min(left, self._timeout)

    def call(self, method: str, request: Any) -> Any:
        """One unary call (a KServe method, or ``v1.Method`` of crossrt.v1), its errors as
        crossrt's."""
        return self._unary(method, request, self._timeout)

    def _unary(self, method: str, request: Any, seconds: float | None) -> Any:
        """``method(request)`` within ``seconds``, its errors as crossrt's; once more with a
        new ticket when the daemon dropped the one sent while the call was on its way."""
        for again in (True, False):
            ticket = self._ticket
            stub = self._current()
            if method.startswith("v1."):
                stub, method = self._v1, method[3:]
            try:
                return getattr(stub, method)(request, timeout=seconds, metadata=self._metadata)
            except grpc.RpcError as exc:
                if not (again and ticket is not None and _ticket_refused(exc)):
                    raise error_of(exc, self.endpoint) from None
                self._renew(ticket)  # refused before it was served: safe to send again
        raise AssertionError("unreachable")

    def infer_async(
        self, request: pb.ModelInferRequest, deadline: float | None = None
    ) -> Future[pb.ModelInferResponse]:
        """One ModelInfer, answered in a future (errors crossrt's): on the direct lane from a
        pool of :data:`ASYNC_LANES` threads, else a gRPC future; ``deadline`` as
        :meth:`infer`'s."""
        if self._lane is not None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(ASYNC_LANES, thread_name_prefix="crossrt-lane")
            return self._pool.submit(self.infer, request, deadline)
        future: Future[pb.ModelInferResponse] = Future()
        seconds = self._seconds(deadline)
        if seconds is not None and seconds <= 0:
            future.set_exception(_unsent(request))
            return future
        stub = self._current()
        call = stub.ModelInfer.future(request, timeout=seconds, metadata=self._metadata)

        def done(call: Any) -> None:
            try:
                future.set_result(call.result())
            except grpc.RpcError as exc:
                future.set_exception(error_of(exc, self.endpoint))
            except BaseException as exc:
                future.set_exception(exc)

        call.add_done_callback(done)
        return future

    def __enter__(self) -> RemoteRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def models(self) -> list[RemoteModel]:
        """The models loaded through this client and not unloaded."""
        return list(self._models)

    def ready(self) -> bool:
        """Whether the daemon takes requests (ServerReady)."""
        return bool(self.call("ServerReady", pb.ServerReadyRequest()).ready)

    def devices(self) -> list[dict[str, Any]]:
        """The daemon's devices (``DeviceInfo.to_dict()`` of each)."""
        response = self.call("v1.Devices", v1.DevicesRequest())
        return [json.loads(d) for d in response.devices_json]

    def core_owners(self) -> dict[int, str]:
        """Host CPU -> ``"PID name"`` of the process holding it, as the daemon sees them."""
        return dict(self.call("v1.Devices", v1.DevicesRequest()).core_owners)

    def create_core_group(
        self, cores: int | None = None, *, indices: Sequence[int] | None = None
    ) -> RemoteCoreGroup:
        """A core group on the daemon (:meth:`Runtime.create_core_group`)."""
        request = v1.CreateCoreGroupRequest(cores=cores or 0, indices=list(indices or ()))
        group = self.call("v1.CreateCoreGroup", request)
        return RemoteCoreGroup(self, group.id, tuple(group.indices))

    def load(
        self,
        source: str | os.PathLike[str] | bytes,
        version: str = "",
        *,
        name: str | None = None,
        group: RemoteCoreGroup | None = None,
        **parameters: Any,
    ) -> RemoteModel:
        """A model on the daemon.

        Args:
            source: the name of a model of the daemon's repository (loaded if it is not);
                or a ``.crm`` / ``.onnx`` file here, or its bytes, sent to the daemon and
                served as ``name`` (default the file's stem) until unloaded or this process
                ends.
            version: for a repository model, the version wanted.
            name: the name a sent model is served as.
            group: load a sent model onto this core group, stopped (``model.start()``).
            **parameters: load parameters ``device``, ``instances``, ``cores``,
                ``queue_depth``, ``timeout``, ``precision`` (a repository model given any is
                loaded again with them); for a sent model also neuron-rtd's ``ninfer``,
                ``enable_tracing``, ``enable_node_profiling`` (docs/daemon.md).
        """
        path = None if isinstance(source, bytes) else Path(os.fspath(source))
        if path is None or path.is_file():
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
            served = name or (path.stem if path is not None else "")
            request = v1.LoadRequest(name=served, model=data, core_group=group.id if group else 0)
            for key, value in parameters.items():
                request.parameters[key] = str(value)
            loaded = self.call("v1.Load", request)
            model = RemoteModel(self, loaded.name, loaded.version)
            model.mode, model.profile = loaded.mode, loaded.profile or None
            return self._add(model)
        listed = str(source)
        ready = self.call("ModelReady", pb.ModelReadyRequest(name=listed, version=version)).ready
        if parameters or not ready:
            load = pb.RepositoryModelLoadRequest(model_name=listed)
            for key, value in parameters.items():
                load.parameters[key].string_param = str(value)
            self.call("RepositoryModelLoad", load)
        return self._add(RemoteModel(self, listed, version))

    def _add(self, model: RemoteModel) -> RemoteModel:
        self._models.append(model)
        return model

    def forget(self, model: RemoteModel) -> None:
        """Stop listing ``model`` (it closed)."""
        with contextlib.suppress(ValueError):
            self._models.remove(model)

    def close(self) -> None:
        """Release this client's shared memory and close the channel (the daemon's models
        stay loaded for its other clients)."""
        for model in self.models:
            model.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._lane is not None:
            self._lane.close()
        if self._ticket is not None:
            self._ticket.close()
        for channel in (self._channel, self._retired):
            if channel is not None:
                channel.close()
