"""Seed 004's examples, ported line by line to crossrt.compat.bmruntime, each checked bit for
bit against crossrt's own API on the same compiled networks.

The networks live in one ``.crm`` as a bmodel holds them: "PNet" (MTCNN's first stage's
shapes: 1x3x28x28 in, 1x2x9x9 and 1x4x9x9 out) and "RNet" with two stages. Device 0 is
``sim:0``, a device whose memory is not the host's, as on a PCIe card.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_FLOAT32,
    BM_STORE_1N,
    BM_SUCCESS,
    bm_dev_free,
    bm_dev_request,
    bm_free_device,
    bm_malloc_device_byte,
    bm_mem_flush_device_mem,
    bm_mem_invalidate_device_mem,
    bm_mem_mmap_device_mem,
    bm_mem_unmap_device_mem,
    bm_memcpy_d2s_partial,
    bm_memcpy_s2d_partial,
    bm_shape_t,
    bm_tensor_t,
    bm_thread_sync,
    bmrt_create,
    bmrt_destroy,
    bmrt_get_network_info,
    bmrt_get_network_names,
    bmrt_get_network_number,
    bmrt_launch_tensor,
    bmrt_launch_tensor_ex,
    bmrt_load_bmodel,
    bmrt_tensor,
    bmrt_tensor_bytesize,
)
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")

RNET_STAGES = [{"data": [1, 3, 24, 24]}, {"data": [4, 3, 24, 24]}]


def pnet() -> crossrt.Model:
    """Two convolutions of stride 3 over 1x3x28x28: 1x2x9x9 (softmax) and 1x4x9x9."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("PNet")
    x = b.input("data", "float32", [1, 3, 28, 28])
    w1 = b.constant(rng.standard_normal((2, 3, 3, 3)).astype(np.float32), name="w1")
    w2 = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w2")
    prob = b.op("Softmax", [b.op("Conv", [x, w1], strides=[3, 3])], axis=1, outputs=["prob1"])
    b.output(prob)
    b.output(b.op("Conv", [x, w2], strides=[3, 3], outputs=["conv4-2"]))
    return b.finish()


def rnet() -> crossrt.Model:
    """A batch-dynamic network compiled for two stages (batch 1 and batch 4)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("RNet")
    x = b.input("data", "float32", ["N", 3, 24, 24])
    w = b.constant(rng.standard_normal((8, 3, 4, 4)).astype(np.float32), name="w")
    b.output(b.op("Relu", [b.op("Conv", [x, w], strides=[4, 4])], outputs=["out"]))
    return b.finish()


@pytest.fixture(scope="module")
def exes() -> dict[str, crossrt.Executable]:
    return {
        "PNet": crossrt.compile(pnet(), "sim:0"),
        "RNet": crossrt.compile(rnet(), "sim:0", stages=RNET_STAGES),
    }


@pytest.fixture(scope="module")
def bmodel(exes: dict[str, crossrt.Executable], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bmodel") / "mtcnn.crm"
    crossrt.save_executables(exes, path)
    return path


def _input0(batch: int = 1, size: int = 28, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


def crossrt_run(exe: crossrt.Executable, x: np.ndarray) -> dict[str, np.ndarray]:
    """The same network through crossrt's own API: the reference."""
    with crossrt.Runtime() as rt:
        return rt.load(exe, "sim:0").run({"data": x})


@pytest.fixture
def runtime(bmodel: Path) -> Iterator[tuple[object, object]]:
    # start program
    status, bm_handle = bm_dev_request(0)
    assert status == BM_SUCCESS
    p_bmrt = bmrt_create(bm_handle)
    assert p_bmrt is not None
    assert bmrt_load_bmodel(p_bmrt, bmodel)
    yield bm_handle, p_bmrt
    # end of program
    bmrt_destroy(p_bmrt)
    bm_dev_free(bm_handle)


def test_device_zero_is_a_device_with_its_own_memory(runtime) -> None:
    bm_handle, p_bmrt = runtime
    assert bm_handle.device.id == "sim:0" and not bm_handle.device.coherent
    net_num = bmrt_get_network_number(p_bmrt)
    net_names = bmrt_get_network_names(p_bmrt)
    assert [net_names[i] for i in range(net_num)] == ["PNet", "RNet"]


