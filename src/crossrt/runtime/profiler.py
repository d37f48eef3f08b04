"""Profiles: what loaded models did between a start and a stop, as a Chrome trace.

A profile taps each model's request statistics (``statistics.py`` records six numbers per
success whether or not anyone profiles) and, for a multi-node executable, has each instance
note when each node ran. Nothing else on a request's path changes, so a profile costs only
the keeping of those numbers.

The trace is the Trace Event Format that Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` open:

- each request is an async slice named after its model, holding its phases in order:
  ``input`` (checking the inputs), ``queue`` (waiting for an instance), ``infer`` (in the
  engines) and ``output`` (handing the outputs back);
- each instance has a track of its own with an ``infer`` slice per run, and for a
  multi-node executable one track per node with a slice per node run, named after the
  node and its driver, so the pipeline's overlap shows;
- a model with device memory (``sim``, a GPU) has a track of its copies between host and
  device memory (``host to device``, ``device to host``, with their bytes).

Failed requests are counted in the summary's ``failed``, not drawn.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from .running import instances_of, statistics_of

if TYPE_CHECKING:
    from .loaded import LoadedModel

MAX_REQUESTS = 100_000
"""Requests per model a profile keeps by default (48 bytes each); later ones are counted in
``dropped``."""

DRAWN_REQUESTS = 20_000
"""Requests per model drawn in the trace by default (about ten events each); the summary
counts them all."""


class Profile:
    """Record what ``models`` do from :meth:`start` to :meth:`stop` (``nrt_profile_start`` /
    ``nrt_profile_stop``; :meth:`Runtime.profile` records every model of a runtime).

    Use it as a context manager: the trace is written to ``path`` on exit when one is given.

    Args:
        models: a loaded model, or several, to record.
        path: where :meth:`stop` writes the trace (JSON); ``None``: nowhere.
        max_requests: requests kept per model; later ones are only counted.
        drawn_requests: requests per model drawn in the trace (the first ones kept).

    Example:
        >>> with crossrt.profiling.Profile(model, "trace.json") as profile:
        ...     for _ in range(100):
        ...         model.run(inputs)
        >>> profile.summary()[0]["infer_us"]["mean"]
    """

    def __init__(
        self,
        models: LoadedModel | Sequence[LoadedModel],
        path: str | os.PathLike[str] | None = None,
        *,
        max_requests: int = MAX_REQUESTS,
        drawn_requests: int = DRAWN_REQUESTS,
    ) -> None:
        for what, value in (("max_requests", max_requests), ("drawn_requests", drawn_requests)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{what}={value!r}: give a whole number >= 0")
        self.models = tuple(models) if isinstance(models, Sequence) else (models,)
        self.path = None if path is None else os.fspath(path)
        self._max = max_requests
        self._drawn = drawn_requests
        self._lock = threading.Lock()
        self._rows: list[list[np.ndarray]] = [[] for _ in self.models]
        self._kept = [0] * len(self.models)
        self._dropped = [0] * len(self.models)
        self._failed_before: list[int] = []
        self._failed = [0] * len(self.models)
        # Appended to by the models' threads without a lock (deque.append is atomic), and
        # bounded like the requests: the latest are kept.
        self._nodes: list[deque[tuple[int, int, int, int, int]]] = [
            deque(maxlen=max_requests * max(1, len(m.executable.nodes))) for m in self.models
        ]
        self._copies: list[deque[tuple[str, int, int, int]]] = [
            deque(maxlen=max_requests * 4) for _ in self.models
        ]
        self._taps: list[Any] = []
        self._marks: list[tuple[str, str, int, int, dict[str, Any]]] = []
        self._start = self._end = 0
        self._epoch_ns = 0
        self._trace: dict[str, Any] | None = None

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def recording(self) -> bool:
        """Whether the profile has started and not stopped."""
        return bool(self._start) and not self._end

    def start(self) -> Profile:
        """Begin recording; requests that arrive from now on are kept."""
        if self._start:
            raise InvalidArgumentError("this profile was started already; make a new one")
        for model in self.models:
            statistics_of(model).sum()  # what arrived before is summed without the tap
        self._failed_before = [model.statistics().failure for model in self.models]
        self._epoch_ns = time.time_ns()
        self._start = time.perf_counter_ns()
        for k, model in enumerate(self.models):
            tap = self._tap(k)
            self._taps.append(tap)
            statistics_of(model).taps.append(tap)
            for inst in instances_of(model):
                if len(inst.programs) > 1:
                    inst.trace = self._nodes[k]
            model.memory.transfers.spans = self._copies[k]  # a model with device memory copies
        return self

    def _tap(self, k: int) -> Any:
        def keep(rows: np.ndarray) -> None:
            rows = rows[rows[:, 1] >= self._start]
            with self._lock:
                room = max(0, self._max - self._kept[k])
                if len(rows) > room:
                    self._dropped[k] += len(rows) - room
                    rows = rows[:room]
                if len(rows):
                    self._rows[k].append(rows.copy())
                    self._kept[k] += len(rows)

        return keep

    def stop(self) -> dict[str, Any]:
        """Stop recording; return the trace (and write it to :attr:`path` when set).

        Calling it again returns the same trace.
        """
        if self._trace is not None:
            return self._trace
        if not self._start:
            raise InvalidArgumentError("this profile was never started; call start() first")
        self._end = time.perf_counter_ns()
        for k, model in enumerate(self.models):
            statistics = statistics_of(model)
            statistics.sum()
            if self._taps[k] in statistics.taps:
                statistics.taps.remove(self._taps[k])
            for inst in instances_of(model):
                if inst.trace is self._nodes[k]:
                    inst.trace = None
            if model.memory.transfers.spans is self._copies[k]:
                model.memory.transfers.spans = None
            self._failed[k] = statistics.snapshot().failure - self._failed_before[k]
        self._trace = self._build()
        if self.path is not None:
            save_trace(self._trace, self.path)
        return self._trace

    def mark(
        self, name: str, begin_ns: int, end_ns: int, track: str = "marks", **args: Any
    ) -> None:
        """Add a span of your own to the trace: ``name`` from ``begin_ns`` to ``end_ns``
        (``time.perf_counter_ns()``) on the track named ``track``, with ``args`` shown beside
        it. What falls outside the profile's start and stop is not drawn.

        Example:
            >>> began = time.perf_counter_ns()
            >>> batch = preprocess(images)
            >>> profile.mark("preprocess", began, time.perf_counter_ns(), images=len(images))
        """
        with self._lock:
            self._marks.append((name, track, begin_ns, end_ns, args))

    def requests(self, k: int = 0) -> np.ndarray:
        """Model ``k``'s recorded requests, one row each, in ``time.perf_counter_ns()``:
        finished, arrived, queue, input, infer (ns) and the instance that ran it."""
        with self._lock:
            kept = list(self._rows[k])
        if not kept:
            return np.zeros((0, 6), np.int64)
        rows = np.concatenate(kept)
        rows = rows[np.argsort(rows[:, 1], kind="stable")]
        if self._end:  # stopped: no more come, so the trace and the summary share one sort
            with self._lock:
                self._rows[k] = [rows]
        return rows

    def summary(self) -> list[dict[str, Any]]:
        """Per model: requests recorded, failed and dropped, throughput over the profile, and
        microseconds per phase (mean, p50, p99): latency, input, queue, infer, output, and
        per node of a multi-node executable."""
        window = max(1, (self._end or time.perf_counter_ns()) - self._start) / 1e9
        result = []
        for k, model in enumerate(self.models):
            rows = self.requests(k)
            finished, arrived, queue, checked, infer = (rows[:, i] for i in range(5))
            latency = finished - arrived
            entry: dict[str, Any] = {
                "model": model.name,
                "served_as": model.served_as,
                "requests": len(rows),
                "failed": self._failed[k],
                "dropped": self._dropped[k],
                "seconds": round(window, 6),
                "throughput": round(len(rows) / window, 3),
                "latency_us": _spread(latency),
                "input_us": _spread(checked),
                "queue_us": _spread(queue),
                "infer_us": _spread(infer),
                "output_us": _spread(latency - checked - queue - infer),
            }
            if len(model.executable.nodes) > 1:
                spans = np.array(list(self._nodes[k]), np.int64).reshape(-1, 5)
                entry["nodes"] = [
                    {
                        "node": node.name,
                        "driver": node.driver,
                        "runs": int((spans[:, 1] == j).sum()),
                        "us": _spread(
                            spans[spans[:, 1] == j][:, 4] - spans[spans[:, 1] == j][:, 3]
                        ),
                    }
                    for j, node in enumerate(model.executable.nodes)
                ]
            copies = [c for c in self._copies[k] if c[2] >= self._start]
            if copies:
                entry["copies"] = {
                    direction: {
                        "count": len(mine),
                        "bytes": sum(c[1] for c in mine),
                        "us": _spread(np.array([c[3] - c[2] for c in mine], np.int64)),
                    }
                    for direction in sorted({c[0] for c in copies})
                    for mine in [[c for c in copies if c[0] == direction]]
                }
            result.append(entry)
        return result

    def _build(self) -> dict[str, Any]:
        trace = _Trace(self._start)
        for k, model in enumerate(self.models):
            tracks = self._draw_instances(trace, model)
            self._draw_requests(trace, k, model, tracks)
            self._draw_copies(trace, k, model)
            self._draw_nodes(trace, k, model, tracks)
        self._draw_marks(trace)
        return {
            "traceEvents": trace.events,
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": "crossrt",
                "pid": trace.pid,
                "start_epoch_us": self._epoch_ns // 1000,
                "summary": self.summary(),
            },
        }

    @staticmethod
    def _draw_instances(trace: _Trace, model: LoadedModel) -> dict[tuple[int, int], int]:
        """A track per instance, or per node of it; by ``(instance, node)``, node -1: all."""
        tracks: dict[tuple[int, int], int] = {}
        for i, inst in enumerate(instances_of(model)):
            where = f"{model.name} instance {i} ({inst.device or model.device.id})"
            if len(inst.programs) == 1:
                tracks[(i, -1)] = trace.track(where)
                continue
            for j, node in enumerate(model.executable.nodes):
                tracks[(i, j)] = trace.track(f"{where} node {j} {node.name} ({node.driver})")
        return tracks

    def _draw_requests(
        self, trace: _Trace, k: int, model: LoadedModel, tracks: dict[tuple[int, int], int]
    ) -> None:
        """Each drawn request as an async slice holding its phases, and its ``infer`` slice
        on its instance's track."""
        pid = trace.pid
        rows = self.requests(k)[: self._drawn]
        for n, (finished, arrived, queue, checked, infer, instance) in enumerate(rows.tolist()):
            started = arrived + checked + queue
            marks = (arrived, arrived + checked, started, started + infer, finished)
            request = {"cat": "request", "id": f"{k}.{n}", "pid": pid, "tid": 0}
            events = trace.events
            events.append(
                {**request, "ph": "b", "name": model.name, "ts": trace.us(arrived),
                 "args": {"instance": instance}}
            )  # fmt: skip
            for phase, begin, end in zip(
                ("input", "queue", "infer", "output"), marks, marks[1:], strict=False
            ):
                if end > begin:
                    events.append({**request, "ph": "b", "name": phase, "ts": trace.us(begin)})
                    events.append({**request, "ph": "e", "name": phase, "ts": trace.us(end)})
            events.append({**request, "ph": "e", "name": model.name, "ts": trace.us(finished)})
            track = tracks.get((instance, -1))
            if track is not None:
                trace.slice("infer", "infer", track, marks[2], infer, {"model": model.name})

    def _draw_copies(self, trace: _Trace, k: int, model: LoadedModel) -> None:
        """The model's copies between host and device memory, on a track of their own."""
        copies = [c for c in self._copies[k] if c[2] >= self._start][: self._drawn * 4]
        if not copies:
            return
        track = trace.track(f"{model.name} copies")
        for direction, nbytes, begin, end in copies:
            args = {"model": model.name, "bytes": nbytes}
            trace.slice("copy", direction.replace("_", " "), track, begin, end - begin, args)

    def _draw_nodes(
        self, trace: _Trace, k: int, model: LoadedModel, tracks: dict[tuple[int, int], int]
    ) -> None:
        """Each node run of a multi-node executable, on its instance's node track."""
        nodes = model.executable.nodes
        drawn = itertools.islice(self._nodes[k], self._drawn * max(1, len(nodes)))
        for instance, j, _, begin, end in drawn:
            if begin < self._start or (instance, j) not in tracks:
                continue
            name = f"{nodes[j].name} ({nodes[j].driver})"
            track = tracks[(instance, j)]
            trace.slice("node", name, track, begin, end - begin, {"model": model.name})

    def _draw_marks(self, trace: _Trace) -> None:
        """The spans of :meth:`mark` inside the profile, a track per ``track`` name."""
        named: dict[str, int] = {}
        with self._lock:
            own = list(self._marks)
        for name, where, begin, end, args in own:
            if begin < self._start or end > self._end:
                continue
            if where not in named:
                named[where] = trace.track(where)
            trace.slice("mark", name, named[where], begin, end - begin, args)


