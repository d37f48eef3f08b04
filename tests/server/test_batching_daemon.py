"""Dynamic batching in the daemon: the load parameters ``max_batch_size`` and
``batch_delay``, ModelConfig's ``dynamic_batching``, and concurrent clients' requests run as
batches (Triton's statistics: fewer executions than inferences)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
from serving import EXPLICIT, Daemon, start_daemon
from test_kserve import _load_with_parameters

import crossrt
from concurrency_models import slow_rows
from crossrt.server.client import connect

WAIT = 60


@pytest.fixture(scope="module")
def batching_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("batching")
    repository = folder / "models"
    repository.mkdir()
    crossrt.compile(slow_rows(), "cpu").save(repository / "rows.crm")
    daemon = start_daemon(folder, repository, EXPLICIT)
    yield daemon
    assert daemon.stop() == 0, "".join(daemon.log)


def test_concurrent_clients_are_served_in_batches(batching_daemon: Daemon) -> None:
    client = batching_daemon.client()
    _load_with_parameters(batching_daemon, "rows", {"max_batch_size": "8", "batch_delay": "0.001"})
    config = client.get_model_config("rows").config
    assert config.dynamic_batching.preferred_batch_size == [8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    # Triton's convention: max_batch_size > 0 and dims without the batch dimension
    assert config.max_batch_size == 8 and list(config.input[0].dims) == [512]
    before = client.get_inference_statistics("rows").model_stats[0]
    xs = [np.random.default_rng(k).random((1 + k % 2, 512), dtype=np.float32) for k in range(8)]
    got: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(xs))

    def call(k: int) -> None:
        with connect(batching_daemon.url) as remote:
            model = remote.load("rows")
            start.wait(WAIT)
            got[k] = model.run({"x": xs[k]})["y"]

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for k, x in enumerate(xs):
        np.testing.assert_allclose(got[k], x, rtol=1e-5)  # identity weights: y == x
    stats = client.get_inference_statistics("rows").model_stats[0]
    served = stats.inference_stats.success.count - before.inference_stats.success.count
    executions = stats.execution_count - before.execution_count
    assert served == len(xs)
    assert executions < served, "no two requests ran in one batch"


def test_bad_batching_parameters_are_refused(batching_daemon: Daemon) -> None:
    from tritonclient.utils import InferenceServerException

    for params, match in (
        ({"max_batch_size": "-1"}, "whole number >= 0"),
        ({"max_batch_size": "4", "batch_delay": "soon"}, "seconds >= 0"),
    ):
        with pytest.raises(InferenceServerException) as info:
            _load_with_parameters(batching_daemon, "rows", params)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert match in info.value.message()
