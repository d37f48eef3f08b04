"""crossrt.compat.bmruntime beyond the seed's examples: each bm_status_t value's meaning,
the mapping both ways, bmlib's copies (offsets, d2d in dwords), the mmap contract across a
launch, bmrt_launch_data, and the shape and size helpers."""

from __future__ import annotations

import dataclasses
import struct
import threading

import numpy as np
import pytest

import crossrt
from crossrt import OutOfResourcesError, StatusCode
from crossrt.compat.bmlib import POISON
from crossrt.compat.bmruntime import (
    BM_ERR_BUSY,
    BM_ERR_DATA,
    BM_ERR_DEVNOTREADY,
    BM_ERR_FAILURE,
    BM_ERR_NOFEATURE,
    BM_ERR_NOMEM,
    BM_ERR_PARAM,
    BM_ERR_TIMEOUT,
    BM_FLOAT32,
    BM_INT8,
    BM_NOT_SUPPORTED,
    BM_STORE_2N,
    BM_STORE_4N,
    BM_SUCCESS,
    FROM_BM,
    TO_BM,
    ByteSize,
    Context,
    Count,
    IsSameShape,
    Network,
    bm_dev_free,
    bm_dev_getcount,
    bm_dev_request,
    bm_free_device,
    bm_handle_sync,
    bm_malloc_device_byte,
    bm_mem_flush_partial_device_mem,
    bm_mem_get_device_size,
    bm_mem_invalidate_partial_device_mem,
    bm_mem_mmap_device_mem,
    bm_mem_unmap_device_mem,
    bm_memcpy_d2d,
    bm_memcpy_d2s,
    bm_memcpy_d2s_partial_offset,
    bm_memcpy_s2d,
    bm_memcpy_s2d_partial,
    bm_memcpy_s2d_partial_offset,
    bm_memset_device,
    bm_memset_device_ext,
    bm_set_sync_timeout,
    bm_shape_t,
    bm_status_t,
    bm_tensor_t,
    bm_thread_sync,
    bm_thread_sync_from_core,
    bmrt_create,
    bmrt_create_ex,
    bmrt_destroy,
    bmrt_get_network_info,
    bmrt_get_network_name,
    bmrt_get_stage_index,
    bmrt_launch_data,
    bmrt_launch_tensor,
    bmrt_launch_tensor_ex,
    bmrt_launch_tensor_multi_cores,
    bmrt_load_bmodel,
    bmrt_load_bmodel_data,
    bmrt_shape,
    bmrt_shape_count,
    bmrt_shape_is_same,
    bmrt_tensor,
    bmrt_tensor_bytesize,
    bmrt_tensor_device_size,
    bmrt_tensor_ex,
    crossrt_status,
    status_of,
)
from crossrt.compat.bmruntime.status import NoFeatureError
from crossrt.compat.bmruntime.storemode import from_1n
from crossrt.drivers import get_driver
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")


def _x() -> np.ndarray:
    return np.arange(8, dtype=np.float32).reshape(2, 4)


def _launch(handle, p, x: np.ndarray) -> list[bm_tensor_t]:
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p, BM_FLOAT32, bm_shape_t.of(x.shape))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor(p, "double", inputs, 1, outputs, 1)
    return [inputs[0], outputs[0]]


# -- each status value's meaning -------------------------------------------------------------


def test_values_are_bmlibs() -> None:
    assert [(s.name, int(s)) for s in bm_status_t] == [
        ("BM_SUCCESS", 0),
        ("BM_ERR_DEVNOTREADY", 1),
        ("BM_ERR_FAILURE", 2),
        ("BM_ERR_TIMEOUT", 3),
        ("BM_ERR_PARAM", 4),
        ("BM_ERR_NOMEM", 5),
        ("BM_ERR_DATA", 6),
        ("BM_ERR_BUSY", 7),
        ("BM_ERR_NOFEATURE", 8),
        ("BM_NOT_SUPPORTED", 9),
    ]


