"""A replica's statistics as Ray metrics, under the names of crossrt's Prometheus output.

The families and samples come from the daemon's own collectors (server/metrics.py: Triton's
names under ``crossrt_``), read from each loaded model's statistics; each sample becomes a
Ray gauge of the same name with the same labels (``model``, ``version``, ``reason``,
``quantile``, ``le``), set to the value the daemon would serve. Ray's Prometheus endpoint
adds its ``ray_`` prefix and the replica's own tags (docs/scale-out.md).
"""

from __future__ import annotations

import threading
from typing import Any

from ...runtime.statistics import ModelStatistics
from ...server.metrics import ModelCollector, ResponseCacheCollector
from ...server.repository import Repository
from ...server.response_cache import CacheCounts


class RayStatistics:
    """The models of one replica's repository, exported as Ray metrics on :meth:`export`."""

    def __init__(self, repository: Repository) -> None:
        self._repository = repository
        self._collectors = (
            ModelCollector(self._models),
            ResponseCacheCollector(self._caches),
        )
        self._gauges: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _models(self) -> list[tuple[dict[str, str], ModelStatistics]]:
        return [
            ({"model": e.name, "version": e.version}, e.statistics())
            for e in self._repository.loaded()
            if e.model is not None
        ]

    def _caches(self) -> list[tuple[dict[str, str], CacheCounts]]:
        return [
            ({"model": e.name, "version": e.version}, e.cache)
            for e in self._repository.loaded()
            if e.model is not None and e.options.response_cache
        ]

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Every sample the daemon's ``--metrics`` would serve for these models now."""
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for collector in self._collectors
            for family in collector.collect()
            for sample in family.samples
        ]

    def in_flight(self) -> int:
        """Requests received and not finished (queued or running), over every model."""
        return sum(stats.in_flight for _, stats in self._models())

    def export(self) -> None:
        """Set each sample's Ray gauge (created on first sight, with its label names)."""
        from ray.util.metrics import Gauge

        with self._lock:
            for name, labels, value in self.samples():
                gauge = self._gauges.get(name)
                if gauge is None:
                    gauge = Gauge(name, f"crossrt's {name}", tag_keys=tuple(sorted(labels)))
                    self._gauges[name] = gauge
                gauge.set(value, tags=labels)
