"""``crossrt deploy ray``: as a user types it (a real subprocess, onto the test cluster), and
its refusals of bad options in-process."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as tc
from ray_models import RayCluster, free_port, raw_ort

from crossrt.scaleout.ray.app import SERVE_ENV
from crossrt.tools import deploy

START_S = 240
"""How long `crossrt deploy ray` may take to start its own cluster and deploy (17-42 s here)."""


@pytest.mark.parametrize(
    "args, said",
    [
        (["ray", "/nowhere/m.crm"], "no such model file"),
        (["ray", ".", "--replicas", "0"], "--replicas '0'"),
        (["ray", ".", "--cores-per-replica", "0"], "--cores-per-replica 0"),
        (["ray", ".", "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas"),
    ],
)
def test_bad_options_are_refused_with_status_2(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert deploy.main(args) == 2
    assert said in capsys.readouterr().err


def test_serve_env_is_set_for_a_cluster_start_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve's proxy switches are in the environment while a cluster starts (its processes
    inherit them), an operator's own value wins, and the driver's environment is as before
    after: the same switches in a driver would change its own handles."""
    from crossrt.scaleout.ray.app import serve_env

    monkeypatch.delenv("RAY_SERVE_PROXY_USE_GRPC", raising=False)
    monkeypatch.setenv("RAY_SERVE_LOG_TO_STDERR", "1")  # the operator's choice
    with serve_env():
        assert os.environ["RAY_SERVE_PROXY_USE_GRPC"] == "1"
        assert os.environ["RAY_SERVE_LOG_TO_STDERR"] == "1"
        assert os.environ["RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"] == "1000"
    assert "RAY_SERVE_PROXY_USE_GRPC" not in os.environ
    assert os.environ["RAY_SERVE_LOG_TO_STDERR"] == "1"


def test_crossrt_deploy_ray_onto_a_cluster(ray_cluster: RayCluster, crm_dir: Path) -> None:
    from ray import serve

    command = [
        sys.executable, "-m", "crossrt", "deploy", "ray", str(crm_dir / "mlp.crm"),
        "--replicas", "1", "--cores-per-replica", "1", "--address", ray_cluster.address,
        "--name", "cli", "--route-prefix", "/cli",
        "--http", f"127.0.0.1:{ray_cluster.http}", "--grpc-port", str(ray_cluster.grpc),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "deployed cli: 1 replica(s) of 1 core(s), models mlp" in done.stdout
        client = tc.InferenceServerClient(f"127.0.0.1:{ray_cluster.grpc}")
        x = np.ones((2, 16), dtype=np.float32)
        given = tc.InferInput("x", [2, 16], "FP32")
        given.set_data_from_numpy(x)
        answer = client.infer("mlp", [given], headers={"application": "cli"})
        np.testing.assert_allclose(
            answer.as_numpy("y"), raw_ort(crm_dir, "mlp", {"x": x})[0], rtol=1e-6
        )
    finally:
        if "cli" in serve.status().applications:
            serve.delete("cli")


@pytest.mark.slow
def test_crossrt_deploy_ray_on_a_local_cluster_serves_until_sigterm(
    crm_dir: Path, tmp_path: Path
) -> None:
    """Without --address: a cluster of its own whose node is on loopback (issue 26: not the
    host's routable address), Serve's proxy with crossrt's switches, its deployment
    answering; SIGTERM stops every process it started."""
    import psutil

    http, grpc = free_port(), free_port()
    command = [
        sys.executable, "-m", "crossrt", "deploy", "ray", str(crm_dir / "mm.crm"),
        "--http", f"127.0.0.1:{http}", "--grpc-port", str(grpc),
    ]  # fmt: skip
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(tmp_path / "run"))  # cores of its own
    errors = tmp_path / "stderr.txt"  # Ray's start-up, for a start that fails or hangs
    with errors.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    started: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        lines = []
        # until it says it serves, or it ends; bounded: a start that hangs fails here, with
        # what it printed, not at pytest's limit with the worker held 10 minutes
        late = threading.Event()

        def give_up() -> None:
            late.set()
            proc.terminate()  # it stops what it started

        ready = threading.Timer(START_S, give_up)
        ready.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if "until SIGINT or SIGTERM" in line:
                    break
        finally:
            ready.cancel()
        assert not late.is_set() and proc.poll() is None, (
            f"no answer in {START_S} s, or it ended: {lines}; "
            f"its stderr ends: {errors.read_text()[-3000:]}"
        )
        assert "deployed crossrt: 1 replica(s) of 1 core(s), models mm\n" in lines, lines
        started = psutil.Process(proc.pid).children(recursive=True)
        addresses = node_addresses(started)
        assert addresses, [p.cmdline()[:2] for p in started]  # the GCS and the raylet at least
        assert all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses
        said = next(line for line in lines if line.startswith("local Ray cluster: node "))
        gcs = said.rsplit("GCS ", 1)[1].strip()
        assert ipaddress.ip_address(gcs.rpartition(":")[0]).is_loopback, said
        proxies = [p for p in started if "ProxyActor" in " ".join(p.cmdline())]
        assert proxies, "no Serve proxy among the processes the command started"
        for proxy in proxies:  # Serve's switches for its proxy: app.SERVE_ENV
            assert {k: proxy.environ().get(k) for k in SERVE_ENV} == SERVE_ENV
        client = tc.InferenceServerClient(f"127.0.0.1:{grpc}")
        given = tc.InferInput("x", [1, 8], "FP32")
        given.set_data_from_numpy(np.ones((1, 8), dtype=np.float32))
        assert client.infer("mm", [given]).as_numpy("y").shape == (1, 8)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        _, alive = psutil.wait_procs(started, timeout=60)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        for leftover in started:  # only what the command started, by pid
            if leftover.is_running():
                leftover.kill()


def node_addresses(processes: list[Any]) -> set[str]:
    """The node addresses Ray gave the processes it started (``--node-ip-address`` of the
    GCS server, the raylet and the agents)."""
    found = set()
    for process in processes:
        try:
            arguments = process.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile
            continue
        for k, argument in enumerate(arguments):
            flag, _, value = argument.partition("=")
            if flag.replace("_", "-") == "--node-ip-address":
                found.add(value or arguments[k + 1])
    return found