def test_success_is_a_completed_call(handle) -> None:
    status, mem = bm_malloc_device_byte(handle, 16)
    assert status == BM_SUCCESS and bm_mem_get_device_size(mem) == 16
    assert bm_memcpy_s2d(handle, mem, bytes(range(16))) == BM_SUCCESS
    out = bytearray(16)
    assert bm_memcpy_d2s(handle, out, mem) == BM_SUCCESS and out == bytes(range(16))
    bm_free_device(handle, mem)


def test_devnotready_is_a_device_that_is_not_there_or_was_freed() -> None:
    status, count = bm_dev_getcount()
    assert status == BM_SUCCESS and count >= 1
    status, h = bm_dev_request(count)
    assert (status, h) == (BM_ERR_DEVNOTREADY, None)
    status, h = bm_dev_request(0)
    bm_dev_free(h)
    assert bm_malloc_device_byte(h, 8) == (BM_ERR_DEVNOTREADY, None)
    assert bm_thread_sync(h) == BM_ERR_DEVNOTREADY


def test_failure_is_a_load_whose_network_is_loaded_already(bmodel) -> None:
    with Context(0) as ctx:
        assert ctx.load_bmodel(bmodel) == BM_SUCCESS
        assert ctx.load_bmodel(bmodel) == BM_ERR_FAILURE  # network names are unique
        assert ctx.get_network_number() == 1


