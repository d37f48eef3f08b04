"""KServe v2 over HTTP/REST (``crossrt serve --http HOST:PORT``), as Triton serves it beside
gRPC: health, server and model metadata, model readiness and inference, in JSON, with the
binary tensor data extension. Requests go to the same service as gRPC's and the lane's
(:class:`kserve.InferenceService`): the same checks, errors, statistics, token and drain.

- ``GET /v2/health/live``, ``GET /v2/health/ready``: 200, or 400 when not ready (draining).
- ``GET /v2``: the server's name, version and extensions.
- ``GET /v2/models/NAME[/versions/V]``: the model's metadata; ``.../ready``: 200 or 400.
- ``POST /v2/models/NAME[/versions/V]/infer``: a JSON request
  (``{"id", "parameters", "inputs": [{"name", "shape", "datatype", "data"}], "outputs":
  [{"name", "parameters": {"binary_data": bool}}]}``). Binary extension: with the header
  ``Inference-Header-Content-Length: N`` the body is N bytes of JSON, then each input whose
  ``parameters.binary_data_size`` is given, in order; outputs asked for with
  ``binary_data`` (or ``parameters.binary_data_output`` for all) come back the same way.

- ``GET /v2/models/stats``, ``GET /v2/models/NAME[/versions/V]/stats``: the statistics
  extension (``{"model_stats": [...]}``, Triton's fields).
- ``GET /v2/models/NAME[/versions/V]/config``, ``/v2/systemsharedmemory/...`` and
  ``/v2/cudasharedmemory/...``: the model configuration and shared-memory extensions
  (:mod:`.rest_extensions`).
- ``POST /v2/repository/index`` (``{"ready": bool}``), ``POST
  /v2/repository/models/NAME/load`` (``{"parameters": {...}}``: the load parameters) and
  ``.../unload``: the repository extension.

The header ``Authorization: Bearer <token>`` says who sends a request (docs/security.md): a
client is anonymous without a per-user token, and the repository's load and unload are the
operator's. Inputs and outputs may name registered system shared-memory regions
(``parameters`` ``shared_memory_region``, ``shared_memory_byte_size``,
``shared_memory_offset``), as on gRPC, for a token that names a local user: an anonymous
client sends its tensors in the request. Errors are ``{"error": message}`` with the HTTP
status for their gRPC code; a request whose JSON does not have KServe's form (a shape that is
not a list of dimensions, a dimension past 2**63, nesting too deep to parse) is 400.

Bounded before anything is paid for: at most ``connections`` are served at once (one more is
answered 503 and closed, without a thread); a client has ``timeout`` seconds to send a
request's headers (or to start the next one on a kept-alive connection), and its body
``timeout`` more plus a second per MiB; the token is checked before the body is read; a
``Content-Length`` over ``max_body``, or a JSON part over ``max_json``, is answered 413
unread; the body is read as it arrives, never reserved whole from what the client declares;
and JSON numbers are parsed straight into the tensor (:mod:`.rest_json`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

import grpc
import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from .. import dtypes
from . import rest_json
from .gate import Gate
from .http_bounds import BoundedServer, Refused
from .kserve import InferenceService
from .peers import Peer, identify
from .rest_checks import json_count, json_object, json_shape, json_shared_memory
from .rest_extensions import model_config, shared_memory_get, shared_memory_post
from .rest_json import Numbers, loads
from .status import ServiceError, status_of
from .tensors import decode_bytes, encode_bytes

log = logging.getLogger("crossrt.serve")

HEADER_LENGTH = "Inference-Header-Content-Length"
MiB = 2**20
BODY_SECONDS_PER_MIB = 1.0
"""A body may take ``timeout`` seconds plus this per MiB to arrive."""

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.OUT_OF_RANGE: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: HTTPStatus.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
    grpc.StatusCode.CANCELLED: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
}


def error_answer(exc: Exception) -> tuple[int, dict[str, str]]:
    """A failed request's HTTP status and JSON answer (``{"error": message}``), the status
    standing for the error's gRPC code; an unexpected error is logged."""
    code, message = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("an HTTP request failed")
    return _HTTP_STATUS.get(code, HTTPStatus.INTERNAL_SERVER_ERROR), {"error": message}