class _Trace:
    """A trace's events as they are drawn, and the next free track id."""

    def __init__(self, start_ns: int) -> None:
        self.pid = os.getpid()
        self.start_ns = start_ns
        self.events: list[dict[str, Any]] = [
            _meta(self.pid, 0, "process_name", {"name": f"crossrt {self.pid}"})
        ]
        self.tid = 1

    def us(self, ns: int) -> float:
        """``ns`` (``perf_counter_ns``) as microseconds since the profile's start."""
        return round((ns - self.start_ns) / 1e3, 3)

    def track(self, name: str) -> int:
        """A new track named ``name``; its id."""
        tid = self.tid
        self.events.append(_meta(self.pid, tid, "thread_name", {"name": name}))
        self.tid += 1
        return tid

    def slice(self, cat: str, name: str, tid: int, begin_ns: int, ns: int, args: Any) -> None:
        """A complete slice on track ``tid`` from ``begin_ns``, ``ns`` long."""
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
             "ts": self.us(begin_ns), "dur": round(ns / 1e3, 3), "args": args}
        )  # fmt: skip


def save_trace(trace: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``trace`` as JSON to ``path`` through a temporary file, so the file is whole or
    absent."""
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))
    os.replace(temporary, path)


def _meta(pid: int, tid: int, what: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}


def _spread(ns: np.ndarray) -> dict[str, float | None]:
    """Mean, p50 and p99 of ``ns`` in microseconds (``None`` for none)."""
    if not len(ns):
        return {"mean": None, "p50": None, "p99": None}
    us = ns.astype(np.float64) / 1e3
    p50, p99 = np.percentile(us, [50, 99])
    return {"mean": round(float(us.mean()), 3), "p50": round(float(p50), 3),
            "p99": round(float(p99), 3)}  # fmt: skip
