"""``nrt_async_sendrecv.h``: tensors sent from one process to another (on this host or
another), over :mod:`crossrt.collectives`.

A receiver calls ``nrt_async_sendrecv_accept`` (it listens on every interface at
``NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT`` + its NeuronCore), a sender
``nrt_async_sendrecv_connect`` with the receiver's address and NeuronCore. Both return at once;
``nrt_async_sendrecv_test_comm`` says when the connection is made (a two-rank
:class:`~crossrt.collectives.Communicator`). Sends and receives are requests run in order, one
at a time per communicator; ``nrt_async_sendrecv_test_request`` says when one is done and how
many bytes moved. As in libnrt, ``NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED=1`` is needed,
and one connection per local NeuronCore is set up at a time (its listening port is one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...collectives import Communicator
from ...memory import Tensor
from .env import load_settings
from .state import _state
from .status import NRT_STATUS, NrtError, guarded, status_of

__all__ = [
    "NRT_ASYNC_SENDRECV_MAX_NUM_COMMUNICATORS_PER_LNC",
    "NRT_ASYNC_SENDRECV_MAX_NUM_PENDING_REQUEST",
    "nrt_async_sendrecv_accept",
    "nrt_async_sendrecv_close",
    "nrt_async_sendrecv_comm_t",
    "nrt_async_sendrecv_connect",
    "nrt_async_sendrecv_flush",
    "nrt_async_sendrecv_get_max_num_communicators_per_lnc",
    "nrt_async_sendrecv_get_max_num_pending_request",
    "nrt_async_sendrecv_init",
    "nrt_async_sendrecv_recv_tensor",
    "nrt_async_sendrecv_request_t",
    "nrt_async_sendrecv_send_tensor",
    "nrt_async_sendrecv_test_comm",
    "nrt_async_sendrecv_test_request",
]

NRT_ASYNC_SENDRECV_MAX_NUM_COMMUNICATORS_PER_LNC = 16
NRT_ASYNC_SENDRECV_MAX_NUM_PENDING_REQUEST = 64


@dataclass(eq=False)
class nrt_async_sendrecv_comm_t:
    """A send or receive communicator: the connection being made, then made."""

    lnc: int
    sending: bool
    joined: Future[Communicator]
    worker: ThreadPoolExecutor
    pending: list[Future[int]] = field(default_factory=list)
    closed: bool = False


@dataclass(eq=False)
class nrt_async_sendrecv_request_t:
    """A send or receive in flight; its result is the bytes moved."""

    done: Future[int]


_lock = threading.Lock()
_lncs: dict[int, list[nrt_async_sendrecv_comm_t]] = {}


def _port(lnc: int) -> int:
    text = os.environ.get("NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT", "").strip()
    if not text.isdigit() or not 0 < int(text) + lnc < 65536:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT={text!r}: give the port NeuronCore 0 "
            "listens on (core N uses port + N), the same on both hosts",
        )
    return int(text) + lnc


@guarded("pair")
def nrt_async_sendrecv_get_max_num_communicators_per_lnc() -> tuple[NRT_STATUS, int | None]:
    """How many communicators one NeuronCore may have open."""
    return NRT_STATUS.NRT_SUCCESS, NRT_ASYNC_SENDRECV_MAX_NUM_COMMUNICATORS_PER_LNC


@guarded("pair")
def nrt_async_sendrecv_get_max_num_pending_request() -> tuple[NRT_STATUS, int | None]:
    """How many requests one communicator may have in flight."""
    return NRT_STATUS.NRT_SUCCESS, NRT_ASYNC_SENDRECV_MAX_NUM_PENDING_REQUEST


@guarded()
def nrt_async_sendrecv_init(lnc: int) -> NRT_STATUS:
    """Make NeuronCore ``lnc`` ready to send and receive (pair it with ``_close``)."""
    nc = _state.require_nc(lnc, "lnc")
    if os.environ.get("NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED", "").strip() != "1":
        raise NrtError(
            NRT_STATUS.NRT_FAILURE,
            "set NEURON_RT_ASYNC_SENDRECV_EXPERIMENTAL_ENABLED=1 to use nrt_async_sendrecv_*",
        )
    _port(nc)
    with _lock:
        if nc in _lncs:
            raise NrtError(NRT_STATUS.NRT_FAILURE, f"NeuronCore {nc}: initialized already")
        _lncs[nc] = []
    return NRT_STATUS.NRT_SUCCESS


@guarded()
def nrt_async_sendrecv_close(lnc: int) -> NRT_STATUS:
    """Close NeuronCore ``lnc``'s communicators (requests in flight end first)."""
    nc = _state.require_nc(lnc, "lnc")
    with _lock:
        comms = _lncs.pop(nc, None)
    if comms is None:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"NeuronCore {nc}: nrt_async_sendrecv_init first")
    for comm in comms:
        _end(comm)
    return NRT_STATUS.NRT_SUCCESS


