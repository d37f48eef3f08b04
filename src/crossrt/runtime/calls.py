"""What a model's runs call on an instance (:class:`Calls`), and the wrappers put around a
program call only where a model needs them (the common case calls the program itself):
results copied to the host, output shapes kept, an execution timeout, a deadline, a cancel
token, the numerics check; and a ``run()`` that is not the common case (:meth:`Calls.run_on`:
``outputs=``, a bound request, ``output_names``, a deadline or a cancel token)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import Any

import numpy as np

from ..drivers.base import CancelToken
from ..errors import DeadlineExceededError
from . import watchdog
from .binding import Binding, OutputBinder
from .instance import Instance
from .memory.transfer import Transfers, release_made, to_host_results
from .numerics import Numerics, checking
from .queued import late


class Calls:
    """What one model's runs call on its instances.

    Args:
        name: the model's name, for its errors.
        inputs: how many inputs the model takes.
        exec_timeout: seconds a run may take (``None``: no limit).
        check_numerics: check each run's results for NaN and infinity.
        transfers: where a resident model's copies to the host are counted (``None``: its
            programs take host memory).
        last: where each run's output shapes are kept per thread (``None``: its outputs are
            static).
        binder: binds and finishes the model's outputs.
    """

    def __init__(
        self,
        name: str,
        inputs: int,
        exec_timeout: float | None,
        check_numerics: Numerics,
        transfers: Transfers | None,
        last: threading.local | None,
        binder: OutputBinder,
    ) -> None:
        self._name = name
        self._inputs = inputs
        self._limit = exec_timeout
        self._numerics = check_numerics
        self._transfers = transfers
        self._last = last
        self._binder = binder
        self.direct = False
        """Whether each instance's run is its single program with nothing around it: then a
        bound request goes straight into the program's own binding (``Binding.call_on``)."""
        self.selectable = False
        """Whether ``output_names`` may be asked of the program itself (one program reading
        every input, nothing but the output shapes kept around it)."""
        # Per instance index: its program and that program's run_outputs, unguarded as
        # run() calls run (made again for a program swapped in since).
        self._run_outputs: dict[int, tuple[Any, Callable[..., dict[str, Any]]]] = {}

    def prepare(self, instances: Sequence[Instance]) -> None:
        """Give each instance what ``run()`` calls on it (:meth:`Instance.run_checked_with`,
        :meth:`plain`): the program itself when nothing is added."""
        for inst in instances:
            inst.run_checked_with(self.plain(inst))
        n = self._inputs
        self.direct = all(
            inst.whole(n) and inst.run_checked == inst.direct(n) for inst in instances
        )
        self.selectable = (
            self._limit is None
            and self._transfers is None
            and not self._numerics
            and all(inst.whole(n) for inst in instances)
        )

    def run_on(
        self,
        inst: Instance,
        feed: dict[str, Any],
        outputs: Any,
        names: tuple[str, ...] | None,
        binding: Binding | None,
        deadline: float | None,
        cancel: CancelToken | None,
    ) -> Any:
        """A ``run()`` on ``inst`` in its caller's thread with ``output_names`` (``names``), a
        ``deadline`` or a ``cancel`` token (``run()`` itself calls :meth:`Instance.run_checked`
        in the common case, and binds ``outputs=`` or a bound request's ``binding``)."""
        if deadline is None and cancel is None:
            call = inst.run_checked
        else:
            call = self.limited(inst, deadline, cancel)
        if binding is not None:
            binding.call_on(inst, self.direct, call)()
            return dict(outputs)  # each bound in place
        if names is not None:
            return self.selected(inst, call, feed, outputs, names)
        if outputs is None or (not outputs and type(outputs) is dict):
            return call(feed)
        return self._binder.run(call, feed, outputs)

    def selected(
        self,
        inst: Instance,
        call: Callable[..., Any],
        feed: dict[str, Any],
        outputs: Mapping[str, Any] | None,
        names: tuple[str, ...],
    ) -> dict[str, Any]:
        """The outputs ``names`` of one run on ``inst``: asked of the program itself when
        nothing is wrapped around it (its engine may fetch or compute fewer), else every
        output computed and those kept."""
        if not outputs and self.selectable and call is inst.run_checked:
            program = inst.programs[0]
            known = self._run_outputs.get(inst.index)
            if known is None or known[0] is not program:
                known = self._run_outputs[inst.index] = (program, inst.selecting())
            result = known[1](feed, names)
            if self._last is not None:  # output_shapes() then has the outputs of this run
                self._last.shapes = {n: getattr(v, "shape", None) for n, v in result.items()}
            return result
        every = self._binder.run(call, feed, outputs) if outputs else call(feed)
        return {n: every[n] for n in names}

    def plain(
        self, inst: Instance, deadline: float | None = None, cancel: CancelToken | None = None
    ) -> Callable[..., dict[str, np.ndarray]]:
        """What ``run()`` calls on an instance it holds: the program itself when nothing is
        added, so the common case costs no extra Python call; with a ``deadline`` or a
        ``cancel`` token, the run stopped then (made per call)."""
        execute: Callable[..., dict[str, np.ndarray]]
        if self._limit is None and deadline is None and cancel is None:
            execute = inst.direct(self._inputs)  # run() maps what it raises
        elif self._limit is None and deadline is None:
            assert cancel is not None
            execute = stoppable(inst, cancel)
        else:
            execute = timed(self._name, inst, self._limit, deadline, cancel)
        if self._transfers is not None:
            execute = on_host(execute, self._transfers)
        if self._numerics:
            execute = checking(self._name, execute, self._numerics != "nan")
        return recording(execute, self._last) if self._last is not None else execute

    def limited(
        self, inst: Instance, deadline: float | None, cancel: CancelToken | None
    ) -> Callable[..., dict[str, np.ndarray]]:
        """:meth:`plain` with a ``deadline`` or a ``cancel`` token (made per call); TIMEOUT
        when the deadline passed already."""
        if deadline is not None and time.monotonic() >= deadline:
            raise late(self._name, "its deadline passed before it could start")
        return self.plain(inst, deadline, cancel)

    def finish(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], outputs: Any
    ) -> Any:
        """A queued request's run in a worker (``execute``: the scheduler's call on the
        instance it holds): outputs bound, results checked."""
        if self._numerics:
            execute = checking(self._name, execute, self._numerics != "nan")
        if outputs is None or (not outputs and type(outputs) is dict):
            result = execute(feed)
            return to_host_results(result, self._transfers) if self._transfers else result
        return self._binder.run(execute, feed, outputs)


