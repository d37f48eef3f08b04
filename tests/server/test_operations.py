"""Running the daemon: a config file, a token, loopback TCP, explicit model control,
SIGHUP rescanning the repository, SIGTERM draining, and the command's own errors."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from serving import Daemon, free_port, start_daemon
from tritonclient.utils import InferenceServerException

import crossrt
from concurrency_models import heavy, tiny
from crossrt.server.client import connect
from crossrt.server.settings import ServeOptions, build, parse_endpoint
from crossrt.tools import cli

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ROOT_TOKEN = "root-token-" + os.urandom(8).hex()
ROOT_AUTH = {"authorization": f"Bearer {ROOT_TOKEN}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Explicit model control, a token, loopback TCP and metrics, from a config file that
    also loads 'pinned' (tiny, 2 instances) at start."""
    folder = tmp_path_factory.mktemp("guarded")
    repository = folder / "models"
    repository.mkdir()
    crossrt.compile(tiny(), "cpu").save(repository / "tiny.crm")
    crossrt.compile(heavy(150, 512), "cpu").save(repository / "heavy.crm")
    tcp, metrics = free_port(), free_port()
    tokens = folder / "tokens.toml"
    tokens.write_text(f'[[tokens]]\ntoken = "{ROOT_TOKEN}"\nuser = "root"\n')
    tokens.chmod(0o600)
    config = folder / "serve.toml"
    config.write_text(
        f'model_control = "explicit"\ntoken = "{TOKEN}"\ndrain_seconds = 30\n'
        f'metrics = "127.0.0.1:{metrics}"\ntokens = "{tokens}"\n'
        '[[models]]\nname = "pinned"\npath = "models/tiny.crm"\ninstances = 2\n'
    )
    d = start_daemon(folder, repository, ["-c", str(config), "-g", f"127.0.0.1:{tcp}"])
    d.tcp, d.metrics = f"127.0.0.1:{tcp}", f"http://127.0.0.1:{metrics}/metrics"
    yield d
    d.stop()


def test_token_is_required(guarded: Daemon) -> None:
    client = guarded.client()
    with pytest.raises(InferenceServerException) as info:
        client.get_server_metadata()
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    assert "authorization: Bearer" in info.value.message()
    with pytest.raises(InferenceServerException):
        client.get_server_metadata(headers={"authorization": "Bearer wrong"})
    assert client.get_server_metadata(headers=AUTH).name == "crossrt"


def test_explicit_control_loads_only_the_config_models(guarded: Daemon) -> None:
    client = guarded.client()
    index = {m.name: m for m in client.get_model_repository_index(headers=AUTH).models}
    assert index["pinned"].state == "READY"
    assert index["tiny"].state == "UNAVAILABLE" and index["heavy"].state == "UNAVAILABLE"
    config = client.get_model_config("pinned", headers=AUTH).config
    assert config.instance_group[0].count == 2


