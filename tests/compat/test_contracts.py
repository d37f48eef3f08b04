"""Every C-style function of every seed layer returns its seed's status, never raises: for
NULL (None), handles of the wrong kind, handles used after they were freed, and sizes that
are negative, huge or not numbers. The function lists are read from each layer's ``__all__``,
so a function added later is covered without touching this file."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossrt.compat import bmruntime as bm
from crossrt.compat import neuron as nrt
from crossrt.compat import nnrt as nn


def _functions(module: Any, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(
        name
        for name in module.__all__
        if name.startswith(prefixes) and inspect.isfunction(getattr(module, name))
    )


BM_FUNCTIONS = _functions(bm, ("bm_", "bmrt_", "get_bmodel"))
NRT_FUNCTIONS = _functions(nrt, ("nrt_", "nrta_"))
NN_FUNCTIONS = _functions(nn, ("OH_NN",))


@pytest.fixture(autouse=True, scope="module")
def quiet() -> Iterator[None]:
    """Thousands of refusals, each logged: keep them out of the report."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _freed_bm() -> list[Any]:
    """A freed handle, freed device memory and a destroyed runtime: use after free."""
    status, handle = bm.bm_dev_request(0)
    assert status == bm.BM_SUCCESS
    status, mem = bm.bm_malloc_device_byte(handle, 64)
    assert status == bm.BM_SUCCESS
    live_mem = bm.bm_malloc_device_byte(handle, 16)[1]
    bm.bm_free_device(handle, mem)
    p_bmrt = bm.bmrt_create(handle)
    assert p_bmrt is not None
    bm.bmrt_destroy(p_bmrt)
    bm.bm_dev_free(handle)
    return [handle, mem, p_bmrt, live_mem]  # live_mem: a wrong kind where a handle goes


_GARBAGE: list[Any] = [None, "x", -1, 2**64, 3.5, b"\0" * 8, object(), [None], {"a": 1}]
_BM_BAD = _GARBAGE + _freed_bm()


def _failure(result: Any) -> bool:
    """Whether ``result`` is one of the forms a failed call returns: a status other than
    success, a pair that starts with one, False, None (NULL, or a void function), or a count
    of 0 / -1."""
    if result is None or result is False:
        return True
    if isinstance(result, tuple):
        return bool(result) and isinstance(result[0], IntEnum) and result[0] != 0
    if isinstance(result, IntEnum):
        return result != 0
    return isinstance(result, int) and not isinstance(result, bool) and result in (0, -1)


def _arity(function: Callable[..., Any]) -> int:
    return len(inspect.signature(function).parameters)


@pytest.mark.parametrize("name", BM_FUNCTIONS)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_bmruntime_returns_statuses_for_bad_arguments(name: str, data: st.DataObject) -> None:
    function = getattr(bm, name)
    args = [data.draw(st.sampled_from(_BM_BAD)) for _ in range(_arity(function))]
    function(*args)  # must return, whatever it is given


@pytest.mark.parametrize("name", BM_FUNCTIONS)
def test_bmruntime_null_everywhere_is_a_failure(name: str) -> None:
    function = getattr(bm, name)
    if not _arity(function):
        pytest.skip(f"{name} takes no argument")
    result = function(*[None] * _arity(function))
    assert _failure(result), f"{name}(None, ...) returned {result!r}"


def test_bmruntime_every_function_is_covered() -> None:
    # 83 C-style functions of seed 004 and crossrt's bm_devices: a drop means one left __all__.
    assert len(BM_FUNCTIONS) >= 84, BM_FUNCTIONS


def test_bmruntime_use_after_free_is_a_status() -> None:
    handle, mem, p_bmrt, live_mem = _freed_bm()
    assert bm.bm_malloc_device_byte(handle, 64) == (bm.BM_ERR_DEVNOTREADY, None)
    assert bm.bm_memcpy_s2d(handle, live_mem, bytes(16)) == bm.BM_ERR_DEVNOTREADY
    _, fresh = bm.bm_dev_request(0)
    assert bm.bm_memcpy_s2d(fresh, mem, bytes(64)) == bm.BM_ERR_PARAM  # freed memory
    assert bm.bmrt_load_bmodel(p_bmrt, "missing.crm") is False  # destroyed runtime
    assert bm.bmrt_get_network_number(p_bmrt) == 0
    assert bm.bm_dev_free(None) is None
    assert bm.bmrt_destroy(None) is None
    assert bm.bm_malloc_device_byte(None, 64) == (bm.BM_ERR_PARAM, None)
    bm.bm_dev_free(fresh)


