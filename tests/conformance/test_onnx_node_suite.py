"""The ONNX backend node conformance suite, through crossrt, on every available driver.

Every case runs on each driver (load_model, compile, load, run, compare). The test fails when
a case fails that ``exclusions.toml`` does not exclude, when an excluded case passes (so a fix
is noticed: remove its entry), or when fewer cases pass than the driver's threshold. Cases
whose outcome depends on the run or the machine are listed under ``[<driver>.flaky]`` and
may pass or fail.
"""

from __future__ import annotations

import time
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

import crossrt

from .backend import run_case
from .node_cases import NodeCase

EXCLUSIONS = Path(__file__).with_name("exclusions.toml")

# Fewest passing cases accepted per configuration (onnx 1.23: 1884 cases).
MIN_PASSED = {"onnxruntime": 1480, "reference": 1850, "onnxruntime-fallback": 1820}


@dataclass(frozen=True)
class Config:
    """One way to run the suite: a driver, and where the nodes it cannot run go."""

    name: str  # the exclusions.toml table
    driver: str
    fallback: str | None = None
    unavailable: str = ""  # why it cannot run here


def configurations() -> list[Config]:
    """Each registered driver alone, then onnxruntime with fallback to the other CPU drivers."""
    statuses = {s.name: s for s in crossrt.driver_statuses()}
    configs = [Config(s.name, s.name, None, s.reason) for s in statuses.values()]
    needed = ("onnxruntime", "reference")
    missing = [statuses[n].reason for n in needed if not statuses[n].available]
    configs.append(Config("onnxruntime-fallback", "onnxruntime", "cpu", "; ".join(missing)))
    return configs


_LISTED = 80  # failing cases spelled out in the assertion message


@dataclass(frozen=True)
class Exclusions:
    """One driver's table of exclusions.toml: case name -> why."""

    excluded: dict[str, str]
    flaky: dict[str, str]  # may pass or fail

    @property
    def names(self) -> set[str]:
        return self.excluded.keys() | self.flaky.keys()


def load_exclusions(driver: str) -> Exclusions | None:
    """The driver's exclusions, or ``None`` when the file has no table for it."""
    table = tomllib.loads(EXCLUSIONS.read_text(encoding="utf-8")).get(driver)
    if table is None:
        return None
    excluded = dict(table)
    flaky = excluded.pop("flaky", {})
    for name, why in (*excluded.items(), *flaky.items()):
        assert isinstance(why, str) and why.strip(), f"[{driver}] {name}: give a reason string"
    both = excluded.keys() & flaky.keys()
    assert not both, f"[{driver}] lists {sorted(both)} in both tables"
    return Exclusions(excluded, flaky)


def run_suite(cases: list[NodeCase], config: Config) -> dict[str, str | None]:
    """Case name -> ``None`` when it passed, else a one-line description of the failure."""
    results: dict[str, str | None] = {}
    # The evaluators overflow, divide by zero and take logs of zero on purpose.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for case in cases:
            try:
                run_case(case, config.driver, config.fallback)
            except Exception as exc:
                results[case.name] = _describe(exc)
            else:
                results[case.name] = None
    return results


@pytest.mark.slow
@pytest.mark.parametrize("config", configurations(), ids=lambda c: c.name)
def test_onnx_node_suite(
    config: Config,
    node_cases: list[NodeCase],
    conformance_summary: dict[str, str],
) -> None:
    if config.unavailable:
        pytest.skip(f"{config.name} cannot run here: {config.unavailable}")
    rules = load_exclusions(config.name)
    if rules is None:
        pytest.skip(f"no [{config.name}] table in {EXCLUSIONS.name}: no baseline for it")
    version = crossrt.drivers.get_driver(config.driver).version

    start = time.perf_counter()
    results = run_suite(node_cases, config)
    seconds = time.perf_counter() - start

    passed = [name for name, error in results.items() if error is None]
    failed = {
        name: error
        for name, error in results.items()
        if error is not None and name not in rules.names
    }
    fixed = sorted(name for name in passed if name in rules.excluded)
    unknown = sorted(rules.names - results.keys())
    minimum = MIN_PASSED.get(config.name, 0)
    conformance_summary[config.name] = (
        f"{config.name} ({version}): {len(passed)} passed / "
        f"{len(rules.names)} excluded ({len(rules.flaky)} flaky) / "
        f"{len(results)} total; {len(failed)} failed unexpectedly, {len(fixed)} excluded but "
        f"passed; threshold {minimum}; {seconds:.1f} s"
    )

    problems = []
    if failed:
        listed = "\n".join(f"  {name}: {error}" for name, error in list(failed.items())[:_LISTED])
        more = f"\n  ... and {len(failed) - _LISTED} more" if len(failed) > _LISTED else ""
        problems.append(
            f"{len(failed)} cases failed that {EXCLUSIONS.name} [{config.name}] does not "
            f"exclude:\n{listed}{more}"
        )
    if fixed:
        problems.append(
            f"{len(fixed)} excluded cases now pass; remove them from [{config.name}] in "
            f"{EXCLUSIONS.name}: {', '.join(fixed)}"
        )
    if unknown:
        problems.append(
            f"{EXCLUSIONS.name} [{config.name}] names cases onnx {onnx.__version__} does not "
            f"have: {', '.join(unknown)}"
        )
    if len(passed) < minimum:
        problems.append(f"only {len(passed)} cases passed; at least {minimum} must")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def _describe(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {' | '.join(lines[:4])}"
    return text if len(text) <= 400 else text[:397] + "..."
