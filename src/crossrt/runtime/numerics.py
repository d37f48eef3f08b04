"""Opt-in detection of non-finite outputs (NaN, infinity): ``EXEC_COMPLETED_WITH_NUM_ERR``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from ..errors import ExecutionError, StatusCode

Numerics = bool | Literal["nan"]
"""What a load checks outputs for: nothing (``False``), NaN and infinity (``True``), or NaN
only (``"nan"``: Neuron's NRT_EXEC_COMPLETED_WITH_NUM_ERR means a NaN was produced)."""


def nonfinite(results: Mapping[str, Any], infinity: bool = True) -> list[str]:
    """Names of the floating-point outputs holding a NaN (or, with ``infinity``, an
    infinity)."""
    bad = []
    for name, value in results.items():
        array = value if isinstance(value, np.ndarray) else getattr(value, "_view", None)
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "fc":
            continue  # integers cannot hold NaN; non-tensors are not checked
        if array.size and not (np.isfinite(array) if infinity else ~np.isnan(array)).all():
            bad.append(name)
    return bad


def checking(
    model: str, execute: Callable[..., dict[str, Any]], infinity: bool = True
) -> Callable[..., dict[str, Any]]:
    """``execute``, raising EXEC_COMPLETED_WITH_NUM_ERR when an output holds a NaN (or, with
    ``infinity``, is not finite)."""
    what = "non-finite values (NaN or infinity)" if infinity else "NaN"

    def run(*args: Any) -> dict[str, Any]:
        results = execute(*args)
        bad = nonfinite(results, infinity)
        if bad:
            names = ", ".join(repr(n) for n in bad)
            raise ExecutionError(
                f"model {model!r} completed with {what} in "
                f"outputs {names}; check the inputs' range, or load without check_numerics to "
                "receive them anyway",
                code=StatusCode.EXEC_COMPLETED_WITH_NUM_ERR,
                details={"model": model, "outputs": bad},
            )
        return results

    return run
