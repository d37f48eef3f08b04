"""Device-resident data through the runtime, on the ``sim`` accelerator (its own memory).

The runtime moves a value only where a program wants it elsewhere, and counts each move per
model and direction (``LoadedModel.memory.transfer_stats``):

- inputs and outputs resident on the model's device: nothing moves;
- host inputs: one host -> device copy per input; host outputs: one device -> host per output;
- a buffer on another device is refused with a coded error.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import crossrt
from crossrt.errors import StatusCode
from crossrt.model import GraphBuilder
from crossrt.runtime.memory.transfer import TransferStats

N = 256


def _model() -> crossrt.Model:
    b = GraphBuilder("affine")
    x = b.input("x", "float32", [N])
    w = b.input("w", "float32", [N])
    y = b.op("Mul", [x, w], outputs=["y"])
    b.output(y)
    b.output(b.op("Add", [y, b.constant(np.float32(1))], outputs=["z"]))
    return b.finish()


@pytest.fixture
def loaded() -> Iterator[crossrt.LoadedModel]:
    with crossrt.Runtime() as rt:
        yield rt.load(_model(), "sim:3")


def _host_inputs() -> dict[str, np.ndarray]:
    return {"x": np.arange(N, dtype=np.float32), "w": np.full(N, 2, np.float32)}


def test_host_inputs_copy_each_input_in_and_each_output_out_once(loaded) -> None:
    feed = _host_inputs()
    out = loaded.run(feed)
    assert isinstance(out["y"], np.ndarray)
    np.testing.assert_array_equal(out["y"], feed["x"] * 2)
    np.testing.assert_array_equal(out["z"], feed["x"] * 2 + 1)
    stats = loaded.memory.transfer_stats()
    assert stats.host_to_device_copies == 2 and stats.host_to_device_bytes == 2 * N * 4
    assert stats.device_to_host_copies == 2 and stats.device_to_host_bytes == 2 * N * 4
    assert stats.device_to_device_copies == 0
    assert loaded.memory.summary()["transfers"]["host_to_device_bytes"] == 2 * N * 4


def test_resident_inputs_and_outputs_move_nothing(loaded) -> None:
    feed = {n: crossrt.Tensor([N], "float32", device="sim:3") for n in ("x", "w")}
    for name, array in _host_inputs().items():
        feed[name].write(array)  # the caller's own upload: not the model's
    outputs = {n: crossrt.Tensor([N], "float32", device="sim:3") for n in ("y", "z")}
    for _ in range(3):  # the first run binds, the next ones repeat the binding
        result = loaded.run(feed, outputs=outputs)
        assert result["y"] is outputs["y"] and result["z"] is outputs["z"]
    assert loaded.memory.transfer_stats() == TransferStats()
    assert not outputs["z"].is_host  # still in sim:3's memory
    np.testing.assert_array_equal(outputs["z"].numpy(), _host_inputs()["x"] * 2 + 1)


def test_outputs_left_to_the_runtime_stay_on_the_device(loaded) -> None:
    feed = {n: crossrt.Tensor([N], "float32", device="sim:3") for n in ("x", "w")}
    for name, array in _host_inputs().items():
        feed[name].write(array)
    result = loaded.run(feed, outputs={"y": None, "z": None})
    assert result["z"].device == "sim:3" and not result["z"].is_host
    assert loaded.memory.transfer_stats().device_to_host_bytes == 0
    assert loaded.memory.transfer_stats().host_to_device_bytes == 0
    np.testing.assert_array_equal(result["y"].numpy(), _host_inputs()["x"] * 2)
    assert loaded.memory.stats().allocations == 2  # charged to the model until freed
    result["y"].free()
    result["z"].free()
    assert loaded.memory.stats().allocations == 0


def test_a_buffer_on_another_device_is_refused(loaded) -> None:
    feed = {n: crossrt.Tensor([N], "float32", device="sim:2") for n in ("x", "w")}
    with pytest.raises(crossrt.InvalidInputError) as info:
        loaded.run(feed)
    assert info.value.code is StatusCode.EXEC_BAD_INPUT
    assert "sim:2" in info.value.message and "sim:3" in info.value.message
    out = {"y": crossrt.Tensor([N], "float32", device="sim:2"), "z": None}
    with pytest.raises(crossrt.InvalidInputError, match="sim:2"):
        loaded.run(_host_inputs(), outputs=out)


def test_a_cpu_model_copies_a_device_tensor_to_the_host_and_counts_it() -> None:
    x = crossrt.Tensor([N], "float32", device="sim:0")
    x.write(np.ones(N, np.float32))
    w = np.full(N, 3, np.float32)
    with crossrt.Runtime() as rt:
        model = rt.load(_model(), "cpu")
        out = model.run({"x": x, "w": w})
        np.testing.assert_array_equal(out["y"], w)
        stats = model.memory.transfer_stats()
    assert stats.device_to_host_copies == 1 and stats.device_to_host_bytes == N * 4
    assert stats.host_to_device_bytes == 0


def test_queued_runs_on_the_device_return_host_arrays(loaded) -> None:
    futures = [loaded.run_async(_host_inputs()) for _ in range(4)]
    for future in futures:
        np.testing.assert_array_equal(future.result()["y"], _host_inputs()["x"] * 2)
    assert loaded.memory.transfer_stats().device_to_host_copies == 8
