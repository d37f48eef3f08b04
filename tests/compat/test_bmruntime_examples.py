"""Seed 004's examples, ported line by line to crossrt.compat.bmruntime, each checked bit for
bit against crossrt's own API on the same compiled networks.

The networks live in one ``.crm`` as a bmodel holds them: "PNet" (MTCNN's first stage's
shapes: 1x3x28x28 in, 1x2x9x9 and 1x4x9x9 out) and "RNet" with two stages. Device 0 is
``sim:0``, a device whose memory is not the host's, as on a PCIe card.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_FLOAT32,
    BM_STORE_1N,
    BM_SUCCESS,
    Context,
    Network,
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
    crossrt.compiler.save_executables(exes, path)
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


def _in_threads(exes, seed: int, work: Callable[[np.ndarray, dict[str, np.ndarray]], None]):
    """``work(x, expected)`` in THREADS threads at once, each with its own input and what
    crossrt's own API gives for it; fails with the threads' errors."""
    inputs = [_input0(seed=seed + i) for i in range(THREADS)]
    expected = [crossrt_run(exes["PNet"], x) for x in inputs]
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(inputs[i], expected[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _repeat(run: Callable[[np.ndarray], dict[str, np.ndarray]], x, expected) -> None:
    for _ in range(RUNS):
        got = run(x)
        for name, want in expected.items():
            np.testing.assert_array_equal(got[name], want)


def test_single_runtime_shared_by_threads(runtime, exes) -> None:
    """One bmruntime, every model loaded once, networks launched from several threads."""
    bm_handle, p_bmrt = runtime
    launch = partial(_launch_pnet, bm_handle, p_bmrt)
    _in_threads(exes, 10, lambda x, want: _repeat(launch, x, want))


def test_one_runtime_per_thread(bmodel, exes) -> None:
    """Each thread creates its own bmruntime and loads the same bmodel into it."""

    def work(x: np.ndarray, expected: dict[str, np.ndarray]) -> None:
        status, bm_handle = bm_dev_request(0)
        assert status == BM_SUCCESS
        p_bmrt = bmrt_create(bm_handle)
        assert bmrt_load_bmodel(p_bmrt, bmodel)
        try:
            _repeat(partial(_launch_pnet, bm_handle, p_bmrt), x, expected)
        finally:
            bmrt_destroy(p_bmrt)
            bm_dev_free(bm_handle)

    _in_threads(exes, 20, work)


# -- the C++ interface ---------------------------------------------------------------------


def net1() -> crossrt.Model:
    """Two batch-dynamic inputs, compiled without stages: a dynamic network."""
    b = GraphBuilder("net1")
    x = b.input("x", "float32", ["N", 4])
    y = b.input("y", "float32", ["N", 4])
    b.output(b.op("Mul", [b.op("Add", [x, y]), y], outputs=["z"]))
    return b.finish()


@pytest.fixture(scope="module")
def net1_exe() -> crossrt.Executable:
    return crossrt.compile(net1(), "sim:0")


def test_context_and_network_example(bmodel, exes, net1_exe) -> None:
    p_net1 = net1_exe.to_bytes()
    net1_size = len(p_net1)
    shape0 = bm_shape_t(2, [3, 4])
    shape1 = bm_shape_t(2, [3, 4])
    x, y = (np.arange(12, dtype=np.float32).reshape(3, 4) + k for k in (1, 2))
    data0 = _input0(batch=4, size=24, seed=7)

    # start program
    status, bm_handle = bm_dev_request(0)
    assert status == BM_SUCCESS
    p_ctx = Context(bm_handle)

    status = p_ctx.load_bmodel(p_net1, net1_size)  # p_net1: the bmodel's bytes in memory
    assert status == BM_SUCCESS
    status = p_ctx.load_bmodel(str(bmodel))  # a bmodel file's path
    assert status == BM_SUCCESS
    net_names: list[str] = []
    p_ctx.get_network_names(net_names)
    assert net_names == ["net1", "PNet", "RNet"] and p_ctx.get_network_number() == 3
    net1_info = p_ctx.get_network_info("net1")
    assert net1_info is not None and net1_info.input_num == 2 and net1_info.is_dynamic
    assert p_ctx.get_network_info("net3") is None

    # net1: its input tensors' shapes may be reshaped
    net1_ = Network(p_ctx, "net1")
    # net2: stage[1]'s shapes of bm_net_info_t, never reshaped
    net2 = Network(p_ctx, "RNet", 1)

    # device_mem0 and device_mem1 hold the input data already
    status, device_mem0 = bm_malloc_device_byte(bm_handle, x.nbytes)
    status, device_mem1 = bm_malloc_device_byte(bm_handle, y.nbytes)
    bm_memcpy_s2d_partial(bm_handle, device_mem0, x, x.nbytes)
    bm_memcpy_s2d_partial(bm_handle, device_mem1, y, y.nbytes)
    inputs = net1_.Inputs()
    assert inputs[0].Reshape(shape0) == BM_SUCCESS
    assert inputs[1].Reshape(shape1) == BM_SUCCESS
    assert inputs[0].set_device_mem(device_mem0) == BM_SUCCESS
    assert inputs[1].set_device_mem(device_mem1) == BM_SUCCESS

    inputs = net2.Inputs()
    assert inputs[0].Reshape(shape0) != BM_SUCCESS  # error: cannot be changed
    assert inputs[0].CopyFrom(data0) == BM_SUCCESS  # the input data is in host memory

    assert net1_.Forward() == BM_SUCCESS
    assert net2.Forward(False) == BM_SUCCESS
    assert bm_thread_sync(p_ctx.handle()) == BM_SUCCESS

    z = np.empty((3, 4), np.float32)
    out = net1_.Output("z")
    assert out is not None and out.tensor().shape == bm_shape_t(2, [3, 4])
    assert out.CopyTo(z) == BM_SUCCESS
    np.testing.assert_array_equal(z, crossrt_run_feed(net1_exe, {"x": x, "y": y})["z"])
    r = np.empty(net2.Outputs()[0].tensor().shape.shape, np.float32)
    assert net2.Outputs()[0].CopyTo(r) == BM_SUCCESS
    np.testing.assert_array_equal(r, crossrt_run(exes["RNet"], data0)["out"])
    assert net2.info().name == "RNet" and net2.Input("data") is net2.Inputs()[0]

    # end of program: destroy the context first, then free bm_handle
    net1_.close()
    net2.close()
    bm_free_device(bm_handle, device_mem0)
    bm_free_device(bm_handle, device_mem1)
    p_ctx.close()
    bm_dev_free(bm_handle)


def crossrt_run_feed(exe: crossrt.Executable, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with crossrt.Runtime() as rt:
        return rt.load(exe, "sim:0").run(feed)


def _forward_pnet(ctx, x: np.ndarray) -> dict[str, np.ndarray]:
    with Network(ctx, "PNet") as net:
        assert net.Inputs()[0].CopyFrom(x) == BM_SUCCESS
        assert net.Forward() == BM_SUCCESS
        result = {}
        for t in net.Outputs():
            result[t.name] = np.empty(t.tensor().shape.shape, np.float32)
            assert t.CopyTo(result[t.name]) == BM_SUCCESS
        return result


def test_cpp_single_context_shared_by_threads(bmodel, exes) -> None:
    """One Context, bmodels loaded once, a Network per thread."""
    with Context() as ctx:
        assert ctx.load_bmodel(bmodel) == BM_SUCCESS
        _in_threads(exes, 30, lambda x, want: _repeat(partial(_forward_pnet, ctx), x, want))


def test_cpp_one_context_per_thread(bmodel, exes) -> None:
    """Each thread makes its own Context and loads the same bmodel."""

    def work(x: np.ndarray, expected: dict[str, np.ndarray]) -> None:
        with Context(0) as ctx:
            assert ctx.load_bmodel(bmodel) == BM_SUCCESS
            _repeat(partial(_forward_pnet, ctx), x, expected)

    _in_threads(exes, 40, work)
