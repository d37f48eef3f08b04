"""The ONNX node suite's per-configuration counts and thresholds, over all its tests.

Each test of ``test_onnx_node_suite.py`` reports its outcome as a user property of its report;
the hooks here add them up where every report arrives: in the one pytest process, or on the
pytest-xdist controller (the workers forward their reports with their user properties). That
is why tests/conftest.py, not a conftest of this folder, registers :class:`ConformanceReport`:
a controller collects nothing and loads only the conftest files of the paths it is given,
their parents, and their ``test*`` subfolders, so ``pytest tests -n 2`` would never load
``tests/conformance/conftest.py``.

At the end of the session, one line per configuration is printed; a configuration whose every
case ran, with fewer passes than ``suite.MIN_PASSED``, fails the session.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .node_cases import load_case_names
from .suite import MIN_PASSED, load_exclusions

_OUTCOME = "onnx-node-outcome"  # as test_onnx_node_suite.OUTCOME, without importing the tests


@dataclass
class _Tally:
    version: str
    ran: int = 0
    passed: int = 0
    failed: int = 0  # failed and not excluded
    fixed: int = 0  # excluded (not flaky) and passed
    seconds: float = 0.0


class ConformanceReport:
    """Adds up the outcomes of the suite's tests and checks the thresholds."""

    def __init__(self) -> None:
        self.tallies: dict[str, _Tally] = {}
        self.lines: list[str] = []
        self.problems: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key != _OUTCOME:
                continue
            config, version, passed, listed = value
            tally = self.tallies.setdefault(config, _Tally(version))
            tally.ran += 1
            tally.passed += passed
            tally.failed += not passed and not listed
            tally.fixed += passed and listed == "excluded"
            tally.seconds += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.tallies:
            return  # an xdist worker: the controller counts
        total = len(load_case_names())
        tables = load_exclusions()
        for name in sorted(self.tallies):
            t = self.tallies[name]
            rules = tables[name]
            minimum = MIN_PASSED.get(name, 0)
            if t.ran == total:
                verdict = f"threshold {minimum}"
                if t.passed < minimum:
                    verdict += " NOT MET"
                    self.problems.append(
                        f"{name}: only {t.passed} of {total} ONNX node cases passed; at least "
                        f"{minimum} must (tests/conformance/suite.py MIN_PASSED)"
                    )
            else:
                verdict = f"{t.ran} of {total} cases ran: threshold {minimum} not checked"
            self.lines.append(
                f"{name} ({t.version}): {t.passed} passed / {len(rules.names)} excluded "
                f"({len(rules.flaky)} flaky) / {total} total; {t.failed} failed unexpectedly, "
                f"{t.fixed} excluded but passed; {verdict}; {t.seconds:.1f} s in tests"
            )
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.lines:
            return
        terminalreporter.section("ONNX backend node conformance")
        for line in self.lines:
            terminalreporter.write_line(line)
        for problem in self.problems:
            terminalreporter.write_line(f"FAILED {problem}", red=True, bold=True)
