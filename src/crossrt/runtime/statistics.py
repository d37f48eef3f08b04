"""Request statistics of a loaded model, kept always: what Triton's ModelStatistics reports
and what ``crossrt serve`` serves, measured in-process too.

Per model: requests, successes and failures by status code, requests in flight, the time
spent queued, checking inputs (``compute_input``), running (``compute_infer``) and handing
outputs back (``compute_output``), and a latency histogram of whole requests from which the
percentiles are read. Per instance: runs and their time. On a request's path: three clock
reads, a count and an append, no lock (``benchmarks/overhead.py`` measures the cost).
"""

from __future__ import annotations

import array
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CrossrtError, InvalidArgumentError, StatusCode

BUCKETS_US: tuple[int, ...] = (
    10, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
    100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
)  # fmt: skip
"""Upper bounds (microseconds) of the latency histogram's buckets; one more counts the rest."""

_BUCKETS_NS = np.array(BUCKETS_US, np.int64) * 1000
_FIELDS = 6  # numbers recorded per success
SUM_AT = 6 * 4096
"""Numbers waiting to be summed before the recording thread sums them."""


@dataclass(frozen=True)
class Duration:
    """A count of events and their total time (Triton's ``StatisticDuration``)."""

    count: int
    ns: int

    @property
    def mean_us(self) -> float:
        """Mean microseconds per event (0 when there were none)."""
        return self.ns / self.count / 1e3 if self.count else 0.0


