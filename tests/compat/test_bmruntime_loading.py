"""crossrt.compat.bmruntime: loading a bmodel into device memory the caller allocated
(``bmrt_get_bmodel_info``, ``bmrt_load_bmodel_with_mem``), encrypted ones
(``bmrt_load_bmodel_with_decrypt`` / ``_lib``), and the runtime's flags. Outputs are compared
bit for bit with crossrt's own ``Runtime.load(exe).run(...)``."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_FLOAT32,
    BM_RUNTIME_AUTO,
    BM_RUNTIME_CHECK_MEM,
    BM_RUNTIME_SHARE_MEM,
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
    bmrt_create,
    bmrt_destroy,
    bmrt_get_bmodel_data_info,
    bmrt_get_bmodel_info,
    bmrt_get_flags,
    bmrt_get_network_names,
    bmrt_launch_tensor,
    bmrt_load_bmodel,
    bmrt_load_bmodel_data,
    bmrt_load_bmodel_data_with_mem,
    bmrt_load_bmodel_with_decrypt,
    bmrt_load_bmodel_with_decrypt_lib,
    bmrt_load_bmodel_with_mem,
    bmrt_set_flags,
    bmrt_tensor,
    mem_info_t,
    memory_t,
)
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")

LOGGER = "crossrt.compat.bmruntime"
WEIGHT = 1234.5  # a constant whose bytes are easy to find in the file
KEY = 0x5A


def affine() -> crossrt.Model:
    """y = x * w + WEIGHT: outputs that depend on the weights the bmodel carries."""
    b = GraphBuilder("affine")
    x = b.input("x", "float32", [2, 4])
    w = b.constant(np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32), name="w")
    c = b.constant(np.full((2, 4), WEIGHT, np.float32), name="c")
    b.output(b.op("Add", [b.op("Mul", [x, w]), c], outputs=["y"]))
    return b.finish()


@pytest.fixture(scope="module")
def exe() -> crossrt.Executable:
    return crossrt.compile(affine(), "sim:0")


@pytest.fixture(scope="module")
def bmodel(exe: crossrt.Executable, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bm") / "affine.crm"
    exe.save(path)
    return path


@pytest.fixture(scope="module")
def encrypted(bmodel: Path) -> Path:
    path = bmodel.with_name("affine.crm.enc")
    path.write_bytes(bytes(b ^ KEY for b in bmodel.read_bytes()))
    return path


@pytest.fixture
def p_bmrt(handle) -> Iterator:
    p = bmrt_create(handle)
    yield p
    bmrt_destroy(p)


X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


def _reference(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        return rt.load(exe, "sim:0").run({"x": X})["y"]


def _run(handle, p) -> np.ndarray | None:
    """One launch of "affine" on X; None when the launch is refused."""
    inputs, outputs = [bm_tensor_t()], [bm_tensor_t()]
    bmrt_tensor(inputs[0], p, BM_FLOAT32, bm_shape_t.of(X.shape))
    assert bm_memcpy_s2d(handle, inputs[0].device_mem, X) == BM_SUCCESS
    try:
        if not bmrt_launch_tensor(p, "affine", inputs, 1, outputs, 1):
            return None
        assert bm_thread_sync(handle) == BM_SUCCESS
        y = np.empty((2, 4), np.float32)
        assert bm_memcpy_d2s(handle, y, outputs[0].device_mem) == BM_SUCCESS
        bm_free_device(handle, outputs[0].device_mem)
        return y
    finally:
        bm_free_device(handle, inputs[0].device_mem)


# -- bmrt_get_bmodel_info and bmrt_load_bmodel_with_mem ---------------------------------------


def test_bmodel_info_asks_room_for_the_bmodel(bmodel: Path, tmp_path: Path) -> None:
    info = mem_info_t(neuron_mem=memory_t(size=99))
    assert bmrt_get_bmodel_info(bmodel, info)
    size = bmodel.stat().st_size
    assert info.coeff_mem.size >= size and info.coeff_mem.size % 128 == 0
    assert info.coeff_mem.size - size < 128 and info.coeff_mem.addr is None
    assert all(m.size == 0 for n, m in info.memories().items() if n != "coeff_mem")
    data = bmodel.read_bytes()
    again = mem_info_t()
    assert bmrt_get_bmodel_data_info(data, len(data), again) and again == info
    assert not bmrt_get_bmodel_info(tmp_path / "missing.crm", mem_info_t())
    assert not bmrt_get_bmodel_data_info(b"not a bmodel", 12, mem_info_t())
    assert not bmrt_get_bmodel_data_info(data, len(data) + 1, mem_info_t())


def test_load_with_mem_lives_in_the_callers_memory(
    handle, p_bmrt, bmodel: Path, exe: crossrt.Executable
) -> None:
    info = mem_info_t()
    assert bmrt_get_bmodel_info(bmodel, info)
    status, coeff = bm_malloc_device_byte(handle, info.coeff_mem.size)
    assert status == BM_SUCCESS
    info.coeff_mem.addr = coeff
    in_use = handle.device.stats().bytes_in_use
    assert bmrt_load_bmodel_with_mem(p_bmrt, bmodel, info)
    assert handle.device.stats().bytes_in_use == in_use  # the runtime allocated nothing
    placed = bytearray(coeff.size)
    assert bm_memcpy_d2s(handle, placed, coeff) == BM_SUCCESS
    data = bmodel.read_bytes()
    assert bytes(placed[: len(data)]) == data
    y = _run(handle, p_bmrt)
    assert y is not None
    np.testing.assert_array_equal(y, _reference(exe))
    bm_free_device(handle, coeff)
    assert _run(handle, p_bmrt) is None  # its weights are gone


def test_load_data_with_mem_and_its_refusals(
    handle, p_bmrt, bmodel: Path, exe: crossrt.Executable, caplog: pytest.LogCaptureFixture
) -> None:
    data = bmodel.read_bytes()
    info = mem_info_t()
    assert bmrt_get_bmodel_data_info(data, len(data), info)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not bmrt_load_bmodel_data_with_mem(p_bmrt, data, len(data), info)  # no addr
    assert "bmrt_get_bmodel_info" in caplog.text
    _, small = bm_malloc_device_byte(handle, info.coeff_mem.size - 128)
    info.coeff_mem.addr = small
    assert not bmrt_load_bmodel_data_with_mem(p_bmrt, data, len(data), info)  # too small
    status, elsewhere = bm_dev_request("sim:1")
    assert status == BM_SUCCESS
    _, far = bm_malloc_device_byte(elsewhere, info.coeff_mem.size)
    info.coeff_mem.addr = far
    assert not bmrt_load_bmodel_data_with_mem(p_bmrt, data, len(data), info)  # another device
    assert not bmrt_load_bmodel_data_with_mem(p_bmrt, data, len(data), "not a mem_info_t")
    assert bmrt_get_network_names(p_bmrt) == []
    _, coeff = bm_malloc_device_byte(handle, info.coeff_mem.size)
    info.coeff_mem.addr = coeff
    assert bmrt_load_bmodel_data_with_mem(p_bmrt, data, len(data), info)
    y = _run(handle, p_bmrt)
    assert y is not None
    np.testing.assert_array_equal(y, _reference(exe))
    for h, mem in ((handle, small), (elsewhere, far), (handle, coeff)):
        bm_free_device(h, mem)
    bm_dev_free(elsewhere)


# -- encrypted bmodels -----------------------------------------------------------------------


def _xor(data: bytes) -> bytes:
    return bytes(b ^ KEY for b in data)


def test_load_with_decrypt_applies_the_callers_function(
    handle, p_bmrt, encrypted: Path, exe: crossrt.Executable
) -> None:
    assert not bmrt_load_bmodel(p_bmrt, encrypted)  # as it lies on disk: no bmodel
    seen: list[int] = []

    def decrypt(data: bytes) -> np.ndarray:
        seen.append(len(data))
        return np.frombuffer(data, np.uint8) ^ np.uint8(KEY)  # any buffer will do

    assert bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, decrypt)
    assert seen == [encrypted.stat().st_size]  # the whole file, once
    y = _run(handle, p_bmrt)
    assert y is not None
    np.testing.assert_array_equal(y, _reference(exe))


def test_a_decrypt_function_that_fails_fails_the_load(
    p_bmrt, encrypted: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(data: bytes) -> bytes:
        raise RuntimeError("wrong key")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, broken)
        assert "wrong key" in caplog.text
        caplog.clear()
        assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, lambda data: None)
        assert "NULL" in caplog.text and "BM_ERR_DATA" in caplog.text
        caplog.clear()
        assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, lambda data: data[::-1])
        assert "BM_ERR_DATA" in caplog.text  # garbage: no bmodel
        caplog.clear()
        assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, lambda data: 42)
        assert "int" in caplog.text
    assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted, None)
    assert not bmrt_load_bmodel_with_decrypt(p_bmrt, encrypted.with_name("nothing"), _xor)
    assert bmrt_get_network_names(p_bmrt) == []


DECRYPT_C = """
#include <stdint.h>
#include <stdlib.h>
uint8_t *decrypt(const uint8_t *in, uint64_t size, uint64_t *out_size) {
    uint8_t *out = malloc(size ? size : 1);
    for (uint64_t i = 0; i < size; i++) out[i] = in[i] ^ %d;
    *out_size = size;
    return out;
}
"""
NULL_C = """
#include <stdint.h>
#include <stddef.h>
uint8_t *decrypt(const uint8_t *in, uint64_t size, uint64_t *out_size) { return NULL; }
"""


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Shared libraries as ``model_tool --encrypt -lib`` takes: ``decrypt`` XORs with KEY;
    another's returns NULL."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a decrypt library with")
    folder = tmp_path_factory.mktemp("lib")
    built = {}
    for name, source in (("xor", DECRYPT_C % KEY), ("null", NULL_C)):
        (folder / f"{name}.c").write_text(source)
        target = folder / f"lib{name}.so"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-o", str(target), str(folder / f"{name}.c")],
            check=True,
            timeout=120,
        )
        built[name] = target
    return built


def test_load_with_decrypt_lib_calls_the_librarys_decrypt(
    handle, p_bmrt, encrypted: Path, exe: crossrt.Executable, libraries: dict[str, Path]
) -> None:
    assert not bmrt_load_bmodel_with_decrypt_lib(p_bmrt, encrypted, libraries["null"])
    assert not bmrt_load_bmodel_with_decrypt_lib(p_bmrt, encrypted, libraries["xor"].parent)
    assert not bmrt_load_bmodel_with_decrypt_lib(p_bmrt, encrypted, "/no/such/libcipher.so")
    assert bmrt_load_bmodel_with_decrypt_lib(p_bmrt, encrypted, libraries["xor"])
    y = _run(handle, p_bmrt)
    assert y is not None
    np.testing.assert_array_equal(y, _reference(exe))


# -- flags -----------------------------------------------------------------------------------


def test_check_mem_checks_every_section_whatever_the_environment(
    handle, bmodel: Path, exe: crossrt.Executable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSRT_VALIDATE_HASH", "0")
    data = bytearray(bmodel.read_bytes())
    at = data.find(np.float32(WEIGHT).tobytes())
    data[at + 3] ^= 0x01  # a weight changed: the file still parses
    p = bmrt_create(handle)
    assert bmrt_get_flags(p) == BM_RUNTIME_AUTO
    bmrt_set_flags(p, BM_RUNTIME_CHECK_MEM | BM_RUNTIME_SHARE_MEM)
    assert bmrt_get_flags(p) == BM_RUNTIME_CHECK_MEM | BM_RUNTIME_SHARE_MEM
    assert not bmrt_load_bmodel_data(p, data, len(data))  # its SHA-256 no longer matches
    bmrt_set_flags(p, BM_RUNTIME_SHARE_MEM)
    assert bmrt_load_bmodel_data(p, data, len(data))  # unchecked, as the environment says
    y = _run(handle, p)
    assert y is not None and not np.array_equal(y, _reference(exe))  # the changed weight
    bmrt_destroy(p)


def test_flags_out_of_range_are_refused(p_bmrt, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        bmrt_set_flags(p_bmrt, 1 << 32)
        bmrt_set_flags(p_bmrt, "share")
        assert bmrt_get_flags(p_bmrt) == BM_RUNTIME_AUTO
        bmrt_set_flags(p_bmrt, 0x10 | BM_RUNTIME_SHARE_MEM)
        assert "0x10" in caplog.text
    assert bmrt_get_flags(p_bmrt) == 0x10 | BM_RUNTIME_SHARE_MEM  # kept, as bmruntime does