def test_bmrt_launch_tensor(runtime, exes) -> None:
    bm_handle, p_bmrt = runtime
    input0 = _input0()
    output0, output1 = np.empty((1, 2, 9, 9), np.float32), np.empty((1, 4, 9, 9), np.float32)

    status = BM_SUCCESS
    input_tensors = [bm_tensor_t()]
    output_tensors = [bm_tensor_t(), bm_tensor_t()]
    bmrt_tensor(input_tensors[0], p_bmrt, BM_FLOAT32, bm_shape_t(4, [1, 3, 28, 28]))
    bm_memcpy_s2d_partial(
        bm_handle, input_tensors[0].device_mem, input0, bmrt_tensor_bytesize(input_tensors[0])
    )
    ret = bmrt_launch_tensor(p_bmrt, "PNet", input_tensors, 1, output_tensors, 2)
    assert ret is True
    status = bm_thread_sync(bm_handle)
    assert status == BM_SUCCESS
    bm_memcpy_d2s_partial(
        bm_handle, output0, output_tensors[0].device_mem, bmrt_tensor_bytesize(output_tensors[0])
    )
    bm_memcpy_d2s_partial(
        bm_handle, output1, output_tensors[1].device_mem, bmrt_tensor_bytesize(output_tensors[1])
    )
    bm_free_device(bm_handle, output_tensors[0].device_mem)
    bm_free_device(bm_handle, output_tensors[1].device_mem)
    bm_free_device(bm_handle, input_tensors[0].device_mem)

    assert output_tensors[0].shape == bm_shape_t(4, [1, 2, 9, 9])
    assert output_tensors[1].shape.shape == (1, 4, 9, 9)
    assert output_tensors[0].st_mode == BM_STORE_1N
    expected = crossrt_run(exes["PNet"], input0)
    np.testing.assert_array_equal(output0, expected["prob1"])
    np.testing.assert_array_equal(output1, expected["conv4-2"])


def test_bmrt_launch_tensor_ex(runtime, exes) -> None:
    bm_handle, p_bmrt = runtime
    input0 = _input0(seed=1)
    output0, output1 = np.empty((1, 2, 9, 9), np.float32), np.empty((1, 4, 9, 9), np.float32)

    status = BM_SUCCESS
    input_tensors = [bm_tensor_t()]
    output_tensors = [bm_tensor_t(), bm_tensor_t()]
    net_info = bmrt_get_network_info(p_bmrt, "PNet")
    status, input_tensors[0].device_mem = bm_malloc_device_byte(
        bm_handle, net_info.max_input_bytes[0]
    )
    assert status == BM_SUCCESS
    input_tensors[0].dtype = BM_FLOAT32
    input_tensors[0].st_mode = BM_STORE_1N
    status, output_tensors[0].device_mem = bm_malloc_device_byte(
        bm_handle, net_info.max_output_bytes[0]
    )
    assert status == BM_SUCCESS
    status, output_tensors[1].device_mem = bm_malloc_device_byte(
        bm_handle, net_info.max_output_bytes[1]
    )
    assert status == BM_SUCCESS

    input_tensors[0].shape = bm_shape_t(4, [1, 3, 28, 28])
    bm_memcpy_s2d_partial(
        bm_handle, input_tensors[0].device_mem, input0, bmrt_tensor_bytesize(input_tensors[0])
    )
    user_out = [t.device_mem for t in output_tensors]
    ret = bmrt_launch_tensor_ex(p_bmrt, "PNet", input_tensors, 1, output_tensors, 2, True, False)
    assert ret is True
    status = bm_thread_sync(bm_handle)
    assert status == BM_SUCCESS
    bm_memcpy_d2s_partial(
        bm_handle, output0, output_tensors[0].device_mem, bmrt_tensor_bytesize(output_tensors[0])
    )
    bm_memcpy_d2s_partial(
        bm_handle, output1, output_tensors[1].device_mem, bmrt_tensor_bytesize(output_tensors[1])
    )
    assert [t.device_mem for t in output_tensors] == user_out  # the caller's memory, used
    bm_free_device(bm_handle, output_tensors[0].device_mem)
    bm_free_device(bm_handle, output_tensors[1].device_mem)
    bm_free_device(bm_handle, input_tensors[0].device_mem)

    expected = crossrt_run(exes["PNet"], input0)
    np.testing.assert_array_equal(output0, expected["prob1"])
    np.testing.assert_array_equal(output1, expected["conv4-2"])


def test_mmap_example_around_an_inference(runtime, exes) -> None:
    """The mmap example of the seed, with its "do inference here" filled by a PNet launch."""
    bm_handle, p_bmrt = runtime
    input_data = _input0(seed=2)
    output_data = np.empty((1, 2, 9, 9), np.float32)
    status, input_mem = bm_malloc_device_byte(bm_handle, input_data.nbytes)
    assert status == BM_SUCCESS
    status, output_mem = bm_malloc_device_byte(bm_handle, output_data.nbytes)
    assert status == BM_SUCCESS
    status, output2_mem = bm_malloc_device_byte(bm_handle, 4 * 4 * 9 * 9)
    assert status == BM_SUCCESS

    # mmap device mem to virtual addr
    status, input = bm_mem_mmap_device_mem(bm_handle, input_mem)
    assert status == BM_SUCCESS
    status, output = bm_mem_mmap_device_mem(bm_handle, output_mem)
    assert status == BM_SUCCESS

    # copy input data to input, and flush it
    input[:] = input_data.tobytes()
    status = bm_mem_flush_device_mem(bm_handle, input_mem)
    assert status == BM_SUCCESS

    # do inference here
    shape = bm_shape_t(4, [1, 3, 28, 28])
    inputs = [bm_tensor_t(BM_FLOAT32, shape, input_mem)]
    outputs = [bm_tensor_t(device_mem=output_mem), bm_tensor_t(device_mem=output2_mem)]
    assert bmrt_launch_tensor_ex(p_bmrt, "PNet", inputs, 1, outputs, 2, True, False)
    assert bm_thread_sync(bm_handle) == BM_SUCCESS

    # invalidate output, and copy output data from output
    status = bm_mem_invalidate_device_mem(bm_handle, output_mem)
    assert status == BM_SUCCESS
    output_data[...] = np.frombuffer(output, np.float32).reshape(1, 2, 9, 9)

    # unmap
    status = bm_mem_unmap_device_mem(bm_handle, input, input_data.nbytes)
    assert status == BM_SUCCESS
    status = bm_mem_unmap_device_mem(bm_handle, output, output_data.nbytes)
    assert status == BM_SUCCESS

    np.testing.assert_array_equal(output_data, crossrt_run(exes["PNet"], input_data)["prob1"])
    for mem in (input_mem, output_mem, output2_mem):
        bm_free_device(bm_handle, mem)


