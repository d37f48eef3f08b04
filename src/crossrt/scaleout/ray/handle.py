"""The Runtime API over a Serve deployment handle, for code that runs inside Ray (a task,
an actor, another deployment): ``run``, ``run_async``, ``await infer``, deadlines and
cancellation, as on a :class:`~crossrt.LoadedModel` or a model of ``crossrt.connect()``.

The request goes through Serve's router to a replica (with multiplexing: one that holds the
model), whose :meth:`Replica.infer` runs it; NumPy arrays travel in Ray's object store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

import numpy as np

from ...drivers.base import CancelToken
from ...errors import CrossrtError, DeadlineExceededError


class RayModel:
    """Model ``name`` of a crossrt deployment, called through ``handle``.

    Args:
        handle: the deployment's ``DeploymentHandle`` (``serve.get_app_handle(app)``, or
            :func:`.app.deploy`'s answer).
        name: the model (a ``.crm``'s stem, or a name in the repository).
        multiplexed: route by model (the deployment multiplexes models).
    """

    def __init__(self, handle: Any, name: str, multiplexed: bool = False) -> None:
        options: dict[str, Any] = {"method_name": "infer"}
        if multiplexed:
            options["multiplexed_model_id"] = name
        self._handle = handle.options(**options)
        self.name = name

    def _call(
        self, inputs: Mapping[str, Any], deadline: float | None, names: Sequence[str] | None
    ) -> Any:
        timeout = None
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise DeadlineExceededError(
                    f"model {self.name}: the deadline passed before the call"
                )
        feed = {k: np.asarray(v) for k, v in inputs.items()}
        return self._handle.remote(self.name, feed, list(names) if names else None, timeout)

    def run(
        self,
        inputs: Mapping[str, Any],
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run once; the outputs by name.

        Args:
            deadline: ``time.monotonic()`` by which the answer must come (the replica drops or
                stops the request then: DeadlineExceededError).
            cancel: a CancelToken whose ``cancel()`` cancels the request in Serve (dropped
                where it waits, stopped where the engine can): CancelledError.
            output_names: only these outputs.
        """
        return dict(
            self.run_async(
                inputs, deadline=deadline, cancel=cancel, output_names=output_names
            ).result()
        )

    def run_async(
        self,
        inputs: Mapping[str, Any],
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
    ) -> Future[dict[str, np.ndarray]]:
        """Queue one run; a :class:`concurrent.futures.Future` of its outputs (its
        ``cancel()`` cancels the request in Serve too)."""
        response = self._call(inputs, deadline, output_names)
        future: Future[dict[str, np.ndarray]] = Future()
        future.set_running_or_notify_cancel()
        if cancel is not None:
            cancel.on_cancel(response.cancel)

        def wait() -> None:
            try:
                future.set_result(response.result())
            except BaseException as exc:  # the caller's, as crossrt's own errors
                future.set_exception(_unwrapped(exc, cancel))

        import threading

        threading.Thread(target=wait, name="crossrt-ray-wait", daemon=True).start()
        return future

    async def infer(
        self,
        inputs: Mapping[str, Any],
        *,
        deadline: float | None = None,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """``await model.infer(inputs)`` in asyncio; cancelling the awaiting task cancels
        the request in Serve."""
        response = self._call(inputs, deadline, output_names)
        try:
            return dict(await response)
        except BaseException as exc:
            raise _unwrapped(exc, None) from None


def _unwrapped(exc: BaseException, cancel: CancelToken | None) -> BaseException:
    """The error a replica raised, as crossrt raised it (Ray wraps it in a RayTaskError);
    a request Serve cancelled as ``CancelledError``."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, CrossrtError):
        return cause
    if isinstance(exc, CrossrtError):
        return exc
    kind = type(exc).__name__
    if "Cancel" in kind or (cancel is not None and cancel.cancelled):
        return CancelledError(f"the request was cancelled ({kind})")
    return exc