def test_bmruntime_memcpy_s2d_checks_the_source_size() -> None:
    _, handle = bm.bm_dev_request(0)
    _, mem = bm.bm_malloc_device_byte(handle, 16)
    assert bm.bm_memcpy_s2d(handle, mem, bytes(32)) == bm.BM_ERR_PARAM  # larger than dst
    assert bm.bm_memcpy_s2d(handle, mem, bytes(8)) == bm.BM_ERR_PARAM  # smaller
    assert bm.bm_memcpy_s2d(handle, mem, bytes(range(16))) == bm.BM_SUCCESS
    out = bytearray(16)
    assert bm.bm_memcpy_d2s(handle, out, mem) == bm.BM_SUCCESS
    assert bytes(out) == bytes(range(16))
    bm.bm_free_device(handle, mem)
    bm.bm_dev_free(handle)


# -- the other two layers, with the same kinds of argument -------------------------------------


def _freed_nrt() -> list[Any]:
    _, tensor = nrt.nrt_tensor_allocate(nrt.NRT_TENSOR_PLACEMENT_HOST, 0, 8, "t")
    nrt.nrt_tensor_free(tensor)
    _, tensor_set = nrt.nrt_allocate_tensor_set()
    nrt.nrt_destroy_tensor_set(tensor_set)
    return [tensor, tensor_set]


@pytest.mark.parametrize("name", NRT_FUNCTIONS)
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_neuron_returns_statuses_for_bad_arguments(
    neuron: None, name: str, data: st.DataObject
) -> None:
    function = getattr(nrt, name)
    pool = _GARBAGE + _freed_nrt()
    function(*[data.draw(st.sampled_from(pool)) for _ in range(_arity(function))])


def _freed_nn() -> list[Any]:
    d = nn.OH_NNTensorDesc_Create()
    nn.OH_NNTensorDesc_Destroy(d)
    model = nn.OH_NNModel_Construct()
    nn.OH_NNModel_Destroy(model)
    q = nn.OH_NNQuantParam_Create()
    nn.OH_NNQuantParam_Destroy(q)
    return [d, model, q]


@pytest.mark.parametrize("name", NN_FUNCTIONS)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_nnrt_returns_statuses_for_bad_arguments(name: str, data: st.DataObject) -> None:
    function = getattr(nn, name)
    pool = _GARBAGE + _freed_nn()
    function(*[data.draw(st.sampled_from(pool)) for _ in range(_arity(function))])


def test_every_layer_is_covered() -> None:
    assert (len(NRT_FUNCTIONS), len(NN_FUNCTIONS)) >= (80, 60)


def test_bmruntime_cpp_methods_raise_only_crossrt_errors(bmodel: Any) -> None:
    """The C++ classes: a method returning bm_status_t returns it; the others (void, a
    pointer) raise a CrossrtError naming the argument, never an AttributeError."""
    from crossrt.errors import CrossrtError

    with bm.Context("sim:0") as ctx:
        assert ctx.load_bmodel(bmodel) == bm.BM_SUCCESS
        net = bm.Network(ctx, "double")
        objects = [ctx, net, net.Inputs()[0], net.Outputs()[0]]
        called, escaped = 0, []
        for obj in objects:
            for name, method in inspect.getmembers(obj, inspect.ismethod):
                if name.startswith("_") or name in ("close", "Forward"):
                    continue
                for value in (None, "x", -1, object()):
                    try:
                        method(*[value] * _arity(method))
                    except CrossrtError:
                        pass
                    except Exception as exc:
                        escaped.append(f"{type(obj).__name__}.{name}({value!r}): {exc!r}")
                    called += 1
        assert not escaped, escaped
        assert called > 40