def _bad(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


class RestRoutes:
    """KServe v2's HTTP/REST routes over a KServe service, without a server of their own:
    :class:`HttpFront` serves them, and so does a Ray Serve replica (crossrt.scaleout.ray),
    with the same checks and conversions.

    Args:
        service: the KServe service the requests go to.
    """

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    def get(self, path: list[str], peer: Peer) -> tuple[int, Any]:
        """A GET's status and JSON answer (``peer``: who asks, for shared memory)."""
        ready = self.service.ServerReady(pb.ServerReadyRequest(), None).ready
        if path == ["health", "live"]:
            return HTTPStatus.OK, {}
        if path == ["health", "ready"]:
            return (HTTPStatus.OK if ready else HTTPStatus.BAD_REQUEST), {}
        if not path:
            meta = self.service.ServerMetadata(pb.ServerMetadataRequest(), None)
            return HTTPStatus.OK, {
                "name": meta.name,
                "version": meta.version,
                "extensions": list(meta.extensions),
            }
        if path == ["models", "stats"]:
            return HTTPStatus.OK, self._statistics("", "")
        if path[:1] in (["systemsharedmemory"], ["cudasharedmemory"]):
            return HTTPStatus.OK, shared_memory_get(self.service, path, peer)
        name, version, rest = _model_path(path)
        if rest == ["stats"]:
            return HTTPStatus.OK, self._statistics(name, version)
        if rest == ["config"]:
            return HTTPStatus.OK, model_config(self.service, name, version)
        if rest == ["ready"]:
            answer = self.service.ModelReady(pb.ModelReadyRequest(name=name, version=version), None)
            return (HTTPStatus.OK if answer.ready else HTTPStatus.BAD_REQUEST), {}
        if rest:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: /v2/{'/'.join(path)}")
        meta = self.service.ModelMetadata(pb.ModelMetadataRequest(name=name, version=version), None)
        return HTTPStatus.OK, {
            "name": meta.name,
            "versions": list(meta.versions),
            "platform": meta.platform,
            "inputs": [_tensor_meta(t) for t in meta.inputs],
            "outputs": [_tensor_meta(t) for t in meta.outputs],
        }

    def _statistics(self, name: str, version: str) -> Any:
        request = pb.ModelStatisticsRequest(name=name, version=version)
        return plain(self.service.ModelStatistics(request, None))

    def repository(self, path: list[str], body: bytes | bytearray, peer: Peer) -> Any:
        """A POST under ``/v2/repository``: the index, or a model's load or unload (Triton's
        HTTP paths) by ``peer``; its JSON answer."""
        doc = _json(body) if body.strip() else {}
        if path == ["index"]:
            request = pb.RepositoryIndexRequest(ready=bool(doc.get("ready", False)))
            return plain(self.service.RepositoryIndex(request, None))["models"]
        if len(path) == 3 and path[0] == "models" and path[2] in ("load", "unload"):
            if path[2] == "unload":
                self.service.unload_model(path[1], peer)
                return {}
            values = {
                str(key): value if isinstance(value, bool | int) else str(value)
                for key, value in json_object(
                    doc.get("parameters"), "the load's 'parameters'"
                ).items()
            }
            self.service.load_model(path[1], values, peer)
            return {}
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND, f"no such path: /v2/repository/{'/'.join(path)}"
        )

    def infer(
        self,
        path: list[str],
        body: bytes | bytearray,
        header_length: int | None,
        peer: Peer,
    ) -> tuple[bytes, int | None]:
        """A POST .../infer: the answer's body, and its JSON part's length when binary
        data follows it."""
        name, version, rest = _model_path(path)
        if rest != ["infer"]:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: /v2/{'/'.join(path)}")
        length = len(body) if header_length is None else header_length
        if not 0 <= length <= len(body):
            raise _bad(f"{HEADER_LENGTH} {length} is beyond the body's {len(body)} bytes")
        doc = _json(memoryview(body)[:length])
        try:
            request = _request(doc, name, version, memoryview(body)[length:])
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # what the checks in _request did not name: still the client's JSON, not a fault
            raise _bad(f"the request does not have KServe's form ({str(exc)[:200]})") from None
        kept: dict[str, np.ndarray] = {}
        return _response(self.service.infer(request, lambda: peer, kept=kept), doc, kept)


