"""crossrt.compat.bmruntime: bmlib's strided, gathered / scattered and cross-device copies, and
the device-wide syncs (``bm_device_sync``, ``bm_flush``). Every copy is compared byte for byte
with the same copy done in NumPy; device 0 is ``sim:0``, whose memory is not the host's."""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np
import pytest

from crossrt.compat.bmlib import POISON
from crossrt.compat.bmruntime import (
    BM_ERR_DEVNOTREADY,
    BM_ERR_FAILURE,
    BM_ERR_PARAM,
    BM_FLOAT32,
    BM_SUCCESS,
    bm_dev_free,
    bm_dev_request,
    bm_device_sync,
    bm_flush,
    bm_free_device,
    bm_handle_sync,
    bm_malloc_device_byte,
    bm_mem_flush_device_mem,
    bm_mem_invalidate_device_mem,
    bm_mem_mmap_device_mem,
    bm_mem_unmap_device_mem,
    bm_memcpy_c2c,
    bm_memcpy_d2d_stride,
    bm_memcpy_d2s,
    bm_memcpy_d2s_scatter,
    bm_memcpy_p2p,
    bm_memcpy_s2d,
    bm_memcpy_s2d_gather,
    bm_shape_t,
    bm_tensor_t,
    bmrt_create,
    bmrt_destroy,
    bmrt_launch_tensor,
    bmrt_load_bmodel,
    bmrt_tensor,
)
from crossrt.drivers import get_driver

pytestmark = pytest.mark.usefixtures("runtime_dir")

LOGGER = "crossrt.compat.bmruntime"


def _mem(handle, data: bytes) -> object:
    status, mem = bm_malloc_device_byte(handle, len(data))
    assert status == BM_SUCCESS
    assert bm_memcpy_s2d(handle, mem, data) == BM_SUCCESS
    return mem


def _read(handle, mem) -> bytes:
    out = bytearray(mem.size)
    assert bm_memcpy_d2s(handle, out, mem) == BM_SUCCESS
    return bytes(out)


# -- bm_memcpy_d2d_stride --------------------------------------------------------------------


def test_stride_copies_every_nth_element(handle) -> None:
    x = np.arange(12, dtype=np.float32) * 1.5
    src, dst = _mem(handle, x.tobytes()), _mem(handle, bytes(16))
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 3, 4, 4) == BM_SUCCESS
    assert _read(handle, dst) == x[::3].tobytes()
    b = bytes(range(16))
    src8, dst8 = _mem(handle, b), _mem(handle, bytes(8))
    assert bm_memcpy_d2d_stride(handle, dst8, 1, src8, 2, 8, 1) == BM_SUCCESS
    assert _read(handle, dst8) == b[::2]
    for mem in (src, dst, src8, dst8):
        bm_free_device(handle, mem)


def test_stride_spreads_bytes_into_words_keeping_the_rest(handle) -> None:
    src, dst = _mem(handle, bytes([1, 2, 3, 4])), _mem(handle, b"\xee" * 16)
    assert bm_memcpy_d2d_stride(handle, dst, 4, src, 1, 4, 1) == BM_SUCCESS
    expected = bytearray(b"\xee" * 16)
    expected[::4] = bytes([1, 2, 3, 4])
    assert _read(handle, dst) == bytes(expected)
    bm_free_device(handle, src)
    bm_free_device(handle, dst)


def test_stride_refusals_copy_nothing(handle, caplog: pytest.LogCaptureFixture) -> None:
    src, dst = _mem(handle, bytes(range(16))), _mem(handle, b"\xee" * 16)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert bm_memcpy_d2d_stride(handle, dst, 2, src, 1, 4, 1) == BM_ERR_PARAM  # bmlib's rule
        assert "dst_stride must be 1" in caplog.text
    assert bm_memcpy_d2d_stride(handle, dst, 4, src, 2, 4, 1) == BM_ERR_PARAM
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 0, 4, 1) == BM_ERR_PARAM
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 1, 4, 3) == BM_ERR_PARAM  # 1, 2 or 4
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 3, 6, 1) == BM_ERR_PARAM  # 18 > 16 bytes
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 1, 5, 4) == BM_ERR_PARAM  # 20 > 16 bytes
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 1, -1, 1) == BM_ERR_PARAM
    assert _read(handle, dst) == b"\xee" * 16
    bm_free_device(handle, src)
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 1, 4, 1) == BM_ERR_PARAM  # freed
    bm_free_device(handle, dst)
    bm_dev_free(handle)
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 1, 4, 1) == BM_ERR_DEVNOTREADY


# -- gather and scatter ----------------------------------------------------------------------