def test_timeout_is_a_sync_that_waited_past_the_limit(
    handle, p_bmrt, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = get_driver("sim")
    monkeypatch.setattr(sim, "config", dataclasses.replace(sim.config, op_us=500_000))
    tensors = _launch(handle, p_bmrt, _x())
    assert bm_set_sync_timeout(handle, 1) == BM_SUCCESS
    assert bm_thread_sync(handle) == BM_ERR_TIMEOUT  # the run takes 0.5 s of device time
    assert bm_set_sync_timeout(handle, 0) == BM_SUCCESS
    assert bm_thread_sync(handle) == BM_SUCCESS  # still pending: waited for now
    out = np.empty((2, 4), np.float32)
    assert bm_memcpy_d2s(handle, out, tensors[1].device_mem) == BM_SUCCESS
    np.testing.assert_array_equal(out, 2 * _x())


def test_param_is_an_argument_out_of_range(handle, p_bmrt) -> None:
    _, mem = bm_malloc_device_byte(handle, 8)
    assert bm_memcpy_s2d_partial(handle, mem, bytes(16), 16) == BM_ERR_PARAM
    assert bm_memcpy_s2d_partial_offset(handle, mem, bytes(4), 4, 6) == BM_ERR_PARAM
    assert bm_memcpy_s2d(handle, mem, bytes(4)) == BM_ERR_PARAM  # src shorter than the memory
    assert bm_memcpy_d2d(handle, mem, 0, mem, 4, 2) == BM_ERR_PARAM  # 2 dwords from byte 4
    assert bm_set_sync_timeout(handle, -1) == BM_ERR_PARAM
    vmem = bytearray(8)
    assert bm_mem_unmap_device_mem(handle, vmem, 8) == BM_ERR_PARAM  # not a mapping
    bm_free_device(handle, mem)


def test_nomem_is_more_than_the_device_has(handle) -> None:
    assert bm_malloc_device_byte(handle, handle.device.info.memory_bytes + 1) == (
        BM_ERR_NOMEM,
        None,
    )


def test_data_is_a_corrupt_bmodel(handle, bmodel) -> None:
    p = bmrt_create(handle)
    data = bytearray(bmodel.read_bytes())
    data[-1] ^= 0xFF  # a section's bytes no longer match their hash
    assert not bmrt_load_bmodel_data(p, data, len(data))
    with Context(handle) as ctx:
        assert ctx.load_bmodel(bytes(data)) == BM_ERR_DATA
        assert ctx.load_bmodel(b"not a bmodel at all") == BM_ERR_DATA
    bmrt_destroy(p)


def test_busy_is_cores_held_elsewhere() -> None:
    # A core owned by another process (EXEC_NC_BUSY) or a full queue: the mapping is all
    # this layer adds; tests/system/test_core_ownership.py makes a real one.
    assert status_of(OutOfResourcesError("held", code=StatusCode.EXEC_NC_BUSY)) == BM_ERR_BUSY
    assert status_of(OutOfResourcesError("full", code=StatusCode.QUEUE_FULL)) == BM_ERR_BUSY


def test_nofeature_is_a_feature_this_layer_lacks() -> None:
    # Every seed function this layer has works; the ones it lacks are absent (AttributeError
    # in Python, docs/compat-bmruntime.md says why), so only the mapping is left to test.
    assert status_of(NoFeatureError("no such feature")) == BM_ERR_NOFEATURE
    assert crossrt_status(BM_ERR_NOFEATURE) is StatusCode.UNSUPPORTED_OPERATOR


def _int8_net() -> crossrt.Executable:
    b = GraphBuilder("inc8")
    x = b.input("x", "int8", [3, 2])
    b.output(b.op("Add", [x, b.constant(np.int8(1))], outputs=["y"]))
    return crossrt.compile(b.finish(), "sim:0")


def _half_net() -> crossrt.Executable:
    b = GraphBuilder("neg16")
    x = b.input("x", "float16", [3, 2])
    b.output(b.op("Neg", [x], outputs=["y"]))
    return crossrt.compile(b.finish(), "sim:0")


def test_store_modes_lay_batches_into_words(handle) -> None:
    """BM_STORE_4N: byte b of a 32-bit word holds batch b (int8); 2N: half h holds batch h."""
    x8 = np.arange(6, dtype=np.int8).reshape(3, 2)
    x16 = np.arange(6, dtype=np.float16).reshape(3, 2)
    with Context(handle) as ctx:
        for exe in (_int8_net(), _half_net()):
            assert ctx.load_bmodel(exe.to_bytes()) == BM_SUCCESS
        with Network(ctx, "inc8") as net:
            _, mem4n = bm_malloc_device_byte(handle, 4 * 2)  # batch 3 padded to 4
            # 4N words: element 0 of batches 0..3, then element 1 of batches 0..3
            stored = np.int8([0, 2, 4, 0, 1, 3, 5, 0])
            assert bm_memcpy_s2d(handle, mem4n, stored) == BM_SUCCESS
            x = net.Inputs()[0]
            assert x.set_device_mem(mem4n) == BM_SUCCESS
            x.set_store_mode(BM_STORE_4N)
            y = net.Outputs()[0]
            _, out4n = bm_malloc_device_byte(handle, 8)
            assert y.set_device_mem(out4n) == BM_SUCCESS
            y.set_store_mode(BM_STORE_4N)
            assert net.Forward() == BM_SUCCESS
            got = np.empty(8, np.int8)
            assert bm_memcpy_d2s(handle, got, out4n) == BM_SUCCESS
            assert got.tolist() == [1, 3, 5, 0, 2, 4, 6, 0]  # x + 1, padded batch zero
            np.testing.assert_array_equal(got, from_1n(x8 + 1, 4).view(np.int8))
            for mem in (mem4n, out4n):
                bm_free_device(handle, mem)
        with Network(ctx, "neg16") as net:
            x = net.Inputs()[0]
            _, mem2n = bm_malloc_device_byte(handle, 4 * 2 * 2)
            assert bm_memcpy_s2d(handle, mem2n, from_1n(x16, 2)) == BM_SUCCESS
            assert x.set_device_mem(mem2n) == BM_SUCCESS
            x.set_store_mode(BM_STORE_2N)
            assert net.Forward() == BM_SUCCESS  # the output stays BM_STORE_1N
            y = np.empty((3, 2), np.float16)
            assert net.Outputs()[0].CopyTo(y) == BM_SUCCESS
            np.testing.assert_array_equal(y, -x16)
            bm_free_device(handle, mem2n)
            x.set_store_mode(BM_STORE_4N)  # 4N is for 8-bit types
            assert net.Forward() == BM_ERR_PARAM


def test_not_supported_is_a_bmodel_of_another_format(bmodel) -> None:
    data = bytearray(bmodel.read_bytes())
    data[8:12] = struct.pack("<I", 999)  # a newer container format
    with Context(0) as ctx:
        assert ctx.load_bmodel(bytes(data)) == BM_NOT_SUPPORTED


def test_the_mapping_both_ways() -> None:
    assert all(crossrt_status(s) is FROM_BM[s] for s in bm_status_t)
    assert set(FROM_BM) == set(bm_status_t)
    for code, status in TO_BM.items():  # each crossrt code and back lands on its meaning
        if status != BM_ERR_NOFEATURE:
            assert TO_BM.get(FROM_BM[status], BM_ERR_FAILURE) == status, code
    assert status_of(crossrt.ExecutionError("engine")) == BM_ERR_FAILURE
    assert status_of(crossrt.CompileError("x")) == BM_ERR_FAILURE  # no counterpart


# -- bmlib -----------------------------------------------------------------------------------


def test_offsets_and_d2d_counts_dwords(handle) -> None:
    # s2d_partial_offset: the offset is in the source (seed 004); d2s_partial_offset: in the
    # device memory.
    _, a = bm_malloc_device_byte(handle, 16)
    _, b = bm_malloc_device_byte(handle, 16)
    assert bm_memcpy_s2d(handle, a, bytes(range(16))) == BM_SUCCESS
    assert bm_memcpy_s2d(handle, b, bytes(16)) == BM_SUCCESS
    assert bm_memcpy_s2d_partial_offset(handle, a, bytes(range(100, 116)), 2, 14) == BM_SUCCESS
    assert bm_memcpy_s2d_partial_offset(handle, a, bytes(4), 2, 3) == BM_ERR_PARAM  # 1 left
    assert bm_memcpy_d2d(handle, b, 4, a, 8, 2) == BM_SUCCESS  # 2 dwords: 8 bytes
    out = bytearray(16)
    assert bm_memcpy_d2s(handle, out, b) == BM_SUCCESS
    assert out == bytes(4) + bytes(range(8, 16)) + bytes(4)
    assert bm_memcpy_d2s(handle, out, a) == BM_SUCCESS
    assert out[:3] == bytes([114, 115, 2])
    part = bytearray(3)
    assert bm_memcpy_d2s_partial_offset(handle, part, a, 3, 1) == BM_SUCCESS
    assert part == bytes([115, 2, 3])
    bm_free_device(handle, a)
    bm_free_device(handle, b)


def test_cpu_device_memory_is_coherent() -> None:
    status, h = bm_dev_request("cpu:0")
    assert status == BM_SUCCESS and h.device.coherent
    _, mem = bm_malloc_device_byte(h, 8)
    _, view = bm_mem_mmap_device_mem(h, mem)
    assert bm_memcpy_s2d(h, mem, b"abcdefgh") == BM_SUCCESS
    assert bytes(view) == b"abcdefgh"  # the memory itself: no invalidate needed
    assert bm_mem_unmap_device_mem(h, view, 8) == BM_SUCCESS
    bm_free_device(h, mem)
    bm_dev_free(h)


def test_a_launch_keeps_the_mmap_contract(handle, p_bmrt) -> None:
    x = _x()
    _, in_mem = bm_malloc_device_byte(handle, x.nbytes)
    _, out_mem = bm_malloc_device_byte(handle, x.nbytes)
    _, vin = bm_mem_mmap_device_mem(handle, in_mem)
    _, vout = bm_mem_mmap_device_mem(handle, out_mem)
    vin[:] = x.tobytes()
    inputs = [bm_tensor_t(BM_FLOAT32, bm_shape_t(2, [2, 4]), in_mem)]
    outputs = [bm_tensor_t(device_mem=out_mem)]
    # The host wrote the input without flushing: the device would not see it.
    assert not bmrt_launch_tensor_ex(p_bmrt, "double", inputs, 1, outputs, 1, True, False)
    assert bm_mem_flush_partial_device_mem(handle, in_mem, 0, x.nbytes) == BM_SUCCESS
    assert bmrt_launch_tensor_ex(p_bmrt, "double", inputs, 1, outputs, 1, True, False)
    assert bm_thread_sync(handle) == BM_SUCCESS
    assert bytes(vout) == bytes([POISON]) * x.nbytes  # stale until invalidated
    assert bm_mem_invalidate_partial_device_mem(handle, out_mem, 0, x.nbytes) == BM_SUCCESS
    np.testing.assert_array_equal(np.frombuffer(vout, np.float32).reshape(2, 4), 2 * x)
    for view, mem in ((vin, in_mem), (vout, out_mem)):
        assert bm_mem_unmap_device_mem(handle, view, x.nbytes) == BM_SUCCESS
        bm_free_device(handle, mem)


# -- bmrt ------------------------------------------------------------------------------------


def test_launch_data_runs_on_host_memory_synchronously(p_bmrt) -> None:
    x = _x()
    outputs: list = [None]
    shapes = [bm_shape_t()]
    assert bmrt_launch_data(
        p_bmrt, "double", [x], [bm_shape_t(2, [2, 4])], 1, outputs, shapes, 1, False
    )
    np.testing.assert_array_equal(outputs[0], 2 * x)
    assert shapes[0] == bm_shape_t(2, [2, 4])
    mine = [np.zeros((2, 4), np.float32)]
    assert bmrt_launch_data(
        p_bmrt, "double", [x], [bm_shape_t(2, [2, 4])], 1, mine, shapes, 1, True
    )
    np.testing.assert_array_equal(mine[0], 2 * x)
    small = [np.zeros(2, np.float32)]
    assert not bmrt_launch_data(
        p_bmrt, "double", [x], [bm_shape_t(2, [2, 4])], 1, small, shapes, 1, True
    )


def test_launch_refusals_return_false(handle, p_bmrt) -> None:
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p_bmrt, BM_FLOAT32, bm_shape_t(2, [2, 4]))
    assert not bmrt_launch_tensor(p_bmrt, "nosuch", inputs, 1, outputs, 1)
    assert not bmrt_launch_tensor(p_bmrt, "double", inputs, 2, outputs, 1)
    inputs[0].shape = bm_shape_t(2, [4, 4])  # not the network's shape
    assert not bmrt_launch_tensor(p_bmrt, "double", inputs, 1, outputs, 1)
    assert bm_thread_sync(handle) == BM_SUCCESS  # nothing was queued
    bm_free_device(handle, inputs[0].device_mem)
    assert bmrt_get_network_info(p_bmrt, "nosuch") is None


