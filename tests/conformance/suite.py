"""What the ONNX node suite runs and expects: its configurations, exclusions and thresholds.

Shared by the pytest suite (``test_onnx_node_suite.py``, one item per configuration and case),
its summary (``report.py``) and ``regenerate.py`` (``make exclusions``).
"""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import crossrt

from .backend import run_case
from .node_cases import NodeCase

EXCLUSIONS = Path(__file__).with_name("exclusions.toml")

# Fewest passing cases accepted per configuration (onnx 1.23: 1884 cases), a little below what
# passes (make exclusions prints it): a drop beyond the margin fails the session.
MIN_PASSED = {
    "onnxruntime": 1700,
    "openvino": 1240,  # 1250 pass
    "openvino-fallback": 1830,  # issue 10 asks 1830; 1834 pass
    "reference": 1850,
    "onnxruntime-fallback": 1825,
    "sim": 1680,
    "sim-fallback": 1825,
}


@dataclass(frozen=True)
class Config:
    """One way to run the suite: a driver, and where the nodes it cannot run go."""

    name: str  # the exclusions.toml table
    driver: str
    fallback: str | None = None
    unavailable: str = ""  # why it cannot run here
    device: str = "cpu"  # the device kind compiled for


def configurations() -> list[Config]:
    """Each registered driver alone, on the kind of its first device (``crossrt.
    driver_statuses()``: a newly registered driver joins without an edit here), then
    onnxruntime with fallback to the other CPU drivers, then each driver of another device
    kind (sim) with fallback to the CPU."""
    statuses = {s.name: s for s in crossrt.drivers.driver_statuses()}
    configs = []
    for status in statuses.values():
        devices = status.driver.devices() if status.driver is not None else []
        why = status.reason or ("" if devices else "it serves no device here")
        kind = devices[0].id.partition(":")[0] if devices else "cpu"
        configs.append(Config(status.name, status.name, None, why, kind))
    needed = ("onnxruntime", "reference")
    missing = [
        statuses[n].reason if n in statuses else f"no driver {n!r} is registered"
        for n in needed
        if n not in statuses or not statuses[n].available
    ]
    configs.append(Config("onnxruntime-fallback", "onnxruntime", "cpu", "; ".join(missing)))
    # Each other driver with fallback to the host CPU drivers, as a user of it compiles: what
    # it cannot run goes to the CPU; it should pass what onnxruntime with fallback passes.
    for config in [c for c in configs if c.fallback is None and c.driver not in needed]:
        why = "; ".join(x for x in (config.unavailable, *missing) if x)
        configs.append(Config(f"{config.name}-fallback", config.driver, "cpu", why, config.device))
    return configs


def engine_version(config: Config) -> str:
    """The version of the engine behind ``config``'s driver (it must be available)."""
    return str(crossrt.drivers.get_driver(config.driver).version)


@dataclass(frozen=True)
class Exclusions:
    """One configuration's table of exclusions.toml: case name -> why."""

    excluded: dict[str, str]  # known to fail: passing fails the test, so a fix is noticed
    flaky: dict[str, str]  # may pass or fail

    @property
    def names(self) -> set[str]:
        return self.excluded.keys() | self.flaky.keys()


def load_exclusions(path: Path = EXCLUSIONS) -> dict[str, Exclusions]:
    """Every table of the exclusions file, by configuration name.

    Raises:
        ValueError: an entry without a reason, or a case in both tables of a configuration.
    """
    tables = {}
    for name, table in tomllib.loads(path.read_text(encoding="utf-8")).items():
        excluded = dict(table)
        flaky = excluded.pop("flaky", {})
        for case, why in (*excluded.items(), *flaky.items()):
            if not (isinstance(why, str) and why.strip()):
                raise ValueError(f"{path.name} [{name}] {case}: give a reason string")
        both = excluded.keys() & flaky.keys()
        if both:
            raise ValueError(f"{path.name} [{name}] lists {sorted(both)} in both tables")
        tables[name] = Exclusions(excluded, flaky)
    return tables


def failure(case: NodeCase, config: Config) -> str | None:
    """Run ``case`` on ``config``: ``None`` when it passed, else a one-line description of
    why not (the exception's type and message)."""
    # The evaluators overflow, divide by zero and take logs of zero on purpose.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            run_case(case, config.device, config.driver, config.fallback)
        except Exception as exc:
            return describe(exc)
    return None


def describe(exc: BaseException) -> str:
    """``Type: message``, its first 6 lines joined by `` | ``, at most 1000 characters (the
    reasons ``make exclusions`` derives need the message past ORT's long prefixes)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {' | '.join(lines[:6])}"
    return text if len(text) <= 1000 else text[:997] + "..."
