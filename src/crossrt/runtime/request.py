"""``Request``: a model's inputs and outputs bound once and run many times, as ONNX Runtime's
IOBinding and OpenVINO's ``InferRequest`` (``OH_NNExecutor``, ``bmruntime::Network``); and
:meth:`Request.repeat` (``nrt_execute_repeat``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from .binding import Binding
from .inputs import InputChecker

Bind = Callable[[dict[str, Any], dict[str, Any]], "Binding | None"]
"""``bind(inputs, outputs)``: the model's :class:`Binding` of them, checked now (``None``: they
cannot be repeated as they are)."""


class Runnable(Protocol):
    """What a :class:`Request` needs of its model (a ``LoadedModel``)."""

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    def run(self, inputs: Any, outputs: Any = None, *, binding: Binding | None = None) -> Any: ...

    def run_async(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
        deadline: float | None = None,
        callback: Callable[[Any, Any], None] | None = None,
        user_data: Any = None,
    ) -> Future[Any]: ...


class Request:
    """A model's inputs and outputs, bound once and run many times.

    Created by :meth:`LoadedModel.request`. Set inputs one by one with :meth:`set_input`
    (or all at once at creation), then :meth:`run` or :meth:`run_async` as often as needed;
    outputs given at creation are written in place on every run (``docs/memory.md``).

    A request whose inputs are arrays or host tensors and whose outputs are all given, as
    arrays or tensors written in place, is bound: its first run is checked as ``run`` is,
    its second checks them once more and binds each instance's engine to them, and later
    runs skip both while the request holds the same objects, unchanged (the same tensors
    with the same memory, the same arrays with the same shape and dtype); anything else is
    checked again, with the same errors as a first run.
    A request is not meant to be shared between threads: make one per thread.
    """

    def __init__(
        self,
        model: Runnable,
        checker: InputChecker,
        bind: Bind,
        inputs: Any = None,
        outputs: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self._checker = checker
        self._bind = bind
        self._inputs: dict[str, Any] = {}
        self._outputs = dict(outputs) if outputs else None
        self._binding: Binding | None = None
        # Runs checked in full since the inputs or outputs last changed: the second binds.
        self._checked = 0
        if inputs is not None:
            # Checked now, kept as given: the run hands them to the model as the caller would
            # (a device tensor stays a tensor, not the form the checks passed on).
            named = checker.named(inputs)
            checker.checked_feed(named)
            self._inputs.update(named)

    @property
    def inputs(self) -> dict[str, Any]:
        """The inputs bound so far, by name."""
        return dict(self._inputs)

    def set_input(self, name: str, value: Any) -> None:
        """Bind ``value`` to input ``name`` (checked when the request runs).

        Raises:
            InvalidInputError: the model has no input of that name.
        """
        if name not in self._checker.names:
            raise InvalidInputError(
                f"unknown input {name!r}; the model takes "
                f"{', '.join(self._checker.names) or 'no inputs'}",
                details={"input": name},
            )
        self._inputs[name] = value
        self._changed()

    def run(self) -> Any:
        """Run once with the bound inputs and outputs (see :meth:`LoadedModel.run`)."""
        outputs = self._outputs
        if outputs is None:
            return self.model.run(self._inputs)
        binding = self._binding
        if binding is None and self._checked == 1:
            # The second run with the same objects: bound now. A request made for one run
            # (a caller binding new objects every time) is checked once a run, no more.
            binding = self._binding = self._bind(self._inputs, outputs)
            self._checked = 2  # bound, or it cannot be: not tried again until a change
        if binding is not None:
            if binding.holds(self._inputs, outputs):
                try:
                    return self.model.run(self._inputs, outputs, binding=binding)
                except BaseException:
                    self._changed()  # checked again next time
                    raise
            self._changed()  # changed in place since it was bound
        result = self.model.run(self._inputs, outputs)
        if self._checked == 0:
            self._checked = 1
        return result

    def _changed(self) -> None:
        self._binding = None
        self._checked = 0

    def run_async(self, **options: Any) -> Future[Any]:
        """Queue one run (see :meth:`LoadedModel.run_async` for ``options``)."""
        return self.model.run_async(self._inputs, self._outputs, **options)

    def repeat(self, n: int, feedback: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
        """Run ``n`` times, each run's outputs fed back as the next run's inputs
        (``nrt_execute_repeat``); returns the last run's outputs. The request's inputs are
        the first run's; they stay as they are.

        Args:
            n: how many runs.
            feedback: ``{output name: input name}``; default: outputs whose name is an
                input's name.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"n={n!r}: give the number of runs, at least 1")
        feed = self._checker.checked_feed(self._inputs)
        outputs = {s.name for s in self.model.outputs}
        pairs = dict(feedback) if feedback is not None else {}
        pairs.update({name: name for name in feed.keys() & outputs if feedback is None})
        bad = [f"{o!r} -> {i!r}" for o, i in pairs.items() if o not in outputs or i not in feed]
        if bad:
            raise InvalidArgumentError(
                f"feedback {', '.join(bad)}: map output names ({', '.join(sorted(outputs))}) to "
                f"input names ({', '.join(feed)})",
                details={"feedback": bad},
            )
        result: dict[str, np.ndarray] = {}
        for _ in range(n):
            result = self.model.run(feed)
            for output, name in pairs.items():
                feed[name] = result[output]
        return result
