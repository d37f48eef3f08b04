"""A crossrt backend for the ONNX node tests: one case through crossrt's public API, the
outputs compared as the ONNX backend runner compares them (rtol 1e-3, atol 1e-7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import crossrt

from .node_cases import NodeCase

RTOL = 1e-3
ATOL = 1e-7
BFLOAT16_RTOL = 2**-6  # two bfloat16 ULPs, as the ONNX runner allows


def run_case(case: NodeCase, device: str, driver: str, fallback: str | None = None) -> None:
    """load_model, compile for ``device`` with ``driver`` (placing what it cannot run on
    ``fallback``), load, run each data set; raise on any difference."""
    model = crossrt.load_model(case.model_path)
    executable = crossrt.compile(model, device, driver=driver, fallback=fallback)
    with crossrt.Runtime() as runtime:
        model = runtime.load(executable)
        for inputs, expected in case.data_sets:
            outputs = model.run(list(inputs))
            assert_similar(expected, list(outputs.values()))


def assert_similar(expected: Sequence[Any], actual: Sequence[Any]) -> None:
    """Raise AssertionError naming the first output that differs."""
    if len(actual) != len(expected):
        raise AssertionError(f"got {len(actual)} outputs, expected {len(expected)}")
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        _similar(want, got, f"output {i}")


def _similar(want: Any, got: Any, where: str) -> None:
    if want is None or got is None:  # an empty optional
        if want is not got:
            raise AssertionError(f"{where}: expected {_what(want)}, got {_what(got)}")
    elif isinstance(want, list):  # a sequence (or an optional holding one)
        if not isinstance(got, list | tuple) or len(got) != len(want):
            raise AssertionError(f"{where}: expected {_what(want)}, got {_what(got)}")
        for j, (w, g) in enumerate(zip(want, got, strict=True)):
            _similar(w, g, f"{where}[{j}]")
    elif isinstance(want, dict):  # a map
        if not isinstance(got, dict) or got.keys() != want.keys():
            raise AssertionError(f"{where}: expected {_what(want)}, got {_what(got)}")
        for key in want:
            _similar(want[key], got[key], f"{where}[{key!r}]")
    else:
        _similar_arrays(np.asarray(want), got, where)


def _similar_arrays(want: np.ndarray, got: Any, where: str) -> None:
    if not isinstance(got, np.ndarray):
        raise AssertionError(f"{where}: expected {_what(want)}, got {_what(got)}")
    if got.shape != want.shape:
        raise AssertionError(f"{where}: expected shape {want.shape}, got {got.shape}")
    if want.dtype.kind in "OUS":  # strings: object, str or bytes arrays alike
        if got.dtype.kind not in "OUS":
            raise AssertionError(f"{where}: expected strings, got {got.dtype}")
        np.testing.assert_array_equal(got.astype(object), want.astype(object), err_msg=where)
        return
    if got.dtype != want.dtype:
        raise AssertionError(f"{where}: expected dtype {want.dtype}, got {got.dtype}")
    if want.dtype.kind == "c":
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=where)
    elif want.dtype.kind == "f" or want.dtype.name.startswith(("float", "bfloat")):
        # float16..64 and ml_dtypes' bfloat16, float8 and float4, compared in float64; NaN
        # equals NaN, infinities must match
        rtol = BFLOAT16_RTOL if want.dtype.name == "bfloat16" else RTOL
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=ATOL, err_msg=where
        )
    else:  # bool and integers (int4 and int2 too): exact
        np.testing.assert_array_equal(got, want, err_msg=where, strict=True)


def _what(value: Any) -> str:
    if value is None:
        return "None (an empty optional)"
    if isinstance(value, list | tuple):
        return f"a sequence of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array {value.dtype}{list(value.shape)}"
    return type(value).__name__
