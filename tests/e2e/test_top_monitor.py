"""``crossrt monitor`` and ``crossrt top`` watching a real process that runs a model.

Each test has a ``CROSSRT_RUNTIME_DIR`` of its own, so it sees its own worker only; the
worker is a child interpreter that loads a Relu model, says ``ready`` and runs it in a loop
until the test kills it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossrt.runtime.statistics import BUCKETS_US, Duration, ModelStatistics
from crossrt.tools import cli
from crossrt.tools.monitor import Sampler, diff_processes, percentiles_us
from observing import hanging_up, worker_script

TAG = "worker-tag"
WAIT_S = 30.0  # for the worker to load its model, however slow this machine is


@pytest.fixture
def runtime_dir(runtime_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/conftest.py's ``CROSSRT_RUNTIME_DIR`` of this test's own (so that it sees its
    own worker only), observation on, and no ``COLUMNS`` to narrow ``top``'s view."""
    monkeypatch.delenv("CROSSRT_OBSERVE", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    return runtime_dir


@contextlib.contextmanager
def _worker(runtime_dir: Path, folder: Path) -> Iterator[tuple[int, str]]:
    """``(pid, model name)`` of a child running a model, tagged :data:`TAG`, once it has
    loaded it; killed on the way out, whatever happened."""
    script = folder / "worker.py"
    script.write_text(worker_script())
    env = os.environ | {"CROSSRT_RUNTIME_DIR": str(runtime_dir), "CROSSRT_PROCESS_TAG": TAG}
    # stderr to a file: a pipe nobody reads would block a worker that logs much.
    errors = folder / "worker.err"
    with errors.open("w") as err:
        child = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], WAIT_S)
        line = child.stdout.readline() if ready else ""
        if not line.startswith("ready"):
            child.kill()
            child.communicate(timeout=WAIT_S)
            pytest.fail(
                f"the worker did not load its model within {WAIT_S:g} s: {line}{errors.read_text()}"
            )
        yield child.pid, line.split()[1]
    finally:
        child.kill()
        child.communicate(timeout=WAIT_S)


