"""KServe v2 over Serve's HTTP proxy: ``crossrt serve --http``'s routes, answered by the
daemon's :class:`~crossrt.server.rest.RestRoutes` (the same checks, conversions and errors),
under the application's route prefix. Shared memory is refused: it is same-host."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ...server.rest import HEADER_LENGTH, RestRoutes, error_answer
from ...server.status import ServiceError
from .calls import ANONYMOUS, SAME_HOST_ONLY, model_id


async def answer_http(
    routes: RestRoutes,
    request: Any,
    load: Callable[[str], Awaitable[Any]],
    offload: Callable[[Callable[[], Any], Any], Awaitable[Any]],
) -> Any:
    """The answer (a starlette ``Response``) to one HTTP request (a starlette ``Request``);
    ``load`` makes a model ready (multiplexing: on demand), ``offload`` runs the blocking
    part on the replica's threads."""
    from starlette.responses import Response

    parts = [p for p in request.url.path.split("/") if p]
    if "v2" in parts:  # the route prefix goes
        parts = parts[parts.index("v2") :]
    body = await request.body() if request.method == "POST" else b""
    header = request.headers.get(HEADER_LENGTH)

    def handle() -> tuple[int, bytes, str, dict[str, str]]:
        if parts[:1] != ["v2"]:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: {request.url.path}")
        path = parts[1:]
        if request.method == "GET":
            status, doc = routes.get(path, ANONYMOUS)
            return status, json.dumps(doc).encode(), "application/json", {}
        if path[:1] == ["repository"]:
            doc = routes.repository(path[1:], body, ANONYMOUS)
            return 200, json.dumps(doc).encode(), "application/json", {}
        if path[:1] in (["systemsharedmemory"], ["cudasharedmemory"]):
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, SAME_HOST_ONLY)
        if header is not None and not header.isdigit():
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{HEADER_LENGTH} {header!r} is not a number of bytes",
            )
        length = None if header is None else int(header)
        answer, json_length = routes.infer(path, body, length, ANONYMOUS)
        if json_length is None:
            return 200, answer, "application/json", {}
        return 200, answer, "application/octet-stream", {HEADER_LENGTH: str(json_length)}

    try:
        if len(parts) >= 3 and parts[1] == "models" and parts[2] != "stats":
            await load(model_id(parts[2]))  # multiplexing: loaded on demand
        status, answer, content, extra = await offload(handle, None)
    except Exception as exc:
        status, doc = error_answer(exc)
        answer, content, extra = json.dumps(doc).encode(), "application/json", {}
    return Response(answer, status_code=status, media_type=content, headers=extra)
