"""``crossrt monitor --format neuron-monitor`` read as neuron-monitor's consumers read it.

The worker is a child interpreter tagged by ``NEURON_PROCESS_TAG`` (as a Neuron program is)
that runs a Relu model in a loop, every 20th request with a wrong input shape, until the test
kills it. Its documents are walked along every key path ``neuron-monitor-prometheus.py``
reads (:func:`_prometheus_script_reads`, written from the script's documented behaviour), and
the Prometheus text is checked with prometheus-client's own parser.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from crossrt.tools import cli
from crossrt.tools.neuron_prometheus import NeuronMetrics
from observing import worker_script

TAG = "neuron-app"
WAIT_S = 30.0  # for the worker to load its model, however slow this machine is


@pytest.fixture
def worker(runtime_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The pid of a worker tagged :data:`TAG` by ``NEURON_PROCESS_TAG`` only, once it has
    loaded its model; killed on the way out."""
    monkeypatch.delenv("CROSSRT_OBSERVE", raising=False)
    monkeypatch.delenv("CROSSRT_PROCESS_TAG", raising=False)
    script = tmp_path / "worker.py"
    script.write_text(worker_script(20))
    env = os.environ | {"CROSSRT_RUNTIME_DIR": str(runtime_dir), "NEURON_PROCESS_TAG": TAG}
    errors = tmp_path / "worker.err"
    with errors.open("w") as err:
        child = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], WAIT_S)
        line = child.stdout.readline() if ready else ""
        if not line.startswith("ready"):
            pytest.fail(f"the worker did not load its model in {WAIT_S:g} s: {errors.read_text()}")
        yield child.pid
    finally:
        child.kill()
        child.communicate(timeout=WAIT_S)