@pytest.fixture
def worker(runtime_dir: Path, tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A worker running before the test starts (see :func:`_worker`)."""
    with _worker(runtime_dir, tmp_path) as found:
        yield found


def _documents(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert cli.main(["monitor", *args]) == 0
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def test_monitor_prints_the_worker_and_its_model(
    worker: tuple[int, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pid, name = worker
    documents = _documents(capsys, "--period", "0.5", "--count", "2")
    assert len(documents) == 2
    served = []
    for document in documents:
        assert document["period"] > 0
        (process,) = [p for p in document["processes"] if p["pid"] == pid]
        assert process["tag"] == TAG and process["error"] is None
        assert process["rss_bytes"] > 0
        assert process["cache"]["hits"] >= 0 and "compile_seconds" in process["cache"]
        assert process["cpu"]["user_percent"] >= 0
        (model,) = process["models"]
        assert model["name"] == name and model["device"] == "cpu:0"
        assert model["failure"] == 0 and model["throughput"] >= 0
        if model["throughput"] > 0:
            served.append(model)
        system = document["system"]
        assert system["vcpu_count"] >= 1
        assert system["memory_total_bytes"] >= system["memory_used_bytes"] > 0
        assert "idle" in system["vcpu_usage_percent"]
    # The worker runs a request every millisecond or so; on a starved machine one period
    # might still see none, not both.
    assert served, documents
    for model in served:
        assert model["success"] > 0 and model["infer_us"] > 0
        (busy,) = model["busy_percent"]  # one instance
        assert 0 < busy <= 100 * 1.5  # the clocks of two processes: not to the percent
        assert isinstance(model["latency_us"]["p50"], float)
        assert model["latency_us"]["p50"] <= model["latency_us"]["p99"]
    assert documents[1]["time"] > documents[0]["time"]


def test_top_once_shows_the_worker(worker: tuple[int, str], runtime_dir: Path) -> None:
    pid, name = worker
    done = subprocess.run(
        [sys.executable, "-m", "crossrt", "top", "--once", "--period", "0.5"],
        env=os.environ | {"CROSSRT_RUNTIME_DIR": str(runtime_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert TAG in out and name in out and str(pid) in out
    assert "1 crossrt process" in out and "REQ/S" in out
    assert "\x1b[" not in out  # no colours in a pipe


def test_monitor_without_processes_prints_empty_documents(
    runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = _documents(capsys, "--period", "0.1", "--count", "2")
    assert [d["processes"] for d in documents] == [[], []]
    assert all(d["system"]["memory_total_bytes"] > 0 for d in documents)


def test_top_without_processes_says_so(
    runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["top", "--once", "--period", "0.1"]) == 0
    out = capsys.readouterr().out
    assert f"no crossrt process answers in {runtime_dir / 'observe'}" in " ".join(out.split())


@pytest.mark.parametrize("command", ["monitor", "top"])
@pytest.mark.parametrize("period", ["0", "-1", "x", "nan"])
def test_a_bad_period_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: str, period: str
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--period", period])
    assert info.value.code == 2
    assert "--period" in capsys.readouterr().err


def test_a_bad_count_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["monitor", "--count", "0"])
    assert info.value.code == 2


# -- the diff, without sockets -----------------------------------------------------------------


def _model(name: str, success: int, histogram: list[int], queue_ns: int) -> dict[str, Any]:
    """A model as a snapshot shows it, with ``success`` requests all successful."""
    stats = ModelStatistics(
        requests=success,
        success=success,
        failures={},
        in_flight=0,
        queue=Duration(success, queue_ns),
        compute_input=Duration(success, 0),
        compute_infer=Duration(success, 3 * queue_ns),
        compute_output=Duration(success, 0),
        latency=Duration(success, 0),
        histogram=tuple(histogram),
        instances=(),
        last_inference_ms=0,
    )
    return {
        "name": name,
        "device": "cpu:0",
        "drivers": ["onnxruntime"],
        "instances": 1,
        "running": True,
        "statistics": stats.to_dict(),
    }


def _process(pid: int, at: float, user_s: float, models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pid": pid,
        "tag": f"p{pid}",
        "command": "python x.py",
        "started": 100.0,
        "time": at,
        "cpu": {"user_s": user_s, "system_s": 0.0},
        "models": models,
    }


def _counts(**by_bucket: int) -> list[int]:
    """A histogram with ``b<i>=n`` successes in bucket i."""
    counts = [0] * (len(BUCKETS_US) + 1)
    for key, n in by_bucket.items():
        counts[int(key[1:])] = n
    return counts


def test_diff_reads_the_period_from_the_difference_of_two_snapshots() -> None:
    # 100 successes before (all in 10-25 us), then 10 more in the 25-50 us bucket (index 2).
    before = [_process(1, 1000.0, 1.0, [_model("m", 100, _counts(b1=100), 100_000)])]
    after_model = _model("m", 110, _counts(b1=100, b2=10), 100_000 + 10 * 2_000)
    after = [
        _process(1, 1002.0, 1.5, [after_model]),
        _process(2, 1002.0, 9.0, [_model("new", 5, _counts(b0=5), 0)]),  # appeared since
        {"pid": 3, "error": "crossrt process 3 did not answer within 2 s"},
    ]
    one, two, three = diff_processes(before, after, period=5.0)

    # Rates over the snapshots' own times (2 s), not the period the caller measured.
    assert one["cpu"] == {"user_percent": pytest.approx(25.0), "system_percent": 0.0}
    (m,) = one["models"]
    assert m["throughput"] == pytest.approx(5.0)
    assert m["success"] == 110 and m["requests"] == 110 and m["failure"] == 0
    # Only the 10 new successes count, interpolated within 25-50 us.
    assert m["latency_us"] == {
        "p50": pytest.approx(37.5),
        "p90": pytest.approx(47.5),
        "p99": pytest.approx(49.75),
    }
    assert m["queue_us"] == pytest.approx(2.0) and m["infer_us"] == pytest.approx(6.0)

    # Compared with nothing: counters, and no rates.
    assert two["cpu"] == {"user_percent": None, "system_percent": None}
    (new,) = two["models"]
    assert new["success"] == 5
    assert new["throughput"] is None and new["latency_us"] is None and new["queue_us"] is None

    assert three["error"] and three["models"] == []


def test_diff_compares_nothing_it_cannot_compare() -> None:
    before = [_process(1, 10.0, 1.0, [_model("m", 50, _counts(b3=50), 0)])]
    # The same pid started again (another process), then a model loaded again (counters
    # restarted), then a period with no success: no latency, throughput 0.
    reused = _process(1, 11.0, 2.0, [_model("m", 60, _counts(b3=60), 0)]) | {"started": 101.0}
    (process,) = diff_processes(before, [reused], 1.0)
    assert process["cpu"]["user_percent"] is None and process["models"][0]["throughput"] is None
    reloaded = [_process(1, 11.0, 2.0, [_model("m", 3, _counts(b3=3), 0)])]
    (process,) = diff_processes(before, reloaded, 1.0)
    assert process["models"][0]["throughput"] is None
    (process,) = diff_processes(before, before, 1.0)
    (idle,) = process["models"]
    assert idle["throughput"] == 0.0 and idle["latency_us"] is None and idle["infer_us"] is None


def test_percentiles_are_the_runtime_s_own() -> None:
    counts = _counts(b0=3, b2=40, b5=7, b19=1)  # b19: above the last bound
    stats = _model("m", 51, counts, 0)["statistics"]
    assert percentiles_us(counts, BUCKETS_US) == stats["latency_us"]
    assert percentiles_us(_counts(), BUCKETS_US) is None


def test_a_process_that_starts_later_has_no_rates_at_first(
    runtime_dir: Path, tmp_path: Path
) -> None:
    sampler = Sampler()  # its first snapshot: no worker yet
    assert sampler.before == []
    with _worker(runtime_dir, tmp_path) as (pid, _):
        first = sampler.sample()
        # Then until a period has successes: the worker may not have finished a request yet.
        deadline = time.monotonic() + WAIT_S
        while True:
            time.sleep(0.2)
            later = sampler.sample()
            (again,) = [p for p in later["processes"] if p["pid"] == pid]
            if again["models"][0]["throughput"] or time.monotonic() > deadline:
                break
    (seen,) = [p for p in first["processes"] if p["pid"] == pid]
    assert seen["cpu"]["user_percent"] is None
    assert seen["models"][0]["throughput"] is None and seen["models"][0]["latency_us"] is None
    model = again["models"][0]
    assert model["throughput"] > 0 and model["latency_us"] is not None


def test_a_process_that_hangs_up_is_an_error_not_the_end(
    runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A socket that accepts and closes without answering (a process dying mid-answer)."""
    with hanging_up(os.getpid()):
        (document,) = _documents(capsys, "--period", "0.1", "--count", "1")
    (process,) = document["processes"]
    assert process["pid"] == os.getpid() and process["error"] and process["models"] == []


def test_cpu_percentages_add_up_to_100_over_short_periods() -> None:
    from crossrt.tools.monitor import _scaled_to_100

    # psutil's answer over 0.2 s on 2 vCPUs: the CPU seconds times 100.
    assert _scaled_to_100({"user": 4.0, "system": 0.0, "idle": 36.0}) == {
        "user": 10.0,
        "system": 0.0,
        "idle": 90.0,
    }
    assert _scaled_to_100({"user": 12.5, "idle": 87.5}) == {"user": 12.5, "idle": 87.5}


def test_busy_is_each_instance_s_engine_time_over_the_period() -> None:
    old, new = _model("m", 10, _counts(b1=10), 0), _model("m", 20, _counts(b1=20), 0)
    old["statistics"]["instances"] = [{"count": 5, "ns": 0}, {"count": 5, "ns": 10**9}]
    new["statistics"]["instances"] = [{"count": 10, "ns": 10**9}, {"count": 10, "ns": 15 * 10**8}]
    (process,) = diff_processes(
        [_process(1, 10.0, 1.0, [old])], [_process(1, 12.0, 1.0, [new])], 2.0
    )
    assert process["models"][0]["busy_percent"] == [50.0, 25.0]


def test_prometheus_mode_refuses_what_does_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["monitor", "--prometheus", "9100", "--count", "2"])
    assert exited.value.code == 2
    assert "--period and --count do not apply" in capsys.readouterr().err
    assert cli.main(["monitor", "--prometheus", "host:port"]) == 1
    assert "give [HOST:]PORT" in capsys.readouterr().err


