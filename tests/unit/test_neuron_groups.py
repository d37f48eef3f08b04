"""neuron-monitor's execution_stats from two snapshots of a process, and its config periods:
where each crossrt failure status counts, and counts over the period only."""

from __future__ import annotations

from typing import Any

import pytest

from crossrt.errors import InvalidArgumentError
from crossrt.runtime.statistics import BUCKETS_US
from crossrt.tools.neuron_groups import runtime_group
from crossrt.tools.neuron_monitor import parse_period


def _snapshot(success: int, failures: dict[str, int], at: float) -> dict[str, Any]:
    counts = [0] * (len(BUCKETS_US) + 1)
    counts[3] = success
    statistics = {
        "success": success,
        "failures": failures,
        "histogram": {"buckets_us": list(BUCKETS_US), "counts": counts},
        "instances": [{"count": success, "ns": 0}],
    }
    model = {"name": "m", "load": "m#1", "device": "cpu:0", "statistics": statistics}
    return {"pid": 1, "started": 100.0, "time": at, "models": [model]}


def test_failures_count_by_kind_over_the_period() -> None:
    before = _snapshot(10, {"TIMEOUT": 1, "HW_ERR_NC_UE": 1}, 110.0)
    after = _snapshot(
        15,
        {"TIMEOUT": 3, "HW_ERR_NC_UE": 2, "EXEC_BAD_INPUT": 4, "CANCELLED": 9, "CLOSED": 1},
        112.0,
    )
    stats = runtime_group("execution_stats", before, after, 2.0)
    assert stats["execution_summary"] == {
        "completed": 5,
        "completed_with_err": 0,
        "completed_with_num_err": 0,
        "timed_out": 2,
        "incorrect_input": 4,
        "failed_to_queue": 0,
    }
    assert stats["error_summary"] == {
        "generic": 1,  # CLOSED: no kind of its own
        "numerical": 0,
        "transient": 2,
        "model": 4,
        "runtime": 0,
        "hardware": 1,
    }  # CANCELLED: the caller gave up, no error
    latency = stats["latency_stats"]
    assert latency["device_latency"] is None
    assert BUCKETS_US[2] / 1e6 <= latency["total_latency"]["p50"] <= BUCKETS_US[3] / 1e6
    # Seen for the first time: everything since the process started, over that time.
    first = runtime_group("execution_stats", None, after, 2.0)
    assert first["execution_summary"]["completed"] == 15 and first["period"] == 12.0


def test_periods_are_neuron_monitors_durations() -> None:
    assert parse_period("1s", "p") == 1.0 and parse_period("500ms", "p") == 0.5
    assert parse_period("2m", "p") == 120.0 and parse_period(3, "p") == 3.0
    for bad in ("0s", "soon", True, "-1s"):
        with pytest.raises(InvalidArgumentError, match=r'write e\.g\. "1s"'):
            parse_period(bad, "p")
