"""Fixtures of the conformance suite, and its per-driver counts in pytest's final summary."""

from __future__ import annotations

import pytest

from .node_cases import NodeCase, load_node_cases

# driver name -> one summary line, written by the test and printed at the end of the session
_SUMMARY = pytest.StashKey[dict[str, str]]()


@pytest.fixture(scope="session")
def node_cases() -> list[NodeCase]:
    """Every ONNX backend node test of the installed onnx (cached under .cache/)."""
    return load_node_cases()


@pytest.fixture
def conformance_summary(request: pytest.FixtureRequest) -> dict[str, str]:
    """Where a test leaves its driver's summary line for the terminal report."""
    return request.config.stash.setdefault(_SUMMARY, {})


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(_SUMMARY, {})
    if lines:
        terminalreporter.section("ONNX backend node conformance")
        for name in sorted(lines):
            terminalreporter.write_line(lines[name])