def test_top_puts_the_busiest_first() -> None:
    """Processes by CPU, models by requests per second, as top sorts."""
    import io

    from rich.console import Console

    from crossrt.tools.top import view

    def model(name: str, throughput: float | None) -> dict[str, Any]:
        return {
            "name": name, "served_as": None, "device": "cpu:0", "drivers": ["onnxruntime"],
            "instances": 1, "cores": [[0]], "running": True, "in_flight": 0,
            "failure": 0, "throughput": throughput, "latency_us": None, "busy_percent": None,
        }  # fmt: skip

    def process(pid: int, cpu: float, models: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "pid": pid, "tag": f"t{pid}", "command": "x", "error": None, "rss_bytes": 1 << 20,
            "cpu": {"user_percent": cpu, "system_percent": 0.0}, "models": models,
        }  # fmt: skip

    document = {
        "system": {
            "vcpu_count": 2,
            "vcpu_usage_percent": {"idle": 50.0},
            "memory_used_bytes": 1 << 30,
            "memory_total_bytes": 4 << 30,
        },
        "processes": [
            process(11, 5.0, [model("quiet", 1.0)]),
            process(22, 90.0, [model("busy", 500.0), model("idle", None)]),
        ],
    }
    out = io.StringIO()
    Console(file=out, width=200).print(view(document, Path("/x"), 1.0))
    lines = out.getvalue().splitlines()
    pids = [line.split()[0] for line in lines if line.split()[:1] in (["11"], ["22"])]
    assert pids == ["22", "11", "22", "11", "22"]  # processes, then models busy, quiet, idle
    names = [line.split()[1] for line in lines if line.split()[:1] in (["11"], ["22"])][2:]
    assert names == ["busy", "quiet", "idle"]
    batched = model("rows", 9.0) | {"max_batch_size": 8, "mean_batch": 2.5}
    document["processes"] = [process(33, 1.0, [batched])]
    out = io.StringIO()
    Console(file=out, width=200).print(view(document, Path("/x"), 1.0))
    assert "batch 2.5/8" in out.getvalue()  # under the model's name