def test_network_info(p_bmrt) -> None:
    info = bmrt_get_network_info(p_bmrt, "double")
    assert (info.name, info.input_num, info.output_num, info.stage_num) == ("double", 1, 1, 1)
    assert info.input_names == ["x"] and info.output_dtypes == [BM_FLOAT32]
    assert info.max_input_bytes == [32] and info.max_output_bytes == [32]
    assert info.input_scales == [1.0] and info.output_zero_point == [0]
    assert info.stages[0].input_shapes == [bm_shape_t(2, [2, 4])]


def test_shape_and_size_helpers(handle, p_bmrt) -> None:
    shape = bm_shape_t()
    bmrt_shape(shape, [4, 3, 228, 228], 4)
    assert shape == bm_shape_t(4, [4, 3, 228, 228]) and bmrt_shape_count(shape) == 4 * 3 * 228 * 228
    assert bmrt_shape_count(bm_shape_t()) == 1 and Count(bm_shape_t()) == 1
    assert bmrt_shape_is_same(bm_shape_t(2, [2, 4]), bm_shape_t(2, [2, 4, 9]))  # num_dims
    assert not IsSameShape(bm_shape_t(2, [2, 4]), bm_shape_t(3, [2, 4, 1]))
    with pytest.raises(crossrt.InvalidArgumentError):
        bm_shape_t(9, [1] * 9)
    t = bm_tensor_t()
    bmrt_tensor(t, p_bmrt, BM_INT8, bm_shape_t(2, [3, 5]))
    assert bmrt_tensor_bytesize(t) == 15 == ByteSize(t) == bmrt_tensor_device_size(t)
    assert ByteSize(BM_FLOAT32) == 4 and ByteSize(t.device_mem) == 15 and Count(t) == 15
    bm_free_device(handle, t.device_mem)
    assert bmrt_create_ex([], 0) is None


