"""bmrt_test's loop, ported: a BMRuntime program saves a launch's tensors with
BMRT_SAVE_IO_TENSORS=1, and ``crossrt verify BMODEL --compare DIR`` checks the bmodel against
them (seed 004: bmrt_test --compare over input_ref_data.dat / output_ref_data.dat)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crossrt.compat.bmruntime import (
    BM_FLOAT32,
    BM_SUCCESS,
    bm_free_device,
    bm_memcpy_s2d,
    bm_shape_t,
    bm_tensor_t,
    bm_thread_sync,
    bmrt_create,
    bmrt_destroy,
    bmrt_launch_tensor,
    bmrt_load_bmodel,
    bmrt_tensor,
)
from crossrt.tools import verify

pytestmark = pytest.mark.usefixtures("runtime_dir")


def test_saved_io_tensors_are_reference_data_for_verify_compare(
    handle, bmodel: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BMRT_SAVE_IO_TENSORS", "1")
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    ins, outs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(ins[0], p, BM_FLOAT32, bm_shape_t.of(x.shape))
    assert bm_memcpy_s2d(handle, ins[0].device_mem, x) == BM_SUCCESS
    assert bmrt_launch_tensor(p, "double", ins, 1, outs, 1)
    assert bm_thread_sync(handle) == BM_SUCCESS
    bm_free_device(handle, ins[0].device_mem)
    bm_free_device(handle, outs[0].device_mem)
    bmrt_destroy(p)
    argv = [str(bmodel), "--compare", str(tmp_path), "--shape", "x=2x4", "--json"]
    assert verify.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["result"] for r in report["targets"]] == ["PASS"]
    assert report["reference_files"] == [
        str(tmp_path / "input_ref_data.dat.bmrt"),
        str(tmp_path / "output_ref_data.dat.bmrt"),
    ]
    saved = tmp_path / "output_ref_data.dat.bmrt"
    saved.write_bytes((3 * x).tobytes())  # not what the network computes
    assert verify.main(argv) == 1
