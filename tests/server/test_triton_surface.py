"""Where Triton's users reach (issue 24, points 6 and 7), against a real ``crossrt serve``:
model config and shared memory over HTTP on the paths and bodies tritonclient.http sends
(driven with urllib: tritonclient's HTTP client needs gevent, which the lock has not; the
HTTP client of perf_analyzer, Triton's C++ one, runs too), CUDA shared-memory
calls answered "no regions", perf_analyzer over HTTP and gRPC end to end, one HOST:PORT form
for every endpoint option (``-g`` adds TCP to the default socket), ``max_batch_size`` with
batching on, latency histograms and failure reasons in /metrics, short NOT_FOUND errors and
400 for malformed HTTP requests."""

from __future__ import annotations

import json
import os
import re
import subprocess
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
from prometheus_client.parser import text_string_to_metric_families
from serving import Daemon, free_port, make_repository, start_daemon
from test_malformed import W
from test_rest import call
from tritonclient.utils import InferenceServerException

import crossrt
from concurrency_models import slow_rows
from crossrt.server.settings import build

PERF_ANALYZER = Path(
    os.environ.get(
        "CROSSRT_PERF_ANALYZER",
        Path(__file__).resolve().parents[2] / "benchmarks" / ".perf_analyzer" / "perf_analyzer",
    )
)


