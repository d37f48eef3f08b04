"""A daemon shared by people who do not trust each other, bounded (issue 24, points 3-6):
files that change under a served model, memory a request may cost, HTTP connections, and
what a client that has gone leaves behind. Each test runs a real ``crossrt serve`` and reads
the daemon's memory from ``/proc/PID/status``: memory is a correctness property here."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import tritonclient.grpc as tc

import crossrt
from crossrt import GraphBuilder

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # serving.py: the daemon's
from serving import Daemon, free_port, start_daemon  # noqa: E402

N = 256


def summing() -> crossrt.Model:
    """y = x @ ones(256, 256): each y is sum(x); 256 KiB of weights that ONNX Runtime maps
    from the .crm file itself (over its 1 KiB threshold)."""
    b = GraphBuilder("summing")
    x = b.input("x", "float32", [1, N])
    b.output(b.op("MatMul", [x, b.constant(np.ones((N, N), np.float32), "W")], outputs=["y"]))
    return b.finish()


def doubled() -> crossrt.Model:
    """The same inputs and outputs, a much smaller file: y = 2 * sum(x) in every place."""
    b = GraphBuilder("summing")
    x = b.input("x", "float32", [1, N])
    total = b.op("ReduceSum", [x, b.constant(np.array([1], np.int64), "axes")])
    b.output(b.op("Mul", [total, b.constant(np.full((1, N), 2, np.float32), "two")], outputs=["y"]))
    return b.finish()


def vm_kib(pid: int, key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of process ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def until(check: Callable[[], bool], tries: int = 400) -> bool:
    """``check()`` until it holds; each try is a request to the daemon (no sleeping)."""
    return any(check() for _ in range(tries))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return tmp_path


def _stop(d: Daemon) -> None:
    assert d.stop() == 0, "".join(d.log)


@pytest.fixture
def served(folder: Path) -> Iterator[Daemon]:
    crossrt.compile(summing(), "cpu").save(folder / "models" / "summing.crm")
    d = start_daemon(folder, folder / "models", ["--http", f"127.0.0.1:{free_port()}"])
    yield d
    if d.proc.poll() is None:
        _stop(d)


def _ask(c: tc.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    given = tc.InferInput("x", [1, N], "FP32")
    given.set_data_from_numpy(x)
    out = c.infer("summing", [given]).as_numpy("y")
    assert out is not None
    return out


# -- 3. files that change under a served model --------------------------------------------------


def test_a_model_file_overwritten_truncated_or_deleted_never_reaches_the_daemon(
    served: Daemon, folder: Path
) -> None:
    x = np.arange(N, dtype=np.float32).reshape(1, N) / N
    served_file = folder / "models" / "summing.crm"
    smaller = folder / "doubled.crm"
    crossrt.compile(doubled(), "cpu").save(smaller)
    assert smaller.stat().st_size < served_file.stat().st_size / 4
    with served.client() as c:
        np.testing.assert_allclose(_ask(c, x), np.full((1, N), x.sum()), rtol=1e-5)
        shutil.copyfile(smaller, served_file)  # what cp does: truncate in place, then write
        for _ in range(20):
            np.testing.assert_allclose(_ask(c, x), np.full((1, N), x.sum()), rtol=1e-5)
        assert served.proc.poll() is None, "".join(served.log)
        served.proc.send_signal(signal.SIGHUP)  # the new version
        assert until(lambda: np.allclose(_ask(c, x), 2 * x.sum(), rtol=1e-5)), "".join(served.log)
        os.truncate(served_file, 0)
        served_file.unlink()
        np.testing.assert_allclose(_ask(c, x), np.full((1, N), 2 * x.sum()), rtol=1e-5)
    assert served.proc.poll() is None, "".join(served.log)
