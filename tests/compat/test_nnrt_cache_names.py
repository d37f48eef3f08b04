"""OH_NNModel_HasCache and the ModelName extension naming cache files: a build through a cache
with ModelName writes ``<ModelName>cache_info.nncache`` beside crossrt's entry (NNRt's file
name), HasCache reads it, and a ConstructForCache build with ModelName restores that model,
not the newest entry of the directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crossrt.compat import nnrt as nn

pytestmark = pytest.mark.usefixtures("runtime_dir")
R = nn.OH_NN_ReturnCode
REF = nn.device_id("reference")


def model(op: int, dims: list[int]) -> Any:
    m = nn.OH_NNModel_Construct()
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, len(dims), dims)
    for _ in range(3):
        assert nn.OH_NNModel_AddTensor(m, t) == 0
    assert nn.OH_NNModel_AddOperation(m, op, [], [0, 1], [2]) == 0
    assert nn.OH_NNModel_SpecifyInputsAndOutputs(m, [0, 1], [2]) == 0
    assert nn.OH_NNModel_Finish(m) == 0
    return m


def build(c: Any, folder: Path, version: int, name: str | None) -> int:
    nn.OH_NNCompilation_SetDevice(c, REF)
    assert nn.OH_NNCompilation_SetCache(c, str(folder), version) == 0
    if name is not None:
        value = name.encode()
        assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", value, len(value)) == 0
    return int(nn.OH_NNCompilation_Build(c))


def run(c: Any, dims: list[int]) -> np.ndarray:
    e = nn.OH_NNExecutor_Construct(c)
    t = nn.OH_NN_Tensor(nn.OH_NN_FLOAT32, len(dims), dims)
    x = np.full(dims, 3, np.float32)
    y = np.full(dims, 2, np.float32)
    assert nn.OH_NNExecutor_SetInput(e, 0, t, x, x.nbytes) == 0
    assert nn.OH_NNExecutor_SetInput(e, 1, t, y, y.nbytes) == 0
    out = np.zeros(dims, np.float32)
    assert nn.OH_NNExecutor_SetOutput(e, 0, out, out.nbytes) == 0
    assert nn.OH_NNExecutor_Run(e) == 0
    nn.OH_NNExecutor_Destroy(e)
    return out


def test_model_name_names_the_cache_files_and_has_cache_reads_them(tmp_path: Path) -> None:
    assert nn.OH_NNModel_HasCache(str(tmp_path), "adder", 1) is False
    adder = nn.OH_NNCompilation_Construct(model(nn.OH_NN_OPS_ADD, [2, 2]))
    assert build(adder, tmp_path, 1, "adder") == 0
    muler = nn.OH_NNCompilation_Construct(model(nn.OH_NN_OPS_MUL, [2, 2]))
    assert build(muler, tmp_path, 1, "muler") == 0
    info = json.loads((tmp_path / "addercache_info.nncache").read_text())
    assert info["version"] == 1 and (tmp_path / f"{info['key']}.crm").exists()
    assert (tmp_path / "mulercache_info.nncache").exists()
    assert nn.OH_NNModel_HasCache(str(tmp_path), "adder", 1) is True
    assert nn.OH_NNModel_HasCache(str(tmp_path), "adder", 2) is False  # another version
    assert nn.OH_NNModel_HasCache(str(tmp_path), "other", 1) is False
    assert nn.OH_NNModel_HasCache(str(tmp_path / "missing"), "adder", 1) is False
    assert nn.OH_NNModel_HasCache(None, "adder", 1) is False
    assert nn.OH_NNModel_HasCache(str(tmp_path), None, 1) is False
    # ConstructForCache restores the named model, not the directory's newest entry.
    again = nn.OH_NNCompilation_ConstructForCache()
    assert build(again, tmp_path, 1, "adder") == 0
    np.testing.assert_array_equal(run(again, [2, 2]), np.full([2, 2], 5, np.float32))
    again = nn.OH_NNCompilation_ConstructForCache()
    assert build(again, tmp_path, 1, "muler") == 0
    np.testing.assert_array_equal(run(again, [2, 2]), np.full([2, 2], 6, np.float32))
    # A name nothing was cached under: INVALID_FILE, as an empty cache.
    again = nn.OH_NNCompilation_ConstructForCache()
    assert build(again, tmp_path, 1, "nobody") == R.OH_NN_INVALID_FILE
    # The entry behind a name gone: HasCache says so.
    (tmp_path / f"{info['key']}.crm").unlink()
    assert nn.OH_NNModel_HasCache(str(tmp_path), "adder", 1) is False


def test_a_model_name_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    for bad in ("../up", "a/b", ""):
        c = nn.OH_NNCompilation_Construct(model(nn.OH_NN_OPS_ADD, [2]))
        nn.OH_NNCompilation_SetDevice(c, REF)
        assert nn.OH_NNCompilation_SetCache(c, str(tmp_path), 1) == 0
        value = bad.encode() or b"\0"
        assert nn.OH_NNCompilation_AddExtensionConfig(c, "ModelName", value, len(value)) == 0
        assert nn.OH_NNCompilation_Build(c) == R.OH_NN_INVALID_PARAMETER, bad
    assert list(tmp_path.parent.glob("*.nncache")) == []
