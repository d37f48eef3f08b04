"""A model loaded with shape stages (bmrt's stages): each run goes to the stage whose static
input shapes equal the inputs' shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from ..compiler import Executable
from ..compiler.stages import describe, stage_shapes
from ..drivers.base import CancelToken
from ..errors import InvalidHandleError, InvalidInputError
from .binding import Binding
from .instance import Instance
from .loaded import LoadedModel


class StagedModel(LoadedModel):
    """A :class:`LoadedModel` of an executable with ``stages``.

    It is itself the first stage (the executable's nodes are that stage's); every other stage
    is an inner model loaded on the same cores, which runs only through this one, so that
    start, stop, unload and close act on all stages at once.
    """

    def __init__(
        self, *args: Any, load: Callable[[Executable], Sequence[Instance]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        exe = self.executable
        self._shapes = [stage_shapes(s) for s in exe.stages]
        self._inner: list[LoadedModel] = []
        try:
            for stage in exe.stages[1:]:
                # The inner models share this one's group without joining it: only this one
                # runs there, and it forwards runs to them.
                self._inner.append(
                    LoadedModel(
                        self._forget,
                        stage,
                        load(stage),
                        self.device,
                        self.cores,
                        self.instances.group,
                        queue_depth=kwargs.get("queue_depth"),
                        exec_timeout=self.instances.exec_timeout,
                        check_numerics=self.instances.check_numerics,
                        statistics=self._statistics,
                    )
                )
        except BaseException:  # the caller closes this one's programs; close the stages'
            for inner in self._inner:
                inner._release(InvalidHandleError, f"model {self.name!r} failed to load")
            raise
        keys = [tuple(s.items()) for s in self._shapes]
        self._by_shape = dict(zip(keys, [self, *self._inner], strict=True))

    def _stage(self, inputs: Any) -> LoadedModel:
        try:
            return self._stage_of(inputs)
        except BaseException as exc:  # refused here, before any stage counts it
            self._statistics.arrived()
            self._statistics.failed(exc)
            raise

    def _stage_of(self, inputs: Any) -> LoadedModel:
        feed = self._checker.checked_feed(inputs)
        key = tuple((n, tuple(getattr(feed[n], "shape", ()))) for n, _ in self._shapes[0].items())
        found = self._by_shape.get(key)
        if found is None:
            given = describe(dict(key))
            listed = "; ".join(describe(s) for s in self._shapes)
            raise InvalidInputError(
                f"no stage of {self.name!r} takes {given}; stages: {listed}. Give inputs of "
                "one of those shapes (pad or split a batch), or compile with a stage for it",
                details={"model": self.name, "stages": [dict(s) for s in self._shapes]},
            )
        return found

    def run(
        self,
        inputs: Any,
        outputs: Mapping[str, Any] | None = None,
        *,
        deadline: float | None = None,
        cancel: CancelToken | None = None,
        output_names: Sequence[str] | None = None,
        binding: Binding | None = None,
    ) -> Any:
        """Run the stage whose input shapes equal the inputs' (see :meth:`LoadedModel.run`;
        a request to a staged model is checked on every run: ``binding`` is never given).

        Raises:
            InvalidInputError: (EXEC_BAD_INPUT) no stage takes these shapes; the message
                lists the stages.
        """
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        stage = self._stage(inputs)
        if stage is self:
            return super().run(
                inputs, outputs, deadline=deadline, cancel=cancel, output_names=output_names
            )
        return stage.run(
            inputs, outputs, deadline=deadline, cancel=cancel, output_names=output_names
        )

    def run_async(
        self, inputs: Any, outputs: Mapping[str, Any] | None = None, **options: Any
    ) -> Future[Any]:
        """:meth:`LoadedModel.run_async` on the stage whose shapes equal the inputs'."""
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        stage = self._stage(inputs)
        if stage is self:
            return super().run_async(inputs, outputs, **options)
        return stage.run_async(inputs, outputs, **options)

    async def infer(
        self, inputs: Any, outputs: Mapping[str, Any] | None = None, **options: Any
    ) -> Any:
        """:meth:`LoadedModel.infer` on the stage whose shapes equal the inputs'."""
        if self._refusal is not None:
            raise self._refusal[0](self._refusal[1])
        stage = self._stage(inputs)
        if stage is self:
            return await super().infer(inputs, outputs, **options)
        return await stage.infer(inputs, outputs, **options)

    def _bind(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> Binding | None:
        """Never bound: which stage runs is known only from the inputs of each run."""
        return None

    def _release(self, error: type[Exception], message: str) -> None:
        super()._release(error, message)
        for inner in self._inner:
            inner._release(error, message)
