"""crossrt.compat.bmruntime: launches on chosen cores and in thread slots, the
pre-allocations, ``get_bmodel_api_info_c`` (not supported), and the ``_parallel`` copies of a
runtime over two devices. Outputs are compared with crossrt's own
``Runtime.load(exe).run(...)``, copies byte for byte with NumPy."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_FLOAT32,
    BM_INT8,
    BM_SUCCESS,
    bm_dev_free,
    bm_dev_request,
    bm_free_device,
    bm_malloc_device_byte,
    bm_memcpy_d2s,
    bm_memcpy_s2d,
    bm_shape_t,
    bm_tensor_t,
    bm_thread_sync,
    bmrt_create_ex,
    bmrt_destroy,
    bmrt_free_api_info,
    bmrt_launch_data_multi_cores,
    bmrt_launch_data_multi_thread,
    bmrt_launch_tensor_multi_cores,
    bmrt_launch_tensor_multi_thread,
    bmrt_memcpy_d2d_byte_parallel,
    bmrt_memcpy_d2d_stride_ex_parallel,
    bmrt_memcpy_d2s_parallel,
    bmrt_memcpy_s2d_parallel,
    bmrt_pre_alloc_mem_multi_thread,
    bmrt_pre_alloc_neuron_multi_cores,
    bmrt_tensor,
    bmrt_tensor_ex,
    get_bmodel_api_info_c,
    mem_info_t,
    memory_t,
)
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")

LOGGER = "crossrt.compat.bmruntime"
X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)


def affine() -> crossrt.Model:
    b = GraphBuilder("affine")
    x = b.input("x", "float32", [2, 4])
    w = b.constant(np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32), name="w")
    b.output(b.op("Add", [b.op("Mul", [x, w]), w], outputs=["y"]))
    return b.finish()


@pytest.fixture(scope="module")
def exe() -> crossrt.Executable:
    return crossrt.compile(affine(), "sim:0")


@pytest.fixture(scope="module")
def reference(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        return rt.load(exe, "sim:0").run({"x": X})["y"]


@pytest.fixture(scope="module")
def bmodel(exe: crossrt.Executable, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bm") / "affine.crm"
    exe.save(path)
    return path


def _data_launch(launch, p, *extra) -> np.ndarray | None:
    outputs: list = [None]
    shapes = [bm_shape_t()]
    ok = launch(p, "affine", [X], [bm_shape_t.of(X.shape)], 1, outputs, shapes, 1, *extra)
    if not ok:
        return None
    assert shapes[0] == bm_shape_t.of(X.shape)
    return outputs[0]


def _tensor_launch(handle, p, launch, *extra) -> np.ndarray | None:
    """An asynchronous launch of "affine" on X, synchronised; None when refused."""
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p, BM_FLOAT32, bm_shape_t.of(X.shape))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, X) == BM_SUCCESS
    try:
        if not launch(p, "affine", inputs, 1, outputs, 1, *extra):
            return None
        assert bm_thread_sync(handle) == BM_SUCCESS
        y = np.empty((2, 4), np.float32)
        assert bm_memcpy_d2s(handle, y, outputs[0].device_mem) == BM_SUCCESS
        bm_free_device(handle, outputs[0].device_mem)
        return y
    finally:
        bm_free_device(handle, inputs[0].device_mem)


# -- cores and pre-allocation ----------------------------------------------------------------


def test_launch_data_on_chosen_cores(p_bmrt, reference: np.ndarray) -> None:
    y = _data_launch(bmrt_launch_data_multi_cores, p_bmrt, False, [1], 1)
    assert y is not None
    np.testing.assert_array_equal(y, reference)
    assert p_bmrt.networks["affine"].on_cores[("sim:0", (1,))].cores == (1,)
    y = _data_launch(bmrt_launch_data_multi_cores, p_bmrt, False, None, 0)  # automatic
    assert y is not None
    np.testing.assert_array_equal(y, reference)
    mine = [np.zeros((2, 4), np.float32)]
    assert bmrt_launch_data_multi_cores(
        p_bmrt, "affine", [X], [bm_shape_t.of(X.shape)], 1, mine, [bm_shape_t()], 1, True, [0], 1
    )
    np.testing.assert_array_equal(mine[0], reference)
    cores = p_bmrt.handle.device.info.cores
    assert _data_launch(bmrt_launch_data_multi_cores, p_bmrt, False, [cores], 1) is None
    assert _data_launch(bmrt_launch_data_multi_cores, p_bmrt, False, [0], 2) is None
    assert _data_launch(bmrt_launch_data_multi_cores, p_bmrt, False, None, 1) is None


def test_pre_alloc_loads_the_network_on_the_cores_first(
    handle, p_bmrt, reference: np.ndarray
) -> None:
    net = p_bmrt.networks["affine"]
    assert ("sim:0", (1,)) not in net.on_cores
    assert bmrt_pre_alloc_neuron_multi_cores(p_bmrt, "affine", 0, [1], 1)
    model = net.on_cores[("sim:0", (1,))]
    y = _tensor_launch(handle, p_bmrt, bmrt_launch_tensor_multi_cores, False, False, [1], 1)
    assert y is not None
    np.testing.assert_array_equal(y, reference)
    assert net.on_cores[("sim:0", (1,))] is model  # the launch found it loaded
    assert not bmrt_pre_alloc_neuron_multi_cores(p_bmrt, "affine", 1, [1], 1)  # one stage
    assert not bmrt_pre_alloc_neuron_multi_cores(p_bmrt, "affine", -1, [1], 1)
    assert not bmrt_pre_alloc_neuron_multi_cores(p_bmrt, "nosuch", 0, [1], 1)
    assert not bmrt_pre_alloc_neuron_multi_cores(p_bmrt, "affine", 0, [1], 2)


# -- thread slots ----------------------------------------------------------------------------


def test_each_thread_slot_is_a_load_of_its_own(handle, p_bmrt, reference: np.ndarray) -> None:
    launch = bmrt_launch_tensor_multi_thread
    assert _tensor_launch(handle, p_bmrt, launch, 0, False, False, [0], 1) is None  # not ready
    assert _data_launch(bmrt_launch_data_multi_thread, p_bmrt, 0, False, None, 0) is None
    for slot in (0, 1):
        assert bmrt_pre_alloc_mem_multi_thread(p_bmrt, slot, mem_info_t())
        y = _tensor_launch(handle, p_bmrt, launch, slot, False, False, [0], 1)
        assert y is not None
        np.testing.assert_array_equal(y, reference)
    slots = p_bmrt.networks["affine"].in_slots
    assert slots[("sim:0", (0,), 0)] is not slots[("sim:0", (0,), 1)]
    y = _data_launch(bmrt_launch_data_multi_thread, p_bmrt, 1, False, None, 0)
    assert y is not None
    np.testing.assert_array_equal(y, reference)
    assert ("sim:0", (), 1) in slots


def test_a_slots_memory_is_checked(handle, p_bmrt) -> None:
    assert not bmrt_pre_alloc_mem_multi_thread(p_bmrt, 0, mem_info_t(neuron_mem=memory_t(size=64)))
    assert not bmrt_pre_alloc_mem_multi_thread(p_bmrt, -1, mem_info_t())
    assert not bmrt_pre_alloc_mem_multi_thread(p_bmrt, 0, "not a mem_info_t")
    _, mem = bm_malloc_device_byte(handle, 32)
    assert not bmrt_pre_alloc_mem_multi_thread(
        p_bmrt, 0, mem_info_t(io_mem=memory_t(mem, size=64))
    )  # smaller than its size
    assert bmrt_pre_alloc_mem_multi_thread(p_bmrt, 0, mem_info_t(io_mem=memory_t(mem, size=32)))
    bm_free_device(handle, mem)
    launch = bmrt_launch_tensor_multi_thread
    assert _tensor_launch(handle, p_bmrt, launch, 0, False, False, None, 0) is None  # freed


def test_api_info_is_not_supported(p_bmrt, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert get_bmodel_api_info_c(p_bmrt, "affine", [], 1, [], 1, False, False) is None
        assert "BM_NOT_SUPPORTED" in caplog.text and "bmrt_launch_tensor_ex" in caplog.text
        caplog.clear()
        assert bmrt_free_api_info(None) is None
        assert not caplog.text
        assert bmrt_free_api_info(object()) is None
        assert "not from get_bmodel_api_info_c" in caplog.text


# -- the _parallel copies --------------------------------------------------------------------


@pytest.fixture
def two(bmodel: Path) -> Iterator:
    """A runtime over sim:0 and sim:1, and a 3x4 float32 tensor on each."""
    handles = [bm_dev_request(f"sim:{i}")[1] for i in (0, 1)]
    p = bmrt_create_ex(handles, 2)
    assert p is not None
    tensors = [bm_tensor_t() for _ in range(4)]
    for i, t in enumerate(tensors):
        bmrt_tensor_ex(t, p, i // 2, BM_FLOAT32, bm_shape_t(2, [3, 4]))
    yield p, handles, tensors
    for i, t in enumerate(tensors):
        bm_free_device(handles[i // 2], t.device_mem)
    bmrt_destroy(p)
    for h in handles:
        bm_dev_free(h)


def _host(n: int) -> list[np.ndarray]:
    return [np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * i for i in range(n)]


def test_s2d_and_d2s_parallel_copy_each_group_to_its_device(two) -> None:
    p, handles, tensors = two
    datas = _host(4)
    assert bmrt_memcpy_s2d_parallel(p, tensors, datas, [2, 2], 2)
    for i, t in enumerate(tensors):
        assert t.device_mem.device == handles[i // 2].device.id
        raw = bytearray(48)
        assert bm_memcpy_d2s(handles[i // 2], raw, t.device_mem) == BM_SUCCESS
        assert bytes(raw) == datas[i].tobytes()
    back = [np.zeros((3, 4), np.float32) for _ in range(4)]
    assert bmrt_memcpy_d2s_parallel(p, back, tensors, [2, 2], 2)
    for got, sent in zip(back, datas, strict=True):
        assert got.tobytes() == sent.tobytes()


def test_d2d_parallel_copies_within_each_device(two) -> None:
    p, _, tensors = two
    datas = _host(4)
    assert bmrt_memcpy_s2d_parallel(p, tensors, datas, [2, 2], 2)
    dst, src = [tensors[0], tensors[2]], [tensors[1], tensors[3]]
    assert bmrt_memcpy_d2d_byte_parallel(p, dst, [4, 0], src, [0, 8], [16, 40], [1, 1], 2)
    first = bytearray(datas[0].tobytes())
    first[4:20] = datas[1].tobytes()[:16]
    third = bytearray(datas[2].tobytes())
    third[0:40] = datas[3].tobytes()[8:48]
    back = [np.zeros((3, 4), np.float32) for _ in range(2)]
    assert bmrt_memcpy_d2s_parallel(p, back, dst, [1, 1], 2)
    assert back[0].tobytes() == bytes(first) and back[1].tobytes() == bytes(third)
    # a transpose on each device: a 4x3 block read down the columns of a 3x4 one
    shapes = [bm_shape_t(2, [4, 3])] * 2
    dst_strides, src_strides = [bm_shape_t(2, [3, 1])] * 2, [bm_shape_t(2, [1, 4])] * 2
    assert bmrt_memcpy_d2d_stride_ex_parallel(
        p, dst, [0, 0], dst_strides, src, [0, 0], src_strides, shapes, [1, 1], 2
    )
    assert bmrt_memcpy_d2s_parallel(p, back, dst, [1, 1], 2)
    assert back[0].tobytes() == datas[1].T.tobytes()
    assert back[1].tobytes() == datas[3].T.tobytes()


def test_parallel_refusals_copy_nothing(two, caplog: pytest.LogCaptureFixture) -> None:
    p, _, tensors = two
    zeros = [np.zeros((3, 4), np.float32) for _ in range(4)]
    assert bmrt_memcpy_s2d_parallel(p, tensors, zeros, [2, 2], 2)
    datas = _host(4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # the second group's first tensor lies on sim:0: refused before the first group moves
        assert not bmrt_memcpy_s2d_parallel(p, tensors, datas, [1, 3], 2)
        assert "belongs to sim:0, not sim:1" in caplog.text
    assert not bmrt_memcpy_s2d_parallel(p, tensors, datas, [2, 2], 3)  # two devices
    assert not bmrt_memcpy_s2d_parallel(p, tensors, datas, [2], 2)
    assert not bmrt_memcpy_s2d_parallel(p, tensors, datas, [2, 3], 2)  # 5 of 4 tensors
    assert not bmrt_memcpy_s2d_parallel(p, tensors, [b"short"] * 4, [2, 2], 2)
    assert not bmrt_memcpy_d2s_parallel(p, [bytes(48)] * 4, tensors, [2, 2], 2)  # read-only
    dst, src = [tensors[0], tensors[2]], [tensors[1], tensors[3]]
    assert not bmrt_memcpy_d2d_byte_parallel(p, dst, [0, 40], src, [0, 0], [8, 16], [1, 1], 2)
    five = [bm_shape_t(5, [1, 1, 1, 1, 2])] * 2
    assert not bmrt_memcpy_d2d_stride_ex_parallel(
        p, dst, [0, 0], five, src, [0, 0], five, five, [1, 1], 2
    )  # up to 4 dims
    square = [bm_shape_t(2, [4, 4])] * 2
    strides = [bm_shape_t(2, [4, 1])] * 2
    assert not bmrt_memcpy_d2d_stride_ex_parallel(
        p, dst, [0, 0], strides, src, [0, 0], strides, square, [1, 1], 2
    )  # 64 bytes from 48
    byte = bm_tensor_t(BM_INT8, bm_shape_t(1, [48]), tensors[3].device_mem)
    assert not bmrt_memcpy_d2d_stride_ex_parallel(
        p, dst, [0, 0], strides, [src[0], byte], [0, 0], strides, [bm_shape_t(2, [3, 4])] * 2,
        [1, 1], 2,
    )  # fmt: skip
    back = [np.ones((3, 4), np.float32) for _ in range(4)]
    assert bmrt_memcpy_d2s_parallel(p, back, tensors, [2, 2], 2)
    assert all(not b.any() for b in back)  # every refusal left the zeros
