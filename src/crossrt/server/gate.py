"""What every call passes through: the token, the drain, the count of calls in flight, and
the translation of errors into gRPC statuses (one place, :func:`status.status_of`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from .status import ServiceError, status_of
from .tokens import UNAUTHENTICATED, Credentials, Grant

log = logging.getLogger("crossrt.serve")

__all__ = ["UNAUTHENTICATED", "Gate", "authorization"]

HEALTH = frozenset({"ServerLive", "ServerReady"})
"""Answered while draining too (ServerReady then says false)."""


def authorization(metadata: Any) -> str | bytes | None:
    """The ``authorization`` value of a call's metadata, ``None`` when it has none."""
    for key, value in metadata or ():
        if key == "authorization":
            return value  # type: ignore[no-any-return]
    return None


class Gate(grpc.ServerInterceptor):  # type: ignore[misc]
    """A server interceptor.

    Args:
        token: when set, every call must carry ``authorization: Bearer <token>`` (this
            token, or one of ``grants``).
        grants: the per-user tokens (:func:`tokens.load_tokens`): a call may carry one, and
            is then that token's user.
    """

    def __init__(self, token: str | None = None, grants: dict[bytes, Grant] | None = None) -> None:
        self.credentials = Credentials(token, grants)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._by_peer: dict[str, int] = {}
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

    def grant(self, value: str | bytes | None) -> Grant | None:
        """What an authorization value (``Bearer <token>``: gRPC's metadata, HTTP's header,
        the lane's greeting) says of its bearer (:meth:`tokens.Credentials.grant`).

        Raises:
            ServiceError: UNAUTHENTICATED.
        """
        return self.credentials.grant(value)

    def busy(self, peer: str) -> bool:
        """Whether a gRPC call of connection ``peer`` (``context.peer()``) is under way: its
        connection is not idle, however long the call runs."""
        return peer in self._by_peer

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

    def _enter(self, health: bool, peer: str = "") -> tuple[grpc.StatusCode, str] | None:
        if health:
            return None
        with self._cond:
            if self.closing:
                return grpc.StatusCode.UNAVAILABLE, (
                    "the daemon is shutting down and takes no new requests; retry when it is "
                    "back (ServerReady)"
                )
            self._in_flight += 1
            if peer:
                self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        return None

    def _leave(self, health: bool, peer: str = "") -> None:
        if health:
            return
        with self._cond:
            self._in_flight -= 1
            if peer:
                left = self._by_peer.pop(peer, 1) - 1
                if left:
                    self._by_peer[peer] = left
            if not self._in_flight:
                self._cond.notify_all()

    def _refusal(self, metadata: Any) -> tuple[grpc.StatusCode, str] | None:
        try:
            self.credentials.grant(authorization(metadata))
        except ServiceError as exc:
            return exc.status, exc.message
        return None

    def intercept_service(
        self,
        continuation: Callable[[Any], Any],
        details: Any,
        held: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The call's handler behind the gate; ``held`` (a private socket's,
        :mod:`.private_sockets`) turns the servicer context of a unary-unary or stream-stream
        call into the one its servicer and the gate see. Other kinds are returned as they
        are, for the caller to wrap."""
        handler = continuation(details)
        if handler is None:
            return None
        refusal = self._refusal(details.invocation_metadata)
        if refusal is not None:
            return refusing(handler, refusal)
        health = details.method.rsplit("/", 1)[-1] in HEALTH
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, refusal, health, held),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream, refusal, held),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(
        self, method: Callable[[Any, Any], Any], refusal: Any, health: bool, held: Any
    ) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            if held is not None:
                context = held(context)
            peer = "" if health else context.peer()
            failure = refusal or self._enter(health, peer)
            if failure is None:
                try:
                    return method(request, context)
                except Exception as exc:
                    failure = _failure(exc, details=method)
                finally:
                    self._leave(health, peer)
            context.abort(*failure)

        return call

    def _stream(
        self, method: Callable[[Any, Any], Any], refusal: Any, held: Any
    ) -> Callable[..., Any]:
        def call(requests: Iterator[Any], context: Any) -> Iterator[Any]:
            if held is not None:
                context = held(context)
            peer = context.peer()
            failure = refusal or self._enter(False, peer)
            if failure is None:
                try:
                    yield from method(self._until_closing(requests), context)
                except Exception as exc:
                    failure = _failure(exc, details=method)
                finally:
                    self._leave(False, peer)
            if failure is not None:
                context.abort(*failure)

        return call

    def _until_closing(self, requests: Iterator[Any]) -> Iterator[Any]:
        for request in requests:
            if self.closing:
                return
            yield request


def refusing(handler: Any, refusal: tuple[grpc.StatusCode, str]) -> Any:
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