ROOT_TOKEN = "root-" + os.urandom(8).hex()
"""A per-user token for root: shared memory over HTTP is a proven local user's
(docs/security.md), as perf_analyzer's and tritonclient's runs with ``-H``/headers are."""
AS_ROOT = {"Authorization": f"Bearer {ROOT_TOKEN}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """HTTP on a bare port, metrics on ``:PORT``, loopback TCP from ``-g PORT``, and 'rows'
    loaded with dynamic batching (max_batch_size 4) from the config file."""
    folder = tmp_path_factory.mktemp("surface")
    repository = make_repository(folder / "models")
    crossrt.compile(slow_rows(chain=1, size=8), "cpu").save(folder / "rows.crm")
    config = folder / "serve.toml"
    config.write_text(
        '[[models]]\nname = "rows"\npath = "rows.crm"\nmax_batch_size = 4\nbatch_delay = 0.001\n'
    )
    tokens = folder / "tokens.toml"
    tokens.write_text(f'[[tokens]]\ntoken = "{ROOT_TOKEN}"\nuser = "root"\n')
    tokens.chmod(0o600)
    http, metrics, tcp = free_port(), free_port(), free_port()
    args = ["-c", str(config), "--http", str(http), "--metrics", f":{metrics}", "-g", str(tcp)]
    args += ["--tokens", str(tokens)]
    daemon = start_daemon(folder, repository, args)
    daemon.metrics = f"http://127.0.0.1:{metrics}/metrics"
    daemon.tcp = f"127.0.0.1:{tcp}"
    daemon.http = f"127.0.0.1:{http}"  # type: ignore[attr-defined]
    yield daemon
    assert daemon.stop() == 0, "".join(daemon.log)


def rest(
    daemon: Daemon, path: str, doc: object = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """GET (no ``doc``) or POST ``/v2/PATH`` as tritonclient.http sends it, with root's token
    unless ``headers`` says otherwise: status, JSON."""
    body = None if doc is None else json.dumps(doc).encode()
    url = f"http://{daemon.http}/v2/{path}"  # type: ignore[attr-defined]
    status, answer, _ = call(url, body, AS_ROOT if headers is None else headers)
    return status, json.loads(answer) if answer else None


# -- endpoints ------------------------------------------------------------------------------


def test_every_endpoint_option_takes_one_address_form() -> None:
    for given in ("8000", ":8000", "127.0.0.1:8000"):
        options = build(None, {"http": given, "metrics": given, "endpoint": ("unix:/s", given)})
        assert options.http == options.metrics == "127.0.0.1:8000"
        assert [str(e) for e in options.endpoints()] == ["unix:/s", "127.0.0.1:8000"]
    assert build(None, {"http": "[::1]:8000"}).http == "[::1]:8000"
    for bad in ("http", "host:port", "99999", "example.org:80"):
        with pytest.raises(crossrt.InvalidOptionError, match=r"HOST:PORT|IP address"):
            build(None, {"http": bad})


def test_tcp_is_added_to_the_default_socket(tmp_path: Path) -> None:
    """``-g HOST:PORT`` adds TCP: the runtime directory's socket still serves."""
    port = free_port()
    repository = make_repository(tmp_path / "models")
    daemon = start_daemon(tmp_path, repository, ["-g", str(port)], default_socket=True)
    try:
        sock = Path(daemon.socket)
        assert sock.is_socket(), "".join(daemon.log)
        for url in (f"unix://{sock}", f"127.0.0.1:{port}"):
            client = tc.InferenceServerClient(url)
            assert client.is_model_ready("tiny")
            client.close()
    finally:
        assert daemon.stop() == 0, "".join(daemon.log)


def test_the_served_addresses_answer(served: Daemon) -> None:
    assert rest(served, "health/ready")[0] == 200
    assert tc.InferenceServerClient(served.tcp).is_server_ready()
    assert served.metrics is not None
    assert urllib.request.urlopen(served.metrics, timeout=10).status == 200


# -- model config and max_batch_size --------------------------------------------------------


def test_model_config_over_http(served: Daemon) -> None:
    status, config = rest(served, "models/tiny/config")
    assert status == 200, config
    assert config["name"] == "tiny" and config["max_batch_size"] == 0
    assert config["input"] == [{**config["input"][0], "name": "x", "data_type": "TYPE_FP32"}]
    assert config["input"][0]["dims"] == [4, 8]  # numbers, as Triton's HTTP gives them
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert rest(served, "models/relu/versions/2/config")[1]["name"] == "relu"
    status, answer = rest(served, "models/nothing/config")
    assert status == 404 and "not loaded" in answer["error"]


def test_max_batch_size_is_reported_with_batching_on(served: Daemon) -> None:
    """Triton's convention: max_batch_size > 0, and the config's dims leave the batch
    dimension out (the metadata keeps it as -1; clients send it)."""
    config = rest(served, "models/rows/config")[1]
    assert config["max_batch_size"] == 4
    assert config["input"][0]["dims"] == [8]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    grpc_config = tc.InferenceServerClient(served.url).get_model_config("rows").config
    assert grpc_config.max_batch_size == 4 and list(grpc_config.input[0].dims) == [8]
    assert rest(served, "models/rows")[1]["inputs"][0]["shape"] == [-1, 8]


# -- shared memory --------------------------------------------------------------------------


def test_system_shared_memory_round_trip_over_http(served: Daemon) -> None:
    key = f"/crossrt-http-shm-{os.getpid()}"
    x = np.random.default_rng(7).random((4, 8), dtype=np.float32)
    handle = shm.create_shared_memory_region("http-io", key, 2 * x.nbytes)
    region = "systemsharedmemory/region/http-io"
    try:
        shm.set_shared_memory_region(handle, [x])
        registered = {"key": key, "offset": 0, "byte_size": 2 * x.nbytes}
        assert rest(served, f"{region}/register", registered) == (200, {})
        status, regions = rest(served, "systemsharedmemory/status")
        assert (status, regions) == (200, [{"name": "http-io", **registered}])
        assert rest(served, f"{region}/status")[1][0]["key"] == key
        request = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [4, 8],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "http-io",
                                   "shared_memory_byte_size": x.nbytes},
                }
            ],
            "outputs": [
                {
                    "name": "y",
                    "parameters": {"shared_memory_region": "http-io",
                                   "shared_memory_byte_size": x.nbytes,
                                   "shared_memory_offset": x.nbytes},
                }
            ],
        }  # fmt: skip
        status, answer = rest(served, "models/tiny/infer", request)
        assert status == 200, answer
        (y_out,) = answer["outputs"]
        assert "data" not in y_out and "parameters" not in y_out  # as Triton answers
        y = shm.get_contents_as_numpy(handle, np.float32, [4, 8], offset=x.nbytes)
        np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)
        assert rest(served, f"{region}/unregister", {})[0] == 200
        assert rest(served, "systemsharedmemory/status") == (200, [])
        status, answer = rest(served, "systemsharedmemory/region/no-such/status")
        assert status == 404 and "no-such" in answer["error"]
    finally:
        rest(served, "systemsharedmemory/unregister", {})
        shm.destroy_shared_memory_region(handle)


def test_cuda_shared_memory_answers_no_regions(served: Daemon) -> None:
    client = tc.InferenceServerClient(served.url)
    assert list(client.get_cuda_shared_memory_status().regions) == []
    client.unregister_cuda_shared_memory()  # what perf_analyzer does at its end
    client.unregister_cuda_shared_memory("never-registered")
    assert rest(served, "cudasharedmemory/status") == (200, [])
    assert rest(served, "cudasharedmemory/unregister", {})[0] == 200
    with pytest.raises(InferenceServerException, match="system shared memory"):
        client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64)
    status, answer = rest(served, "cudasharedmemory/region/gpu/register", {"byte_size": 64})
    assert status == 400 and "system shared memory" in answer["error"]


