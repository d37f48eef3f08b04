"""``connect(endpoint) -> RemoteRuntime``: a daemon's models behind the Runtime API.

Code moves between in-process and daemon by changing the line that makes the runtime (and
naming the model as the daemon's repository does)::

    rt = crossrt.Runtime()                             # in-process
    model = rt.load("models/mymodel.crm")

    rt = connect("unix:/run/crossrt/crossrt.sock")     # through crossrt serve
    model = rt.load("mymodel")                         # DIR/mymodel.crm of its repository

    outputs = model.run({"x": x})                      # the same dict of NumPy arrays

From ``shm_threshold`` bytes (inputs and static outputs together), a request's inputs, and
its outputs when their shapes are static, travel through a POSIX shared-memory segment of
this process (0600, registered with the daemon, reused) when the daemon is on this host,
instead of inside the gRPC messages. Errors are the runtime's (``CrossrtError`` with its
status code): the daemon sends the code in its message, and a gRPC status without one maps
through ``status.error_of``. A call pending on a daemon that dies fails at once with CLOSED; the
channel reconnects when the daemon is back.

What the KServe protocol lacks is not here yet: ``load`` of a file or bytes, core groups,
devices (the ``crossrt.v1`` service of issue 11).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from .. import dtypes
from ..errors import InvalidInputError
from ..model import TensorSpec
from ..runtime import TensorInfo
from ..runtime.memory.shm import SharedMemorySegment
from .settings import parse_endpoint
from .status import error_of

SHM_THRESHOLD = 1 << 20
"""Tensors of this many bytes or more go through shared memory when the daemon is local."""


def connect(
    endpoint: str | None = None,
    *,
    token: str | None = None,
    shm_threshold: int | None = SHM_THRESHOLD,
    timeout: float | None = None,
) -> RemoteRuntime:
    """A :class:`RemoteRuntime` on the daemon at ``endpoint`` (as ``crossrt serve -g`` takes
    it; default the daemon's default Unix socket).

    Args:
        token: the daemon's ``--token``.
        shm_threshold: bytes from which a request's tensors go through shared memory on a
            local daemon; ``None`` never.
        timeout: seconds each call may take.

    Raises:
        ClosedError: no daemon answers there.
    """
    from .settings import default_endpoint

    where = parse_endpoint(endpoint) if endpoint else default_endpoint()
    return RemoteRuntime(str(where), token, shm_threshold, timeout)


class RemoteRuntime:
    """The daemon's models with :class:`crossrt.Runtime`'s calls (made by :func:`connect`)."""

    def __init__(
        self, target: str, token: str | None, shm_threshold: int | None, timeout: float | None
    ) -> None:
        self.endpoint = target
        local = target.startswith("unix:") or target.split(":")[0] in (
            "127.0.0.1",
            "localhost",
            "[::1]",
        )
        self._shm_threshold = shm_threshold if local else None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ],
        )
        self._stub = pbg.GRPCInferenceServiceStub(self._channel)
        self._models: list[RemoteModel] = []
        self.call("ServerLive", pb.ServerLiveRequest())

    def call(self, method: str, request: Any) -> Any:
        """One unary call, its errors as crossrt's."""
        try:
            return getattr(self._stub, method)(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise error_of(exc, self.endpoint) from None

    def call_async(self, method: str, request: Any) -> Any:
        """A unary call's gRPC future."""
        return getattr(self._stub, method).future(
            request, timeout=self._timeout, metadata=self._metadata
        )

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

    def load(self, name: str, version: str = "", **parameters: Any) -> RemoteModel:
        """Model ``name`` of the daemon's repository, loaded if it is not (with load
        parameters ``device``, ``instances``, ``cores``, ``queue_depth``, ``timeout``,
        ``precision``: given any, it is loaded again with them)."""
        ready = self.call("ModelReady", pb.ModelReadyRequest(name=name, version=version)).ready
        if parameters or not ready:
            request = pb.RepositoryModelLoadRequest(model_name=name)
            for key, value in parameters.items():
                request.parameters[key].string_param = str(value)
            self.call("RepositoryModelLoad", request)
        model = RemoteModel(self, name, version)
        self._models.append(model)
        return model

    def _forget(self, model: RemoteModel) -> None:
        with contextlib.suppress(ValueError):
            self._models.remove(model)

    def close(self) -> None:
        """Release this client's shared memory and close the channel (the daemon's models
        stay loaded for its other clients)."""
        for model in self.models:
            model.close()
        self._channel.close()


class RemoteModel:
    """A model on the daemon, with :class:`crossrt.LoadedModel`'s calls."""

    def __init__(self, runtime: RemoteRuntime, name: str, version: str) -> None:
        self._rt = runtime
        meta = runtime.call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version))
        self.name = name
        self.version = meta.versions[0] if meta.versions else version
        self.inputs = tuple(_spec(t) for t in meta.inputs)
        self.outputs = tuple(_spec(t) for t in meta.outputs)
        # Static outputs can be asked for in shared memory: their sizes are known now.
        sizes = [_nbytes(s) for s in self.outputs]
        self._output_bytes = None if None in sizes else sum(s or 0 for s in sizes)
        self._segments: list[SharedMemorySegment] = []  # free ones, to reuse
        self._lock = threading.Lock()

    def tensor_info(self) -> list[TensorInfo]:
        """Inputs then outputs, as :meth:`LoadedModel.tensor_info`."""
        rows = []
        for usage, specs in (("input", self.inputs), ("output", self.outputs)):
            for s in specs:
                rows.append(TensorInfo(s.name, usage, str(s.dtype), s.shape, _nbytes(s)))
        return rows

    def run(self, inputs: Any) -> dict[str, np.ndarray]:
        """Run once; the outputs by name."""
        feed = self._feed(inputs)
        segment = self._segment(sum(a.nbytes for a in feed.values()) + (self._output_bytes or 0))
        try:
            response = self._rt.call("ModelInfer", self._request(feed, segment))
            return self._results(response, segment)
        finally:
            self._give_back(segment)

    def run_async(self, inputs: Any) -> Future[dict[str, np.ndarray]]:
        """Run once; a future of the outputs (``concurrent.futures``)."""
        feed = self._feed(inputs)
        segment = self._segment(sum(a.nbytes for a in feed.values()) + (self._output_bytes or 0))
        request = self._request(feed, segment)
        future: Future[dict[str, np.ndarray]] = Future()
        call = self._rt.call_async("ModelInfer", request)

        def done(call: Any) -> None:
            try:
                future.set_result(self._results(call.result(), segment))
            except grpc.RpcError as exc:
                future.set_exception(error_of(exc, self._rt.endpoint))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                self._give_back(segment)

        call.add_done_callback(done)
        return future

    async def infer(self, inputs: Any) -> dict[str, np.ndarray]:
        """``await model.infer(inputs)``: :meth:`run_async` for asyncio."""
        return await asyncio.wrap_future(self.run_async(inputs))

    def statistics(self) -> Any:
        """Triton's ``ModelStatistics`` message for this model."""
        request = pb.ModelStatisticsRequest(name=self.name, version=self.version)
        return self._rt.call("ModelStatistics", request).model_stats[0]

    def unload(self) -> None:
        """Unload it on the daemon (for every client)."""
        self.close()
        self._rt.call(
            "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=self.name)
        )

    def close(self) -> None:
        """Release this client's shared memory for the model."""
        self._rt._forget(self)
        with self._lock:
            segments, self._segments = self._segments, []
        for segment in segments:
            self._unregister(segment)

    # -- requests --------------------------------------------------------------------

    def _feed(self, inputs: Any) -> dict[str, np.ndarray]:
        if not isinstance(inputs, Mapping):
            if len(self.inputs) != 1:
                raise InvalidInputError(
                    f"model {self.name!r} has {len(self.inputs)} inputs; pass a dict by name"
                )
            inputs = {self.inputs[0].name: inputs}
        return {k: np.ascontiguousarray(v) for k, v in inputs.items()}

    def _request(
        self, feed: dict[str, np.ndarray], segment: SharedMemorySegment | None
    ) -> pb.ModelInferRequest:
        request = pb.ModelInferRequest(model_name=self.name, model_version=self.version)
        offset = 0
        for name, array in feed.items():
            tensor = request.inputs.add(
                name=name, datatype=_kserve(array, name), shape=list(array.shape)
            )
            if segment is None:
                request.raw_input_contents.append(array.tobytes())
                continue
            segment.array()[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)
            tensor.parameters["shared_memory_region"].string_param = str(segment.name)
            tensor.parameters["shared_memory_offset"].int64_param = offset
            tensor.parameters["shared_memory_byte_size"].int64_param = array.nbytes
            offset += array.nbytes
        if segment is not None and self._output_bytes is not None:
            for spec in self.outputs:
                size = _nbytes(spec) or 0
                wanted = request.outputs.add(name=spec.name)
                wanted.parameters["shared_memory_region"].string_param = str(segment.name)
                wanted.parameters["shared_memory_offset"].int64_param = offset
                wanted.parameters["shared_memory_byte_size"].int64_param = size
                offset += size
        return request

    def _results(
        self, response: pb.ModelInferResponse, segment: SharedMemorySegment | None
    ) -> dict[str, np.ndarray]:
        results = {}
        for i, out in enumerate(response.outputs):
            dtype = dtypes.from_kserve(out.datatype).numpy
            params = out.parameters
            if segment is not None and "shared_memory_region" in params:
                start = params["shared_memory_offset"].int64_param
                raw: Any = segment.array()[
                    start : start + params["shared_memory_byte_size"].int64_param
                ]
            else:
                raw = response.raw_output_contents[i]
            results[out.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(out.shape)).copy()
        return results

    # -- shared memory -------------------------------------------------------------------

    def _segment(self, nbytes: int) -> SharedMemorySegment | None:
        threshold = self._rt._shm_threshold
        if threshold is None or nbytes < threshold:
            return None
        with self._lock:
            for segment in self._segments:
                if segment.size >= nbytes:
                    self._segments.remove(segment)
                    return segment
        segment = SharedMemorySegment(nbytes, kind="posix", keep_name=True)
        request = pb.SystemSharedMemoryRegisterRequest(
            name=str(segment.name), key=f"/{segment.name}", byte_size=nbytes
        )
        try:
            self._rt.call("SystemSharedMemoryRegister", request)
        except Exception:  # the daemon cannot read it (another host, another user): inline
            segment.close()
            self._rt._shm_threshold = None
            return None
        return segment

    def _give_back(self, segment: SharedMemorySegment | None) -> None:
        if segment is not None:
            with self._lock:
                self._segments.append(segment)

    def _unregister(self, segment: SharedMemorySegment) -> None:
        with contextlib.suppress(Exception):
            request = pb.SystemSharedMemoryUnregisterRequest(name=str(segment.name))
            self._rt.call("SystemSharedMemoryUnregister", request)
        segment.close()


def _nbytes(spec: TensorSpec) -> int | None:
    """Bytes of a static tensor, ``None`` for a dynamic one."""
    if not spec.is_static or spec.dtype is None or not spec.dtype.itemsize:
        return None
    return math.prod(d for d in spec.shape or () if isinstance(d, int)) * spec.dtype.itemsize


def _spec(meta: Any) -> TensorSpec:
    dtype = dtypes.from_kserve(meta.datatype) if meta.datatype != "BYTES" else None
    shape = tuple(int(d) if d >= 0 else None for d in meta.shape)
    return TensorSpec(meta.name, dtype, shape)


def _kserve(array: np.ndarray, name: str) -> str:
    kserve = dtypes.from_numpy(array.dtype).kserve
    if kserve is None or kserve == "BYTES":
        raise InvalidInputError(
            f"input {name!r}: {array.dtype} has no KServe datatype the daemon carries; "
            "run this model in-process"
        )
    return kserve
