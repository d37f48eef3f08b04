"""neuron-monitor's runtime metric groups of one crossrt process, from two of its observation
snapshots (``runtime/observer.py``): see ``tools/neuron_monitor.py`` for the mapping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..runtime.statistics import histogram_percentile_us

PERCENTILES = (0, 1, 25, 50, 75, 99, 100)
"""The latency percentiles neuron-monitor reports (``p0`` ... ``p100``)."""

EXECUTION_SUMMARY = (
    "completed",
    "completed_with_err",
    "completed_with_num_err",
    "timed_out",
    "incorrect_input",
    "failed_to_queue",
)
ERROR_SUMMARY = ("generic", "numerical", "transient", "model", "runtime", "hardware")

FAILURE_KINDS: dict[str, tuple[str | None, str]] = {
    "EXEC_COMPLETED_WITH_ERR": ("completed_with_err", "generic"),
    "EXEC_COMPLETED_WITH_NUM_ERR": ("completed_with_num_err", "numerical"),
    "TIMEOUT": ("timed_out", "transient"),
    "EXEC_BAD_INPUT": ("incorrect_input", "model"),
    "INVALID": ("incorrect_input", "model"),
    "QUEUE_FULL": ("failed_to_queue", "transient"),
    "EXEC_NC_BUSY": ("failed_to_queue", "transient"),
    "EXEC_SW_NQ_OVERFLOW": ("failed_to_queue", "transient"),
    "RESOURCE": (None, "runtime"),
    "FAIL_HOST_MEM_ALLOC": (None, "runtime"),
    "HW_ERROR": (None, "hardware"),
    "EXEC_UNIT_UNRECOVERABLE": (None, "hardware"),
}
"""crossrt's failure status -> (``execution_summary`` key or none, ``error_summary`` key).
``HW_ERR_*`` and ``EXEC_HW_ERR_*`` are ``hardware`` too, ``CANCELLED`` (its caller gave up)
counts nowhere, any other status is ``generic``."""


def failure_kind(status: str) -> tuple[str | None, str | None]:
    """Where a failure of ``status`` counts: (``execution_summary`` key, ``error_summary`` key)."""
    if status == "CANCELLED":
        return None, None
    if status.startswith(("HW_ERR", "EXEC_HW_ERR")):
        return None, "hardware"
    return FAILURE_KINDS.get(status, (None, "generic"))


def runtime_group(
    group: str, before: Mapping[str, Any] | None, after: Mapping[str, Any], seconds: float
) -> dict[str, Any]:
    """Group ``group`` of the process whose snapshot is ``after``, over the ``seconds`` since
    ``before`` (``None``: since the process started, from zero)."""
    if before is not None and before.get("started") != after.get("started"):
        before = None  # another process that reuses the pid
    if before is None:
        seconds = max(1e-9, float(after.get("time", 0)) - float(after.get("started", 0))) or seconds
    if group == "neuroncore_counters":
        body: dict[str, Any] = {"neuroncores_in_use": _cores(before, after, seconds)}
    elif group == "execution_stats":
        body = _execution(before, after)
    elif group == "memory_used":
        body = _memory(after)
    else:  # neuron_runtime_vcpu_usage
        old = before["cpu"] if before is not None else {"user_s": 0.0, "system_s": 0.0}
        body = {
            "vcpu_usage": {
                kind: round((after["cpu"][f"{kind}_s"] - old[f"{kind}_s"]) / seconds * 100, 2)
                for kind in ("user", "system")
            }
        }
    return {"period": seconds, **body, "error": ""}


def _pairs(
    before: Mapping[str, Any] | None, after: Mapping[str, Any]
) -> list[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]:
    """Each model of ``after`` with the same load in ``before`` (or ``None``: count from 0)."""
    old = {m.get("load"): m for m in (before or {}).get("models", [])}
    return [(old.get(m.get("load")), m) for m in after.get("models", [])]


def _cores(
    before: Mapping[str, Any] | None, after: Mapping[str, Any], seconds: float
) -> dict[str, dict[str, Any]]:
    """Per core, the share of the period the engines of the instances placed on it ran (an
    instance on several cores counts its time on each, split evenly); ``flops``: unknown."""
    busy: dict[str, float] = {}
    for old, model in _pairs(before, after):
        now_i = model["statistics"]["instances"]
        was_i = old["statistics"]["instances"] if old is not None else []
        devices = model.get("devices") or [model["device"]] * len(now_i)
        for i, cores in enumerate(model.get("cores", [])):
            ns = now_i[i]["ns"] - (was_i[i]["ns"] if i < len(was_i) else 0) if i < len(now_i) else 0
            device = devices[i] if i < len(devices) else model["device"]
            for core in cores:
                key = str(core) if str(device).startswith("cpu") else f"{device}:{core}"
                busy[key] = busy.get(key, 0.0) + max(0, ns) / 1e9 / len(cores)
    return {
        key: {"neuroncore_utilization": round(min(100.0, s / seconds * 100), 2), "flops": None}
        for key, s in sorted(busy.items(), key=lambda kv: (len(kv[0]), kv[0]))
    }


def _execution(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """``error_summary``, ``execution_summary`` and ``latency_stats`` of every model."""
    summary = dict.fromkeys(EXECUTION_SUMMARY, 0)
    errors = dict.fromkeys(ERROR_SUMMARY, 0)
    histogram: list[int] = []
    buckets: Sequence[int] = ()
    for old, model in _pairs(before, after):
        now, was = model["statistics"], old["statistics"] if old is not None else None
        summary["completed"] += now["success"] - (was["success"] if was else 0)
        for status, count in now["failures"].items():
            delta = count - (was["failures"].get(status, 0) if was else 0)
            executed, error = failure_kind(status)
            if executed:
                summary[executed] += delta
            if error:
                errors[error] += delta
        counts = now["histogram"]["counts"]
        old_counts = was["histogram"]["counts"] if was else [0] * len(counts)
        delta_counts = [a - b for a, b in zip(counts, old_counts, strict=True)]
        if not buckets:
            buckets, histogram = now["histogram"]["buckets_us"], delta_counts
        elif list(buckets) == list(now["histogram"]["buckets_us"]):
            histogram = [a + b for a, b in zip(histogram, delta_counts, strict=True)]
    total = None
    if sum(histogram) > 0:
        total = {
            f"p{q}": (histogram_percentile_us(histogram, buckets, q) or 0.0) / 1e6
            for q in PERCENTILES
        }
    return {
        "error_summary": errors,
        "execution_summary": summary,
        # device_latency: crossrt keeps the engines' time as a sum, not a histogram.
        "latency_stats": {"total_latency": total, "device_latency": None},
    }


def _memory(after: Mapping[str, Any]) -> dict[str, Any]:
    """``neuron_runtime_used_bytes`` (the bytes charged to the process's models in their
    devices' allocator accounts: host memory on the cpu device, device memory on the others)
    and ``loaded_models`` with their own."""
    host = device = 0
    models = []
    for index, model in enumerate(after.get("models", [])):
        own = int((model.get("memory") or {}).get("bytes_in_use", 0))
        on_host = str(model.get("device", "")).startswith("cpu")
        own_host, own_device = (own, 0) if on_host else (0, own)
        host, device = host + own_host, device + own_device
        cores = model.get("cores") or [[]]
        models.append(
            {
                "name": model.get("served_as") or model["name"],
                "uuid": model.get("load"),
                "model_id": index,
                "is_running": bool(model.get("running")),
                "subgraphs": {
                    "sg_00": {
                        "memory_used_bytes": _used(own_host, own_device),
                        "neuroncore_index": cores[0][0] if cores and cores[0] else None,
                        "neuron_device_index": 0,
                    }
                },
            }
        )
    return {"neuron_runtime_used_bytes": _used(host, device), "loaded_models": models}


def _used(host: int, device: int) -> dict[str, Any]:
    """``{host, neuron_device, usage_breakdown}``: crossrt's allocator knows tensors only,
    per device, not per core nor as constants or code."""
    return {
        "host": host,
        "neuron_device": device,
        "usage_breakdown": {
            "host": {
                "application_memory": None,
                "constants": None,
                "dma_buffers": None,
                "tensors": host,
            },
            "neuroncore_memory_usage": {},
        },
    }
