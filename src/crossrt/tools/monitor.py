"""``crossrt monitor``: the metrics of every crossrt process on this machine as JSON lines,
as AWS ``neuron-monitor`` prints them.

Every ``--period`` seconds (default 5) one complete JSON document goes to stdout on a line
of its own: per process that answers on its observation socket (``runtime/observer.py``),
its CPU use and resident memory, and per loaded model its cumulative counters and, over the
period, its throughput, latency percentiles and mean queue and compute times; then the
machine's CPU and memory. The rates compare two snapshots of the same process: the first
document is printed one period after the start, against a snapshot taken then, and a process
or model seen for the first time has ``null`` rates. ``--count N`` stops after N documents;
Ctrl-C ends the command with exit status 0.

:func:`diff_processes` computes a document's processes from two lists of snapshots, without
sockets; ``crossrt top`` draws what it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..compiler.cache import CacheStats
from ..errors import CrossrtError, InvalidArgumentError, OutOfResourcesError
from ..runtime import observer
from ..runtime.statistics import (
    Duration,
    ModelStatistics,
    histogram_percentile_us,
    statistics_from_dict,
)
from .common import fail, require_psutil

DEFAULT_PERIOD = 5.0
"""Seconds between documents when ``--period`` is not given."""

SNAPSHOT_TIMEOUT = 2.0
"""Seconds each process has to answer a snapshot."""


def positive_seconds(text: str) -> float:
    """``--period``'s value: a finite number of seconds above 0 (argparse's ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def _positive_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt monitor",
        description="Print, every period, one JSON document per line: each crossrt process "
        "on this machine (CPU, memory, and per model its requests, throughput and latency "
        "percentiles over the period) and the machine's CPU and memory.",
        epilog="example: crossrt monitor --period 1 --count 10 > metrics.jsonl",
    )
    p.add_argument(
        "--period",
        type=positive_seconds,
        default=DEFAULT_PERIOD,
        metavar="S",
        help=f"seconds between documents (default {DEFAULT_PERIOD:g})",
    )
    p.add_argument(
        "--count",
        type=_positive_count,
        default=None,
        metavar="N",
        help="stop after N documents (default: run until interrupted)",
    )
    p.add_argument(
        "--format",
        choices=("crossrt", "neuron-monitor"),
        default="crossrt",
        help="crossrt's documents (default), or AWS neuron-monitor's layout "
        "(neuron_runtime_data, system_data...) and, with --prometheus, the metric names of "
        "neuron-monitor-prometheus.py",
    )
    p.add_argument(
        "-c",
        "--config-file",
        metavar="FILE",
        help="with --format neuron-monitor: a neuron-monitor JSON config file (period, "
        "neuron_runtimes with tag_filter and metrics, system_metrics); default: every "
        "group of every process every --period",
    )
    p.add_argument(
        "--prometheus",
        metavar="[HOST:]PORT",
        help="instead of printing, serve the processes' metrics for Prometheus on "
        "http://HOST:PORT/metrics (HOST default 127.0.0.1), asked anew at each scrape",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt monitor``."""
    p = parser()
    args = p.parse_args(argv)
    if args.prometheus is not None and args.count is not None:
        p.error("--prometheus serves each scrape as it comes: --period and --count do not apply")
    if args.prometheus is not None and args.format == "crossrt" and args.period != DEFAULT_PERIOD:
        p.error("--prometheus serves each scrape as it comes: --period and --count do not apply")
    if args.config_file is not None and args.format != "neuron-monitor":
        p.error("-c/--config-file is neuron-monitor's: add --format neuron-monitor")
    if args.config_file is not None and args.period != DEFAULT_PERIOD:
        p.error("the config file gives the periods: leave --period out with -c")
    try:
        if args.format == "neuron-monitor":
            return neuron_main(args.config_file, args.period, args.count, args.prometheus)
        if args.prometheus is not None:
            return serve_prometheus(args.prometheus)
        sampler = Sampler()
        for document in sampler.documents(args.period, args.count):
            sys.stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
            # Flushed per document: a reader at the other end of a pipe sees each line as
            # it is made, not when a buffer fills.
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how an unbounded monitor ends
    except CrossrtError as exc:
        return fail("monitor", exc)
    return 0


def neuron_main(
    config_file: str | None, period: float, count: int | None, prometheus: str | None
) -> int:
    """``--format neuron-monitor``: print neuron-monitor's documents, or serve its
    Prometheus metrics (``tools/neuron_monitor.py``, ``tools/neuron_prometheus.py``)."""
    from .neuron_monitor import NeuronConfig, NeuronSampler, load_config

    config = load_config(config_file) if config_file else NeuronConfig.default(period)
    sampler = NeuronSampler(config)
    if prometheus is not None:
        from .neuron_prometheus import Feed

        return serve_collectors(prometheus, Feed(sampler, config.tick()))
    for made, pause in enumerate(pauses(config.tick()), 1):
        time.sleep(pause)
        sys.stdout.write(json.dumps(sampler.sample(), separators=(",", ":")) + "\n")
        sys.stdout.flush()
        if count is not None and made >= count:
            break
    return 0


# -- Prometheus -------------------------------------------------------------------------------


def serve_prometheus(address: str) -> int:
    """Serve every crossrt process's metrics on ``[HOST:]PORT`` until interrupted: the
    daemon's Triton-style model metrics, labelled ``pid`` and ``tag`` too, and each
    process's CPU time and resident memory (``server/metrics.py``).

    Raises:
        CrossrtError: prometheus-client or psutil is missing, or the address is taken.
    """
    try:
        from ..server.metrics import CacheCollector, ModelCollector, ProcessCollector
    except ImportError as exc:
        raise CrossrtError(
            f"prometheus-client is missing ({exc}); install the serve extra: "
            "pip install 'crossrt[serve]'"
        ) from None
    scrape = Scrape(require_psutil())
    return serve_collectors(
        address,
        ModelCollector(scrape.models),
        ProcessCollector(scrape.processes),
        CacheCollector(scrape.caches),
    )


def serve_collectors(address: str, *collectors: Any) -> int:
    """Serve ``collectors`` on ``[HOST:]PORT`` (``/metrics``) until interrupted.

    Raises:
        CrossrtError: prometheus-client is missing, or the address is malformed or taken.
    """
    try:
        from ..server.metrics import serve_metrics
    except ImportError as exc:
        raise CrossrtError(
            f"prometheus-client is missing ({exc}); install the serve extra: "
            "pip install 'crossrt[serve]'"
        ) from None
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"--prometheus {address!r}: give [HOST:]PORT, e.g. 9100")
    try:
        server, _ = serve_metrics(f"{host or '127.0.0.1'}:{port}", *collectors)
    except OSError as exc:
        raise OutOfResourcesError(
            f"cannot serve metrics on {address}: {exc.strerror or exc}; choose another "
            "--prometheus [HOST:]PORT"
        ) from None
    sys.stderr.write(f"crossrt monitor: metrics on http://{host or '127.0.0.1'}:{port}/metrics\n")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


class Scrape:
    """The processes' snapshots for one scrape: a scrape collects models and processes
    apart, so the snapshots are taken once per :data:`SCRAPE_SECONDS`."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self._at = -float("inf")
        self._found: list[dict[str, Any]] = []

    def _snapshots(self) -> list[dict[str, Any]]:
        if time.monotonic() - self._at > SCRAPE_SECONDS:
            self._found = [p for p in observer.processes() if "error" not in p]
            self._at = time.monotonic()
        return self._found

    def models(self) -> list[tuple[dict[str, str], ModelStatistics]]:
        """``(labels, statistics)`` per model of every process."""
        rows = []
        for process in self._snapshots():
            for model in process["models"]:
                name, version = model["name"], ""
                if model.get("served_as"):
                    name, _, version = str(model["served_as"]).rpartition(":")
                labels = {
                    "model": name,
                    "version": version,
                    "pid": str(process["pid"]),
                    "tag": str(process["tag"]),
                }
                try:
                    statistics = statistics_from_dict(model["statistics"])
                except InvalidArgumentError:
                    continue  # another crossrt version's: one model, not the whole scrape
                rows.append((labels, statistics))
        return rows

    def caches(self) -> list[tuple[dict[str, str], CacheStats]]:
        """``(labels, compile cache counters)`` per process."""
        rows = []
        for process in self._snapshots():
            found = process.get("cache")
            if isinstance(found, dict):
                with contextlib.suppress(TypeError):
                    labels = {"pid": str(process["pid"]), "tag": str(process["tag"])}
                    rows.append((labels, CacheStats(**found)))
        return rows

    def processes(self) -> list[tuple[dict[str, str], float, float, int | None]]:
        """``(labels, user seconds, system seconds, resident bytes)`` per process."""
        rows = []
        for process in self._snapshots():
            labels = {"pid": str(process["pid"]), "tag": str(process["tag"])}
            rss = rss_bytes(self.psutil, process["pid"])
            cpu = process["cpu"]
            rows.append((labels, float(cpu["user_s"]), float(cpu["system_s"]), rss))
        return rows


SCRAPE_SECONDS = 0.5
"""How long one set of snapshots serves scrapes."""


# -- sampling ---------------------------------------------------------------------------------


class Sampler:
    """Snapshots of every crossrt process, each compared with the one before it.

    Creating one takes the first snapshot (the processes' and the machine's CPU times);
    each :meth:`sample` then returns a document of the time since the previous one.

    Raises:
        CrossrtError: psutil is missing, or the runtime directory cannot be used.
    """

    def __init__(self, timeout: float = SNAPSHOT_TIMEOUT) -> None:
        self.psutil = require_psutil()
        self.timeout = timeout
        # cpu_times_percent(None) compares with its previous call: this one starts the period.
        self.psutil.cpu_times_percent(interval=None)
        self.before = observer.processes(timeout)
        self.at = time.monotonic()

    def sample(self) -> dict[str, Any]:
        """A document of the processes and the machine since the previous sample."""
        after = observer.processes(self.timeout)
        now = time.monotonic()
        period = now - self.at
        processes = diff_processes(self.before, after, period)
        for process in processes:
            process["rss_bytes"] = self.rss_bytes(process["pid"])
        self.before, self.at = after, now
        return {
            "time": time.time(),
            "period": period,
            "processes": processes,
            "system": self.system(),
        }

    def documents(self, period: float, count: int | None = None) -> Iterator[dict[str, Any]]:
        """A :meth:`sample` every ``period`` seconds, ``count`` of them (``None``: forever)."""
        for made, pause in enumerate(pauses(period), 1):
            time.sleep(pause)
            yield self.sample()
            if count is not None and made >= count:
                return

    def rss_bytes(self, pid: int) -> int | None:
        """The resident memory of process ``pid`` (:func:`rss_bytes`)."""
        return rss_bytes(self.psutil, pid)

    def system(self) -> dict[str, Any]:
        """The machine: vCPUs, their use in percent since the previous call, and memory."""
        cpu = self.psutil.cpu_times_percent(interval=None)
        memory = self.psutil.virtual_memory()
        swap = self.psutil.swap_memory()
        return {
            "vcpu_count": self.psutil.cpu_count(logical=True),
            "vcpu_usage_percent": _scaled_to_100(cpu._asdict()),
            "memory_total_bytes": int(memory.total),
            "memory_used_bytes": int(memory.used),
            "swap_total_bytes": int(swap.total),
            "swap_used_bytes": int(swap.used),
        }


def rss_bytes(psutil: Any, pid: int) -> int | None:
    """The resident memory of process ``pid``; ``None`` when it ended or is not ours."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _scaled_to_100(percent: Mapping[str, float]) -> dict[str, float]:
    """psutil's ``cpu_times_percent`` fields, made to add up to 100.

    psutil 7.2 divides each field's CPU seconds by ``max(1, total seconds)`` (its comment
    takes the times for integers: they are seconds, fractions of one): when the period times
    the vCPUs is under a second (0.2 s on 2 vCPUs), the fields add up to less than 100
    (idle 40, the rest 0). Dividing by their sum gives each field's true share.
    """
    total = sum(percent.values())
    scale = 100.0 / total if 0 < total < 99.0 else 1.0
    return {key: round(float(value) * scale, 1) for key, value in percent.items()}


def pauses(period: float) -> Iterator[float]:
    """Seconds to wait before each tick of a clock ticking every ``period`` seconds from now.

    The ticks are at fixed times (now + k periods), so that the time spent between them
    (asking the processes, drawing) does not make them drift later; a tick that is already
    past waits 0 seconds and the clock starts again from there, rather than catching up with
    ticks in quick succession.
    """
    due = time.monotonic()
    while True:
        due += period
        now = time.monotonic()
        if due < now:
            due = now
        yield due - now


# -- diffing ----------------------------------------------------------------------------------


def diff_processes(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], period: float
) -> list[dict[str, Any]]:
    """The processes of ``after`` (snapshots as ``observer.processes`` returns them), with
    their rates since ``before``.

    Each process is compared with the snapshot of the same pid in ``before`` (one whose
    ``started`` differs is another process that reuses the pid, so it is compared with
    nothing), each model with the model of the same name (the n-th of that name, when a
    process loads one several times) in that snapshot. Rates are over the time between the two
    snapshots' ``time`` fields, else ``period``; compared with nothing they are ``None``.
    ``rss_bytes`` is ``None`` here: :class:`Sampler` reads it.
    """
    earlier = {p["pid"]: p for p in before if "error" not in p}
    result = []
    for snap in after:
        pid = snap["pid"]
        if "error" in snap:
            result.append(
                {
                    "pid": pid,
                    "tag": None,
                    "command": None,
                    "error": str(snap["error"]),
                    "cpu": {"user_percent": None, "system_percent": None},
                    "rss_bytes": None,
                    "models": [],
                }
            )
            continue
        old = earlier.get(pid)
        if old is not None and old.get("started") != snap.get("started"):
            old = None
        seconds = period
        if old is not None and snap.get("time", 0) > old.get("time", 0):
            seconds = float(snap["time"]) - float(old["time"])
        cpu = {"user_percent": None, "system_percent": None}
        if old is not None and seconds > 0:
            for key, field in (("user_percent", "user_s"), ("system_percent", "system_s")):
                cpu[key] = (snap["cpu"][field] - old["cpu"][field]) / seconds * 100
        old_models = _by_occurrence(old["models"] if old is not None else [])
        models = [
            diff_model(old_models.get(key), model, seconds)
            for key, model in _by_occurrence(snap.get("models", [])).items()
        ]
        result.append(
            {
                "pid": pid,
                "tag": snap.get("tag"),
                "command": snap.get("command"),
                "error": None,
                "cpu": cpu,
                "rss_bytes": None,
                "cache": snap.get("cache"),
                "models": models,
            }
        )
    return result


def diff_model(
    before: Mapping[str, Any] | None, after: Mapping[str, Any], seconds: float
) -> dict[str, Any]:
    """One model of a snapshot (``observer.describe``'s form) with its rates since
    ``before`` over ``seconds``: all ``None`` when ``before`` is ``None``, or is another
    load of the model (unloaded and loaded again: its ``load`` differs, or, from a process
    whose snapshots have none, its counters are ahead of ``after``'s)."""
    stats = after["statistics"]
    old = before["statistics"] if before is not None else None
    if before is not None and before.get("load", after.get("load")) != after.get("load"):
        old = None
    if old is not None and (
        old["success"] > stats["success"] or old["requests"] > stats["requests"]
    ):
        old = None
    row: dict[str, Any] = {
        "name": after["name"],
        "served_as": after.get("served_as"),
        "device": after["device"],
        "drivers": list(after["drivers"]),
        "instances": after["instances"],
        "cores": [list(c) for c in after.get("cores", [])],
        "running": after["running"],
        "in_flight": stats["in_flight"],
        "requests": stats["requests"],
        "success": stats["success"],
        "failure": stats["failure"],
        "failures": dict(stats["failures"]),
        "throughput": None,
        "latency_us": None,
        "queue_us": None,
        "infer_us": None,
        "busy_percent": None,
        "max_batch_size": after.get("max_batch_size", 0),
        "mean_batch": None,
    }
    if old is None or seconds <= 0:
        return row
    if len(old["instances"]) == len(stats["instances"]):
        # Engine time per instance over the period: how much of it each instance ran (over
        # 100 for a multi-node instance whose nodes run requests side by side).
        row["busy_percent"] = [
            round((a["ns"] - b["ns"]) / 1e9 / seconds * 100, 1)
            for a, b in zip(stats["instances"], old["instances"], strict=True)
        ]
    successes = stats["success"] - old["success"]
    row["throughput"] = successes / seconds
    runs = sum(a["count"] for a in stats["instances"]) - sum(b["count"] for b in old["instances"])
    if row["max_batch_size"] and runs > 0:  # a batch is one run of its instance
        row["mean_batch"] = round(successes / runs, 2)
    counts = [
        a - b for a, b in zip(stats["histogram"]["counts"], old["histogram"]["counts"], strict=True)
    ]
    row["latency_us"] = percentiles_us(counts, stats["histogram"]["buckets_us"])
    row["queue_us"] = _mean_us(old["queue"], stats["queue"])
    row["infer_us"] = _mean_us(old["compute_infer"], stats["compute_infer"])
    return row


def percentiles_us(
    counts: Sequence[int], buckets_us: Sequence[int], qs: Sequence[int] = (50, 90, 99)
) -> dict[str, float | None] | None:
    """``{"p50": ..., "p90": ..., "p99": ...}`` microseconds of a latency histogram (one more
    count than bucket bounds, as ``ModelStatistics`` keeps it), each interpolated within its
    bucket; ``None`` when it counts nothing."""
    kept = [max(0, int(c)) for c in counts]
    if not sum(kept):
        return None
    return {f"p{q}": histogram_percentile_us(kept, buckets_us, q) for q in qs}


def _mean_us(before: Mapping[str, int], after: Mapping[str, int]) -> float | None:
    """The mean microseconds of the events between two ``{count, ns}`` sums; ``None`` when
    there were none."""
    count = after["count"] - before["count"]
    if count <= 0:
        return None
    return Duration(count, after["ns"] - before["ns"]).mean_us


def _by_occurrence(models: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], Mapping[str, Any]]:
    """Models keyed by ``(name, n)``: the n-th model of that name, in load order."""
    seen: dict[str, int] = {}
    keyed = {}
    for model in models:
        n = seen.get(model["name"], 0)
        seen[model["name"]] = n + 1
        keyed[(model["name"], n)] = model
    return keyed