def test_extensions_advertised_are_served(served: Daemon) -> None:
    """Each extension /v2 names answers on its HTTP paths; CUDA shared memory, which answers
    only "no regions" here, is not named."""
    extensions = set(rest(served, "")[1]["extensions"])
    assert {"model_configuration", "system_shared_memory", "statistics"} <= extensions
    assert "cuda_shared_memory" not in extensions
    for path in ("models/tiny/config", "systemsharedmemory/status", "models/tiny/stats"):
        assert rest(served, path)[0] == 200, path


def test_shared_memory_over_http_needs_a_proven_user(served: Daemon) -> None:
    """An anonymous HTTP client is nobody the kernel vouches for: it cannot name OS files."""
    status, answer = rest(served, "systemsharedmemory/status", headers={})
    assert status == 401, answer
    assert "send" in answer["error"] and "token" in answer["error"]
    doc = {"key": "/dev/shm/anything", "offset": 0, "byte_size": 64}
    status, answer = rest(served, "systemsharedmemory/region/r/register", doc, headers={})
    assert status == 401, answer


# -- perf_analyzer --------------------------------------------------------------------------


def test_perf_analyzer_runs_end_to_end(served: Daemon) -> None:
    _perf_analyzer(served, "http", "none")


def test_perf_analyzer_runs_with_system_shared_memory(served: Daemon) -> None:
    # One after the other in one test: perf_analyzer names its segments after the tensors
    # (/x_0_0, /y) and unlinks them at exit, so two runs at once on one host (two pytest
    # workers) unlink each other's ("Unable to unlink shared memory with key: y").
    for protocol in ("grpc", "http"):
        _perf_analyzer(served, protocol, "system")


def _perf_analyzer(served: Daemon, protocol: str, memory: str) -> None:
    if not os.access(PERF_ANALYZER, os.X_OK):
        pytest.skip(
            f"perf_analyzer is not at {PERF_ANALYZER}: `make perf-analyzer` fetches it from "
            "the tritonclient 2.48.0 wheel (needs PyPI and Debian's libb64)"
        )
    url = served.http if protocol == "http" else f"unix:{served.socket}"  # type: ignore[attr-defined]
    command = [str(PERF_ANALYZER), "-m", "tiny", "-i", protocol, "-u", url]
    command += ["--measurement-mode", "count_windows", "--measurement-request-count", "20"]
    # stable or not (a busy 2-core machine is not), a run that answers is what is checked
    command += ["--max-trials", "10", "--stability-percentage", "1000"]
    if memory != "none":
        command += ["--shared-memory", memory, "--output-shared-memory-size", "4096"]
        if protocol == "http":  # over TCP, shared memory is a proven user's
            command += ["-H", f"Authorization: Bearer {ROOT_TOKEN}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"Throughput: [0-9.]+ infer/sec", out), out
    assert "Unable to" not in out, out


# -- metrics --------------------------------------------------------------------------------


def test_metrics_have_latency_histograms_and_failure_reasons(served: Daemon) -> None:
    client = tc.InferenceServerClient(served.url)
    good = tc.InferInput("x", [4, 8], "FP32")
    good.set_data_from_numpy(np.ones((4, 8), np.float32))
    bad = tc.InferInput("x", [4, 8], "FP64")
    bad.set_data_from_numpy(np.ones((4, 8), np.float64))
    client.infer("tiny", [good])
    with pytest.raises(InferenceServerException):
        client.infer("tiny", [bad])
    samples = scrape(served)
    tiny = {"model": "tiny", "version": "1"}
    failures = {
        labels["reason"]: value
        for name, labels, value in samples
        if name == "crossrt_inference_request_failure_total" and labels.items() >= tiny.items()
    }
    assert set(failures) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}  # Triton's reasons
    assert failures["OTHER"] >= 1 and failures["REJECTED"] == 0
    refused = {**tiny, "code": "REFUSED"}  # turned away by the daemon: the wrong datatype
    assert ("crossrt_inference_request_failure_code_total", refused) in [
        (name, labels) for name, labels, value in samples if value >= 1
    ]
    buckets = {
        labels["le"]: value
        for name, labels, value in samples
        if name == "crossrt_inference_request_duration_histogram_us_bucket"
        and labels.items() >= tiny.items()
    }
    assert buckets["+Inf"] >= 1 and list(buckets.values()) == sorted(buckets.values())
    quantiles = {
        labels["quantile"]: value
        for name, labels, value in samples
        if name == "crossrt_inference_request_summary_us" and labels.items() >= tiny.items()
    }
    assert set(quantiles) == {"0.5", "0.9", "0.99"} and 0 < quantiles["0.5"] <= quantiles["0.99"]
    assert ("crossrt_inference_request_summary_us_count", tiny) in [s[:2] for s in samples]


