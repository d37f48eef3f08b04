"""``RemoteModel.run(output_names=)``: the KServe ``outputs`` of the request, answered with
those outputs only, in that order, as in-process; an unknown name is refused before anything
is sent."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
from serving import Daemon

import crossrt
from crossrt.server.client import connect
from small_models import three_outputs


@pytest.mark.parametrize("shm_threshold", [None, 1])
def test_remote_output_names(daemon: Daemon, shm_threshold: int | None) -> None:
    x = np.arange(3, dtype=np.float32)
    with connect(daemon.url, shm_threshold=shm_threshold) as remote:
        model = remote.load(three_outputs().proto.SerializeToString(), name="three_outputs")
        try:
            result = model.run({"x": x}, output_names=["times", "plus"])
            assert list(result) == ["times", "plus"]
            np.testing.assert_array_equal(result["times"], x * 2)
            np.testing.assert_array_equal(result["plus"], x + 1)
            assert list(model.run({"x": x})) == ["plus", "times", "trap"]
            out = np.zeros(3, np.float32)
            result = model.run({"x": x}, {"trap": out}, output_names=["trap"])
            np.testing.assert_array_equal(out, x)
            with pytest.raises(crossrt.InvalidInputError, match="plus, times, trap"):
                model.run({"x": x}, output_names=["tims"])
            with pytest.raises(crossrt.InvalidInputError, match="'trap'"):
                model.run({"x": x}, {"trap": out}, output_names=["plus"])
        finally:
            model.unload()