def on_host(
    execute: Callable[..., dict[str, Any]], transfers: Transfers
) -> Callable[..., dict[str, Any]]:
    """``execute``, with the device results of a plain run (no ``outputs=``) copied to the
    host: a plain ``run()`` returns host arrays."""

    def run(feed: dict[str, Any], outputs: Any = None, *rest: Any) -> dict[str, Any]:
        result = execute(feed, outputs, *rest) if outputs is not None else execute(feed)
        return to_host_results(result, transfers) if outputs is None else result

    return run


def recording(
    execute: Callable[..., dict[str, np.ndarray]], last: threading.local
) -> Callable[..., dict[str, np.ndarray]]:
    """``execute``, keeping each run's output shapes for ``output_shapes`` in ``last``."""

    def run(*args: Any) -> dict[str, np.ndarray]:
        result = execute(*args)
        last.shapes = {name: getattr(v, "shape", None) for name, v in result.items()}
        return result

    return run


def timed(
    name: str,
    inst: Instance,
    limit: float | None,
    deadline: float | None = None,
    cancel: CancelToken | None = None,
) -> Callable[..., dict[str, np.ndarray]]:
    """``inst.execute`` stopped by the watchdog after ``limit`` seconds (the execution
    timeout), or at ``deadline`` (``time.monotonic()``: the request's), whichever comes
    first (TIMEOUT); or when ``cancel`` is cancelled (its caller went away:
    ``CancelledError``)."""

    def run(feed: dict[str, Any], outputs: Any = None) -> dict[str, np.ndarray]:
        token = CancelToken()
        end = math.inf if limit is None else time.monotonic() + limit
        stop = min(end, math.inf if deadline is None else deadline)
        if stop < math.inf:
            watchdog.watch(token, stop)
        if cancel is not None:
            cancel.on_cancel(token.cancel)
        try:
            result = inst.execute(feed, outputs, token)
        except DeadlineExceededError:  # the engine stopped: say which limit stopped it
            if _gone(cancel, stop):
                raise CancelledError from None
            raise _late(name, limit, stop < end) from None
        finally:
            expired = watchdog.finish(token)
        if _gone(cancel, stop):
            release_made(result, outputs)
            raise CancelledError
        if expired or time.monotonic() > stop:
            release_made(result, outputs)  # device results nobody will receive
            raise _late(name, limit, stop < end)
        return result

    return run


def stoppable(inst: Instance, cancel: CancelToken) -> Callable[..., dict[str, np.ndarray]]:
    """``inst.execute`` stopped where the engine can when ``cancel`` is cancelled (its caller
    went away: ``CancelledError``). Without a time limit there is nothing for the watchdog
    to do, so the engine is handed the caller's token itself: no token of its own, no
    watchdog, a few µs less per call than :func:`timed`."""

    def run(feed: dict[str, Any], outputs: Any = None) -> dict[str, np.ndarray]:
        try:
            result = inst.execute(feed, outputs, cancel)
        except DeadlineExceededError:  # the engine stopped
            if cancel.cancelled:
                raise CancelledError from None
            raise
        if cancel.cancelled:
            release_made(result, outputs)  # device results nobody will receive
            raise CancelledError
        return result

    return run


def _gone(cancel: CancelToken | None, stop: float) -> bool:
    """Whether the caller went away before the time limit passed (after it, the limit is
    what stopped the run: a client's gRPC deadline ends its call, which cancels too)."""
    return cancel is not None and cancel.cancelled and time.monotonic() < stop


def _late(name: str, limit: float | None, by_deadline: bool) -> DeadlineExceededError:
    """TIMEOUT saying which limit stopped the run: the request's deadline, or the model's
    execution timeout."""
    if by_deadline:
        return late(name, "its deadline passed while it ran")  # as the queue says it
    return DeadlineExceededError(
        f"model {name!r}: the run took longer than its execution timeout of {limit} s; raise "
        "exec_timeout (or CROSSRT_EXEC_TIMEOUT) or give the model more cores",
        details={"model": name, "exec_timeout": limit},
    )