class HttpFront(RestRoutes):
    """The HTTP/REST endpoint of a daemon.

    Args:
        address: ``(host, port)`` to listen on (port 0: any free one, see :attr:`port`).
        service: the daemon's KServe service.
        gate: the daemon's token and drain.
        max_body: the largest body taken (``max_message_bytes``).
        max_json: the largest JSON part taken (``max_json_bytes``).
        connections: connections served at once (``http_connections``).
        timeout: seconds a client has to send a request's headers (``http_timeout``).
    """

    def __init__(
        self,
        address: tuple[str, int],
        service: InferenceService,
        gate: Gate,
        max_body: int = 256 * MiB,
        max_json: int = 32 * MiB,
        connections: int = 64,
        timeout: float = 30.0,
    ) -> None:
        front = self

        class Handler(_Handler):
            owner = front

        class Server(BoundedServer):
            address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

        self.service = service
        self.gate = gate
        self.max_body = max_body
        self.max_json = max_json
        self.timeout = timeout
        self._server = Server(address, Handler, connections)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="crossrt-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop listening (the drain has waited for the requests under way)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    owner: HttpFront
    peer: Peer
    """Who sent the request being handled: anonymous, or its token's user."""
    protocol_version = "HTTP/1.1"
    server_version = "crossrt"

    def setup(self) -> None:
        super().setup()
        # The headers and the body go out in two writes: with Nagle's algorithm the body
        # waited for the client's delayed ACK, 40 ms a request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._deadline = float("inf")

    def handle_one_request(self) -> None:
        # The headers of each request (the next one on a kept-alive connection too) within
        # the timeout, else the connection is shut (BaseHTTPRequestHandler sees it end).
        server: BoundedServer = self.server  # type: ignore[assignment]
        self._deadline = server.watch(self.connection, self.owner.timeout)
        super().handle_one_request()

    def finish(self) -> None:
        server: BoundedServer = self.server  # type: ignore[assignment]
        server.forget(self.connection)  # before it is closed
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:
        self._handle(lambda path: self._json(*self.owner.get(path, self.peer)))

    def do_POST(self) -> None:
        def post(path: list[str]) -> None:
            given_size = self.headers.get("Content-Length") or "0"
            size = int(given_size) if given_size.isdigit() else -1
            if size < 0:
                raise _bad(f"Content-Length {given_size!r} is not a number of bytes")
            given = self.headers.get(HEADER_LENGTH)
            try:
                header_length = None if given is None else int(given)
            except ValueError:
                raise _bad(f"{HEADER_LENGTH} {given!r} is not a number of bytes") from None
            owner = self.owner
            if size > owner.max_body:
                raise Refused(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"a body of {size} bytes is over this daemon's limit of {owner.max_body} "
                    "(max_message_bytes); send large tensors over gRPC or the lane through "
                    "shared memory, or start crossrt serve with a larger --max-message-bytes",
                )
            json_size = size if header_length is None else header_length
            if json_size > owner.max_json:
                raise Refused(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"a JSON request of {json_size} bytes is over this daemon's limit of "
                    f"{owner.max_json} (max_json_bytes); send tensors as binary data "
                    f"({HEADER_LENGTH}), or start crossrt serve with a larger "
                    "--max-json-bytes",
                )
            body = self._body(size)
            # Counted by the drain until the answer is sent, not only computed: the daemon
            # stops once the drain ends.
            self.owner.gate.enter()
            try:
                if path[:1] == ["repository"]:
                    self._json(HTTPStatus.OK, self.owner.repository(path[1:], body, self.peer))
                    return
                if path[:1] in (["systemsharedmemory"], ["cudasharedmemory"]):
                    doc = _json(body) if body.strip() else {}
                    self._json(
                        HTTPStatus.OK,
                        shared_memory_post(self.owner.service, path, doc, self.peer),
                    )
                    return
                answer, json_length = self.owner.infer(path, body, header_length, self.peer)
                extra = {} if json_length is None else {HEADER_LENGTH: str(json_length)}
                binary = json_length is not None
                content = "application/octet-stream" if binary else "application/json"
                self._send(HTTPStatus.OK, answer, content, extra)
            finally:
                self.owner.gate.leave()

        self._handle(post)

    def _body(self, size: int) -> bytes | bytearray:
        """The body, read as it arrives (never reserved whole from what the client declares),
        within the timeout plus a second per MiB."""
        server: BoundedServer = self.server  # type: ignore[assignment]
        seconds = self.owner.timeout + size / MiB * BODY_SECONDS_PER_MIB
        self._deadline = server.watch(self.connection, seconds)
        if size <= MiB:
            body: bytes | bytearray = self.rfile.read(size)
        else:
            body = bytearray()
            while len(body) < size:
                chunk = self.rfile.read1(min(size - len(body), MiB))
                if not chunk:
                    break
                body += chunk
        if len(body) != size:
            if time.monotonic() > self._deadline:  # shut by the reaper
                raise TimeoutError("the body did not arrive in time")
            raise _bad(f"the body ended after {len(body)} of its {size} bytes")
        server.watch(self.connection, float("inf"))  # answered in its own time
        return body

    def _handle(self, action: Callable[[list[str]], None]) -> None:
        server: BoundedServer = self.server  # type: ignore[assignment]
        server.watch(self.connection, float("inf"))  # the headers came: no deadline while served
        try:
            parts = [unquote(p) for p in self.path.split("?")[0].split("/") if p]
            if parts[:1] != ["v2"]:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: {self.path}")
            grant = None  # health needs no token
            if parts[1:3] not in (["health", "live"], ["health", "ready"]):
                grant = self.owner.gate.grant(self.headers.get("Authorization"))
            host, port = self.client_address[:2]
            kind = "ipv6" if ":" in host else "ipv4"
            self.peer = identify(f"{kind}:{host}:{port}", {}, grant)
            action(parts[1:])
        except (Refused, TimeoutError) as exc:
            # The body is not read: the connection cannot carry another request.
            self.close_connection = True
            if isinstance(exc, TimeoutError):
                log.debug("http %s: %s", self.client_address[0], exc)
                exc = Refused(
                    HTTPStatus.REQUEST_TIMEOUT,
                    f"the request did not arrive within {self.owner.timeout:g} s plus "
                    f"{BODY_SECONDS_PER_MIB:g} s per MiB of body (http_timeout)",
                )
            self._json(exc.status, {"error": exc.message})
        except Exception as exc:
            # The body may not have been read: the connection cannot carry another request.
            self.close_connection = True
            self._json(*error_answer(exc))

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json", {})

    def _send(self, status: int, body: bytes, content: str, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content)
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra.items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")  # the client opens another
        self.end_headers()
        self.wfile.write(body)


