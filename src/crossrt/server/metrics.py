"""The Prometheus endpoint (``--metrics HOST:PORT``): Triton's metric names under
``crossrt_``, labelled ``model`` and ``version``, read from each loaded model's statistics
when scraped (nothing is counted twice, nothing costs a request anything). Counters are
written as Prometheus and OpenMetrics want them, with ``_total`` after the family name
(``crossrt_inference_request_success_total``); Triton writes its counters without it.

| metric | Triton's | from ``ModelStatistics`` |
| --- | --- | --- |
| ``crossrt_inference_request_success`` | ``nv_inference_request_success`` | ``success`` |
| ``crossrt_inference_request_failure`` (``reason``) | same, its ``reason`` | ``failures`` |
| ``crossrt_inference_request_failure_code`` (``code``) | (none) | ``failures`` |
| ``crossrt_inference_count`` | ``nv_inference_count`` | ``success`` (batch 1) |
| ``crossrt_inference_exec_count`` | ``nv_inference_exec_count`` | runs of every instance |
| ``crossrt_inference_request_duration_us`` | same | ``latency`` |
| ``crossrt_inference_queue_duration_us`` | same | ``queue`` |
| ``crossrt_inference_compute_input_duration_us`` | same | ``compute_input`` |
| ``crossrt_inference_compute_infer_duration_us`` | same | ``compute_infer`` |
| ``crossrt_inference_compute_output_duration_us`` | same | ``compute_output`` |
| ``crossrt_inference_pending_request_count`` | same (a gauge) | ``in_flight`` |
| ``crossrt_inference_request_summary_us`` | same (a summary) | ``latency``, ``histogram`` |
| ``crossrt_inference_request_duration_histogram_us`` | see below | ``histogram`` |

Failures carry Triton's ``reason`` (every one of the four, zeros included): ``REJECTED``
(``QUEUE_FULL``, ``TIMEOUT``: turned away or out of time before an answer), ``CANCELED``
(``CANCELLED``), ``OTHER`` (the request was wrong: ``REFUSED`` by the daemon before the model,
``INVALID``, ``EXEC_BAD_INPUT``) and ``BACKEND`` (the rest: the engine failed); the
``_code`` family counts them by crossrt's status name, one sample per code seen. The
summary's quantiles (0.5, 0.9, 0.99) and the histogram's buckets (``le``, microseconds:
10 us to 10 s) are of successful requests' end-to-end time, as Triton's are (its histogram
is ``nv_inference_first_response_histogram_ms``: one answer per request here, in us).

The compile cache's counters (``crossrt_cache_hits_total``, ``_misses_total``,
``_evictions_total``, ``crossrt_cache_compile_seconds_total``) say whether models came from
the cache or were compiled, and for how long.

``crossrt monitor --prometheus`` serves the same for every crossrt process on the machine,
each model labelled ``pid`` and ``tag`` too, with ``crossrt_process_cpu_seconds_total``
(``mode`` user or system) and ``crossrt_process_resident_memory_bytes`` per process.

The response cache's counters per model (``--response-cache-bytes``, models loaded with
``response_cache``): ``crossrt_response_cache_hits_total``, ``_misses_total``,
``_hit_duration_us_total``, ``_miss_duration_us_total`` (Triton's
``nv_cache_num_hits_per_model`` and the like); a hit counts as a successful request too.

And the daemon's own, labelled ``socket`` (each Unix socket's path), which Triton has not:
``crossrt_connections`` (a gauge: open now) and ``crossrt_connections_refused_total``
(refused at ``max_connections``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric

from ..compiler.cache import CacheStats
from ..runtime.statistics import ModelStatistics
from .response_cache import CacheCounts

ConnectionSource = Callable[[], list[tuple[str, int, int]]]
"""``() -> [(socket path, open connections, connections refused)]`` of the Unix sockets."""

StatisticsSource = Callable[[], list[tuple[dict[str, str], ModelStatistics]]]
"""``() -> [(labels, statistics)]`` of the loaded models: the daemon labels each ``model``
and ``version`` (``crossrt monitor --prometheus`` adds ``pid`` and ``tag``); a daemon's
count the requests it refused before they reached the model as failures ``"REFUSED"``."""

_COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
    ("inference_request_success", "successful inference requests", lambda s: s.success),
    ("inference_count", "inferences performed (batch 1: one per request)", lambda s: s.success),
    (
        "inference_exec_count",
        "model executions performed",
        lambda s: sum(d.count for d in s.instances),
    ),
    (
        "inference_request_duration_us",
        "cumulative end-to-end inference request time (us)",
        lambda s: s.latency.ns / 1e3,
    ),
    (
        "inference_queue_duration_us",
        "cumulative time requests spent queued (us)",
        lambda s: s.queue.ns / 1e3,
    ),
    (
        "inference_compute_input_duration_us",
        "cumulative compute input time (us)",
        lambda s: s.compute_input.ns / 1e3,
    ),
    (
        "inference_compute_infer_duration_us",
        "cumulative compute inference time (us)",
        lambda s: s.compute_infer.ns / 1e3,
    ),
    (
        "inference_compute_output_duration_us",
        "cumulative compute output time (us)",
        lambda s: s.compute_output.ns / 1e3,
    ),
)


class _Collector:
    """A Prometheus collector that reads its rows from ``source`` at each scrape (nothing is
    kept between scrapes)."""

    def __init__(self, source: Callable[[], Any], prefix: str = "crossrt_") -> None:
        self._source = source
        self._prefix = prefix


def _counters(
    prefix: str, table: Sequence[tuple[str, str, Callable[[Any], float]]], rows: Any
) -> Iterator[Metric]:
    """One counter family per ``(suffix, doc, read)`` of ``table``, a sample per
    ``(labels, value)`` of ``rows`` (``_total`` after the name, as Prometheus wants)."""
    for suffix, doc, read in table:
        name = prefix + suffix
        metric = Metric(name, doc, "counter")
        for labels, value in rows:
            metric.add_sample(name + "_total", labels, float(read(value)))
        yield metric


REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""Triton's failure reasons (``nv_inference_request_failure{reason=...}``)."""