def test_tensor_copies_check_the_range(handle, p_bmrt) -> None:
    ctx = Context(handle)
    assert ctx.load_bmodel(p_bmrt.networks["double"].executable.to_bytes()) == BM_SUCCESS
    with Network(ctx, "double") as net:
        x = net.Input("x")
        assert x is not None and x.ByteSize() == 32 and x.num_elements() == 8
        assert x.CopyFrom(_x()) == BM_SUCCESS
        assert x.CopyFrom(b"\x00" * 8, 8, 28) == BM_ERR_PARAM
        assert x.CopyFrom(np.float32([100, 101]), 8, 24) == BM_SUCCESS  # elements 6 and 7
        _, small = bm_malloc_device_byte(handle, 16)
        assert x.set_device_mem(small) == BM_ERR_PARAM
        assert net.Forward() == BM_SUCCESS
        y = np.empty(2, np.float32)
        assert net.Output("y").CopyTo(y, 8, 24) == BM_SUCCESS
        assert y.tolist() == [200, 202]
        assert net.Output("nosuch") is None
        bm_free_device(handle, small)
    ctx.close()


def test_a_dynamic_networks_outputs_are_made_per_forward_and_freed_by_the_next(handle) -> None:
    b = GraphBuilder("dyn")
    x = b.input("x", "float32", ["N", 4])
    b.output(b.op("Neg", [x], outputs=["y"]))
    exe = crossrt.compile(b.finish(), "sim:0")
    with Context(handle) as ctx:
        assert ctx.load_bmodel(exe.to_bytes()) == BM_SUCCESS
        with Network(ctx, "dyn") as net:
            assert net.info().is_dynamic and net.info().max_output_bytes == [0]
            used = []
            for n in (3, 5, 2):
                data = np.arange(4 * n, dtype=np.float32)
                assert net.Inputs()[0].Reshape(bm_shape_t(2, [n, 4])) == BM_SUCCESS
                _, mem = bm_malloc_device_byte(handle, data.nbytes)
                assert net.Inputs()[0].set_device_mem(mem) == BM_SUCCESS
                assert net.Inputs()[0].CopyFrom(data) == BM_SUCCESS
                assert net.Forward() == BM_SUCCESS
                y = net.Outputs()[0]
                assert y.tensor().shape == bm_shape_t(2, [n, 4])
                out = np.empty(4 * n, np.float32)
                assert y.CopyTo(out) == BM_SUCCESS
                np.testing.assert_array_equal(out, -data)
                bm_free_device(handle, mem)
                used.append(handle.device.stats().bytes_in_use)
            assert used[2] < used[1]  # the 5-row output was freed by the next Forward


