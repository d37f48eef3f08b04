"""What every call passes through: the token, the drain, the count of calls in flight, and
the translation of errors into gRPC statuses (one place, :func:`status.status_of`)."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from .status import ServiceError, status_of

log = logging.getLogger("crossrt.serve")

UNAUTHENTICATED = (
    "this daemon needs a token: send the metadata 'authorization: Bearer <token>' "
    "(tritonclient: headers={'authorization': 'Bearer <token>'}; crossrt.connect: token=)"
)

HEALTH = frozenset({"ServerLive", "ServerReady"})
"""Answered while draining too (ServerReady then says false)."""


class Gate(grpc.ServerInterceptor):  # type: ignore[misc]
    """A server interceptor.

    Args:
        token: when set, every call must carry ``authorization: Bearer <token>``.
    """

    def __init__(self, token: str | None = None) -> None:
        self._token = f"Bearer {token}".encode() if token else None
        self._cond = threading.Condition()
        self._in_flight = 0
        self.closing = False

    @property
    def in_flight(self) -> int:
        """Calls under way."""
        return self._in_flight

    def drain(self, seconds: float) -> int:
        """Refuse new calls (UNAVAILABLE) and wait up to ``seconds`` for those under way;
        return how many are still running."""
        deadline = time.monotonic() + seconds
        with self._cond:
            self.closing = True
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return self._in_flight

    def token_matches(self, given: bytes) -> bool:
        """Whether ``given`` (the token a lane client sent, :mod:`.lane`) is this daemon's
        token; any is when none is set."""
        return self._token is None or hmac.compare_digest(b"Bearer " + given, self._token)

    def enter(self) -> None:
        """Count one call that is not gRPC's (a lane request) in flight, so the drain waits
        for it; :meth:`leave` when it is answered.

        Raises:
            ServiceError: UNAVAILABLE while the daemon drains.
        """
        failure = self._enter(False)
        if failure is not None:
            raise ServiceError(*failure)

    def leave(self) -> None:
        """The call counted by :meth:`enter` is answered."""
        self._leave(False)

    def _enter(self, health: bool) -> tuple[grpc.StatusCode, str] | None:
        if health:
            return None
        with self._cond:
            if self.closing:
                return grpc.StatusCode.UNAVAILABLE, (
                    "the daemon is shutting down and takes no new requests; retry when it is "
                    "back (ServerReady)"
                )
            self._in_flight += 1
        return None

    def _leave(self, health: bool) -> None:
        if health:
            return
        with self._cond:
            self._in_flight -= 1
            if not self._in_flight:
                self._cond.notify_all()

    def _refusal(self, metadata: Any) -> tuple[grpc.StatusCode, str] | None:
        if self._token is None:
            return None
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                if hmac.compare_digest(given, self._token):
                    return None
        return grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        refusal = self._refusal(details.invocation_metadata)
        if refusal is not None:
            return _refusing(handler, refusal)
        health = details.method.rsplit("/", 1)[-1] in HEALTH
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, refusal, health),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream, refusal),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(
        self, method: Callable[[Any, Any], Any], refusal: Any, health: bool
    ) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            failure = refusal or self._enter(health)
            if failure is None:
                try:
                    return method(request, context)
                except Exception as exc:
                    failure = _failure(exc, details=method)
                finally:
                    self._leave(health)
            context.abort(*failure)

        return call

    def _stream(self, method: Callable[[Any, Any], Any], refusal: Any) -> Callable[..., Any]:
        def call(requests: Iterator[Any], context: Any) -> Iterator[Any]:
            failure = refusal or self._enter(False)
            if failure is None:
                try:
                    yield from method(self._until_closing(requests), context)
                except Exception as exc:
                    failure = _failure(exc, details=method)
                finally:
                    self._leave(False)
            if failure is not None:
                context.abort(*failure)

        return call

    def _until_closing(self, requests: Iterator[Any]) -> Iterator[Any]:
        for request in requests:
            if self.closing:
                return
            yield request


def _refusing(handler: Any, refusal: tuple[grpc.StatusCode, str]) -> Any:
    """A handler that refuses the call without reading its request: a unary handler's
    request is received and deserialized before the handler runs (an unauthenticated 512 MiB
    request cost the daemon 1.6 GiB), a streaming one's only when the handler asks, and the
    wire is the same for both. What the client sent past HTTP/2's flow-control window is
    never received."""

    def refuse(requests: Iterator[Any], context: Any) -> Any:
        context.abort(*refusal)

    def refuse_stream(requests: Iterator[Any], context: Any) -> Iterator[Any]:
        context.abort(*refusal)
        yield  # a generator, as a streaming answer is

    if handler.unary_unary is not None or handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            refuse, response_serializer=handler.response_serializer
        )
    return grpc.stream_stream_rpc_method_handler(
        refuse_stream, response_serializer=handler.response_serializer
    )


def _failure(exc: Exception, details: Any) -> tuple[grpc.StatusCode, str]:
    code, message = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", getattr(details, "__name__", "a call"))
    return code, message