_REASON_OF = {
    "QUEUE_FULL": "REJECTED",
    "TIMEOUT": "REJECTED",
    "CANCELLED": "CANCELED",
    "REFUSED": "OTHER",
    "INVALID": "OTHER",
    "EXEC_BAD_INPUT": "OTHER",
}
"""crossrt's status names that are not the engine's failure (``BACKEND``)."""

QUANTILES = (0.5, 0.9, 0.99)


def reason(code: str) -> str:
    """Triton's failure reason for a crossrt status name."""
    return _REASON_OF.get(code, "BACKEND")


class ModelCollector(_Collector):
    """A Prometheus collector over the loaded models' statistics (a :data:`StatisticsSource`)."""

    def collect(self) -> Iterator[Metric]:
        rows = self._source()
        yield from _counters(self._prefix, _COUNTERS, rows)
        yield from self._failures(rows)
        yield from self._latency(rows)
        name = self._prefix + "inference_pending_request_count"
        gauge = Metric(name, "requests received and not finished (queued or running)", "gauge")
        for labels, stats in rows:
            gauge.add_sample(name, labels, float(stats.in_flight))
        yield gauge

    def _failures(self, rows: list[tuple[dict[str, str], ModelStatistics]]) -> Iterator[Metric]:
        name = self._prefix + "inference_request_failure"
        by_reason = Metric(name, "failed inference requests, by Triton's reason", "counter")
        by_code = Metric(name + "_code", "failed inference requests, by status name", "counter")
        for labels, stats in rows:
            counts = dict.fromkeys(REASONS, 0)
            for code, count in sorted(stats.failures.items()):
                counts[reason(code)] += count
                by_code.add_sample(name + "_code_total", {**labels, "code": code}, float(count))
            for why, count in counts.items():
                by_reason.add_sample(name + "_total", {**labels, "reason": why}, float(count))
        yield by_reason
        yield by_code

    def _latency(self, rows: list[tuple[dict[str, str], ModelStatistics]]) -> Iterator[Metric]:
        name = self._prefix + "inference_request_summary_us"
        summary = Metric(name, "end-to-end time of successful requests (us)", "summary")
        hname = self._prefix + "inference_request_duration_histogram_us"
        histogram = Metric(hname, "end-to-end time of successful requests (us)", "histogram")
        for labels, stats in rows:
            total_us = stats.latency.ns / 1e3
            for q in QUANTILES:
                value = stats.percentile_us(q * 100)
                summary.add_sample(
                    name,
                    {**labels, "quantile": str(q)},
                    float("nan") if value is None else value,
                )
            summary.add_sample(name + "_count", labels, float(stats.latency.count))
            summary.add_sample(name + "_sum", labels, total_us)
            seen = 0
            for bound, count in zip(stats.buckets_us, stats.histogram, strict=False):
                seen += count
                histogram.add_sample(hname + "_bucket", {**labels, "le": str(bound)}, float(seen))
            everything = float(sum(stats.histogram))
            histogram.add_sample(hname + "_bucket", {**labels, "le": "+Inf"}, everything)
            histogram.add_sample(hname + "_count", labels, everything)
            histogram.add_sample(hname + "_sum", labels, total_us)
        yield summary
        yield histogram


