"""BMLIB's synchronisation: wait for the launches queued through handles (``bmrt_launch_tensor``
and the other asynchronous launches queue ``LoadedModel.run_async`` runs).

``bm_thread_sync`` waits for this thread's launches through a handle, ``bm_handle_sync`` and
``bm_flush`` for every thread's through it, ``bm_device_sync`` for every launch on the
handle's device, through any handle. Each returns the first failed launch's status; a sync
that sees a launch end also lays out its outputs (store modes) and marks their mappings stale.
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

from ...errors import CrossrtError, DeadlineExceededError, InvalidArgumentError
from .contract import seed_call
from .device import Launch, bm_handle_t, call, handles_on
from .status import BM_SUCCESS, bm_status_t, failed

__all__ = [
    "bm_device_sync",
    "bm_flush",
    "bm_handle_sync",
    "bm_set_sync_timeout",
    "bm_thread_sync",
    "bm_thread_sync_from_core",
]


@seed_call
def bm_set_sync_timeout(handle: bm_handle_t, timeout: int) -> bm_status_t:
    """The most milliseconds :func:`bm_thread_sync` waits (0: no limit)."""

    def set_timeout() -> None:
        handle.check()
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise InvalidArgumentError(f"timeout={timeout!r}: give milliseconds >= 0")
        handle.sync_timeout_ms = timeout

    return call("bm_set_sync_timeout", set_timeout)


@seed_call
def bm_thread_sync(handle: bm_handle_t) -> bm_status_t:
    """Wait for every launch this thread made through ``handle``; the first failure's status.

    A launch still running after the ``bm_set_sync_timeout`` limit gives BM_ERR_TIMEOUT and
    stays pending: a later call waits for it again.
    """
    return _sync(handle, handle.pending() if not handle.freed else [], "bm_thread_sync")


@seed_call
def bm_thread_sync_from_core(handle: bm_handle_t, core_id: int) -> bm_status_t:
    """:func:`bm_thread_sync` (this thread's launches on every core: crossrt does not keep
    them apart by core)."""
    return bm_thread_sync(handle)


@seed_call
def bm_handle_sync(handle: bm_handle_t) -> bm_status_t:
    """Wait for every launch made through ``handle``, by any thread."""
    return _sync(handle, handle.outstanding(), "bm_handle_sync")


@seed_call
def bm_device_sync(handle: bm_handle_t) -> bm_status_t:
    """Wait for every launch on the handle's device: through any handle of that device (freed
    ones too: their launches still run there), by any thread."""
    device = handle.device.id
    launches = [launch for other in handles_on(device) for launch in other.outstanding()]
    return _sync(handle, launches, "bm_device_sync")


@seed_call
def bm_flush(handle: bm_handle_t) -> None:
    """Wait for every launch made through ``handle``, as libbmlib's ``bm_flush`` does
    (``bm_handle_sync``); it returns nothing, so a failure is only logged."""
    _sync(handle, handle.outstanding(), "bm_flush")


def _sync(handle: bm_handle_t, pending: list[Launch], what: str) -> bm_status_t:
    try:
        handle.check()
    except CrossrtError as exc:
        return failed(what, exc)
    limit = handle.sync_timeout_ms / 1000 or None
    status = BM_SUCCESS
    while pending:
        launch = pending[0]
        try:
            launch.future.result(timeout=limit)
        except FutureTimeout:
            return failed(
                what,
                DeadlineExceededError(
                    f"a launch is still running after {handle.sync_timeout_ms} ms; call "
                    f"{what} again, or raise bm_set_sync_timeout"
                ),
            )
        except Exception as exc:
            if status == BM_SUCCESS:
                status = failed(f"{what} (the launch)", exc)
        pending.pop(0)
        launch.owner.forget(launch)
        try:
            launch.finish()  # the outputs' store modes laid out: copies that may fail
        except (CrossrtError, ValueError, MemoryError) as exc:
            if status == BM_SUCCESS:
                status = failed(f"{what} (the launch's outputs)", exc)
    return status
