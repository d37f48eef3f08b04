"""The daemon's response cache: ``crossrt serve --response-cache-bytes N`` and the load
parameter ``response_cache``. A request asked before is answered without running the model,
counted as Triton counts it (a success and a cache hit), and never across model loads."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from serving import EXPLICIT, Daemon, free_port, make_repository, start_daemon
from test_kserve import _load_with_parameters
from tritonclient.utils import InferenceServerException

from crossrt.server.client import connect

CACHE_BYTES = 8192


@pytest.fixture(scope="module")
def caching(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The cache's size on the command line; a config file loads 'cached' (tiny) with
    ``response_cache`` at start, and serves metrics."""
    folder = tmp_path_factory.mktemp("cache")
    repository = make_repository(folder / "models")
    port = free_port()
    config = folder / "serve.toml"
    config.write_text(
        f'metrics = "127.0.0.1:{port}"\n'
        '[[models]]\nname = "cached"\npath = "models/tiny.crm"\nresponse_cache = true\n'
    )
    daemon = start_daemon(
        folder,
        repository,
        ["-c", str(config), "--response-cache-bytes", str(CACHE_BYTES), *EXPLICIT],
    )
    daemon.metrics = f"http://127.0.0.1:{port}/metrics"
    yield daemon
    assert daemon.stop() == 0, "".join(daemon.log)


def _ask(
    client: tc.InferenceServerClient, x: np.ndarray, request_id: str = "", model: str = "tiny"
) -> np.ndarray:
    i = tc.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    result = client.infer(model, [i], request_id=request_id)
    assert result.get_response().id == request_id
    y = result.as_numpy("y")
    assert y is not None
    return y


def _stats(client: tc.InferenceServerClient) -> tuple[int, int, int, int]:
    """success, cache hits, cache misses, executions of tiny."""
    s = client.get_inference_statistics("tiny").model_stats[0]
    i = s.inference_stats
    return i.success.count, i.cache_hit.count, i.cache_miss.count, s.execution_count


def test_a_request_asked_before_is_answered_from_the_cache(caching: Daemon) -> None:
    client = caching.client()
    _load_with_parameters(caching, "tiny", {"response_cache": "true"})
    x = np.random.default_rng(1).random((4, 8), dtype=np.float32)
    first = _ask(client, x, "a")
    assert _stats(client) == (1, 0, 1, 1)
    again = _ask(client, x, "b")  # the same inputs: the id is this request's
    np.testing.assert_array_equal(again, first)
    assert _stats(client) == (2, 1, 1, 1)  # a success, a hit, and no run
    other = _ask(client, x + 1)
    assert not np.array_equal(other, first)
    assert _stats(client) == (3, 1, 2, 2)
    with connect(caching.url) as remote:  # the lane finds the same answers
        np.testing.assert_array_equal(remote.load("tiny").run({"x": x})["y"], first)
    assert _stats(client)[1] == 2


def test_answers_written_to_shared_memory_are_not_cached(caching: Daemon) -> None:
    client = caching.client()
    _load_with_parameters(caching, "tiny", {"response_cache": "true"})
    x = np.full((4, 8), 3, np.float32)
    with connect(caching.url, shm_threshold=1) as remote:  # outputs into a mapped region
        model = remote.load("tiny")
        first = model.run({"x": x})["y"]
        np.testing.assert_array_equal(model.run({"x": x})["y"], first)
    assert _stats(client)[1:3] == (0, 0)  # neither looked up nor kept
    np.testing.assert_array_equal(_ask(client, x), first)  # in the message: cached from now


def test_a_model_loaded_again_starts_with_no_answers(caching: Daemon) -> None:
    client = caching.client()
    _load_with_parameters(caching, "tiny", {"response_cache": "true"})
    x = np.full((4, 8), 2, np.float32)
    _ask(client, x)
    _ask(client, x)
    assert _stats(client)[1] == 1
    _load_with_parameters(caching, "tiny", {"response_cache": "true", "instances": "1"})
    _ask(client, x)  # a new load: run, not answered from the old one's answers
    assert _stats(client) == (1, 0, 1, 1)


def test_the_cache_keeps_at_most_its_bytes(caching: Daemon) -> None:
    client = caching.client()
    _load_with_parameters(caching, "tiny", {"response_cache": "true"})
    xs = [np.full((4, 8), k, np.float32) for k in range(200)]  # far more than 8 KiB of answers
    for x in xs:
        _ask(client, x)
    _ask(client, xs[0])  # the least recently used went first
    _ask(client, xs[-1])  # the most recent is still there
    success, hits, misses, _ = _stats(client)
    assert (success, hits, misses) == (202, 1, 201)


def test_response_cache_needs_the_daemon_s_cache(daemon: Daemon) -> None:
    with pytest.raises(InferenceServerException) as info:
        _load_with_parameters(daemon, "tiny", {"response_cache": "true"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "--response-cache-bytes" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        _load_with_parameters(daemon, "tiny", {"response_cache": "maybe"})
    assert "give true or false" in info.value.message()


def test_a_config_file_model_and_the_metrics(caching: Daemon) -> None:
    client = caching.client()
    x = np.full((4, 8), 7, np.float32)
    for _ in range(3):
        _ask(client, x, model="cached")
    assert caching.metrics is not None
    text = urllib.request.urlopen(caching.metrics, timeout=10).read().decode()
    labels = '{model="cached",version="1"}'
    assert f"crossrt_response_cache_hits_total{labels} 2.0" in text
    assert f"crossrt_response_cache_misses_total{labels} 1.0" in text
    assert f"crossrt_inference_request_success_total{labels} 3.0" in text  # hits included
    assert f"crossrt_inference_exec_count_total{labels} 1.0" in text


def test_the_cache_size_is_checked() -> None:
    import crossrt
    from crossrt.server.settings import build

    assert build(None, {"response_cache_bytes": 1024}).response_cache_bytes == 1024
    assert build(None, {}).response_cache_bytes == 0
    for bad in (-1, True, "64MB"):
        with pytest.raises(crossrt.InvalidOptionError, match="response_cache_bytes"):
            build(None, {"response_cache_bytes": bad})