def test_gather_and_scatter_take_pieces_in_order(handle) -> None:
    pieces = [b"abcd", bytearray(b"efgh"), np.arange(4, dtype=np.uint8)]
    _, mem = bm_malloc_device_byte(handle, 16)
    assert bm_memcpy_s2d(handle, mem, b"\xee" * 16) == BM_SUCCESS
    args = [x for p in pieces for x in (p, 4)]
    assert bm_memcpy_s2d_gather(handle, mem, 6, *args) == BM_SUCCESS
    assert _read(handle, mem) == b"abcdefgh" + bytes(range(4)) + b"\xee" * 4
    a, b = bytearray(3), np.zeros(9, np.uint8)
    assert bm_memcpy_d2s_scatter(handle, mem, 4, a, 3, b, 9) == BM_SUCCESS
    assert bytes(a) + b.tobytes() == b"abcdefgh" + bytes(range(4))
    bm_free_device(handle, mem)


def test_gather_and_scatter_refusals_copy_nothing(handle) -> None:
    mem = _mem(handle, b"\xee" * 8)
    assert bm_memcpy_s2d_gather(handle, mem, 3, b"abcd", 4) == BM_ERR_PARAM  # argc counts args
    assert bm_memcpy_s2d_gather(handle, mem, 3, b"abcd", 4, b"x") == BM_ERR_PARAM  # odd
    assert bm_memcpy_s2d_gather(handle, mem, 4, b"abcd", 4, b"efghi", 5) == BM_ERR_PARAM  # > 8
    assert bm_memcpy_s2d_gather(handle, mem, 2, b"ab", 4) == BM_ERR_PARAM  # buffer too short
    assert _read(handle, mem) == b"\xee" * 8
    assert bm_memcpy_d2s_scatter(handle, mem, 2, b"readonly", 8) == BM_ERR_PARAM
    out = bytearray(9)
    assert bm_memcpy_d2s_scatter(handle, mem, 2, out, 9) == BM_ERR_PARAM  # more than mem
    assert out == bytes(9)
    bm_free_device(handle, mem)


def test_the_new_copies_keep_the_mmap_contract(handle) -> None:
    src, dst = _mem(handle, bytes(range(16))), _mem(handle, bytes(16))
    assert not handle.device.coherent  # sim: the mapping is a cache in front of the memory
    _, view = bm_mem_mmap_device_mem(handle, dst)
    assert bm_memcpy_d2d_stride(handle, dst, 1, src, 2, 8, 1) == BM_SUCCESS
    assert bytes(view[:8]) == bytes([POISON]) * 8  # stale until invalidated
    assert bm_mem_invalidate_device_mem(handle, dst) == BM_SUCCESS
    assert bytes(view[:8]) == bytes(range(0, 16, 2))
    view[8:12] = b"host"  # written through the mapping, not flushed
    assert bm_memcpy_s2d_gather(handle, dst, 2, b"abcd", 4) == BM_ERR_FAILURE  # would be lost
    assert bm_memcpy_d2d_stride(handle, src, 1, dst, 1, 4, 1) == BM_ERR_FAILURE  # unseen
    assert bm_mem_flush_device_mem(handle, dst) == BM_SUCCESS
    assert bm_memcpy_d2d_stride(handle, src, 1, dst, 4, 4, 1) == BM_SUCCESS
    assert _read(handle, src)[:4] == bytes([0, 8, ord("h"), 0])  # dst[0], [4], [8], [12]
    assert bm_mem_unmap_device_mem(handle, view, 16) == BM_SUCCESS
    bm_free_device(handle, src)
    bm_free_device(handle, dst)


# -- between devices -------------------------------------------------------------------------


def _pair(linked: bool) -> tuple[str, str]:
    """Two sim devices, directly linked to each other or not."""
    first, *others = get_driver("sim").devices()
    for other in others:
        if (other.id in first.links) == linked:
            return first.id, other.id
    pytest.skip(f"no sim device {'linked' if linked else 'unlinked'} to {first.id} in CROSSRT_SIM")


def test_p2p_copies_the_destinations_size_to_another_device() -> None:
    a, b = _pair(linked=False)
    _, h0 = bm_dev_request(a)
    _, h1 = bm_dev_request(b)
    data = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    src = _mem(h0, data)
    _, dst = bm_malloc_device_byte(h1, 48)
    assert bm_memcpy_p2p(h0, src, h1, dst) == BM_SUCCESS
    assert _read(h1, dst) == data[:48]
    assert bm_memcpy_p2p(h1, dst, h0, src) == BM_ERR_PARAM  # 64 bytes from a 48-byte source
    assert bm_memcpy_p2p(h0, src, h0, src) == BM_ERR_FAILURE  # one device: use d2d
    assert bm_memcpy_p2p(h0, dst, h1, src) == BM_ERR_PARAM  # each memory on the other device
    bm_free_device(h0, src)
    bm_free_device(h1, dst)
    bm_dev_free(h1)
    assert bm_memcpy_p2p(h0, src, h1, dst) == BM_ERR_DEVNOTREADY
    bm_dev_free(h0)


