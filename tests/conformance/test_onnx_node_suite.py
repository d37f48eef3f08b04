"""The ONNX backend node conformance suite, through crossrt, on every available driver.

One test per configuration and case (load_model, compile, load, run, compare): ``-k test_celu``
selects a case, and pytest-xdist shares the cases between workers. A test fails when its case
fails and ``exclusions.toml`` does not exclude it, or when an excluded case passes (so a fix is
noticed: remove its entry, or run ``make exclusions``). Cases whose outcome depends on the run
or the machine are listed under ``[<config>.flaky]`` and may pass or fail. When a
configuration's whole suite ran, the session fails if fewer cases passed than its threshold
(``suite.MIN_PASSED``): ``report.py`` counts the outcomes and prints one line per
configuration.
"""

from __future__ import annotations

import functools

import onnx
import pytest

from .node_cases import NodeCase, load_case_names, read_case
from .suite import EXCLUSIONS, Config, configurations, engine_version, failure, load_exclusions

OUTCOME = "onnx-node-outcome"  # the user property a test reports its outcome under (report.py)

_EXCLUSIONS = load_exclusions()
_CASES = load_case_names()


def _params() -> list[object]:
    params = []
    for config in configurations():
        if config.unavailable:
            skip = pytest.mark.skip(reason=f"{config.name} cannot run here: {config.unavailable}")
        elif config.name not in _EXCLUSIONS:
            skip = pytest.mark.skip(
                reason=f"no [{config.name}] table in {EXCLUSIONS.name}: no baseline for it "
                "(make exclusions)"
            )
        else:
            skip = None
        marks = [pytest.mark.slow, *([skip] if skip else [])]
        params += [
            pytest.param(config, name, id=f"{config.name}-{name}", marks=marks) for name in _CASES
        ]
    return params


@functools.cache
def _case(name: str) -> NodeCase:
    return read_case(name)


@pytest.mark.parametrize(("config", "case_name"), _params())
def test_onnx_node(config: Config, case_name: str, request: pytest.FixtureRequest) -> None:
    rules = _EXCLUSIONS[config.name]
    error = failure(_case(case_name), config)
    listed = next((t for t in ("flaky", "excluded") if case_name in getattr(rules, t)), "")
    request.node.user_properties.append(
        (OUTCOME, (config.name, engine_version(config), error is None, listed))
    )
    if error is not None and not listed:
        pytest.fail(
            f"{case_name} fails on {config.name} and {EXCLUSIONS.name} [{config.name}] does not "
            f"exclude it: {error}",
            pytrace=False,
        )
    if error is None and listed == "excluded":
        pytest.fail(
            f"{case_name} passes on {config.name} but {EXCLUSIONS.name} [{config.name}] excludes "
            f"it ({rules.excluded[case_name]}): remove the entry (make exclusions)",
            pytrace=False,
        )


@pytest.mark.parametrize("table", sorted(_EXCLUSIONS))
def test_exclusions_name_only_cases_onnx_has(table: str) -> None:
    unknown = sorted(_EXCLUSIONS[table].names - set(_CASES))
    assert not unknown, (
        f"{EXCLUSIONS.name} [{table}] names cases onnx {onnx.__version__} does not have: "
        f"{', '.join(unknown)} (make exclusions)"
    )
