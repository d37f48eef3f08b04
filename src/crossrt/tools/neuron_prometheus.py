"""neuron-monitor's documents as the metrics ``neuron-monitor-prometheus.py`` exports.

:class:`NeuronMetrics` reads each document as that script does (written here from its
documented behaviour): per runtime group it sets gauges and adds the period's counts to
counters, labelled with the instance's fields and, for runtime metrics, ``runtime_tag``, so
that the Grafana dashboard Neuron ships reads crossrt processes. Two processes with one tag
share their series, as they do under the script (gauges: the last one read). ``crossrt
monitor --format neuron-monitor --prometheus`` serves them (:func:`serve`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

INSTANCE_LABELS = {
    "instance_name": "instance_name",
    "instance_id": "instance_id",
    "instance_type": "instance_type",
    "availability_zone": "instance_availability_zone",
    "region": "instance_region",
    "subnet_id": "subnet_id",
}
"""The label on every metric -> its ``instance_info`` field."""

MEMORY_KINDS = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")

Labels = tuple[tuple[str, str], ...]


class NeuronMetrics:
    """The metrics of the documents read so far (:meth:`read`); a prometheus-client collector
    (:meth:`collect`)."""

    def __init__(self) -> None:
        self.gauges: dict[str, tuple[str, dict[Labels, float]]] = {}
        self.counters: dict[str, tuple[str, dict[Labels, float]]] = {}
        self.infos: dict[str, tuple[str, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def _gauge(self, name: str, doc: str, labels: Mapping[str, str], value: Any) -> None:
        if value is not None:
            self.gauges.setdefault(name, (doc, {}))[1][tuple(labels.items())] = float(value)

    def _count(self, name: str, doc: str, labels: Mapping[str, str], value: Any) -> None:
        series = self.counters.setdefault(name, (doc, {}))[1]
        key = tuple(labels.items())
        series[key] = series.get(key, 0.0) + max(0.0, float(value or 0))

    def read(self, document: Mapping[str, Any]) -> None:
        """Take one neuron-monitor document into the metrics."""
        with self._lock:
            self._read(document)

    def _read(self, document: Mapping[str, Any]) -> None:
        instance = document.get("instance_info") or {}
        base = {label: str(instance.get(key) or "") for label, key in INSTANCE_LABELS.items()}
        self.infos["instance"] = (
            "EC2 instance information",
            {k: str(v or "") for k, v in instance.items() if k != "error"},
        )
        hardware = document.get("neuron_hardware_info") or {}
        self.infos["neuron_hardware"] = (
            "Neuron hardware information",
            {k: str(v if v is not None else "") for k, v in hardware.items() if k != "error"},
        )
        for runtime in document.get("neuron_runtime_data") or []:
            if runtime.get("error"):
                continue
            labels = base | {"runtime_tag": str(runtime.get("neuron_runtime_tag", ""))}
            for group, data in (runtime.get("report") or {}).items():
                if isinstance(data, Mapping) and not data.get("error"):
                    getattr(self, f"_runtime_{group}", _ignore)(labels, data)
        for group, data in (document.get("system_data") or {}).items():
            if isinstance(data, Mapping) and not data.get("error"):
                getattr(self, f"_system_{group}", _ignore)(base, data)

    def _runtime_neuroncore_counters(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        for core, counters in (data.get("neuroncores_in_use") or {}).items():
            value = counters.get("neuroncore_utilization")
            self._gauge(
                "neuroncore_utilization_ratio",
                "NeuronCore utilization ratio",
                labels | {"neuroncore": str(core)},
                None if value is None else value / 100.0,
            )

    def _runtime_memory_used(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        used = data.get("neuron_runtime_used_bytes") or {}
        for location in ("host", "neuron_device"):
            self._gauge(
                "neuron_runtime_memory_used_bytes",
                "Runtime memory used bytes",
                labels | {"memory_location": location},
                used.get(location),
            )
        per_core = (used.get("usage_breakdown") or {}).get("neuroncore_memory_usage") or {}
        for core, kinds in per_core.items():
            for kind in MEMORY_KINDS:
                self._gauge(
                    f"neuroncore_memory_usage_{kind}",
                    f"NeuronCore memory usage: {kind}",
                    labels | {"neuroncore": str(core), "memory_location": "None"},
                    kinds.get(kind),
                )

    def _runtime_neuron_runtime_vcpu_usage(
        self, labels: dict[str, str], data: Mapping[str, Any]
    ) -> None:
        for kind in ("user", "system"):
            value = (data.get("vcpu_usage") or {}).get(kind)
            self._gauge(
                "neuron_runtime_vcpu_usage_ratio",
                "Runtime vCPU utilization ratio",
                labels | {"usage_type": kind},
                None if value is None else value / 100.0,
            )

    def _runtime_execution_stats(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        for kind, count in (data.get("error_summary") or {}).items():
            self._count(
                "execution_errors", "Execution errors total", labels | {"error_type": kind}, count
            )
        for kind, count in (data.get("execution_summary") or {}).items():
            self._count(
                "execution_status", "Execution status total", labels | {"status_type": kind}, count
            )
        total = (data.get("latency_stats") or {}).get("total_latency") or {}
        for percentile, seconds in total.items():
            self._gauge(
                "execution_latency_seconds",
                "Execution latency in seconds",
                labels | {"percentile": percentile},
                seconds,
            )

    def _system_memory_info(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        for what in ("memory_total", "memory_used", "swap_total", "swap_used"):
            self._gauge(
                f"system_{what}_bytes", f"System {what.replace('_', ' ')} bytes", labels,
                data.get(f"{what}_bytes"),
            )  # fmt: skip

    def _system_vcpu_usage(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        self._gauge(
            "system_vcpu_count", "System vCPU count", labels, len(data.get("usage_data") or {})
        )
        average = data.get("average_usage") or {}
        shares = {
            "user": ("user", "nice"),
            "system": ("system", "io_wait", "irq", "soft_irq"),
        }
        for kind, fields in shares.items():
            value = sum(float(average.get(f) or 0) for f in fields) / 100.0
            self._gauge(
                "system_vcpu_usage_ratio",
                "System vCPU usage ratio",
                labels | {"usage_type": kind},
                value,
            )

    def _system_neuron_hw_counters(self, labels: dict[str, str], data: Mapping[str, Any]) -> None:
        for device in data.get("neuron_devices") or []:
            index = str(device.get("neuron_device_index", ""))
            for event, count in device.items():
                if event != "neuron_device_index":
                    self._count(
                        "hardware_ecc_events",
                        "Hardware ECC events total",
                        labels | {"event_type": event, "neuron_device_index": index},
                        count,
                    )

    def collect(self) -> Iterator[Any]:
        """The metric families (prometheus-client's collector protocol)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        with self._lock:
            for name, (doc, series) in sorted(self.gauges.items()):
                yield _family(GaugeMetricFamily(name, doc, labels=_names(series)), series)
            for name, (doc, series) in sorted(self.counters.items()):
                yield _family(CounterMetricFamily(name, doc, labels=_names(series)), series)
            for name, (doc, values) in sorted(self.infos.items()):
                info = InfoMetricFamily(name, doc)
                info.add_metric([], values)
                yield info


def _ignore(labels: dict[str, str], data: Mapping[str, Any]) -> None:
    """A group the script does not export."""


def _names(series: Mapping[Labels, float]) -> list[str]:
    first = next(iter(series), ())
    return [name for name, _ in first]


def _family(family: Any, series: Mapping[Labels, float]) -> Any:
    for labels, value in series.items():
        family.add_metric([v for _, v in labels], value)
    return family


class Feed:
    """A collector that reads a fresh document from ``sampler`` when a scrape comes at least
    ``tick`` seconds after the last one read, then serves ``metrics``."""

    def __init__(self, sampler: Any, tick: float) -> None:
        self.sampler, self.tick, self.metrics = sampler, tick, NeuronMetrics()
        self._at = -float("inf")
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self._lock:
            if time.monotonic() - self._at >= self.tick:
                self.metrics.read(self.sampler.sample())
                self._at = time.monotonic()
        yield from self.metrics.collect()
