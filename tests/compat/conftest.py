"""Fixtures the compat tests share: ``neuron`` (the Neuron layer initialised), and the
BMRuntime layer's: ``sim:0`` as device 0 (the default device, ``CROSSRT_DEFAULT_DEVICE``: a
device whose memory is not the host's, as on a PCIe card), a device handle
(``bm_dev_request(0)``), the ``double`` bmodel (y = x + x on float32 [2, 4], compiled for
sim:0) and a runtime that has loaded it. A test module may give its own ``bmodel``:
``p_bmrt`` then loads that one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import crossrt
from crossrt.compat.bmruntime import (
    BM_SUCCESS,
    bm_dev_free,
    bm_dev_request,
    bmrt_create,
    bmrt_destroy,
    bmrt_load_bmodel,
)
from crossrt.compat.neuron import NRT_FRAMEWORK_TYPE_NO_FW, NRT_SUCCESS, nrt_close, nrt_init
from crossrt.model import GraphBuilder


def double() -> crossrt.Model:
    b = GraphBuilder("double")
    x = b.input("x", "float32", [2, 4])
    b.output(b.op("Add", [x, x], outputs=["y"]))
    return b.finish()


@pytest.fixture
def neuron() -> Iterator[None]:
    """The Neuron layer initialised (``nrt_init``) for the test, closed after it."""
    assert nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "") == NRT_SUCCESS
    yield
    nrt_close()


@pytest.fixture(autouse=True)
def sim_is_device_0(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device 0 of every layer is the default device (docs/compat.md): the BMRuntime tests
    make it the simulated accelerator, as the seed's programs expect a Sophgo chip there."""
    if request.module.__name__.rpartition(".")[2].startswith("test_bmruntime"):
        monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", "sim:0")


@pytest.fixture
def handle() -> Iterator:
    status, h = bm_dev_request(0)
    assert status == BM_SUCCESS
    yield h
    bm_dev_free(h)


@pytest.fixture(scope="module")
def bmodel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bm") / "double.crm"
    crossrt.compile(double(), "sim:0").save(path)
    return path


@pytest.fixture
def p_bmrt(handle, bmodel: Path) -> Iterator:
    p = bmrt_create(handle)
    assert bmrt_load_bmodel(p, bmodel)
    yield p
    bmrt_destroy(p)
