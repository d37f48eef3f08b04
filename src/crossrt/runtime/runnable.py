"""RunnableModel: the one name for "a model you can run".

A model loaded in this process (:class:`~crossrt.LoadedModel`), one compiled with static
shape stages (``StagedModel``) and one a daemon serves (``RemoteModel``, from
:func:`crossrt.connect`) answer the same calls. Code that only runs a model (a benchmark loop,
a server adapter) takes a ``RunnableModel`` and works with any of them::

    def warm_up(model: crossrt.RunnableModel, feed: dict[str, np.ndarray]) -> None:
        for _ in range(10):
            model.run(feed)

It is a :class:`typing.Protocol`: mypy checks each class against it (``_check`` below, and
``tools/bench.py``'s ``measure`` for the daemon's models), and ``isinstance(m,
crossrt.RunnableModel)`` tells at run time that ``m`` has these members (not their types).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..cancel import CancelToken
    from ..model import TensorSpec
    from .loaded import LoadedModel
    from .staged import StagedModel
    from .statistics import ModelStatistics

__all__ = ["RunnableModel"]


@runtime_checkable
class RunnableModel(Protocol):
    """What every model you can run answers, wherever it runs."""

    @property
    def name(self) -> str:
        """The name errors, statistics and ``crossrt top`` call the model by."""
        ...

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs ``run`` takes, in order."""
        ...

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs ``run`` returns, in order."""
        ...

    def run(
        self,
        inputs: Any,
        outputs: Any = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
    ) -> Any:
        """Run once and return the outputs by name (see :meth:`crossrt.LoadedModel.run`)."""
        ...

    def run_async(
        self, inputs: Any, outputs: Any = None, *, deadline: float | None = None
    ) -> Future[Any]:
        """Run once; a :class:`concurrent.futures.Future` of the outputs."""
        ...

    async def infer(
        self, inputs: Any, outputs: Any = None, *, deadline: float | None = None
    ) -> Any:
        """``await model.infer(inputs)``: :meth:`run_async` for asyncio."""
        ...

    def statistics(self) -> ModelStatistics:
        """Requests, failures by status, queue and compute time, latency percentiles."""
        ...

    def start(self) -> None:
        """Run it on its core group (stopping the group's running model)."""
        ...

    def stop(self) -> None:
        """Stop taking requests until :meth:`start`."""
        ...

    def unload(self) -> None:
        """Release it; later calls fail with ``InvalidHandleError``."""
        ...


if TYPE_CHECKING:

    def _check(loaded: LoadedModel, staged: StagedModel) -> tuple[RunnableModel, ...]:
        # mypy fails here when LoadedModel or StagedModel stops being a RunnableModel.
        return loaded, staged