def scrape(daemon: Daemon) -> list[tuple[str, dict[str, str], float]]:
    """/metrics, parsed as Prometheus parses it: (sample name, labels, value)."""
    assert daemon.metrics is not None
    text = urllib.request.urlopen(daemon.metrics, timeout=10).read().decode()
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


# -- errors ---------------------------------------------------------------------------------


def test_not_found_lists_a_few_models_only(tmp_path: Path) -> None:
    """The NOT_FOUND error used to list every loaded model: with 400 models (here 70 with
    long names: the same 17 KB of names, loaded faster) past gRPC's metadata limit, so
    tritonclient got RESOURCE_EXHAUSTED instead."""
    repository = tmp_path / "models"
    repository.mkdir()
    crossrt.compile(slow_rows(chain=1, size=2), "cpu").save(repository / "m000.crm")
    payload = (repository / "m000.crm").read_bytes()
    for i in range(1, 70):
        (repository / f"{i:03d}{'m' * 240}.crm").write_bytes(payload)
    daemon = start_daemon(tmp_path, repository)
    try:
        client = daemon.client()
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("missing")
        assert info.value.status() == "StatusCode.NOT_FOUND", info.value.message()
        assert len(info.value.message()) < 2000
        assert "60 more" in info.value.message()
    finally:
        assert daemon.stop() == 0, "".join(daemon.log)


def test_errors_stay_short_whatever_the_client_sent(served: Daemon) -> None:
    """An error that echoes what the client sent (here a 100,000-character input name) is
    cut: whole, it passed gRPC's 16 KiB metadata limit, and the client saw
    RESOURCE_EXHAUSTED instead of what it did wrong."""
    client = tc.InferenceServerClient(served.url)
    given = tc.InferInput("x" * 100_000, [4, 8], "FP32")
    given.set_data_from_numpy(np.ones((4, 8), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("tiny", [given])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()[:300]
    assert "has no input" in info.value.message() and len(info.value.message()) < 5000


DEEP = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _x(**item: object) -> bytes:
    doc = {"inputs": [{"name": "x", "shape": [4, 8], "datatype": "FP32", "data": [0] * 32}]}
    doc["inputs"][0].update(item)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("models/tiny/infer", _x(shape="abc")),
        ("models/tiny/infer", _x(shape=[2**70, 16])),
        ("models/tiny/infer", DEEP),
        ("models/tiny/infer", _x(shape=5)),
        ("models/tiny/infer", _x(shape=[4.5, 8])),
        ("models/tiny/infer", _x(shape=[4, -8])),
        ("models/tiny/infer", _x(parameters=[])),
        ("models/tiny/infer", _x(parameters={"binary_data_size": "many"})),
        ("models/tiny/infer", _x(data=[[0] * 8] * 3 + [[0] * 7])),
        ("models/tiny/infer", _x(data=json.loads("[" * 500 + "]" * 500))),
        ("models/tiny/infer", _x(datatype=["FP32"])),
        ("models/tiny/infer", _x(name={"x": 1})),
        ("models/tiny/infer", json.dumps({"inputs": ["x"], "parameters": 5}).encode()),
        ("models/tiny/infer", json.dumps({"inputs": [], "parameters": {"timeout": "x"}}).encode()),
        ("models/tiny/infer", _x()[:-1] + b', "outputs": 5}'),
        ("repository/models/tiny/load", json.dumps({"parameters": ["instances"]}).encode()),
        # (A deep but empty array in a repository/index body is valid JSON it ignores: 200.)
        ("systemsharedmemory/region/r/register", json.dumps({"key": 5, "byte_size": "x"}).encode()),
    ],
)
def test_malformed_http_requests_get_400(served: Daemon, path: str, body: bytes) -> None:
    base = f"http://{served.http}/v2"  # type: ignore[attr-defined]
    status, answer, _ = call(f"{base}/{path}", body)
    assert status == 400, answer[:300]
    assert len(json.loads(answer)["error"]) < 1000
    assert call(f"{base}/health/ready")[0] == 200  # and it serves on
