"""Seed 004's facts and variables (issue 27): max_*_bytes of a dynamic network from its
declared bounds, the device facts (bm_dev_query, bm_get_chipid, bm_get_misc_info, cards,
bm_get_stat as bm_dev_stat_t), bmlib's logging calls, and the BMRT_* / BMRUNTIME_*
environment variables."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt.compat.bmruntime import (
    BM_ERR_DEVNOTREADY,
    BM_FLOAT32,
    BM_SUCCESS,
    BMLIB_LOG_ERROR,
    BMLIB_LOG_WARNING,
    CROSSRT_CHIPID,
    Context,
    Network,
    bm_dev_getcount,
    bm_dev_query,
    bm_free_device,
    bm_get_card_id,
    bm_get_card_num,
    bm_get_chipid,
    bm_get_misc_info,
    bm_get_stat,
    bm_malloc_device_byte,
    bm_memcpy_d2s,
    bm_memcpy_s2d,
    bm_set_debug_mode,
    bm_shape_t,
    bm_tensor_t,
    bm_thread_sync,
    bmlib_log_get_level,
    bmlib_log_set_callback,
    bmlib_log_set_level,
    bmrt_create,
    bmrt_destroy,
    bmrt_get_network_info,
    bmrt_launch_data,
    bmrt_launch_tensor,
    bmrt_launch_tensor_ex,
    bmrt_load_bmodel,
    bmrt_load_bmodel_data,
    bmrt_tensor,
)

pytestmark = pytest.mark.usefixtures("runtime_dir")

MB = 1 << 20


def _neg(ranges: str | None) -> bytes:
    """y = -x, x of shape [N, 4], N declared in 1..8 when ``ranges`` says so."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])],
        "neg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    if ranges is not None:
        proto.metadata_props.add(key="crossrt.dim_ranges", value=ranges)
    onnx.checker.check_model(proto)
    return crossrt.compile(crossrt.load_model(proto), "sim:0").to_bytes()


@pytest.fixture
def crossrt_log_level() -> Iterator[None]:
    """These tests set the crossrt logger's level and handlers: put them back."""
    logger = logging.getLogger("crossrt")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    for h in list(logger.handlers):
        if h not in handlers:
            logger.removeHandler(h)


# -- max_*_bytes of a dynamic network ----------------------------------------------------------


