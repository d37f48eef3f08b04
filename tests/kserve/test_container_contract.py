"""The container's contract with KServe, exercised by running the command line the
ClusterServingRuntime gives the container (the image's entrypoint and the manifest's args, the
InferenceService's name for ``{{.Name}}``, a temporary folder for /mnt/models), in a network
namespace of its own as a pod has one, so that it binds 0.0.0.0:8080/8081/8082 as written:

- ``/v2/health/ready`` says 400 while the model loads and 200 only after;
- an inference over HTTP/REST and over gRPC (tritonclient) equals raw onnxruntime's;
- SIGTERM during a request: the request completes, and the process exits 0 within the
  InferenceService's grace period; a request longer than the drain is cut, and the process
  still exits within a few seconds of the drain's end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("yaml", reason="PyYAML (the dev extra) reads the manifests")
pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import netns
import onnxruntime as ort
import tritonclient.grpc as tc
from manifests import DIGITS, container_args, entrypoint, inference_service, mount

from concurrency_models import slow_rows

if why := netns.available():
    pytest.skip(why, allow_module_level=True)

HTTP, GRPC, METRICS = 8080, 8081, 8082
READY_SECONDS = 60.0
GRACE = float(inference_service()["spec"]["predictor"]["terminationGracePeriodSeconds"])


@dataclass
class Pod:
    """``crossrt serve`` run as the manifest says, and the test's ports to it."""

    proc: subprocess.Popen[str]
    ports: dict[int, netns.Forward]
    log: list[str] = field(default_factory=list)
    listening: threading.Event = field(default_factory=threading.Event)
    """Set once it logs that HTTP/REST is served (or it ends)."""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[HTTP].port}{path}"

    def get(self, path: str) -> int:
        """The HTTP status of GET ``path``; 0 when nothing answers yet."""
        try:
            with urllib.request.urlopen(self.url(path), timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError, OSError):
            return 0

    def grpc(self) -> tc.InferenceServerClient:
        return tc.InferenceServerClient(f"127.0.0.1:{self.ports[GRPC].port}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for forward in self.ports.values():
            forward.close()


def start(folder: Path, name: str, model: Path, *more: str) -> Pod:
    """The container's command for InferenceService ``name`` serving ``model`` (``more``:
    flags added after the manifest's)."""
    args = [*container_args(name, mount(folder, model)), *more]
    # The image's entrypoint, its console script from this environment's bin/.
    program, *rest = entrypoint()
    script = Path(sys.executable).parent / program
    assert script.is_file(), f"{script}: install crossrt (pip install -e .) for its script"
    command = netns.isolated([str(script), *rest, *args])
    env = dict(
        os.environ,
        CROSSRT_RUNTIME_DIR=str(folder / "run"),
        CROSSRT_CACHE_DIR=str(folder / "cache"),  # compiled at load, as in a fresh pod
    )
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    pod = Pod(proc, {port: netns.Forward(proc.pid, port) for port in (HTTP, GRPC, METRICS)})

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            pod.log.append(line)
            if "serving KServe v2 HTTP/REST" in line:
                pod.listening.set()
        pod.listening.set()  # it ended

    threading.Thread(target=read, daemon=True).start()
    return pod


def wait_ready(pod: Pod) -> list[int]:
    """Once HTTP is served, poll /v2/health/ready until 200 (as the kubelet's probe does);
    the statuses seen."""
    seen: list[int] = []
    deadline = time.monotonic() + READY_SECONDS
    pod.listening.wait(READY_SECONDS)
    while time.monotonic() < deadline and pod.proc.poll() is None:
        status = pod.get("/v2/health/ready")
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == 200:
            return seen
    raise AssertionError(f"not ready ({seen}):\n" + "".join(pod.log))


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The example InferenceService's pod: digits.onnx under its name."""
    pod = start(tmp_path_factory.mktemp("pod"), inference_service()["metadata"]["name"], DIGITS)
    pod.seen = wait_ready(pod)  # type: ignore[attr-defined]
    yield pod
    pod.close()


def test_ready_only_once_the_model_is_loaded(digits: Pod) -> None:
    seen: list[int] = digits.seen  # type: ignore[attr-defined]
    # Live and listening while the model loads: the probe said 400 before it said 200.
    assert seen == [400, 200], seen
    assert digits.get("/v2/health/live") == 200
    log = "".join(digits.log)
    assert log.index("serving KServe v2 HTTP/REST") < log.index("loaded model digits")


def test_http_and_grpc_inference_equal_raw_onnxruntime(digits: Pod) -> None:
    x = np.load(DIGITS.parent / "test_images.npy")[:8]
    label, probabilities = ort.InferenceSession(str(DIGITS)).run(None, {"input": x})
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    body = json.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]}).encode()
    request = urllib.request.Request(
        digits.url("/v2/models/digits/infer"), body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        outputs = {o["name"]: o for o in json.load(answer)["outputs"]}
    assert outputs["label"]["datatype"] == "INT64"
    np.testing.assert_array_equal(outputs["label"]["data"], label)
    got = np.array(outputs["probabilities"]["data"], np.float32).reshape(probabilities.shape)
    np.testing.assert_allclose(got, probabilities, rtol=1e-5, atol=1e-6)

    client = digits.grpc()
    given = tc.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("digits", [given])
    np.testing.assert_array_equal(result.as_numpy("label"), label)
    got = result.as_numpy("probabilities")
    np.testing.assert_allclose(got, probabilities, rtol=1e-5, atol=1e-6)
    assert client.get_model_metadata("digits").name == "digits"  # the InferenceService's name
    # its own args (--load-parameter max_batch_size=32) reached the load
    assert client.get_model_config("digits").config.max_batch_size == 32
    client.close()


def _pending(pod: Pod, model: str) -> float:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{pod.ports[METRICS].port}/metrics", timeout=10
    ) as answer:
        text = answer.read().decode()
    found = re.search(rf'crossrt_inference_pending_request_count{{model="{model}".*}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_sigterm_during_a_request_completes_it_and_exits_within_the_grace_period(
    tmp_path: Path,
) -> None:
    model = tmp_path / "slow.onnx"
    slow_rows(chain=100, size=512).save(model)
    pod = start(tmp_path, "slow", model)
    try:
        wait_ready(pod)
        # Half a second of work here (13 GFLOP): the drain has a request to wait for, well
        # inside its 20 s even on a loaded machine.
        x = np.random.default_rng(0).standard_normal((256, 512), dtype=np.float32)
        tensor = {"name": "x", "shape": [1, 512], "datatype": "FP32"}
        client = pod.grpc()
        given = tc.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        results: list[Any] = []
        running = threading.Thread(target=lambda: results.append(client.infer("slow", [given])))
        running.start()
        deadline = time.monotonic() + 30
        while _pending(pod, "slow") < 1 and time.monotonic() < deadline:
            pass
        assert _pending(pod, "slow") == 1, "".join(pod.log)
        pod.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        # While it drains: not ready (a probe takes the pod out of its Service), and a new
        # request is refused with 503, not queued behind the drain.
        deadline = time.monotonic() + 10
        while pod.get("/v2/health/ready") == 200 and time.monotonic() < deadline:
            pass  # until the signal is taken
        assert pod.get("/v2/health/ready") == 400
        late = urllib.request.Request(
            pod.url("/v2/models/slow/infer"),
            json.dumps({"inputs": [{**tensor, "data": [0.0] * 512}]}).encode(),
            {"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(late, timeout=30)
        assert refused.value.code == 503
        assert "shutting down" in refused.value.read().decode()
        code = pod.proc.wait(GRACE)  # past the grace period, the kubelet would SIGKILL
        took = time.monotonic() - stopped
        running.join(30)
        (result,) = results  # answered, not cut
        (expected,) = ort.InferenceSession(str(model)).run(None, {"x": x})
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-5)
        assert code == 0, "".join(pod.log)
        assert took < GRACE
        log = "".join(pod.log)
        assert "draining 1 calls" in log and "stopped" in log
        client.close()
    finally:
        pod.close()


STOP_SECONDS = 5.0
"""What the process may take after its drain (cut calls, unload, exit): the runtime's preStop
pause (5 s) and drain (20 s) leave 5 s of the 30 s grace period."""


def test_a_request_longer_than_the_drain_is_cut_and_the_process_exits_in_time(
    tmp_path: Path,
) -> None:
    model = tmp_path / "slow.onnx"
    slow_rows(chain=400, size=512).save(model)
    drain = 1.0
    pod = start(tmp_path, "slow", model, "--drain-seconds", str(drain))
    try:
        wait_ready(pod)
        # ~12 s of work on a quiet 2-core machine (the manifest batches: a dynamic first
        # dimension is needed, so not concurrency_models.endless): longer than drain + grace
        x = np.ones((8192, 512), np.float32)
        client = pod.grpc()
        given = tc.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        failures: list[Exception] = []

        def run() -> None:
            try:
                client.infer("slow", [given])
            except Exception as exc:
                failures.append(exc)

        running = threading.Thread(target=run)
        running.start()
        deadline = time.monotonic() + 30
        while _pending(pod, "slow") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # a bounded poll of the daemon's count (no event to wait on)
        assert _pending(pod, "slow") == 1, "the request never started: " + "".join(pod.log)
        pod.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        code = pod.proc.wait(GRACE)
        took = time.monotonic() - stopped
        running.join(30)
        assert code == 0, "".join(pod.log)
        assert took < drain + STOP_SECONDS, "".join(pod.log)
        (failure,) = failures  # cut, and told so
        assert "UNAVAILABLE" in str(failure)
        assert "1 calls still running after 1 s; cutting them" in "".join(pod.log)
        client.close()
    finally:
        pod.close()