def _end(comm: nrt_async_sendrecv_comm_t) -> None:
    comm.closed = True
    comm.worker.shutdown(wait=True)  # requests in flight are bounded by their timeout
    if comm.joined.done() and comm.joined.exception() is None:
        comm.joined.result().close()


def _open(lnc: Any, sending: bool, join: Callable[[], Communicator]) -> nrt_async_sendrecv_comm_t:
    nc = _state.require_nc(lnc, "lnc")
    with _lock:
        comms = _lncs.get(nc)
        if comms is None:
            raise NrtError(
                NRT_STATUS.NRT_INVALID, f"NeuronCore {nc}: nrt_async_sendrecv_init first"
            )
        if len(comms) >= NRT_ASYNC_SENDRECV_MAX_NUM_COMMUNICATORS_PER_LNC:
            raise NrtError(
                NRT_STATUS.NRT_RESOURCE,
                f"NeuronCore {nc} has {len(comms)} communicators, the most it may have",
            )
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"nrt sendrecv nc{nc}")
        comm = nrt_async_sendrecv_comm_t(nc, sending, worker.submit(join), worker)
        comms.append(comm)
    return comm


def _peer(peer_ip: Any, peer_lnc: Any) -> tuple[str, int]:
    if not isinstance(peer_ip, str) or not peer_ip:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"peer_ip {peer_ip!r}: give the peer's address")
    if isinstance(peer_lnc, bool) or not isinstance(peer_lnc, int) or peer_lnc < 0:
        raise NrtError(NRT_STATUS.NRT_INVALID, f"peer_lnc {peer_lnc!r}: give its NeuronCore")
    return peer_ip, peer_lnc


@guarded("pair")
def nrt_async_sendrecv_connect(
    peer_ip: str, peer_lnc: int, lnc: int
) -> tuple[NRT_STATUS, nrt_async_sendrecv_comm_t | None]:
    """A send communicator from NeuronCore ``lnc`` to ``peer_lnc`` at ``peer_ip``; connected
    once :func:`nrt_async_sendrecv_test_comm` says so."""
    host, their = _peer(peer_ip, peer_lnc)
    root = f"{host}:{_port(their)}"
    timeout = load_settings().exec_timeout
    return NRT_STATUS.NRT_SUCCESS, _open(
        lnc, True, lambda: Communicator.join(1, 2, root, timeout=timeout)
    )


@guarded("pair")
def nrt_async_sendrecv_accept(
    peer_ip: str, peer_lnc: int, lnc: int
) -> tuple[NRT_STATUS, nrt_async_sendrecv_comm_t | None]:
    """A receive communicator on NeuronCore ``lnc`` for the sender at ``peer_ip``; it
    listens at ``NEURON_RT_ASYNC_SENDRECV_BOOTSTRAP_PORT`` + ``lnc`` on every interface."""
    _peer(peer_ip, peer_lnc)
    root = f"0.0.0.0:{_port(_state.require_nc(lnc, 'lnc'))}"
    timeout = load_settings().exec_timeout
    return NRT_STATUS.NRT_SUCCESS, _open(
        lnc, False, lambda: Communicator.join(0, 2, root, timeout=timeout)
    )


def _comm(comm: Any) -> nrt_async_sendrecv_comm_t:
    if not isinstance(comm, nrt_async_sendrecv_comm_t) or comm.closed:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{comm!r} is not an open communicator")
    return comm


@guarded("pair")
def nrt_async_sendrecv_test_comm(
    comm: nrt_async_sendrecv_comm_t,
) -> tuple[NRT_STATUS, bool | None]:
    """Whether the connection is made; a connection that failed (no peer in
    ``NEURON_RT_EXEC_TIMEOUT``: NRT_TIMEOUT) returns its status."""
    joined = _comm(comm).joined
    if not joined.done():
        return NRT_STATUS.NRT_SUCCESS, False
    failure = joined.exception()
    if failure is not None:
        raise failure
    return NRT_STATUS.NRT_SUCCESS, True