@pytest.mark.parametrize("stage", [0, 1])
def test_a_network_with_stages_runs_the_stage_the_shapes_choose(runtime, exes, stage) -> None:
    bm_handle, p_bmrt = runtime
    info = bmrt_get_network_info(p_bmrt, "RNet")
    assert info.stage_num == 2 and not info.is_dynamic
    shape = info.stages[stage].input_shapes[0]
    x = _input0(batch=shape.dims[0], size=24, seed=stage)
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p_bmrt, BM_FLOAT32, shape)
    assert bm_memcpy_s2d_partial(bm_handle, inputs[0].device_mem, x, x.nbytes) == BM_SUCCESS
    assert bmrt_launch_tensor(p_bmrt, "RNet", inputs, 1, outputs, 1)
    assert bm_thread_sync(bm_handle) == BM_SUCCESS
    assert outputs[0].shape == info.stages[stage].output_shapes[0]
    out = np.empty(outputs[0].shape.shape, np.float32)
    bm_memcpy_d2s_partial(bm_handle, out, outputs[0].device_mem, out.nbytes)
    np.testing.assert_array_equal(out, crossrt_run(exes["RNet"], x)["out"])
    assert info.max_input_bytes == [4 * 3 * 24 * 24 * 4]
    bm_free_device(bm_handle, outputs[0].device_mem)
    bm_free_device(bm_handle, inputs[0].device_mem)


def _launch_pnet(bm_handle, p_bmrt, x: np.ndarray) -> dict[str, np.ndarray]:
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t(), bm_tensor_t()]
    bmrt_tensor(inputs[0], p_bmrt, BM_FLOAT32, bm_shape_t(4, [1, 3, 28, 28]))
    assert bm_memcpy_s2d_partial(bm_handle, inputs[0].device_mem, x, x.nbytes) == BM_SUCCESS
    assert bmrt_launch_tensor(p_bmrt, "PNet", inputs, 1, outputs, 2)
    assert bm_thread_sync(bm_handle) == BM_SUCCESS
    result = {}
    for name, t in zip(("prob1", "conv4-2"), outputs, strict=True):
        result[name] = np.empty(t.shape.shape, np.float32)
        bm_memcpy_d2s_partial(bm_handle, result[name], t.device_mem, bmrt_tensor_bytesize(t))
        bm_free_device(bm_handle, t.device_mem)
    bm_free_device(bm_handle, inputs[0].device_mem)
    return result


THREADS, RUNS = 4, 3


def _check_threads(work) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_single_runtime_shared_by_threads(runtime, exes) -> None:
    """One bmruntime, every model loaded once, networks launched from several threads."""
    bm_handle, p_bmrt = runtime
    inputs = [_input0(seed=10 + i) for i in range(THREADS)]
    expected = [crossrt_run(exes["PNet"], x) for x in inputs]

    def work(i: int) -> None:
        for _ in range(RUNS):
            got = _launch_pnet(bm_handle, p_bmrt, inputs[i])
            for name, want in expected[i].items():
                np.testing.assert_array_equal(got[name], want)

    _check_threads(work)


def test_one_runtime_per_thread(bmodel, exes) -> None:
    """Each thread creates its own bmruntime and loads the same bmodel into it."""
    inputs = [_input0(seed=20 + i) for i in range(THREADS)]
    expected = [crossrt_run(exes["PNet"], x) for x in inputs]

    def work(i: int) -> None:
        status, bm_handle = bm_dev_request(0)
        assert status == BM_SUCCESS
        p_bmrt = bmrt_create(bm_handle)
        assert bmrt_load_bmodel(p_bmrt, bmodel)
        try:
            for _ in range(RUNS):
                got = _launch_pnet(bm_handle, p_bmrt, inputs[i])
                for name, want in expected[i].items():
                    np.testing.assert_array_equal(got[name], want)
        finally:
            bmrt_destroy(p_bmrt)
            bm_dev_free(bm_handle)

    _check_threads(work)
