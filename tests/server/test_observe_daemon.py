"""The daemon is observed like any crossrt process: ``crossrt top`` and ``monitor`` see the
models it serves, and ``crossrt profile --pid`` records the requests its clients send."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")

import numpy as np
from serving import Daemon

from crossrt.runtime import observer
from crossrt.server.client import connect


def test_a_daemon_serving_clients_can_be_profiled(
    daemon: Daemon, served_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(served_folder / "run"))
    stop = threading.Event()
    x = np.ones((4, 8), np.float32)
    with connect(daemon.url) as remote:
        model = remote.load("tiny")
        model.run({"x": x})  # loaded in the daemon before anyone looks

        def client() -> None:
            while not stop.is_set():
                model.run({"x": x})

        thread = threading.Thread(target=client)
        thread.start()
        try:
            (seen,) = [p for p in observer.processes() if p["pid"] == daemon.proc.pid]
            assert "tiny:1" in [m["served_as"] for m in seen["models"]]
            trace = observer.ask(
                daemon.proc.pid, {"op": "profile", "seconds": 0.5, "models": ["tiny"]}, timeout=60
            )
        finally:
            stop.set()
            thread.join()
    (summary,) = trace["otherData"]["summary"]
    assert (summary["model"], summary["served_as"]) == ("tiny", "tiny:1")  # not its graph's name
    assert summary["requests"] > 0
    assert summary["infer_us"]["mean"] > 0
