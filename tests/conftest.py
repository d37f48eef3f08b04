"""Fixtures shared by every test folder; tests/README.md says which folder a test goes in.

pytest puts this folder on ``sys.path`` when it loads this file, so the helper modules beside
it (``models``, ``concurrency_models``, ``crm_layout``) import by their plain names from any
folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crossrt
from concurrency_models import tiny
from conformance.report import ConformanceReport
from crossrt.drivers import get_driver


def pytest_configure(config: pytest.Config) -> None:
    # Here, not in tests/conformance/conftest.py: conformance/report.py says why.
    config.pluginmanager.register(ConformanceReport(), "crossrt-conformance-report")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (``make test``): every test of tests/ray on one worker, so that one
    Ray cluster is started, not one per worker (two clusters on CI's 2 cores). The
    ``xdist_group`` marker cannot do it: pytest-xdist 3.8 suffixes ``item._nodeid``, which
    pytest 9 no longer reads, so ``--dist loadgroup`` groups nothing. Every other test is a
    scope of its own, handed out as the default distribution hands them out."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RayOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "tests/ray" if nodeid.startswith("tests/ray/") else nodeid

    return RayOnOneWorker(config, log)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``CROSSRT_RUNTIME_DIR`` of this test's own (core locks, allocation-log dumps), not yet
    created, and no core reservation asked by the environment: a test never sees another
    test's locks or the user's. Files that need it in every test name it in ``pytestmark``."""
    folder = tmp_path / "run"
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("CROSSRT_VISIBLE_CORES", raising=False)
    monkeypatch.delenv("CROSSRT_NUM_CORES", raising=False)
    return folder


@pytest.fixture
def rt() -> Iterator[crossrt.Runtime]:
    """A default runtime, closed after the test."""
    with crossrt.Runtime() as runtime:
        yield runtime


@pytest.fixture(scope="module")
def tiny_exe() -> crossrt.Executable:
    """``concurrency_models.tiny()`` compiled for the default device, once per test file."""
    return crossrt.compile(tiny())


@pytest.fixture
def ort_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int], tuple[int, int]]:
    """``ort_reads(max_ir, max_opset)``: the onnxruntime driver takes ORT to read at most that
    IR version and ai.onnx opset (the limits it probed, made lower; never higher than the
    installed ORT's), for this test, so that models newer than ORT reads exist whatever ORT is
    installed. Returns the limits in force."""
    driver = get_driver("onnxruntime")
    real = driver._registry()
    monkeypatch.delenv("CROSSRT_CACHE_DIR", raising=False)  # a cached artifact is not lowered

    def reads(max_ir: int, max_opset: int) -> tuple[int, int]:
        limits = dataclasses.replace(
            real, max_ir=min(max_ir, real.max_ir), max_opset=min(max_opset, real.max_opset)
        )
        monkeypatch.setattr(driver, "_known", limits)
        return limits.max_ir, limits.max_opset

    return reads