def test_a_dynamic_networks_max_bytes_come_from_its_declared_ranges(handle) -> None:
    p = bmrt_create(handle)
    data = _neg('{"x": [[1, 8], [4, 4]]}')
    assert bmrt_load_bmodel_data(p, data, len(data))
    info = bmrt_get_network_info(p, "neg")
    assert info is not None and info.is_dynamic
    assert info.max_input_bytes == [8 * 4 * 4] and info.max_output_bytes == [8 * 4 * 4]
    # user_mem sized from them holds the largest output
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    ins, outs = [bm_tensor_t()], [bm_tensor_t()]
    _, in_mem = bm_malloc_device_byte(handle, info.max_input_bytes[0])
    _, out_mem = bm_malloc_device_byte(handle, info.max_output_bytes[0])
    ins[0].dtype, ins[0].shape, ins[0].device_mem = BM_FLOAT32, bm_shape_t.of([8, 4]), in_mem
    outs[0].device_mem = out_mem
    assert bm_memcpy_s2d(handle, in_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor_ex(p, "neg", ins, 1, outs, 1, True, False)
    assert bm_thread_sync(handle) == BM_SUCCESS
    y = np.empty_like(x)
    assert bm_memcpy_d2s(handle, y, out_mem) == BM_SUCCESS
    np.testing.assert_array_equal(y, -x)
    bm_free_device(handle, in_mem)
    bm_free_device(handle, out_mem)
    bmrt_destroy(p)


def test_a_bounded_dynamic_network_runs_in_the_memory_network_allocates(handle) -> None:
    # Network allocates max_*_bytes for each input and output, as BMRuntime does: with the
    # bounds, a dynamic network's outputs go into that memory, not memory made per Forward.
    with Context(handle) as ctx:
        assert ctx.load_bmodel(_neg('{"x": [[1, 8], [4, 4]]}')) == BM_SUCCESS
        with Network(ctx, "neg") as net:
            out_mem = net.Outputs()[0].tensor().device_mem
            assert out_mem is not None and out_mem.size == 8 * 4 * 4
            for n in (3, 8):
                x = np.arange(4 * n, dtype=np.float32)
                assert net.Inputs()[0].Reshape(bm_shape_t(2, [n, 4])) == BM_SUCCESS
                assert net.Inputs()[0].CopyFrom(x) == BM_SUCCESS
                assert net.Forward() == BM_SUCCESS
                y = net.Outputs()[0]
                assert y.tensor().device_mem is out_mem
                assert y.tensor().shape == bm_shape_t(2, [n, 4])
                out = np.empty(4 * n, np.float32)
                assert y.CopyTo(out) == BM_SUCCESS
                np.testing.assert_array_equal(out, -x)


def test_without_a_bound_max_bytes_is_0_and_user_mem_is_refused_saying_why(handle, caplog) -> None:
    p = bmrt_create(handle)
    data = _neg(None)
    assert bmrt_load_bmodel_data(p, data, len(data))
    info = bmrt_get_network_info(p, "neg")
    assert info.max_input_bytes == [0] and info.max_output_bytes == [0]
    ins, outs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(ins[0], p, BM_FLOAT32, bm_shape_t.of([2, 4]))
    with caplog.at_level(logging.WARNING, "crossrt.compat.bmruntime"):
        assert not bmrt_launch_tensor_ex(p, "neg", ins, 1, outs, 1, True, False)
    assert "crossrt.dim_ranges" in caplog.text and "user_mem=false" in caplog.text
    bm_free_device(handle, ins[0].device_mem)
    bmrt_destroy(p)


# -- device facts ------------------------------------------------------------------------------


def test_device_facts(handle) -> None:
    assert bm_dev_query(0) == BM_SUCCESS
    assert bm_dev_query(bm_dev_getcount()[1]) == BM_ERR_DEVNOTREADY
    assert bm_get_chipid(handle) == (BM_SUCCESS, CROSSRT_CHIPID)
    status, misc = bm_get_misc_info(handle)
    assert status == BM_SUCCESS and misc.chipid == CROSSRT_CHIPID
    assert misc.ddr0a_size == handle.device.info.memory_bytes and misc.device == "sim:0"
    assert misc.pcie_soc_mode == 0  # sim memory is not the host's, as on a PCIe card
    assert bm_get_card_num() == bm_dev_getcount()
    assert bm_get_card_id(handle) == (BM_SUCCESS, 0)


def test_bm_get_stat_has_bm_dev_stat_ts_fields(handle) -> None:
    status, before = bm_get_stat(handle)
    assert status == BM_SUCCESS
    assert before.mem_total == -(-handle.device.stats().limit_bytes // MB)
    assert before.tpu_util == 0 and before.heap_num == 1
    _, mem = bm_malloc_device_byte(handle, 3 * MB)
    _, after = bm_get_stat(handle)
    assert after.mem_used >= before.mem_used + 3
    assert after.heap_stat[0].mem_avail == after.mem_total - after.mem_used
    bm_free_device(handle, mem)


def test_tpu_util_is_100_while_a_launch_on_the_device_runs(handle) -> None:
    running: Future[None] = Future()  # a launch the device has not finished: queued, as
    handle.launched(running, lambda: None)  # bmrt_launch_tensor records one
    assert bm_get_stat(handle)[1].tpu_util == 100
    running.set_result(None)
    assert bm_get_stat(handle)[1].tpu_util == 0
    assert bm_thread_sync(handle) == BM_SUCCESS


# -- logging -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("crossrt_log_level")
def test_log_level_and_callback_govern_crossrts_messages() -> None:
    got: list[tuple[int, str]] = []
    assert bmlib_log_set_callback(lambda level, msg: got.append((level, msg))) == BM_SUCCESS
    assert bmlib_log_set_level(BMLIB_LOG_ERROR) == BM_SUCCESS
    assert bmlib_log_get_level() == BMLIB_LOG_ERROR
    assert bm_dev_query(10_000) == BM_ERR_DEVNOTREADY  # logged as a warning: dropped
    assert got == []
    assert bmlib_log_set_level(BMLIB_LOG_WARNING) == BM_SUCCESS
    assert bm_dev_query(10_000) == BM_ERR_DEVNOTREADY
    assert got and got[0][0] == BMLIB_LOG_WARNING and "10000" in got[0][1]
    assert bmlib_log_set_level(None) != BM_SUCCESS
    assert bmlib_log_set_callback(None) != BM_SUCCESS


@pytest.mark.usefixtures("crossrt_log_level")
def test_debug_mode_logs_crossrt_at_debug(handle) -> None:
    assert bm_set_debug_mode(handle, 1) == BM_SUCCESS
    assert logging.getLogger("crossrt").getEffectiveLevel() == logging.DEBUG
    assert bm_set_debug_mode(handle, 0) == BM_SUCCESS
    assert logging.getLogger("crossrt").getEffectiveLevel() == logging.WARNING
    assert bm_set_debug_mode(handle, 7) != BM_SUCCESS


# -- environment variables ---------------------------------------------------------------------


def _run_double(handle, p, x: np.ndarray) -> None:
    ins, outs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(ins[0], p, BM_FLOAT32, bm_shape_t.of(x.shape))
    assert bm_memcpy_s2d(handle, ins[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor(p, "double", ins, 1, outs, 1)
    assert bm_thread_sync(handle) == BM_SUCCESS
    bm_free_device(handle, ins[0].device_mem)
    bm_free_device(handle, outs[0].device_mem)


def test_save_io_tensors_writes_each_launchs_inputs_and_outputs(
    handle, bmodel: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BMRT_SAVE_IO_TENSORS", "1")
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _run_double(handle, p, x)
    bmrt_destroy(p)
    assert (tmp_path / "input_ref_data.dat.bmrt").read_bytes() == x.tobytes()
    assert (tmp_path / "output_ref_data.dat.bmrt").read_bytes() == (2 * x).tobytes()


def test_save_io_tensors_covers_launch_data(
    handle, bmodel: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BMRT_SAVE_IO_TENSORS", "1")
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    x = np.full((2, 4), 3, np.float32)
    outs: list = [None]
    assert bmrt_launch_data(
        p, "double", [x], [bm_shape_t.of([2, 4])], 1, outs, [bm_shape_t()], 1, False
    )
    bmrt_destroy(p)
    assert (tmp_path / "input_ref_data.dat.bmrt").read_bytes() == x.tobytes()
    assert (tmp_path / "output_ref_data.dat.bmrt").read_bytes() == (2 * x).tobytes()


def test_enable_profile_writes_a_trace_at_destroy(
    handle, bmodel: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BMRUNTIME_ENABLE_PROFILE", "1")
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    _run_double(handle, p, np.ones((2, 4), np.float32))
    assert not list(tmp_path.glob("bmprofile_data-*"))
    bmrt_destroy(p)
    (trace,) = tmp_path.glob("bmprofile_data-*.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "infer" for e in events)


def test_log_version_logs_crossrts_version_at_create(handle, monkeypatch, caplog) -> None:
    monkeypatch.setenv("BMRT_LOG_VERSION", "1")
    with caplog.at_level(logging.INFO, "crossrt.compat.bmruntime"):
        p = bmrt_create(handle)
    assert f"crossrt {crossrt.__version__}" in caplog.text
    bmrt_destroy(p)


def test_sophgo_variables_not_read_and_share_mem_are_warned_of_once(
    handle, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27.4: BMRUNTIME_USING_FAST_ALLREDUCE and BM_RUNTIME_SHARE_MEM changed nothing,
    silently."""
    from crossrt.compat.bmruntime import BM_RUNTIME_SHARE_MEM, bmrt_set_flags, envvars

    caplog.set_level(logging.WARNING, logger="crossrt")  # another test may have raised it
    monkeypatch.setattr(envvars, "_warned", set())
    monkeypatch.setenv("BMRUNTIME_USING_FAST_ALLREDUCE", "1")
    monkeypatch.setenv("BMRT_SAVE_IO_TENSORS", "0")  # read: never warned of
    for _ in range(2):
        p = bmrt_create(handle)
        bmrt_set_flags(p, int(BM_RUNTIME_SHARE_MEM))
        bmrt_destroy(p)
    text = [r.getMessage() for r in caplog.records if "no effect here" in r.getMessage()]
    assert len(text) == 2, text
    assert any("BMRUNTIME_USING_FAST_ALLREDUCE" in t for t in text)
    assert any("BM_RUNTIME_SHARE_MEM" in t for t in text)