def test_loopback_tcp_with_shared_memory(guarded: Daemon) -> None:
    assert guarded.tcp is not None
    client = tc.InferenceServerClient(guarded.tcp)
    x = np.ones((4, 8), np.float32)
    key = f"/crossrt-tcp-{os.getpid()}"
    region = shm.create_shared_memory_region("tcp", key, x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        # The shared token lets a client in, and says nothing of who it is: over TCP, only a
        # token of the tokens file makes it a local user, whose files it may name.
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("tcp", key, x.nbytes, headers=AUTH)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        client.register_system_shared_memory("tcp", key, x.nbytes, headers=ROOT_AUTH)
        i = tc.InferInput("x", [4, 8], "FP32")
        i.set_shared_memory("tcp", x.nbytes)
        y = client.infer("pinned", [i], headers=ROOT_AUTH).as_numpy("y")
        assert y is not None and y.shape == (4, 8)
        client.unregister_system_shared_memory("tcp", headers=ROOT_AUTH)
    finally:
        shm.destroy_shared_memory_region(region)


def test_sighup_rescans_the_repository(guarded: Daemon) -> None:
    client = guarded.client()
    crossrt.compile(tiny(), "cpu").save(guarded.repository / "late.crm")
    guarded.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    names: set[str] = set()
    while "late" not in names and time.monotonic() < deadline:
        names = {m.name for m in client.get_model_repository_index(headers=AUTH).models}
    assert "late" in names  # known; explicit control leaves it unloaded
    assert not client.is_model_ready("late", headers=AUTH)
    client.load_model("late", headers=AUTH)
    assert client.is_model_ready("late", headers=AUTH)


def _pending(url: str, model: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(rf'crossrt_inference_pending_request_count{{model="{model}".*}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_sigterm_drains_then_stops(guarded: Daemon) -> None:
    """Runs last in this file: the daemon is stopped by it."""
    client = guarded.client()
    client.load_model("heavy", headers=AUTH)
    x = tc.InferInput("x", [512, 512], "FP32")
    x.set_data_from_numpy(np.eye(512, dtype=np.float32))
    results: list[Any] = []
    running = threading.Thread(
        target=lambda: results.append(client.infer("heavy", [x], headers=AUTH))
    )
    running.start()
    remote = connect(guarded.url, token=TOKEN)  # and one through the direct lane
    assert remote.lane
    heavy = remote.load("heavy")
    laned: list[Any] = []
    lane_running = threading.Thread(
        target=lambda: laned.append(heavy.run(np.eye(512, dtype=np.float32)))
    )
    lane_running.start()
    assert guarded.metrics is not None
    deadline = time.monotonic() + 30
    while _pending(guarded.metrics, "heavy") < 2 and time.monotonic() < deadline:
        pass
    assert _pending(guarded.metrics, "heavy") == 2
    guarded.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    refused = None
    while refused is None and time.monotonic() < deadline:
        try:
            client.get_model_metadata("pinned", headers=AUTH)
        except InferenceServerException as exc:
            refused = exc
    assert refused is not None, "".join(guarded.log)
    assert refused.status() == "StatusCode.UNAVAILABLE"
    running.join(60)
    lane_running.join(60)
    (result,) = results  # the requests under way when SIGTERM came were answered
    output = result.get_response().outputs[0].name
    np.testing.assert_array_equal(result.as_numpy(output), np.eye(512, dtype=np.float32))
    (lane_result,) = laned
    np.testing.assert_array_equal(lane_result[output], np.eye(512, dtype=np.float32))
    with pytest.raises(crossrt.ClosedError):
        heavy.run(np.eye(512, dtype=np.float32))  # the lane is closed with the daemon
    remote.close()
    assert guarded.proc.wait(60) == 0
    assert not Path(guarded.socket).exists()
    assert "stopped" in "".join(guarded.log)


def test_endpoints_and_config(tmp_path: Path) -> None:
    assert str(parse_endpoint("5555")) == "127.0.0.1:5555"
    assert str(parse_endpoint(":5555")) == "127.0.0.1:5555"
    assert str(parse_endpoint("0.0.0.0:5555")) == "0.0.0.0:5555"
    assert str(parse_endpoint("[::1]:7")) == "[::1]:7"
    assert str(parse_endpoint("unix:/run/x.sock")) == "unix:/run/x.sock"
    for bad in ("host.example:1", "1.2.3.4:port", "unix:"):
        with pytest.raises(crossrt.InvalidOptionError):
            parse_endpoint(bad)
    config = tmp_path / "c.toml"
    config.write_text('model_repository = "/m"\ncores = "0-1"\nlog_level = "debug"\n')
    options = build(str(config), {"log_level": "6", "endpoint": ()})
    assert options == ServeOptions(model_repository="/m", cores="0-1", log_level="6")
    assert options.level == 10
    config.write_text("bogus = 1\n")
    with pytest.raises(crossrt.InvalidOptionError, match="unknown setting"):
        build(str(config), {})
    config.write_text('tls_cert = "c.pem"\n')
    with pytest.raises(crossrt.InvalidOptionError, match="both tls_cert and tls_key"):
        build(str(config), {})
    config.write_text('[[models]]\nname = "a"\npath = "a.crm"\ninstances = 0\n')
    with pytest.raises(crossrt.InvalidArgumentError, match="whole number"):
        build(str(config), {})


def test_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--help"])
    assert info.value.code == 0
    assert "KServe v2" in capsys.readouterr().out
    assert cli.main(["serve", "-x", "-l", "loud", "-g", str(tmp_path / "s.sock")]) == 1
    assert "log level 'loud'" in capsys.readouterr().err
    assert cli.main(["serve", "-x", "-g", "nowhere.example:80"]) == 1
    assert "not an IP address" in capsys.readouterr().err
    with socket.socket() as taken:  # a metrics port in use: one error line, status 1
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sock = tmp_path / "m.sock"
        args = ["serve", "-x", "-g", f"unix:{sock}", "--metrics", f"127.0.0.1:{port}"]
        assert cli.main(args) == 1
    assert "cannot serve metrics" in capsys.readouterr().err
    assert not sock.exists()


_HEAVY_CLIENT = """
import sys
import numpy as np
import tritonclient.grpc as tc
x = tc.InferInput("x", [512, 512], "FP32")
x.set_data_from_numpy(np.eye(512, dtype=np.float32))
tc.InferenceServerClient(sys.argv[1]).infer("heavy", [x])
"""


def test_killed_client_and_killed_daemon(tmp_path: Path) -> None:
    """A client killed mid-request leaves the daemon serving; a daemon killed with -9 fails
    a pending crossrt.connect call at once with CLOSED and gives tritonclient UNAVAILABLE, and
    once restarted on the same socket (the stale socket file and its private folder cleared
    away) the same clients work again."""
    repository = tmp_path / "models"
    repository.mkdir()
    crossrt.compile(tiny(), "cpu").save(repository / "tiny.crm")
    crossrt.compile(heavy(150, 512), "cpu").save(repository / "heavy.crm")
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"
    first = start_daemon(tmp_path, repository, ["--metrics", f"127.0.0.1:{port}"])
    try:
        # The client killed mid-request: a new interpreter (a fork of this threaded process
        # could hang inside gRPC before it sent anything).
        child = subprocess.Popen([sys.executable, "-c", _HEAVY_CLIENT, first.url])
        deadline = time.monotonic() + 30
        while _pending(metrics, "heavy") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        child.kill()
        child.wait()
        client = first.client()
        x = tc.InferInput("x", [4, 8], "FP32")
        x.set_data_from_numpy(np.ones((4, 8), np.float32))
        assert client.infer("tiny", [x]).as_numpy("y") is not None
        while _pending(metrics, "heavy") > 0 and time.monotonic() < deadline:
            pass  # the dead client's request ran to its end
        remote = connect(first.url)
        pending = remote.load("heavy").run_async(np.eye(512, dtype=np.float32))
        laned: list[BaseException] = []  # and one pending on the direct lane

        def lane_run() -> None:
            try:
                remote.load("heavy").run(np.eye(512, dtype=np.float32))
            except BaseException as exc:
                laned.append(exc)

        lane_pending = threading.Thread(target=lane_run)
        lane_pending.start()
        while _pending(metrics, "heavy") < 2 and time.monotonic() < deadline:
            pass
        first.proc.kill()
        first.proc.wait(30)
        with pytest.raises(crossrt.ClosedError, match="not answering"):
            pending.result(timeout=10)  # at once, with a coded error
        lane_pending.join(10)
        assert len(laned) == 1 and isinstance(laned[0], crossrt.ClosedError), laned
        assert "not answering" in str(laned[0])
        assert Path(first.socket).exists()  # left behind by -9
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", [x])
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        second = start_daemon(tmp_path, repository)
        try:
            deadline = time.monotonic() + 30  # gRPC's reconnection backoff: about a second
            answer = None
            while answer is None and time.monotonic() < deadline:
                with contextlib.suppress(InferenceServerException):
                    answer = client.infer("tiny", [x]).as_numpy("y")
            assert answer is not None
            outputs = None
            while outputs is None and time.monotonic() < deadline:
                with contextlib.suppress(crossrt.ClosedError):
                    outputs = remote.load("tiny").run(np.ones((4, 8), np.float32))
            assert outputs is not None and outputs["y"].shape == (4, 8)
            remote.close()
            leftovers = [p for p in Path("/tmp").glob(f"crossrt-serve-*-{first.proc.pid}-*")]
            assert leftovers == []
        finally:
            assert second.stop() == 0
    finally:
        if first.proc.poll() is None:
            first.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_tls_on_tcp(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    repository = tmp_path / "models"
    repository.mkdir()
    crossrt.compile(tiny(), "cpu").save(repository / "tiny.crm")
    config = tmp_path / "tls.toml"
    config.write_text(f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    port = free_port()
    d = start_daemon(tmp_path, repository, ["-c", str(config), "-g", f"127.0.0.1:{port}"])
    try:
        secure = tc.InferenceServerClient(
            f"127.0.0.1:{port}", ssl=True, root_certificates=str(cert)
        )
        assert secure.get_server_metadata().name == "crossrt"
        with pytest.raises(InferenceServerException):
            tc.InferenceServerClient(f"127.0.0.1:{port}").get_server_metadata(client_timeout=5)
        with connect(f"127.0.0.1:{port}", tls_ca=cert) as remote:
            y = remote.load("tiny").run(np.ones((4, 8), np.float32))["y"]
            assert y.shape == (4, 8)
        assert d.client().is_server_ready()  # the Unix socket needs no TLS
    finally:
        assert d.stop() == 0


def test_default_endpoint_is_in_the_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(tmp_path / "run"))
    (endpoint,) = ServeOptions().endpoints()
    assert (endpoint.kind, endpoint.address) == ("unix", str(tmp_path / "run" / "crossrt.sock"))
    monkeypatch.delenv("CROSSRT_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    (endpoint,) = ServeOptions().endpoints()
    assert endpoint.address == str(tmp_path / "xdg" / "crossrt" / "crossrt.sock")
