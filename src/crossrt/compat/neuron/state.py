"""The process's one Neuron runtime, as libnrt keeps it, and the handles every ``nrt_*``
module checks: ``nrt_model_t`` and the NeuronCore a tensor was allocated for.

Its own module so that each family (execution, profiling, the async modes) reads the same
state without importing the others.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import LoadedModel, Runtime
from ...memory import Tensor
from ...profiling import Profile
from .status import NRT_STATUS, NrtError
from .types import nrt_framework_type_t

_model_ids = itertools.count(1)


@dataclass(eq=False)
class nrt_model_t:
    """A loaded model: the crossrt :class:`LoadedModel` and the cores it was staged on.

    Attributes:
        model: the crossrt model (its whole API is there: ``run_async``, ``stats``...).
        start_nc: the first core (an index among the process's cores).
        nc_count: how many cores, one copy of the model on each.
        rank: for ``nrt_load_collectives``, ``(g_device_id, g_device_count)``.
        model_id: the number the async-exec callback names it by (1, 2, ... in load order).
    """

    model: LoadedModel
    start_nc: int
    nc_count: int
    rank: tuple[int, int] | None = None
    model_id: int = field(default_factory=lambda: next(_model_ids))


class _State:
    """The process's runtime, as libnrt keeps it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runtime: Runtime | None = None
        self.closed = False
        self.framework = nrt_framework_type_t.NRT_FRAMEWORK_TYPE_INVALID
        self.log_handler: Any = None
        self.models: list[nrt_model_t] = []
        # File name -> (model, its Profile): the runtime's, with each API call marked in it.
        self.profiles: dict[str, tuple[nrt_model_t, Profile]] = {}
        self.inflight = 0
        """NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS as nrt_init read it (0: nrt_execute
        waits for its run)."""
        # What each family does at nrt_init (after the runtime exists) and at nrt_close
        # (before the models go): registered by the modules at import, so that this one
        # knows none of them.
        self.on_init: list[Callable[[], None]] = []
        self.on_close: list[Callable[[], None]] = []

    def require(self) -> Runtime:
        """The runtime, or the status the seed gives before ``nrt_init`` or after
        ``nrt_close``."""
        runtime = self.runtime
        if runtime is not None:
            return runtime
        if self.closed:
            raise NrtError(NRT_STATUS.NRT_CLOSED, "nrt_close() was called; call nrt_init again")
        raise NrtError(NRT_STATUS.NRT_UNINITIALIZED, "call nrt_init first")

    def require_nc(self, nc: Any, what: str = "vnc") -> int:
        """``nc`` when it is one of the process's cores, else NRT_INVALID."""
        visible = len(self.require().cores)
        if isinstance(nc, bool) or not isinstance(nc, int) or not 0 <= nc < visible:
            raise NrtError(
                NRT_STATUS.NRT_INVALID,
                f"{what} {nc!r}: this process holds NeuronCores 0..{visible - 1} "
                "(NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES)",
            )
        return nc


_state = _State()


def _model(model: Any) -> nrt_model_t:
    if not isinstance(model, nrt_model_t):
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, f"{model!r} is not an nrt_model_t")
    if model not in _state.models:
        _state.require()  # after nrt_close: NRT_CLOSED, as every call then (issue 27)
        raise NrtError(NRT_STATUS.NRT_INVALID_HANDLE, "the model was unloaded")
    return model


# The NeuronCore each tensor was allocated for (nrt_tensor_allocate's logical_nc_id): the
# async API runs a tensor's copies on that core's execution units. A crossrt Tensor has no
# core of its own, so the layer keeps it beside the tensor, for as long as the tensor lives.
_tensor_nc: weakref.WeakKeyDictionary[Tensor, int] = weakref.WeakKeyDictionary()


def tensor_nc(tensor: Tensor) -> int:
    """The NeuronCore ``tensor`` was allocated for (0 for one ``nrt_tensor_allocate`` did not
    make: an empty tensor, a crossrt tensor)."""
    return _tensor_nc.get(tensor, 0)


def set_tensor_nc(tensor: Tensor, nc: int) -> None:
    """Record the NeuronCore ``tensor`` belongs to."""
    _tensor_nc[tensor] = nc
