"""``crossrt monitor --format neuron-monitor``: crossrt processes in AWS neuron-monitor's JSON.

neuron-monitor prints one JSON document per line: ``neuron_runtime_data`` (per Neuron process:
``pid``, ``address``, ``neuron_runtime_tag``, ``error`` and a ``report`` of runtime metric
groups), ``system_data`` (the machine's groups), ``instance_info`` and
``neuron_hardware_info``. Its config file (``-c``) sets the ``period``, which processes to
watch (``neuron_runtimes[].tag_filter``, a regular expression on the process tag) and which
groups to collect, each with its own period. This module reads that config file and writes
that layout from crossrt's own facts:

- a NeuronCore is a crossrt core (``neuroncores_in_use`` keyed by core index; utilization is
  the engine time of the model instances placed on it over the period);
- ``execution_stats`` come from each model's ``ModelStatistics``: successes are
  ``completed``, failures by status code go to ``execution_summary`` and ``error_summary``
  (``neuron_groups.FAILURE_KINDS``), ``total_latency`` percentiles from the latency histogram;
- ``memory_used`` from the allocator accounts of the models (``OwnerStats``): on the cpu device
  host memory, on the others device memory; per model, the bytes charged to its load.

What crossrt cannot know is ``null`` (``flops``, ``device_latency``, the host breakdown but
tensors, the EC2 instance fields) or empty (``neuron_hw_counters``: no ECC counters), as
docs/observability.md lists. Counts (``execution_summary``...) are over the group's period,
as neuron-monitor's are; a process seen for the first time counts from its start.
"""

from __future__ import annotations

import json
import platform
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from ..runtime import observer
from .common import require_psutil
from .neuron_groups import runtime_group

RUNTIME_GROUPS = (
    "neuroncore_counters",
    "execution_stats",
    "memory_used",
    "neuron_runtime_vcpu_usage",
)
SYSTEM_GROUPS = ("vcpu_usage", "memory_info", "neuron_hw_counters")
DEFAULT_PERIOD = 5.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_period(value: Any, where: str) -> float:
    """neuron-monitor's period (``"1s"``, ``"500ms"``, ``"2m"``; a bare number is seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*", str(value))
    seconds = (
        float(match[1]) * _UNITS[match[2] or "s"] if match and not isinstance(value, bool) else 0
    )
    if seconds <= 0:
        raise InvalidArgumentError(
            f'{where}: period {value!r} is not a duration above 0; write e.g. "1s" or "500ms"'
        )
    return seconds


@dataclass
class RuntimeFilter:
    """One ``neuron_runtimes`` entry: processes whose tag matches ``tag_filter`` (searched,
    as a regular expression), and their groups with their periods."""

    tag_filter: re.Pattern[str]
    groups: dict[str, float]


@dataclass
class NeuronConfig:
    """A neuron-monitor config file, read by :func:`load_config`."""

    period: float = DEFAULT_PERIOD
    runtimes: list[RuntimeFilter] = field(default_factory=list)
    system: dict[str, float] = field(default_factory=dict)

    @classmethod
    def default(cls, period: float = DEFAULT_PERIOD) -> NeuronConfig:
        """neuron-monitor's default: every group, every ``period``, for every process."""
        every = dict.fromkeys(RUNTIME_GROUPS, period)
        return cls(
            period, [RuntimeFilter(re.compile(".*"), every)], dict.fromkeys(SYSTEM_GROUPS, period)
        )

    def match(self, tag: str) -> RuntimeFilter | None:
        """The first entry whose ``tag_filter`` matches ``tag`` (neuron-monitor's order)."""
        return next((r for r in self.runtimes if r.tag_filter.search(tag)), None)

    def tick(self) -> float:
        """How often a group falls due: the shortest period."""
        periods = [p for r in self.runtimes for p in r.groups.values()] + list(self.system.values())
        return min(periods, default=self.period)


