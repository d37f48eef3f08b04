"""Each process that loads a model answers on its observation socket
(``runtime/observer.py``): other processes see its models, profile it, and get clear errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import crossrt
from crossrt import InvalidArgumentError, ModelNotFoundError
from crossrt.runtime import observer
from crossrt.tools.cli import main as cli
from observing import hanging_up

pytestmark = pytest.mark.usefixtures("runtime_dir")

WAIT = 60

# Loads a tiny model, says "ready <pid>", then runs it until stdin closes.
CHILD = """
import sys, threading
import numpy as np
import crossrt
from concurrency_models import tiny

rt = crossrt.Runtime()
model = rt.load(crossrt.compile(tiny()))
x = np.ones((4, 8), np.float32)
model.run({"x": x})
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
while not stop.is_set():
    model.run({"x": x})
"""


def start_child(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    tests = str(Path(__file__).parents[1])
    environ = dict(os.environ, PYTHONPATH=tests, CROSSRT_PROCESS_TAG="worker-tag", **(env or {}))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=environ,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "ready", line
    return child


def stop(child: subprocess.Popen[str]) -> None:
    if child.stdin is not None:
        child.stdin.close()
    try:
        child.wait(WAIT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = start_child()
    yield proc
    stop(proc)


def test_another_process_sees_the_models_and_their_statistics(
    child: subprocess.Popen[str],
) -> None:
    (seen,) = [p for p in observer.processes() if p["pid"] == child.pid]
    assert seen["tag"] == "worker-tag"
    assert seen["cpu"]["user_s"] > 0
    (model,) = seen["models"]
    assert (model["name"], model["device"], model["drivers"]) == (
        "tiny_mm",
        "cpu:0",
        ["onnxruntime"],
    )
    assert model["running"] and model["instances"] == 1
    first = model["statistics"]["success"]
    assert first >= 1 and model["statistics"]["latency_us"]["p50"] is not None
    # Asked anew each time: a later snapshot shows more successes (the child runs in a loop;
    # asked again until it has, within WAIT, rather than after a fixed sleep).
    deadline = time.monotonic() + WAIT
    while True:
        (again,) = [p for p in observer.processes() if p["pid"] == child.pid]
        if again["models"][0]["statistics"]["success"] > first:
            break
        assert time.monotonic() < deadline, "the snapshots never showed a new success"
        time.sleep(0.01)


def test_a_running_process_can_be_profiled(
    child: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = observer.ask(child.pid, {"op": "profile", "seconds": 0.5}, timeout=WAIT)
    (summary,) = trace["otherData"]["summary"]
    assert summary["model"] == "tiny_mm" and summary["requests"] > 0
    assert trace["otherData"]["pid"] == child.pid
    drawn = [e for e in trace["traceEvents"] if e["ph"] == "b" and e["name"] == "tiny_mm"]
    assert 0 < len(drawn) <= observer.DRAWN_REQUESTS
    # The same through the command line.
    out = tmp_path / "p.json"
    assert cli(["profile", "--pid", str(child.pid), "--seconds", "0.3", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "'tiny_mm':" in printed and "infer" in printed and str(out) in printed
    assert json.loads(out.read_text())["otherData"]["summary"][0]["requests"] > 0


def test_bad_questions_get_clear_errors(child: subprocess.Popen[str]) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown op 'nonsense'"):
        observer.ask(child.pid, {"op": "nonsense"})
    with pytest.raises(InvalidArgumentError, match="seconds"):
        observer.ask(child.pid, {"op": "profile", "seconds": -1})
    with pytest.raises(ModelNotFoundError, match=r"no model named resnet.*loaded: tiny_mm"):
        observer.ask(child.pid, {"op": "profile", "seconds": 0.1, "models": ["resnet"]})
    path = observer.observe_directory() / f"{child.pid}.sock"
    for raw in (b"not json\n", b"[1, 2]\n", b"x" * (observer.MAX_REQUEST_BYTES + 10)):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(WAIT)
            conn.connect(str(path))
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_WR)
            answer = json.loads(conn.makefile().readline())
        assert answer["error"]["code"] == "INVALID", answer
    # The process is none the worse for it.
    assert any(p["pid"] == child.pid for p in observer.processes())


def test_a_process_that_died_is_forgotten() -> None:
    child = start_child()
    path = observer.observe_directory() / f"{child.pid}.sock"
    assert path.exists()
    child.kill()  # no exit handler runs: the socket file stays
    child.wait()
    assert path.exists()
    assert all(p["pid"] != child.pid for p in observer.processes())
    assert not path.exists()
    with pytest.raises(ModelNotFoundError, match=f"no crossrt process {child.pid} answers"):
        observer.ask(child.pid, {"op": "snapshot"})


def test_a_process_that_ends_removes_its_socket() -> None:
    child = start_child()
    path = observer.observe_directory() / f"{child.pid}.sock"
    assert path.exists()
    stop(child)
    assert not path.exists()


def test_observing_can_be_turned_off() -> None:
    child = start_child({"CROSSRT_OBSERVE": "0"})
    try:
        assert not (observer.observe_directory() / f"{child.pid}.sock").exists()
        assert all(p["pid"] != child.pid for p in observer.processes())
    finally:
        stop(child)


@pytest.mark.parametrize(
    ("variable", "value"), [("CROSSRT_OBSERVE", "often"), ("CROSSRT_PROCESS_TAG", "a\tb")]
)
def test_a_malformed_setting_is_said_at_the_load_which_loads_nothing(
    monkeypatch: pytest.MonkeyPatch, tiny_exe: crossrt.Executable, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with crossrt.Runtime() as rt:
        with pytest.raises(crossrt.InvalidOptionError, match=variable):
            rt.load(tiny_exe)
        assert rt.models == []


def test_a_process_that_hangs_up_spoils_only_its_own_entry(child: subprocess.Popen[str]) -> None:
    """A socket that takes the question and closes without answering, as a process dying
    mid-answer does: an error for that pid, the other processes listed all the same."""
    with hanging_up(999999998):
        found = {p["pid"]: p for p in observer.processes()}
        with pytest.raises(crossrt.CrossrtError, match="999999998 hung up without answering"):
            observer.ask(999999998, {"op": "snapshot"})
    assert "hung up without answering" in found[999999998]["error"]
    assert found[child.pid]["models"][0]["name"] == "tiny_mm"
    assert "python" in found[child.pid]["command"]  # the whole command line


def test_crossrt_ls_lists_the_processes_with_models(
    child: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["ls", "--json"]) == 0
    (row,) = [p for p in json.loads(capsys.readouterr().out)["processes"] if p["pid"] == child.pid]
    assert (row["tag"], row["devices"], row["models"]) == ("worker-tag", ["cpu:0"], ["tiny_mm"])
    assert row["version"] == crossrt.__version__
    assert cli(["ls"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == [str(child.pid)]]
    assert line.split()[1:] == ["worker-tag", crossrt.__version__, "cpu:0", "tiny_mm"]


def test_monitor_serves_every_process_for_prometheus(
    child: subprocess.Popen[str], runtime_dir: Path
) -> None:
    """``crossrt monitor --prometheus``: a real endpoint, scraped and parsed as Prometheus
    does; SIGINT ends it with status 0."""
    import signal
    import urllib.request

    parser = pytest.importorskip("prometheus_client.parser")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monitor = subprocess.Popen(
        [sys.executable, "-m", "crossrt", "monitor", "--prometheus", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert monitor.stderr is not None
        assert "metrics on http://127.0.0.1:" in monitor.stderr.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as r:
            text = r.read().decode()
    finally:
        monitor.send_signal(signal.SIGINT)
        assert monitor.wait(WAIT) == 0
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }
    mine = {"model": "tiny_mm", "version": "", "pid": str(child.pid), "tag": "worker-tag"}
    key = ("crossrt_inference_request_success_total", tuple(sorted(mine.items())))
    assert samples[key] > 0
    process = {"pid": str(child.pid), "tag": "worker-tag", "mode": "user"}
    assert samples[("crossrt_process_cpu_seconds_total", tuple(sorted(process.items())))] > 0
    del process["mode"]
    memory = ("crossrt_process_resident_memory_bytes", tuple(sorted(process.items())))
    assert samples[memory] > 1 << 20
    # The child compiled without a cache directory: no hits, no misses, but counted.
    assert samples[("crossrt_cache_hits_total", tuple(sorted(process.items())))] == 0


def test_a_snapshot_counts_the_compile_cache(tmp_path: Path) -> None:
    """The second process compiling the same model finds it in the cache: a hit."""
    env = {"CROSSRT_CACHE_DIR": str(tmp_path / "cache")}
    for expected in ({"hits": 0, "misses": 1}, {"hits": 1, "misses": 0}):
        child = start_child(env)
        try:
            (seen,) = [p for p in observer.processes() if p["pid"] == child.pid]
        finally:
            stop(child)
        assert {k: seen["cache"][k] for k in expected} == expected
