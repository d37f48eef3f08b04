"""A model on the daemon with :class:`crossrt.LoadedModel`'s calls, and a core group on it:
what :class:`client.RemoteRuntime` hands out, over any :class:`Connection`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from .. import dtypes
from ..drivers.base import CancelToken, copy_into
from ..errors import CrossrtError, InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from ..runtime import TensorInfo
from ..runtime.inputs import output_names_checked
from ..runtime.memory.shm import SharedMemorySegment
from ..runtime.statistics import ModelStatistics
from .proto import runtime_pb2 as v1
from .tensors import decode_bytes, encode_bytes


class Connection(Protocol):
    """What a remote model needs of its client (:class:`client.RemoteRuntime`)."""

    endpoint: str
    shm_threshold: int | None

    def call(self, method: str, request: Any) -> Any: ...

    def infer(
        self,
        request: pb.ModelInferRequest,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
    ) -> pb.ModelInferResponse: ...

    def infer_async(
        self, request: pb.ModelInferRequest, deadline: float | None = None
    ) -> Future[pb.ModelInferResponse]: ...

    def forget(self, model: RemoteModel) -> None: ...

    @property
    def lane(self) -> bool: ...

    def register_sealed(self, name: str, fd: int, byte_size: int) -> bool: ...


class RemoteModel:
    """A model on the daemon, with :class:`crossrt.LoadedModel`'s calls."""

    def __init__(self, runtime: Connection, name: str, version: str) -> None:
        self._rt = runtime
        meta = runtime.call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version))
        self.name = name
        self.version = meta.versions[0] if meta.versions else version
        self.inputs = tuple(_spec(t) for t in meta.inputs)
        self.outputs = tuple(_spec(t) for t in meta.outputs)
        self._by_name = {s.name: s for s in self.outputs}
        # Static outputs can be asked for in shared memory: their sizes are known now.
        sizes = [_nbytes(s) for s in self.outputs]
        self._output_bytes = None if None in sizes else sum(s or 0 for s in sizes)
        self._segments: list[SharedMemorySegment] = []  # free ones, to reuse
        # Those registered with the daemon now, free or in use: forgotten when it is found
        # to know none of them (started again), so that those in use are closed when done.
        self._live: set[SharedMemorySegment] = set()
        self._lock = threading.Lock()
        self.mode = ""
        """For a model sent with crossrt.v1 Load: how its nodes share its cores, ``shared``
        or ``normal`` (docs/daemon.md, "neuron-rtd semantics")."""
        self.profile: str | None = None
        """For a model loaded with ``enable_tracing`` / ``enable_node_profiling``: the file
        on the daemon's host its profile is written to at unload."""

    def tensor_info(self) -> list[TensorInfo]:
        """Inputs then outputs, as :meth:`LoadedModel.tensor_info`."""
        rows = []
        for usage, specs in (("input", self.inputs), ("output", self.outputs)):
            for s in specs:
                rows.append(TensorInfo(s.name, usage, str(s.dtype), s.shape, _nbytes(s)))
        return rows

    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, np.ndarray] | None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run once; the outputs by name.

        Args:
            inputs: ``{name: array}``, a list in input order, or one array for a one-input
                model.
            outputs: ``{name: NumPy array}``: those outputs are written into the arrays
                given (of the output's dtype and shape), which the result holds, as
                :meth:`LoadedModel.run` does; the others are new arrays.
            deadline: a ``time.monotonic()`` time by which the result is wanted, as
                :meth:`LoadedModel.run`'s: the daemon does not run a request still queued
                then and stops a running one where the engine can (TIMEOUT).
            cancel: a :class:`crossrt.CancelToken` (one per call) whose ``cancel()`` ends
                the call at once with ``CancelledError``; the daemon drops or stops the
                request.
            output_names: only these outputs, in this order (the request's KServe
                ``outputs``), as :meth:`LoadedModel.run`'s: the daemon fetches only those.

        Raises:
            InvalidInputError: an ``output_names`` entry the model has no output of (before
                anything is sent), naming its outputs.
            DeadlineExceededError: (TIMEOUT) the deadline, or the client's timeout, passed.
            CrossrtError: the daemon's error, with its code.
        """
        feed = self._feed(inputs)
        into = self._buffers(outputs)
        names = (
            None
            if output_names is None
            else output_names_checked(self.name, list(self._by_name), output_names, into)
        )
        try:
            return self._run(feed, deadline, cancel, into, names)
        except CrossrtError as exc:
            if not self._forgotten(exc):
                raise
        # A daemon started again: segments anew.
        return self._run(feed, deadline, cancel, into, names)

    def _run(
        self,
        feed: dict[str, np.ndarray],
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        into: dict[str, np.ndarray] | None = None,
        names: tuple[str, ...] | None = None,
    ) -> dict[str, np.ndarray]:
        segment = self._segment_for(feed)
        try:
            response = self._rt.infer(self._request(feed, segment, names), deadline, cancel)
            return self._results(response, segment, into)
        finally:
            self._give_back(segment)

    def _buffers(self, outputs: Any) -> dict[str, np.ndarray] | None:
        """``outputs=`` checked before anything is sent: output names, writable arrays."""
        if outputs is None:
            return None
        if not isinstance(outputs, Mapping):
            raise InvalidArgumentError(
                f"outputs= is a dict of output name to NumPy array, not {type(outputs).__name__}"
            )
        names = [s.name for s in self.outputs]
        for name, buffer in outputs.items():
            if name not in names:
                raise InvalidArgumentError(
                    f"model {self.name!r} has no output {name!r}; its outputs: {', '.join(names)}"
                )
            if type(buffer) is not np.ndarray or not buffer.flags.writeable:
                raise InvalidArgumentError(
                    f"outputs[{name!r}] is a {type(buffer).__name__}; give a writable NumPy array "
                    "(the daemon's answer is copied into it)"
                )
        return dict(outputs)

    def _forgotten(self, exc: CrossrtError) -> bool:
        """Whether ``exc`` says the daemon knows none of this model's segments (it was
        started again since they were registered); then they are dropped, to be made and
        registered anew."""
        if _FORGOTTEN not in exc.message:
            return False
        with self._lock:
            segments, self._segments = self._segments, []
            self._live.clear()  # those in use now are closed when given back
        for segment in segments:
            segment.close()  # the daemon holds no registration of it to undo
        return True

    def run_async(
        self,
        inputs: Any,
        outputs: Mapping[str, np.ndarray] | None = None,
        *,
        deadline: float | None = None,
    ) -> Future[dict[str, np.ndarray]]:
        """Run once; a future of the outputs (``concurrent.futures``); ``outputs`` and
        ``deadline`` as :meth:`run`'s (keep the arrays of ``outputs`` until it is done)."""
        feed = self._feed(inputs)
        into = self._buffers(outputs)
        segment = self._segment_for(feed)
        answer = self._rt.infer_async(self._request(feed, segment), deadline)
        future: Future[dict[str, np.ndarray]] = Future()

        def done(answer: Future[pb.ModelInferResponse]) -> None:
            try:
                try:
                    result = self._results(answer.result(), segment, into)
                except CrossrtError as exc:
                    if segment is None or not self._forgotten(exc):
                        raise
                    result = self._run(feed, deadline, None, into)  # in this thread: rare
                future.set_result(result)
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                self._give_back(segment)

        answer.add_done_callback(done)
        return future

    async def infer(
        self,
        inputs: Any,
        outputs: Mapping[str, np.ndarray] | None = None,
        *,
        deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        """``await model.infer(inputs)``: :meth:`run_async` for asyncio."""
        return await asyncio.wrap_future(self.run_async(inputs, outputs, deadline=deadline))

    def start(self) -> None:
        """Run it on its core group (stopping the group's running model)."""
        self._rt.call("v1.Start", v1.ModelRequest(name=self.name))

    def stop(self) -> None:
        """Stop it on its core group."""
        self._rt.call("v1.Stop", v1.ModelRequest(name=self.name))

    def post(self, inputs: Any) -> int:
        """Queue one run on the daemon (neuron-rtd's infer_post); its cookie for :meth:`wait`.
        Tensors travel inside the message."""
        request = self._request(self._feed(inputs), None)
        post = v1.InferPostRequest(model_infer_request=request.SerializeToString())
        return int(self._rt.call("v1.InferPost", post).cookie)

    def wait(self, cookie: int, timeout: float | None = None) -> dict[str, np.ndarray] | None:
        """The outputs of a posted run (infer_wait); ``None`` when not done within
        ``timeout`` seconds (it stays posted)."""
        request = v1.InferWaitRequest(cookie=cookie, timeout=timeout or 0.0)
        answer = self._rt.call("v1.InferWait", request)
        if not answer.done:
            return None
        return self._results(pb.ModelInferResponse.FromString(answer.model_infer_response), None)

    def cancel(self, cookie: int) -> bool:
        """Cancel a posted run still queued; whether it was."""
        return bool(self._rt.call("v1.Cancel", v1.CancelRequest(cookie=cookie)).cancelled)

    def statistics(self) -> ModelStatistics:
        """This model's statistics in the daemon, as ``LoadedModel.statistics()`` gives
        them in-process (with the requests the daemon answered from its response cache, and
        those it refused before they reached the model as ``failures["REFUSED"]``)."""
        answer = self._rt.call("v1.Statistics", v1.ModelRequest(name=self.name))
        return ModelStatistics.from_dict(json.loads(answer.statistics_json))

    def triton_statistics(self) -> Any:
        """Triton's ``ModelStatistics`` message for this model (KServe's fields only)."""
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
        self._rt.forget(self)
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
        self,
        feed: dict[str, np.ndarray],
        segment: SharedMemorySegment | None,
        names: tuple[str, ...] | None = None,
    ) -> pb.ModelInferRequest:
        """The request for ``feed``: every output, or those ``names`` (KServe ``outputs``),
        into ``segment`` where it is given and the outputs are static."""
        request = pb.ModelInferRequest(model_name=self.name, model_version=self.version)
        offset = 0
        for name, array in feed.items():
            tensor = request.inputs.add(
                name=name, datatype=_kserve(array, name), shape=list(array.shape)
            )
            if segment is None:
                raw = encode_bytes(array) if array.dtype == object else array.tobytes()
                request.raw_input_contents.append(raw)
                continue
            segment.array()[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)
            tensor.parameters["shared_memory_region"].string_param = str(segment.name)
            tensor.parameters["shared_memory_offset"].int64_param = offset
            tensor.parameters["shared_memory_byte_size"].int64_param = array.nbytes
            offset += array.nbytes
        specs = self.outputs if names is None else [self._by_name[n] for n in names]
        if segment is None or self._output_bytes is None:
            for spec in specs if names is not None else ():
                request.outputs.add(name=spec.name)
        else:
            for spec in specs:
                size = _nbytes(spec) or 0
                wanted = request.outputs.add(name=spec.name)
                wanted.parameters["shared_memory_region"].string_param = str(segment.name)
                wanted.parameters["shared_memory_offset"].int64_param = offset
                wanted.parameters["shared_memory_byte_size"].int64_param = size
                offset += size
        return request

    def _results(
        self,
        response: pb.ModelInferResponse,
        segment: SharedMemorySegment | None,
        into: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The outputs of ``response`` (read from ``segment`` where the daemon wrote them
        there), copied into the arrays of ``into`` for those it names."""
        results = {}
        given: dict[str, np.ndarray] = {}
        for i, out in enumerate(response.outputs):
            shape = tuple(out.shape)
            if out.datatype == "BYTES":  # strings come inside the message (see _request)
                raw_bytes = response.raw_output_contents[i]
                what = f"output {out.name!r}"
                results[out.name] = decode_bytes(raw_bytes, math.prod(shape), what).reshape(shape)
                continue
            dtype = dtypes.from_kserve(out.datatype).numpy
            params = out.parameters if segment is not None else None
            if params is not None and "shared_memory_region" in params:
                start = params["shared_memory_offset"].int64_param
                raw: Any = segment.array()[  # type: ignore[union-attr]
                    start : start + params["shared_memory_byte_size"].int64_param
                ]
            else:
                raw = response.raw_output_contents[i]
            value = np.frombuffer(raw, dtype=dtype).reshape(shape)
            if into is not None and out.name in into:
                given[out.name] = value  # copied once, into the caller's array
            else:
                results[out.name] = value.copy()
        if given:
            assert into is not None
            results |= copy_into(given, {n: into[n] for n in given})
        return results

    # -- shared memory -------------------------------------------------------------------

    def _segment_for(self, feed: dict[str, np.ndarray]) -> SharedMemorySegment | None:
        """A registered segment for these inputs and the static outputs, when they are large
        enough; never for strings (BYTES travel in the message: their size is their encoding)."""
        if any(a.dtype == object for a in feed.values()):
            return None
        return self._segment(sum(a.nbytes for a in feed.values()) + (self._output_bytes or 0))

    def _segment(self, nbytes: int) -> SharedMemorySegment | None:
        threshold = self._rt.shm_threshold
        if threshold is None or nbytes < threshold:
            return None
        with self._lock:
            for segment in self._segments:
                if segment.size >= nbytes:
                    self._segments.remove(segment)
                    return segment
        made = self._registered(nbytes)
        if made is not None:
            with self._lock:
                self._live.add(made)
        return made

    def _registered(self, nbytes: int) -> SharedMemorySegment | None:
        """A new segment of ``nbytes``, registered with the daemon; ``None`` (and tensors
        inside the messages from now on) where the daemon cannot read this process's."""
        if self._rt.lane:  # a sealed memfd, passed over the lane: the daemon maps it
            sealed = SharedMemorySegment(nbytes, kind="memfd")
            if self._rt.register_sealed(str(sealed.name), sealed.fd, nbytes):
                return sealed
            sealed.close()
        segment = SharedMemorySegment(nbytes, kind="posix", keep_name=True)
        request = pb.SystemSharedMemoryRegisterRequest(
            name=str(segment.name), key=f"/{segment.name}", byte_size=nbytes
        )
        try:
            self._rt.call("SystemSharedMemoryRegister", request)
        except Exception:  # the daemon cannot read it (another host, another user): inline
            segment.close()
            self._rt.shm_threshold = None
            return None
        return segment

    def _give_back(self, segment: SharedMemorySegment | None) -> None:
        if segment is None:
            return
        with self._lock:
            current = segment in self._live
            if current:
                self._segments.append(segment)
        if not current:
            segment.close()  # registered with a daemon that is gone

    def _unregister(self, segment: SharedMemorySegment) -> None:
        with self._lock:
            self._live.discard(segment)
        with contextlib.suppress(Exception):
            request = pb.SystemSharedMemoryUnregisterRequest(name=str(segment.name))
            self._rt.call("SystemSharedMemoryUnregister", request)
        segment.close()


class RemoteCoreGroup:
    """A core group on the daemon (:meth:`RemoteRuntime.create_core_group`)."""

    def __init__(self, runtime: Connection, number: int, indices: tuple[int, ...]) -> None:
        self._rt = runtime
        self.id = number
        self.indices = indices

    def destroy(self) -> None:
        """Give its cores back (only an empty group)."""
        self._rt.call("v1.DestroyCoreGroup", v1.CoreGroup(id=self.id))


_FORGOTTEN = "no shared-memory region"
"""How the daemon's error for a region it does not know begins (regions.Regions)."""


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
    if array.dtype == object:  # strings: KServe BYTES
        return "BYTES"
    kserve = dtypes.from_numpy(array.dtype).kserve
    if kserve is None:
        raise InvalidInputError(
            f"input {name!r}: {array.dtype} has no KServe datatype the daemon carries; "
            "run this model in-process"
        )
    return kserve