def load_config(path: str | Path) -> NeuronConfig:
    """Read a neuron-monitor JSON config file.

    Raises:
        InvalidArgumentError: it cannot be read, is not JSON, or names an unknown group,
            a bad period or regular expression (the message says which and what to write).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"-c {path}: cannot read a JSON config file ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"-c {path}: a config file is one JSON object")
    period = parse_period(doc.get("period", "5s"), f"{path}: period")
    runtimes = []
    for i, entry in enumerate(_list(doc, "neuron_runtimes", path)):
        where = f"{path}: neuron_runtimes[{i}]"
        if not isinstance(entry, dict):
            raise InvalidArgumentError(f"{where} is not an object")
        own = parse_period(entry.get("period", period), f"{where}.period")
        try:
            tag_filter = re.compile(str(entry.get("tag_filter", ".*")))
        except re.error as exc:
            raise InvalidArgumentError(
                f"{where}.tag_filter: not a regular expression ({exc})"
            ) from None
        runtimes.append(
            RuntimeFilter(tag_filter, _groups(entry, "metrics", RUNTIME_GROUPS, own, where))
        )
    system = _groups(doc, "system_metrics", SYSTEM_GROUPS, period, str(path))
    return NeuronConfig(period, runtimes, system)


def _list(doc: Mapping[str, Any], key: str, where: object) -> list[Any]:
    found = doc.get(key, [])
    if not isinstance(found, list):
        raise InvalidArgumentError(f"{where}: {key} is a list")
    return found


def _groups(
    doc: Mapping[str, Any], key: str, known: Sequence[str], period: float, where: str
) -> dict[str, float]:
    groups: dict[str, float] = {}
    for j, metric in enumerate(_list(doc, key, where)):
        kind = metric.get("type") if isinstance(metric, dict) else None
        if not isinstance(kind, str) or kind not in known:
            raise InvalidArgumentError(
                f"{where}.{key}[{j}]: type {kind!r} is not one of {', '.join(known)}"
            )
        groups[kind] = parse_period(metric.get("period", period), f"{where}.{key}[{j}].period")
    return groups


# -- documents ----------------------------------------------------------------------------


class NeuronSampler:
    """Documents in neuron-monitor's layout, each group computed when its period is due and
    compared with the snapshot taken when it was last computed (the group's ``period`` is
    that measured time). A document holds the groups that fell due since the previous one
    (all of them with one period for all): a consumer adds each ``execution_summary`` to its
    counters, so a count must not be said twice."""

    def __init__(self, config: NeuronConfig, timeout: float = 2.0) -> None:
        self.config = config
        self.timeout = timeout
        self.psutil = require_psutil()
        self.psutil.cpu_times_percent(interval=None, percpu=True)
        now = time.monotonic()
        self._system_at = dict.fromkeys(config.system, now)
        self._said: set[str] = set()
        self._switches = self.psutil.cpu_stats().ctx_switches
        # (pid, started, group) -> (monotonic time, snapshot) the group was last computed at
        self._runtime_at: dict[tuple[Any, Any, str], tuple[float, Mapping[str, Any] | None]] = {}
        for snap in self._snapshots():
            for group in self._groups_of(snap):
                self._runtime_at[(snap["pid"], snap.get("started"), group)] = (now, snap)

    def _snapshots(self) -> list[dict[str, Any]]:
        return observer.processes(self.timeout)

    def _groups_of(self, snap: Mapping[str, Any]) -> dict[str, float]:
        found = self.config.match(str(snap.get("tag", "")))
        return found.groups if found is not None else {}

    def sample(self) -> dict[str, Any]:
        """One document of every watched process and the machine."""
        now = time.monotonic()
        # Documents come every tick, give or take a late one: a group whose period is all
        # but half a tick over is due now, not a whole tick late (or skipped when the
        # previous document came late and this one on time).
        slack = self.config.tick() / 2
        runtimes = []
        for snap in self._snapshots():
            if "error" in snap:
                continue  # no tag to filter by: neuron-monitor shows only what it can read
            found = self.config.match(str(snap.get("tag", "")))
            if found is None:
                continue
            report = {}
            for group, period in found.groups.items():
                key = (snap["pid"], snap.get("started"), group)
                at, before = self._runtime_at.get(key, (now - period, None))
                if key in self._runtime_at and now - at < period - slack:
                    continue  # not due: a consumer adds counts up, so each is said once
                report[group] = runtime_group(group, before, snap, max(now - at, 1e-9))
                self._runtime_at[key] = (now, snap)
            runtimes.append(
                {
                    "pid": snap["pid"],
                    "address": None,
                    "neuron_runtime_tag": str(snap.get("tag", "")),
                    "error": "",
                    "report": report,
                }
            )
        system = {}
        for group, period in self.config.system.items():
            if now - self._system_at[group] >= period - slack or group not in self._said:
                system[group] = self._system_group(group, now - self._system_at[group])
                self._system_at[group] = now
                self._said.add(group)
        return {
            "neuron_runtime_data": runtimes,
            "system_data": system,
            "instance_info": instance_info(),
            "neuron_hardware_info": self.hardware_info(),
        }

    def _system_group(self, group: str, seconds: float) -> dict[str, Any]:
        ps = self.psutil
        if group == "memory_info":
            memory, swap = ps.virtual_memory(), ps.swap_memory()
            return {
                "period": seconds,
                "memory_total_bytes": int(memory.total),
                "memory_used_bytes": int(memory.used),
                "swap_total_bytes": int(swap.total),
                "swap_used_bytes": int(swap.used),
                "error": "",
            }
        if group == "vcpu_usage":
            per_cpu = [
                _cpu_fields(t._asdict()) for t in ps.cpu_times_percent(interval=None, percpu=True)
            ]
            switches = ps.cpu_stats().ctx_switches
            count, self._switches = switches - self._switches, switches
            average = {
                k: round(sum(c[k] for c in per_cpu) / max(1, len(per_cpu)), 2) for k in CPU_FIELDS
            }
            return {
                "period": seconds,
                "average_usage": average,
                "usage_data": {str(i): c for i, c in enumerate(per_cpu)},
                "context_switch_count": count,
                "error": "",
            }
        # neuron_hw_counters: crossrt's engines report no ECC counters.
        return {"period": seconds, "neuron_devices": [], "error": ""}

    def hardware_info(self) -> dict[str, Any]:
        """The machine's cores as neuron-monitor's ``neuron_hardware_info``: one "device", the
        host, with its logical CPUs as cores (crossrt's cpu device)."""
        return {
            "neuron_device_type": "crossrt-cpu",
            "neuron_device_version": None,
            "neuroncore_version": platform.machine() or None,
            "neuron_device_count": 1,
            "neuron_device_memory_size": int(self.psutil.virtual_memory().total),
            "neuroncore_per_device_count": self.psutil.cpu_count(logical=True),
            "logical_neuroncore_config": None,
            "error": "",
        }


CPU_FIELDS = ("user", "nice", "system", "idle", "io_wait", "irq", "soft_irq")
_PSUTIL_CPU = {"io_wait": "iowait", "soft_irq": "softirq"}


def _cpu_fields(times: Mapping[str, float]) -> dict[str, float]:
    return {k: round(float(times.get(_PSUTIL_CPU.get(k, k), 0.0)), 2) for k in CPU_FIELDS}


def instance_info() -> dict[str, Any]:
    """``instance_info``: crossrt does not ask the EC2 metadata service, so every field is null."""
    keys = (
        "instance_name",
        "instance_id",
        "instance_type",
        "instance_availability_zone",
        "instance_availability_zone_id",
        "instance_region",
        "ami_id",
        "subnet_id",
    )
    return dict.fromkeys(keys) | {"error": "crossrt does not read EC2 instance metadata"}
