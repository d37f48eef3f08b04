"""The daemon's request threads compute on the cores of the instance they run (issue 28.4):
gRPC's pool threads, an HTTP connection's thread and a lane connection's thread, each read
from inside the engine call. The daemon runs in the test's process (its real gRPC server,
HTTP server and lane, on real sockets) so that its programs can be watched."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tc

import crossrt
from concurrency_models import tiny, watch_affinity
from crossrt.host import host_cpus
from crossrt.server.client import connect
from crossrt.server.daemon import Daemon
from crossrt.server.settings import build

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = pytest.mark.skipif(
    len(CPUS) < 2 or host_cpus().limit < 2, reason="pinning needs 2 usable CPUs and Linux"
)
X = np.ones((4, 8), np.float32)
TURNS = 4


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A daemon serving the tiny model as two instances of one core each, on a Unix socket
    (gRPC and the lane) and HTTP."""
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(tmp_path / "run"))
    crossrt.compile(tiny(), "cpu").save(tmp_path / "tiny.crm")
    options = build(
        None,
        {
            "endpoint": (f"unix:{tmp_path / 'd.sock'}",),
            "model": (f"tiny={tmp_path / 'tiny.crm'}",),
            "load_parameter": ("instances=2",),
            "http": "127.0.0.1:0",
            "drain_seconds": 5.0,
        },
    )
    served = Daemon(options)
    try:
        served.start()
        yield served
    finally:
        served.stop()


def _in_turn(model: crossrt.LoadedModel, send: object) -> None:
    """``send()`` a request ``TURNS`` times, each on the other instance than the last (the
    requests one at a time: the idle instances are not touched while one runs)."""
    for _ in range(TURNS):
        send()  # type: ignore[operator]
        model._line.idle.rotate(1)


def _check(seen: list[tuple[tuple[int, ...] | None, set[int]]]) -> None:
    assert len(seen) == TURNS and len({pin for pin, _ in seen}) == 2, seen
    assert all(pin is not None and cpus == set(pin) for pin, cpus in seen), seen


def test_each_protocol_s_thread_computes_on_the_instance_s_cores(daemon: Daemon) -> None:
    _, model = daemon.repository.get("tiny", "")
    seen = watch_affinity(model)
    socket_path = daemon.options.endpoint[0].removeprefix("unix:")

    grpc_client = tc.InferenceServerClient(f"unix://{socket_path}")
    given = tc.InferInput("x", [4, 8], "FP32")
    given.set_data_from_numpy(X)
    _in_turn(model, lambda: grpc_client.infer("tiny", [given]))
    _check(seen)  # gRPC's pool threads

    seen.clear()
    assert daemon._http is not None
    web = http.client.HTTPConnection("127.0.0.1", daemon._http.port, timeout=30)
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [4, 8], "datatype": "FP32", "data": X.ravel().tolist()}]}
    )

    def post() -> None:
        web.request("POST", "/v2/models/tiny/infer", body)
        assert web.getresponse().read() and True

    _in_turn(model, post)  # one kept-alive connection: one thread, moved at each turn
    web.close()
    _check(seen)

    seen.clear()
    with connect(f"unix:{socket_path}") as remote:
        assert remote.lane
        lane_model = remote.load("tiny")
        _in_turn(model, lambda: lane_model.run(X))
    _check(seen)  # the lane connection's thread