def _request(
    comm: Any, tensor: Any, offset: Any, length: Any, move: Callable[..., int]
) -> nrt_async_sendrecv_request_t:
    handle = _comm(comm)
    if not handle.joined.done() or handle.joined.exception() is not None:
        raise NrtError(
            NRT_STATUS.NRT_FAILURE,
            "the communicator is not connected: wait for nrt_async_sendrecv_test_comm",
        )
    if not isinstance(tensor, Tensor) or tensor.freed:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{tensor!r} is not a live nrt_tensor_t")
    for what, value in (("offset", offset), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise NrtError(NRT_STATUS.NRT_INVALID, f"{what} {value!r}: give a byte count >= 0")
    if offset + length > tensor.size:
        raise NrtError(
            NRT_STATUS.NRT_INVALID,
            f"{length} bytes at offset {offset}: the tensor holds {tensor.size}",
        )
    handle.pending = [p for p in handle.pending if not p.done()]
    if len(handle.pending) >= NRT_ASYNC_SENDRECV_MAX_NUM_PENDING_REQUEST:
        raise NrtError(NRT_STATUS.NRT_RESOURCE, "too many requests in flight; test them first")
    peer = handle.joined.result()
    done = handle.worker.submit(move, peer, tensor, offset, length)
    handle.pending.append(done)
    return nrt_async_sendrecv_request_t(done)


def _send(peer: Communicator, tensor: Tensor, offset: int, length: int) -> int:
    data = np.empty(length, np.uint8)
    tensor.read(data, offset, length)
    peer.send(data, 1 - peer.rank)
    return length


def _recv(peer: Communicator, tensor: Tensor, offset: int, length: int) -> int:
    data = peer.recv(np.empty(length, np.uint8), 1 - peer.rank)
    tensor.write(data, offset, length)
    return length


@guarded("pair")
def nrt_async_sendrecv_send_tensor(
    tensor: Tensor, offset: int, length: int, send_comm: nrt_async_sendrecv_comm_t
) -> tuple[NRT_STATUS, nrt_async_sendrecv_request_t | None]:
    """Send ``length`` bytes of ``tensor`` from ``offset``; returns the request at once."""
    if isinstance(send_comm, nrt_async_sendrecv_comm_t) and not send_comm.sending:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, "a receive communicator cannot send")
    return NRT_STATUS.NRT_SUCCESS, _request(send_comm, tensor, offset, length, _send)


@guarded("pair")
def nrt_async_sendrecv_recv_tensor(
    tensor: Tensor, offset: int, length: int, recv_comm: nrt_async_sendrecv_comm_t
) -> tuple[NRT_STATUS, nrt_async_sendrecv_request_t | None]:
    """Receive ``length`` bytes (the sender's length) into ``tensor`` at ``offset``."""
    if isinstance(recv_comm, nrt_async_sendrecv_comm_t) and recv_comm.sending:
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, "a send communicator cannot receive")
    return NRT_STATUS.NRT_SUCCESS, _request(recv_comm, tensor, offset, length, _recv)


@guarded("pair")
def nrt_async_sendrecv_test_request(
    request: nrt_async_sendrecv_request_t,
) -> tuple[NRT_STATUS, tuple[bool, int] | None]:
    """``(done, size)``: whether the request ended and the bytes it moved; a request that
    failed returns its status (a peer that exited: NRT_EXEC_HW_ERR_COLLECTIVES)."""
    if not isinstance(request, nrt_async_sendrecv_request_t):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{request!r} is not a request")
    if not request.done.done():
        return NRT_STATUS.NRT_SUCCESS, (False, 0)
    failure = request.done.exception()
    if failure is not None:
        raise NrtError(status_of(failure), str(failure))
    return NRT_STATUS.NRT_SUCCESS, (True, request.done.result())


@guarded()
def nrt_async_sendrecv_flush(lnc: int) -> NRT_STATUS:
    """Wait until every request of NeuronCore ``lnc``'s communicators has ended."""
    nc = _state.require_nc(lnc, "lnc")
    with _lock:
        comms = list(_lncs.get(nc, ()))
    for comm in comms:
        for pending in list(comm.pending):
            pending.exception()  # waits; a failure is the request's, read by test_request
    return NRT_STATUS.NRT_SUCCESS


def _close_all() -> None:
    with _lock:
        comms = [c for cs in _lncs.values() for c in cs]
        _lncs.clear()
    for comm in comms:
        _end(comm)


_state.on_close.append(_close_all)