def test_mean_batch_is_requests_per_run_over_the_period() -> None:
    old, new = _model("m", 10, _counts(b1=10), 0), _model("m", 30, _counts(b1=30), 0)
    for snapshot in (old, new):
        snapshot["max_batch_size"] = 8
    old["statistics"]["instances"] = [{"count": 10, "ns": 0}]
    new["statistics"]["instances"] = [{"count": 15, "ns": 10**9}]  # 20 requests in 5 runs
    (process,) = diff_processes(
        [_process(1, 10.0, 1.0, [old])], [_process(1, 12.0, 1.0, [new])], 2.0
    )
    (model,) = process["models"]
    assert (model["max_batch_size"], model["mean_batch"]) == (8, 4.0)
    plain = _model("p", 10, _counts(b1=10), 0)  # a snapshot without batching
    (process,) = diff_processes(
        [_process(1, 10.0, 1.0, [plain])], [_process(1, 12.0, 1.0, [plain])], 2.0
    )
    assert (process["models"][0]["max_batch_size"], process["models"][0]["mean_batch"]) == (0, None)


def test_a_model_loaded_again_starts_its_rates_anew() -> None:
    """Reloaded between two snapshots and busier since: seen by its load, not only when its
    counters drop."""
    old, new = _model("m", 10, _counts(b1=10), 0), _model("m", 30, _counts(b1=30), 0)
    old["load"], new["load"] = "m#1", "m#2"
    (process,) = diff_processes(
        [_process(1, 10.0, 1.0, [old])], [_process(1, 12.0, 1.0, [new])], 2.0
    )
    assert process["models"][0]["throughput"] is None
    new["load"] = "m#1"  # the same load: rates as usual
    (process,) = diff_processes(
        [_process(1, 10.0, 1.0, [old])], [_process(1, 12.0, 1.0, [new])], 2.0
    )
    assert process["models"][0]["throughput"] == 10.0