def _json(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A request body's JSON object (long arrays of numbers as :class:`rest_json.Numbers`)."""
    try:
        doc = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"the request is not JSON ({str(exc)[:200]})") from None
    except RecursionError:
        raise _bad("the request's JSON nests too deep; KServe's needs a few levels") from None
    if not isinstance(doc, dict):
        raise _bad("the request is a JSON object")
    return doc


def plain(message: Any) -> Any:
    """A protobuf message as JSON values, every field present (zeros too), 64-bit integers
    as numbers, as Triton's HTTP answers carry them."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = {k: _scalar(v) for k, v in value.items()}
        elif field.label == field.LABEL_REPEATED:
            out[field.name] = [_scalar(v) for v in value]
        else:
            out[field.name] = _scalar(value)
    return out


def _scalar(value: Any) -> Any:
    return plain(value) if hasattr(value, "DESCRIPTOR") else value


def _model_path(path: list[str]) -> tuple[str, str, list[str]]:
    """``models/NAME[/versions/V]/REST...``: (name, version, rest)."""
    if len(path) < 2 or path[0] != "models":
        raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: /v2/{'/'.join(path)}")
    name, rest = path[1], path[2:]
    version = ""
    if rest[:1] == ["versions"]:
        if len(rest) < 2:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, "a version is named after /versions/")
        version, rest = rest[1], rest[2:]
    return name, version, rest


def _tensor_meta(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def _request(
    doc: dict[str, Any], name: str, version: str, binary: memoryview
) -> pb.ModelInferRequest:
    """The ModelInferRequest of a JSON request (binary inputs taken from ``binary`` in
    order)."""
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    request.id = str(doc.get("id", ""))[:256]
    parameters = json_object(doc.get("parameters"), "the request's 'parameters'")
    if "timeout" in parameters:
        timeout = json_count(parameters["timeout"], "parameter timeout (microseconds)")
        request.parameters["timeout"].int64_param = timeout
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise _bad("the request names its inputs: 'inputs': [{name, shape, datatype, data}]")
    offset = 0
    for item in inputs:
        if not isinstance(item, dict) or not {"name", "shape", "datatype"} <= item.keys():
            raise _bad("each input has 'name', 'shape', 'datatype' and 'data'")
        input_name = str(item["name"])
        what = f"input {input_name[:64]!r}"
        params = json_object(item.get("parameters"), f"{what}: 'parameters'")
        shape = item["shape"]
        tensor = request.inputs.add(
            name=input_name,
            datatype=str(item["datatype"]),
            shape=json_shape(input_name, shape.plain() if isinstance(shape, Numbers) else shape),
        )
        if json_shared_memory(tensor, params, what):
            request.raw_input_contents.append(b"")  # read from the region, kept in order
            continue
        if "binary_data_size" in params:
            size = json_count(params["binary_data_size"], f"{what}: binary_data_size")
            if offset + size > len(binary):
                raise _bad(
                    f"input {tensor.name!r}: binary_data_size {size} goes beyond the "
                    f"{len(binary)} bytes after the JSON"
                )
            request.raw_input_contents.append(bytes(binary[offset : offset + size]))
            offset += size
            continue
        if "data" not in item:
            raise _bad(f"input {tensor.name!r} has no 'data' (nor binary_data_size)")
        # taken out of the document: its text is freed once its tensor is made
        data = item.pop("data")
        request.raw_input_contents.append(_raw(tensor.name, tensor.datatype, data, tensor.shape))
        del data
    outputs = doc.get("outputs") or []
    if not isinstance(outputs, list):
        raise _bad("'outputs' is a list: [{name, parameters}]")
    for item in outputs:
        if not isinstance(item, dict) or "name" not in item:
            raise _bad("each output asked for has a 'name'")
        wanted = request.outputs.add(name=str(item["name"]))
        what = f"output {wanted.name[:64]!r}"
        json_shared_memory(
            wanted, json_object(item.get("parameters"), f"{what}: 'parameters'"), what
        )
    return request


def _raw(name: str, datatype: str, data: Any, shape: Any) -> bytes:
    """A JSON input's data (nested or flat, row-major) as KServe raw contents."""
    if datatype == "BYTES":
        return encode_bytes(np.asarray(_flat(data), dtype=object))
    try:
        dtype = dtypes.from_kserve(datatype).numpy
    except Exception:
        raise _bad(f"input {name!r}: unknown datatype {datatype!r}") from None
    needed = 1
    for dim in shape:
        needed *= max(int(dim), 0)
    try:
        if isinstance(data, Numbers):
            # counted as parsed, the tensor allocated for the shape's count only when the
            # text is long enough to hold it
            try:
                return data.array(np.dtype(dtype), needed).tobytes()
            except rest_json.WrongCount as exc:
                _check_count(name, exc.count, shape, needed)
                raise
        values = rest_json.tensor(data, np.dtype(dtype))  # a regular nest: NumPy at once
        if values is None:
            values = rest_json.flat_tensor(_flat(data), np.dtype(dtype))
        _check_count(name, values.size, shape, needed)
        return values.tobytes()
    except (TypeError, ValueError, OverflowError) as exc:
        raise _bad(f"input {name!r}: its data are not {datatype} values ({exc})") from None