class ConnectionCollector(_Collector):
    """A Prometheus collector over the Unix sockets' connections (a :data:`ConnectionSource`)."""

    def collect(self) -> Iterator[Metric]:
        rows = self._source()
        name = self._prefix + "connections"
        gauge = Metric(name, "connections open on a Unix socket", "gauge")
        refused = Metric(name + "_refused", "connections refused at max_connections", "counter")
        for path, count, turned_away in rows:
            gauge.add_sample(name, {"socket": path}, float(count))
            refused.add_sample(name + "_refused_total", {"socket": path}, float(turned_away))
        yield gauge
        yield refused


CacheSource = Callable[[], list[tuple[dict[str, str], CacheStats]]]
"""``() -> [(labels, counters)]`` of processes' compile caches (``compiler/cache.py``)."""

_CACHE: tuple[tuple[str, str, Callable[[CacheStats], float]], ...] = (
    ("cache_hits", "compiles answered from the compile cache", lambda c: c.hits),
    ("cache_misses", "compiles the cache could not answer (rebuilds included)", lambda c: c.misses),
    (
        "cache_evictions",
        "cache entries removed to keep within the size budget",
        lambda c: c.evictions,
    ),
    (
        "cache_compile_seconds",
        "seconds spent compiling on cache misses",
        lambda c: c.compile_seconds,
    ),
)


class CacheCollector(_Collector):
    """A Prometheus collector over compile caches' counters (a :data:`CacheSource`): hits,
    misses, evictions, time compiling."""

    def collect(self) -> Iterator[Metric]:
        return _counters(self._prefix, _CACHE, self._source())


ResponseCacheSource = Callable[[], list[tuple[dict[str, str], CacheCounts]]]
"""``() -> [(labels, counts)]`` of the models that use the daemon's response cache."""

_RESPONSE_CACHE: tuple[tuple[str, str, Callable[[CacheCounts], float]], ...] = (
    ("response_cache_hits", "requests the response cache answered", lambda c: c.hits),
    ("response_cache_misses", "requests the response cache could not answer", lambda c: c.misses),
    (
        "response_cache_hit_duration_us",
        "cumulative time of the lookups that answered (us)",
        lambda c: c.hit_ns / 1e3,
    ),
    (
        "response_cache_miss_duration_us",
        "cumulative time the cache took on the requests it could not answer (us)",
        lambda c: c.miss_ns / 1e3,
    ),
)


class ResponseCacheCollector(_Collector):
    """A Prometheus collector over the daemon's response cache, per model (a
    :data:`ResponseCacheSource`; Triton's ``nv_cache_num_hits_per_model`` and the like)."""

    def collect(self) -> Iterator[Metric]:
        return _counters(self._prefix, _RESPONSE_CACHE, self._source())


ProcessSource = Callable[[], list[tuple[dict[str, str], float, float, int | None]]]
"""``() -> [(labels, user CPU seconds, system CPU seconds, resident bytes or None)]`` of
crossrt processes (``crossrt monitor --prometheus``)."""


class ProcessCollector(_Collector):
    """A Prometheus collector over crossrt processes' CPU time and resident memory (a
    :data:`ProcessSource`)."""

    def collect(self) -> Iterator[Metric]:
        rows = self._source()
        name = self._prefix + "process_cpu_seconds"
        cpu = Metric(name, "CPU time of a crossrt process, by mode", "counter")
        memory = Metric(
            self._prefix + "process_resident_memory_bytes",
            "resident memory of a crossrt process",
            "gauge",
        )
        for labels, user, system, rss in rows:
            cpu.add_sample(name + "_total", {**labels, "mode": "user"}, user)
            cpu.add_sample(name + "_total", {**labels, "mode": "system"}, system)
            if rss is not None:
                memory.add_sample(memory.name, labels, float(rss))
        yield cpu
        yield memory


def serve_metrics(address: str, *collectors: Any) -> tuple[Any, Any]:
    """Serve ``collectors`` on ``HOST:PORT`` (``/metrics``); return (server, thread) of
    prometheus-client.

    Raises:
        OSError: the address cannot be bound.
    """
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=registry)
