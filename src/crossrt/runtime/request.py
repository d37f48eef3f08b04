"""``Request``: inputs and outputs bound once, run many times (``OH_NNExecutor``,
``bmruntime::Network``), and ``run_repeat`` (``nrt_execute_repeat``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from .inputs import InputChecker


class Runnable(Protocol):
    """What a :class:`Request` and :func:`repeat` need of their model (a ``LoadedModel``)."""

    _checker: InputChecker

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    def run(self, inputs: Any, outputs: Any = None) -> Any: ...

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
    outputs given at creation are written in place on every run (``docs/memory.md``). A
    request is not meant to be shared between threads: make one per thread.
    """

    def __init__(
        self, model: Runnable, inputs: Any = None, outputs: Mapping[str, Any] | None = None
    ) -> None:
        self.model = model
        self._inputs: dict[str, Any] = {}
        self._outputs = dict(outputs) if outputs else None
        if inputs is not None:
            # Checked now, kept as given: the run hands them to the model as the caller would
            # (a device tensor stays a tensor, not the form the checks passed on).
            named = model._checker._as_dict(inputs)
            model._checker.check(named)
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
        if name not in self.model._checker.names:
            raise InvalidInputError(
                f"unknown input {name!r}; the model takes "
                f"{', '.join(self.model._checker.names) or 'no inputs'}",
                details={"input": name},
            )
        self._inputs[name] = value

    def run(self) -> Any:
        """Run once with the bound inputs and outputs (see :meth:`LoadedModel.run`)."""
        return self.model.run(self._inputs, self._outputs)

    def run_async(self, **options: Any) -> Future[Any]:
        """Queue one run (see :meth:`LoadedModel.run_async` for ``options``)."""
        return self.model.run_async(self._inputs, self._outputs, **options)


def repeat(
    model: Runnable, inputs: Any, n: int, feedback: Mapping[str, str] | None = None
) -> dict[str, np.ndarray]:
    """Run ``model`` ``n`` times, feeding outputs back as inputs (see ``run_repeat``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgumentError(f"n={n!r}: give the number of runs, at least 1")
    feed = model._checker.check(inputs)
    outputs = {s.name for s in model.outputs}
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
        result = model.run(feed)
        for output, name in pairs.items():
            feed[name] = result[output]
    return result