def _check_count(name: str, count: int, shape: Any, needed: int) -> None:
    if count != needed:
        raise _bad(
            f"input {name!r}: its data hold {count} values, its shape {list(shape)} needs "
            f"{needed}; send as many values as the shape says"
        )


def _flat(data: Any) -> list[Any]:
    """Nested lists' values in row-major order, without recursion: nesting as deep as the
    JSON parser allows must not reach Python's recursion limit here."""
    out: list[Any] = []
    stack = [iter([data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            if isinstance(item, Numbers):
                out.extend(item.plain())
            else:
                out.append(item)
        else:
            stack.pop()
    return out


def _response(
    response: pb.ModelInferResponse, doc: dict[str, Any], kept: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The JSON (and binary) body of an answer: outputs asked for with ``binary_data``
    (or all, with the request's ``binary_data_output``) after the JSON; an output in
    ``kept`` is written from its array, not the answer's raw contents."""
    everything = bool((doc.get("parameters") or {}).get("binary_data_output"))
    wanted = {
        str(o["name"]): bool((o.get("parameters") or {}).get("binary_data", everything))
        for o in doc.get("outputs") or []
        if isinstance(o, dict) and "name" in o
    }
    outputs = []
    tail: list[Any] = []
    for i, out in enumerate(response.outputs):
        array = kept.get(out.name)
        raw: Any = response.raw_output_contents[i] if array is None else _bytes_of(array)
        item: dict[str, Any] = {
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(out.shape),
        }
        if "shared_memory_region" in out.parameters:
            pass  # written there: neither data nor parameters, as Triton answers
        elif wanted.get(out.name, everything):
            item["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        elif out.datatype == "BYTES":
            count = int(np.prod(out.shape)) if out.shape else 1
            item["data"] = decode_bytes(raw, count, f"output {out.name!r}").tolist()
        else:
            values = (
                array.reshape(-1)
                if array is not None
                else np.frombuffer(raw, dtype=dtypes.from_kserve(out.datatype).numpy)
            )
            item["data"] = rest_json.writable(values)
        outputs.append(item)
    head = orjson.dumps(
        {
            "model_name": response.model_name,
            "model_version": response.model_version,
            "id": response.id,
            "outputs": outputs,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    if not tail:
        return head, None
    return head + b"".join(tail), len(head)


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """``array``'s bytes, in place (a flat uint8 view: ``len`` and ``bytes.join`` take it)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