def _documents(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert cli.main(["monitor", "--format", "neuron-monitor", "--count", "2", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _prometheus_script_reads(document: Mapping[str, Any]) -> None:
    """Every key path neuron-monitor-prometheus.py reads, with the type it reads there."""
    instance = document["instance_info"]
    for key in ("instance_name", "instance_id", "instance_type", "instance_availability_zone"):
        assert key in instance
    assert {"instance_region", "subnet_id", "error"} <= instance.keys()
    hardware = document["neuron_hardware_info"]
    for key in ("neuron_device_count", "neuroncore_per_device_count", "error"):
        assert key in hardware
    for runtime in document["neuron_runtime_data"]:
        assert isinstance(runtime["pid"], int) and runtime["error"] == ""
        assert isinstance(runtime["neuron_runtime_tag"], str)
        report = runtime["report"]
        for group in report.values():
            assert _number(group["period"]) and group["error"] == ""
        for core, counters in report["neuroncore_counters"]["neuroncores_in_use"].items():
            assert core.isdigit() and 0 <= counters["neuroncore_utilization"] <= 100
        used = report["memory_used"]["neuron_runtime_used_bytes"]
        assert _number(used["host"]) and _number(used["neuron_device"])
        assert isinstance(used["usage_breakdown"]["neuroncore_memory_usage"], dict)
        vcpu = report["neuron_runtime_vcpu_usage"]["vcpu_usage"]
        assert _number(vcpu["user"]) and _number(vcpu["system"])
        stats = report["execution_stats"]
        for kind in ("generic", "numerical", "transient", "model", "runtime", "hardware"):
            assert isinstance(stats["error_summary"][kind], int)
        for kind in ("completed", "completed_with_err", "completed_with_num_err"):
            assert isinstance(stats["execution_summary"][kind], int)
        for kind in ("timed_out", "incorrect_input", "failed_to_queue"):
            assert isinstance(stats["execution_summary"][kind], int)
        total = stats["latency_stats"]["total_latency"]
        assert total is None or all(_number(total[f"p{q}"]) for q in (0, 1, 25, 50, 75, 99, 100))
    system = document["system_data"]
    memory = system["memory_info"]
    for key in ("memory_total_bytes", "memory_used_bytes", "swap_total_bytes", "swap_used_bytes"):
        assert _number(memory[key])
    vcpus = system["vcpu_usage"]
    for usage in [vcpus["average_usage"], *vcpus["usage_data"].values()]:
        for key in ("user", "nice", "system", "idle", "io_wait", "irq", "soft_irq"):
            assert _number(usage[key])
    assert isinstance(system["neuron_hw_counters"]["neuron_devices"], list)


def _samples(text: str) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


NEURON_NAMES = {
    "neuron_runtime_memory_used_bytes",
    "neuroncore_utilization_ratio",
    "neuron_runtime_vcpu_usage_ratio",
    "execution_errors_total",
    "execution_status_total",
    "execution_latency_seconds",
    "neuron_hardware_info",
    "instance_info",
    "system_memory_total_bytes",
    "system_memory_used_bytes",
    "system_swap_total_bytes",
    "system_vcpu_count",
    "system_vcpu_usage_ratio",
}


def test_documents_have_neuron_monitors_layout_and_export_its_metrics(
    worker: int, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = _documents(capsys, "--period", "0.5")
    assert len(documents) == 2
    metrics = NeuronMetrics()
    for document in documents:
        _prometheus_script_reads(document)
        (runtime,) = [r for r in document["neuron_runtime_data"] if r["pid"] == worker]
        assert runtime["neuron_runtime_tag"] == TAG  # NEURON_PROCESS_TAG, read by crossrt
        stats = runtime["report"]["execution_stats"]
        assert stats["execution_summary"]["completed"] > 0
        assert stats["latency_stats"]["total_latency"]["p50"] > 0
        (model,) = runtime["report"]["memory_used"]["loaded_models"]
        assert model["name"] == "relu64" and model["is_running"] is True
        metrics.read(document)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    samples = _samples(generate_latest(registry).decode())
    assert samples.keys() >= NEURON_NAMES, NEURON_NAMES - samples.keys()
    status = {s.labels["status_type"]: s.value for s in samples["execution_status_total"]}
    completed = sum(
        d["neuron_runtime_data"][0]["report"]["execution_stats"]["execution_summary"]["completed"]
        for d in documents
    )
    assert status["completed"] == completed  # each document's count added once
    errors = {s.labels["error_type"]: s.value for s in samples["execution_errors_total"]}
    assert errors["model"] > 0 and status["incorrect_input"] == errors["model"]
    for sample in samples["execution_latency_seconds"]:
        assert (
            sample.labels["runtime_tag"] == TAG
            and {"instance_id", "region"} <= sample.labels.keys()
        )
    (hardware,) = samples["neuron_hardware_info"]
    assert int(hardware.labels["neuroncore_per_device_count"]) >= 1


def _config(tmp_path: Path, doc: Mapping[str, Any]) -> str:
    path = tmp_path / "monitor.conf"
    path.write_text(json.dumps(doc))
    return str(path)


def test_config_files_tag_filter_and_groups_select_what_is_reported(
    worker: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = {
        "period": "500ms",
        "neuron_runtimes": [
            {"tag_filter": "^other-app$", "metrics": [{"type": "memory_used"}]},
            {"tag_filter": "^neuron-", "metrics": [{"type": "execution_stats"}]},
        ],
        "system_metrics": [{"type": "memory_info"}],
    }
    for document in _documents(capsys, "-c", _config(tmp_path, chosen)):
        (runtime,) = [r for r in document["neuron_runtime_data"] if r["pid"] == worker]
        assert set(runtime["report"]) == {"execution_stats"}  # the entry whose filter matched
        assert set(document["system_data"]) == {"memory_info"}
    others = chosen | {"neuron_runtimes": [chosen["neuron_runtimes"][0]]}
    for document in _documents(capsys, "-c", _config(tmp_path, others)):
        assert [r for r in document["neuron_runtime_data"] if r["pid"] == worker] == []


def test_a_bad_config_file_is_refused_saying_what_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {"neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "flops"}]}]}
    assert cli.main(["monitor", "--format", "neuron-monitor", "-c", _config(tmp_path, bad)]) == 1
    assert "type 'flops' is not one of neuroncore_counters" in capsys.readouterr().err
    late = {"period": "soon"}
    assert cli.main(["monitor", "--format", "neuron-monitor", "-c", _config(tmp_path, late)]) == 1
    assert 'write e.g. "1s"' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["monitor", "-c", _config(tmp_path, late)])
    assert exited.value.code == 2
    assert "add --format neuron-monitor" in capsys.readouterr().err


def test_prometheus_serves_neuron_monitor_prometheus_names(
    worker: int, runtime_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "crossrt.tools.cli", "monitor", "--format", "neuron-monitor"]
    server = subprocess.Popen(
        [*command, "--period", "0.2", "--prometheus", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"CROSSRT_RUNTIME_DIR": str(runtime_dir)},
    )
    try:
        assert server.stderr is not None
        ready, _, _ = select.select([server.stderr], [], [], WAIT_S)
        assert ready and "metrics on" in server.stderr.readline()
        # A scrape reads a new document once a period (0.2 s) has passed; the worker's
        # groups fall due one period after the command found it.
        deadline = time.monotonic() + WAIT_S
        samples: dict[str, list[Any]] = {}
        while "execution_status_total" not in samples and time.monotonic() < deadline:
            url = f"http://127.0.0.1:{port}/metrics"
            with contextlib.closing(urllib.request.urlopen(url, timeout=WAIT_S)) as answer:
                samples = _samples(answer.read().decode())
    finally:
        server.kill()
        server.communicate(timeout=WAIT_S)
    assert samples.keys() >= NEURON_NAMES, NEURON_NAMES - samples.keys()
    tags = {s.labels["runtime_tag"] for s in samples["execution_status_total"]}
    assert tags == {TAG}
    assert "crossrt_inference_request_success_total" not in samples  # the crossrt format's