def test_launch_on_chosen_cores_loads_the_network_there(handle, p_bmrt) -> None:
    x = _x()
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p_bmrt, BM_FLOAT32, bm_shape_t(2, [2, 4]))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor_multi_cores(
        p_bmrt, "double", inputs, 1, outputs, 1, False, False, [1], 1
    )
    assert bm_thread_sync_from_core(handle, 1) == BM_SUCCESS
    out = np.empty((2, 4), np.float32)
    assert bm_memcpy_d2s(handle, out, outputs[0].device_mem) == BM_SUCCESS
    np.testing.assert_array_equal(out, 2 * x)
    assert p_bmrt.networks["double"].on_cores[("sim:0", (1,))].cores == (1,)
    assert p_bmrt.networks["double"].model.cores == (0, 1)  # the load's own: every core
    cores = handle.device.info.cores
    assert not bmrt_launch_tensor_multi_cores(
        p_bmrt, "double", inputs, 1, outputs, 1, False, False, [cores], 1
    )  # no such core
    for t in (*inputs, *outputs):
        bm_free_device(handle, t.device_mem)


def test_handle_sync_waits_for_every_threads_launches(
    handle, p_bmrt, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = get_driver("sim")
    monkeypatch.setattr(sim, "config", dataclasses.replace(sim.config, op_us=100_000))
    launched: list[list[bm_tensor_t]] = []
    thread = threading.Thread(target=lambda: launched.append(_launch(handle, p_bmrt, _x())))
    thread.start()
    thread.join()  # the other thread launched and did not sync
    assert bm_thread_sync(handle) == BM_SUCCESS  # this thread launched nothing
    assert bm_handle_sync(handle) == BM_SUCCESS
    out = np.empty((2, 4), np.float32)
    assert bm_memcpy_d2s(handle, out, launched[0][1].device_mem) == BM_SUCCESS
    np.testing.assert_array_equal(out, 2 * _x())


def test_memset_repeats_a_32_bit_value_or_a_pattern(handle) -> None:
    _, mem = bm_malloc_device_byte(handle, 10)
    assert bm_memset_device(handle, 0x04030201, mem) == BM_SUCCESS
    out = bytearray(10)
    assert bm_memcpy_d2s(handle, out, mem) == BM_SUCCESS
    assert out == bytes([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    assert bm_memset_device_ext(handle, b"\xaa\xbb", 2, mem) == BM_SUCCESS
    assert bm_memcpy_d2s(handle, out, mem) == BM_SUCCESS and out == b"\xaa\xbb" * 5
    assert bm_memset_device_ext(handle, b"\x01", 5, mem) == BM_ERR_PARAM
    bm_free_device(handle, mem)


def test_stage_index_and_network_name(bmodel, handle) -> None:
    b = GraphBuilder("staged")
    x = b.input("x", "float32", ["N", 4])
    b.output(b.op("Neg", [x], outputs=["y"]))
    exe = crossrt.compile(b.finish(), "sim:0", stages=[{"x": [1, 4]}, {"x": [3, 4]}])
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel) and bmrt_load_bmodel_data(
        p, exe.to_bytes(), len(exe.to_bytes())
    )
    assert [bmrt_get_network_name(p, i) for i in range(3)] == ["double", "staged", None]
    t = bm_tensor_t(BM_FLOAT32, bm_shape_t(2, [3, 4]))
    assert bmrt_get_stage_index(p, "staged", [t]) == 1
    t.shape = bm_shape_t(2, [2, 4])
    assert bmrt_get_stage_index(p, "staged", [t]) == -1
    tensor = bm_tensor_t()
    bmrt_tensor_ex(tensor, p, 1, BM_FLOAT32, bm_shape_t(1, [4]))  # a runtime of one device
    assert tensor.device_mem is None
    bmrt_destroy(p)


def test_a_runtime_over_two_devices_runs_where_the_inputs_lie(bmodel) -> None:
    _, h0 = bm_dev_request(0)
    _, h1 = bm_dev_request(1)
    p = bmrt_create_ex([h0, h1], 2)
    assert bmrt_load_bmodel(p, bmodel)
    outputs = []
    for devid, h in enumerate((h0, h1)):
        inputs, out = [bm_tensor_t()], [bm_tensor_t()]
        bmrt_tensor_ex(inputs[0], p, devid, BM_FLOAT32, bm_shape_t(2, [2, 4]))
        assert inputs[0].device_mem.device == h.device.id
        assert bm_memcpy_s2d(h, inputs[0].device_mem, (devid + 1) * _x()) == BM_SUCCESS
        assert bmrt_launch_tensor(p, "double", inputs, 1, out, 1)
        assert out[0].device_mem.device == h.device.id  # the output lies there too
        outputs.append(out[0])
    for devid, h in enumerate((h0, h1)):
        assert bm_thread_sync(h) == BM_SUCCESS
        result = np.empty((2, 4), np.float32)
        assert bm_memcpy_d2s(h, result, outputs[devid].device_mem) == BM_SUCCESS
        np.testing.assert_array_equal(result, 2 * (devid + 1) * _x())
    bmrt_destroy(p)
    bm_dev_free(h0)
    bm_dev_free(h1)