def histogram_percentile_us(
    counts: Sequence[int], buckets_us: Sequence[int], q: float
) -> float | None:
    """The ``q``-th percentile (0-100) in microseconds of a latency histogram (``counts``
    per bucket of ``buckets_us``, then one more for the rest), interpolated within its
    bucket; ``None`` when it counts nothing. ``crossrt monitor`` reads the difference of
    two snapshots' histograms with it."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q / 100 * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            low = buckets_us[i - 1] if i else 0
            high = buckets_us[i] if i < len(buckets_us) else low * 2
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return float(buckets_us[-1])


@dataclass(frozen=True)
class ModelStatistics:
    """A snapshot of one model's request statistics.

    Attributes:
        requests: requests received (run, run_async, infer), whatever became of them.
        success: requests that returned outputs.
        failures: failed requests by status code name (``"EXEC_BAD_INPUT"``...);
            ``"CANCELLED"`` for those their caller cancelled before they ran.
        in_flight: requests received and not finished yet (queued or running).
        queue: time from a request's arrival to the start of its run (successes).
        compute_input: time checking and preparing inputs (successes).
        compute_infer: time in the engines (successes).
        compute_output: time handing the outputs back (successes).
        latency: whole-request time of successes.
        histogram: success counts per bucket of :data:`BUCKETS_US` (then the rest).
        instances: per instance: runs and their compute time.
        last_inference_ms: when the last success finished (ms since the epoch; 0: never).
    """

    requests: int
    success: int
    failures: dict[str, int]
    in_flight: int
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    latency: Duration
    histogram: tuple[int, ...]
    instances: tuple[Duration, ...]
    last_inference_ms: int
    buckets_us: tuple[int, ...] = field(default=BUCKETS_US)

    @property
    def failure(self) -> int:
        """Failed requests, all codes together."""
        return sum(self.failures.values())

    def percentile_us(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) of success latency in microseconds, interpolated
        within its histogram bucket; ``None`` before the first success."""
        return histogram_percentile_us(self.histogram, self.buckets_us, q)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelStatistics:
        """The statistics :meth:`to_dict` wrote (a daemon sends a model's so:
        ``RemoteModel.statistics()``).

        Raises:
            InvalidArgumentError: ``doc`` is not such a form.
        """

        def duration(d: Any) -> Duration:
            return Duration(int(d["count"]), int(d["ns"]))

        try:
            histogram = doc["histogram"]
            return cls(
                requests=int(doc["requests"]),
                success=int(doc["success"]),
                failures={str(k): int(v) for k, v in dict(doc["failures"]).items()},
                in_flight=int(doc["in_flight"]),
                queue=duration(doc["queue"]),
                compute_input=duration(doc["compute_input"]),
                compute_infer=duration(doc["compute_infer"]),
                compute_output=duration(doc["compute_output"]),
                latency=duration(doc["latency"]),
                histogram=tuple(int(c) for c in histogram["counts"]),
                instances=tuple(duration(d) for d in doc["instances"]),
                last_inference_ms=int(doc["last_inference_ms"]),
                buckets_us=tuple(int(b) for b in histogram["buckets_us"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"not a model's statistics as ModelStatistics.to_dict writes them ({exc!r})"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form, with p50/p90/p99."""

        def duration(d: Duration) -> dict[str, int]:
            return {"count": d.count, "ns": d.ns}

        return {
            "requests": self.requests,
            "success": self.success,
            "failure": self.failure,
            "failures": dict(self.failures),
            "in_flight": self.in_flight,
            "queue": duration(self.queue),
            "compute_input": duration(self.compute_input),
            "compute_infer": duration(self.compute_infer),
            "compute_output": duration(self.compute_output),
            "latency": duration(self.latency),
            "latency_us": {f"p{q}": self.percentile_us(q) for q in (50, 90, 99)},
            "histogram": {"buckets_us": list(self.buckets_us), "counts": list(self.histogram)},
            "instances": [duration(d) for d in self.instances],
            "last_inference_ms": self.last_inference_ms,
        }


def statistics_from_dict(data: Any) -> ModelStatistics:
    """The :class:`ModelStatistics` that :meth:`ModelStatistics.to_dict` wrote (another
    process's, as ``crossrt monitor`` reads them).

    Raises:
        InvalidArgumentError: ``data`` is not such a dict.
    """

    def whole(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(value)
        return value

    def duration(value: Any) -> Duration:
        return Duration(whole(value["count"]), whole(value["ns"]))

    try:
        histogram = data["histogram"]
        return ModelStatistics(
            requests=whole(data["requests"]),
            success=whole(data["success"]),
            failures={str(k): whole(v) for k, v in data["failures"].items()},
            in_flight=whole(data["in_flight"]),
            queue=duration(data["queue"]),
            compute_input=duration(data["compute_input"]),
            compute_infer=duration(data["compute_infer"]),
            compute_output=duration(data["compute_output"]),
            latency=duration(data["latency"]),
            histogram=tuple(whole(c) for c in histogram["counts"]),
            instances=tuple(duration(d) for d in data["instances"]),
            last_inference_ms=whole(data["last_inference_ms"]),
            buckets_us=tuple(whole(b) for b in histogram["buckets_us"]),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgumentError(
            f"not the statistics ModelStatistics.to_dict() writes ({type(exc).__name__}: "
            f"{exc}); is the other process another crossrt version?"
        ) from None


class Statistics:
    """The live counters of one loaded model (thread-safe; read with :meth:`snapshot`).

    A request's path takes no lock: arrivals are an ``itertools.count``, and a success
    appends its six times to an ``array`` (both single C calls, atomic under the GIL); they
    are summed, with NumPy, when read or when many are waiting. Failures, rare, take a lock.
    """

    def __init__(self, instances: int) -> None:
        self._lock = threading.Lock()
        arrivals = itertools.count()
        self._arrivals = arrivals
        self.arrived: Callable[[], object] = arrivals.__next__
        """Count a request in (in flight until its outcome is recorded)."""
        self._peeks = 0  # values of the count taken by snapshot(), not by arrivals
        self._handed_on = 0
        # Per success: finished at, arrived at, queue, input, infer (ns), instance.
        self.pending = array.array("q")
        """Successes not summed yet; with more than :data:`SUM_AT` numbers, call :meth:`sum`."""
        self.record: Callable[[tuple[int, int, int, int, int, int]], None] = self.pending.extend
        """Record a success: ``(finished, arrived, queue, input, infer, instance)``, times
        from ``time.perf_counter_ns()``; what :meth:`succeeded` does, for the hottest path."""
        self._instances = instances
        self._failures: dict[str, int] = {}
        self._success = 0
        # Success sums, ns: queue, input, infer, output, whole request.
        self._sums = np.zeros(5, np.int64)
        self._histogram = np.zeros(len(BUCKETS_US) + 1, np.int64)
        self._runs = np.zeros(instances, np.int64)
        self._run_ns = np.zeros(instances, np.int64)
        self._last_ns = 0
        self.taps: list[Callable[[np.ndarray], None]] = []
        """Called with each batch of successes summed, an ``(n, 6)`` int64 array of the
        numbers :attr:`record` takes (a profile keeps them: ``profiler.py``)."""

    def handed_on(self) -> None:
        """Take back an :meth:`arrived`: the request is handed on, to be counted there."""
        with self._lock:
            self._handed_on += 1

    def succeeded(
        self, arrived: int, queue_ns: int, input_ns: int, infer_ns: int, instance: int
    ) -> None:
        """A request finished with outputs: it arrived at ``arrived``
        (``time.perf_counter_ns()``), waited ``queue_ns``, had its inputs checked in
        ``input_ns`` and ran ``infer_ns`` on ``instance``; the rest of the time until now
        went to handing the outputs back."""
        self.record((time.perf_counter_ns(), arrived, queue_ns, input_ns, infer_ns, instance))
        if len(self.pending) > SUM_AT:
            self.sum()

    def sum(self) -> None:
        """Sum the successes recorded so far into the totals."""
        with self._lock:
            self._sum_locked()

    def failed(self, error: BaseException) -> None:
        """A request ended with ``error`` (``CANCELLED`` for a ``CancelledError``: its caller
        went away)."""
        if isinstance(error, CrossrtError):
            code = error.code.name
        else:
            code = "CANCELLED" if isinstance(error, CancelledError) else StatusCode.FAILURE.name
        with self._lock:
            self._failures[code] = self._failures.get(code, 0) + 1

    def cancelled(self) -> None:
        """A request cancelled by its caller before it ran (counted as ``CANCELLED``)."""
        with self._lock:
            self._failures["CANCELLED"] = self._failures.get("CANCELLED", 0) + 1

    def _sum_locked(self) -> None:
        times = self.pending
        n = len(times) // _FIELDS * _FIELDS
        if not n:
            return
        taken = times[:n]  # a copy: other threads append behind it meanwhile
        del times[:n]
        rows = np.frombuffer(taken, np.int64).reshape(-1, _FIELDS)
        for tap in self.taps:
            tap(rows)
        whole, parts = rows[:, 0] - rows[:, 1], rows[:, 2:5]
        self._success += len(rows)
        self._sums[:3] += parts.sum(axis=0)
        self._sums[3] += int(whole.sum() - parts.sum())
        self._sums[4] += int(whole.sum())
        buckets = np.searchsorted(_BUCKETS_NS, whole, side="left")
        self._histogram += np.bincount(buckets, minlength=len(self._histogram))
        instance = rows[:, 5]
        valid = (instance >= 0) & (instance < self._instances)
        self._runs += np.bincount(instance[valid], minlength=self._instances)
        self._run_ns += np.bincount(
            instance[valid], weights=rows[valid, 4], minlength=self._instances
        ).astype(np.int64)
        self._last_ns = max(self._last_ns, int(rows[:, 0].max()))

    def snapshot(self) -> ModelStatistics:
        """The statistics now."""
        with self._lock:
            # Arrivals first, then the successes: a thread running requests meanwhile (the
            # sum releases the GIL) adds both, and counted the other way round its requests
            # would show as dozens in flight from one caller. This way a request that came
            # and went meanwhile is in both, and ``requests`` is at least what finished.
            # The next value of the count is the arrivals so far plus the earlier peeks.
            arrivals = next(self._arrivals) - self._peeks - self._handed_on
            self._peeks += 1
            self._sum_locked()
            sums = [int(v) for v in self._sums]
            success = self._success
            failures = dict(self._failures)
            finished = success + sum(failures.values())
            requests = max(arrivals, finished)
            return ModelStatistics(
                requests=requests,
                success=success,
                failures=failures,
                in_flight=requests - finished,
                queue=Duration(success, sums[0]),
                compute_input=Duration(success, sums[1]),
                compute_infer=Duration(success, sums[2]),
                compute_output=Duration(success, sums[3]),
                latency=Duration(success, sums[4]),
                histogram=tuple(int(c) for c in self._histogram),
                instances=tuple(
                    Duration(int(n), int(ns))
                    for n, ns in zip(self._runs, self._run_ns, strict=True)
                ),
                last_inference_ms=_epoch_ms(self._last_ns),
            )


def _epoch_ms(perf_ns: int) -> int:
    """A ``time.perf_counter_ns()`` time as milliseconds since the epoch (0 stays 0)."""
    if not perf_ns:
        return 0
    return (time.time_ns() - (time.perf_counter_ns() - perf_ns)) // 1_000_000