def test_c2c_copies_between_linked_devices_only() -> None:
    a, linked = _pair(linked=True)
    _, unlinked = _pair(linked=False)
    handles = [bm_dev_request(i)[1] for i in (a, linked, unlinked)]
    h0, h1, h2 = handles
    data = bytes(range(32))
    src = _mem(h0, data)
    _, dst = bm_malloc_device_byte(h1, 40)
    assert bm_memcpy_s2d(h1, dst, b"\xee" * 40) == BM_SUCCESS
    assert bm_memcpy_c2c(h0, h1, src, dst, True) == BM_SUCCESS
    assert _read(h1, dst) == data + b"\xee" * 8  # all of the source, to the start
    _, far = bm_malloc_device_byte(h2, 32)
    assert bm_memcpy_c2c(h0, h2, src, far, False) == BM_ERR_FAILURE  # two cards: p2p
    _, small = bm_malloc_device_byte(h1, 16)
    assert bm_memcpy_c2c(h0, h1, src, small, False) == BM_ERR_PARAM
    _, same = bm_malloc_device_byte(h0, 32)
    assert bm_memcpy_c2c(h0, h0, src, same, False) == BM_SUCCESS  # one chip: a plain copy
    assert _read(h0, same) == data
    for h, mem in ((h0, src), (h1, dst), (h2, far), (h1, small), (h0, same)):
        bm_free_device(h, mem)
    for h in handles:
        bm_dev_free(h)


# -- device-wide syncs -----------------------------------------------------------------------


@pytest.fixture
def slow_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that take 0.1 s of device time: an output read before its launch ends is not it."""
    sim = get_driver("sim")
    monkeypatch.setattr(sim, "config", dataclasses.replace(sim.config, op_us=100_000))


def _launch(handle, p, x: np.ndarray) -> bm_tensor_t:
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p, BM_FLOAT32, bm_shape_t.of(x.shape))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor(p, "double", inputs, 1, outputs, 1)
    return outputs[0]


def _result(handle, tensor: bm_tensor_t) -> np.ndarray:
    out = np.empty((2, 4), np.float32)
    assert bm_memcpy_d2s(handle, out, tensor.device_mem) == BM_SUCCESS
    return out


@pytest.mark.usefixtures("slow_sim")
def test_device_sync_waits_for_every_handle_and_thread_on_the_device(bmodel) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _, h_launch = bm_dev_request("sim:0")
    _, h_sync = bm_dev_request("sim:0")  # another handle of the same device
    status, other = bm_dev_request(_pair(linked=True)[1])  # another device
    assert status == BM_SUCCESS
    p, q = bmrt_create(h_launch), bmrt_create(other)
    assert bmrt_load_bmodel(p, bmodel) and bmrt_load_bmodel(q, bmodel)
    got: list[bm_tensor_t] = []
    thread = threading.Thread(target=lambda: got.append(_launch(h_launch, p, x)))
    thread.start()
    thread.join()  # launched from another thread, not synchronised
    elsewhere = _launch(other, q, x)
    assert h_launch.outstanding()
    assert bm_device_sync(h_sync) == BM_SUCCESS
    assert not h_launch.outstanding()  # seen to end
    np.testing.assert_array_equal(_result(h_launch, got[0]), 2 * x)
    assert other.outstanding()  # another device's launch is not this device's
    assert bm_handle_sync(other) == BM_SUCCESS
    np.testing.assert_array_equal(_result(other, elsewhere), 2 * x)
    bmrt_destroy(p)
    bmrt_destroy(q)
    for h in (h_launch, h_sync, other):
        bm_dev_free(h)
    assert bm_device_sync(h_sync) == BM_ERR_DEVNOTREADY


@pytest.mark.usefixtures("slow_sim")
def test_flush_waits_for_the_handles_launches(
    handle, bmodel, caplog: pytest.LogCaptureFixture
) -> None:
    x = np.ones((2, 4), np.float32)
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    out = _launch(handle, p, x)
    assert bm_flush(handle) is None  # void in C
    assert not handle.outstanding()
    np.testing.assert_array_equal(_result(handle, out), 2 * x)
    bmrt_destroy(p)
    bm_dev_free(handle)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert bm_flush(handle) is None
    assert "bm_flush" in caplog.text and "BM_ERR_DEVNOTREADY" in caplog.text
