"""For the tests of the observation socket (``runtime/observer.py``) and of the tools that
read it: a worker script that keeps a model busy, and a stand-in for a crossrt process that
dies mid-answer."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from crossrt.runtime import observer

WORKER = """
import time
import numpy as np
from onnx import TensorProto, helper
import crossrt

BAD_EVERY = {bad_every}  # every so many runs a bad input (0: none), counted as a failure
graph = helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])],
    "relu64",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
loaded = crossrt.Runtime().load(crossrt.compile(model))
good, bad = np.ones((1, 64), np.float32), np.ones((2, 3), np.float32)
print("ready", loaded.name, flush=True)
deadline = time.monotonic() + 300  # a safety net: the test kills it long before
n = 0
while time.monotonic() < deadline:
    n += 1
    try:
        loaded.run({{"x": bad if BAD_EVERY and n % BAD_EVERY == 0 else good}})
    except crossrt.CrossrtError:
        pass
    time.sleep(0.001)  # leave the CPU to the command under test on a small machine
"""


def worker_script(bad_every: int = 0) -> str:
    """A Python program that loads a Relu model ("relu64"), prints ``ready NAME`` and runs
    it in a loop for up to 300 s, an input of the wrong shape every ``bad_every`` runs."""
    return WORKER.format(bad_every=bad_every)


@contextlib.contextmanager
def hanging_up(pid: int) -> Iterator[Path]:
    """A socket for ``pid`` in the observe directory that takes each question and closes the
    connection without answering, until the block ends."""
    path = observer.observe_directory() / f"{pid}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)

    def hang_up() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = server.accept()[0]
                conn.recv(100)
                conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        yield path
    finally:
        server.close()
