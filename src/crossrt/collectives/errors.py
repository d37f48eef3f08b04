"""The error a broken collective raises."""

from __future__ import annotations

from ..errors import CrossrtError, StatusCode


class CollectiveError(CrossrtError, RuntimeError):
    """A collective could not complete: a peer exited, or the communicator is broken (Neuron's
    NRT_EXEC_HW_ERR_COLLECTIVES, a stuck collective)."""

    default_code = StatusCode.EXEC_HW_ERR_COLLECTIVES
