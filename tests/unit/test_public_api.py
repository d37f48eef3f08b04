"""The three tiers of crossrt's API, each name in one of them (issue 25.4): ``crossrt`` for
users (at most 35 names), ``crossrt.drivers`` for driver authors (the contract only), the rest
in its own module; and ``RunnableModel``, the one name for "a model you can run"."""

from __future__ import annotations

import asyncio
import importlib
from concurrent.futures import Future

import numpy as np
import pytest

import crossrt
import crossrt.drivers
from small_models import add_one

# What only the runtime uses: in crossrt.drivers.registry / .boundary, not the authors' tier.
RUNTIME_ONLY = {"describe_devices", "device_order", "program_error", "unguarded"}


def test_the_users_tier_has_at_most_35_names_and_every_one_exists() -> None:
    names = crossrt.__all__
    assert len(names) <= 35, f"{len(names)} names in crossrt.__all__: {names}"
    assert len(set(names)) == len(names)
    missing = [n for n in names if not hasattr(crossrt, n)]
    assert not missing, f"crossrt.__all__ names what crossrt lacks: {missing}"


def test_the_users_tier_keeps_what_an_application_uses() -> None:
    for name in (
        "Runtime",
        "compile",
        "load_executable",
        "connect",
        "RemoteRuntime",
        "LoadedModel",
        "RunnableModel",
        "Model",
        "GraphBuilder",
        "load_model",
        "Tensor",
        "TensorSet",
        "shared_tensor",
        "DType",
        "dtypes",
        "CancelToken",
        "CrossrtError",
        "StatusCode",
    ):
        assert name in crossrt.__all__, name


def test_each_root_name_is_its_home_modules_object() -> None:
    """A root name is a re-export, not a second definition: the object its module defines."""
    for name in crossrt.__all__:
        value = getattr(crossrt, name)
        home = getattr(value, "__module__", None)
        if home is None or not home.startswith("crossrt.") or name == "dtypes":
            continue
        assert getattr(importlib.import_module(home), name) is value, (name, home)


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("CompileCache", "crossrt.compiler.cache"),
        ("cache_stats", "crossrt.compiler.cache"),
        ("InvalidHandleError", "crossrt.errors"),
        ("CompileOptions", "crossrt.drivers"),
        ("Driver", "crossrt.drivers"),
        ("Profile", "crossrt.profiling"),
        ("Placement", "crossrt.memory"),
        ("list_networks", "crossrt.compiler"),
    ],
)
def test_a_name_moved_off_the_root_says_where_it_lives(name: str, home: str) -> None:
    assert name not in crossrt.__all__
    with pytest.raises(AttributeError, match=rf"lives in {home}: from {home} import {name}"):
        getattr(crossrt, name)
    assert hasattr(importlib.import_module(home), name)


def test_the_driver_authors_tier_is_the_contract_only() -> None:
    names = crossrt.drivers.__all__
    missing = [n for n in names if not hasattr(crossrt.drivers, n)]
    assert not missing, missing
    assert {"Driver", "Program", "DeviceInfo", "CompileOptions", "Capabilities"} <= set(names)
    assert not RUNTIME_ONLY & set(names), RUNTIME_ONLY & set(names)
    registry = importlib.import_module("crossrt.drivers.registry")
    boundary = importlib.import_module("crossrt.drivers.boundary")
    assert all(hasattr(registry, n) or hasattr(boundary, n) for n in RUNTIME_ONLY)


def test_cancel_token_lives_in_the_base_layer() -> None:
    from crossrt.cancel import CancelToken

    assert crossrt.CancelToken is CancelToken is crossrt.drivers.CancelToken
    assert CancelToken.__module__ == "crossrt.cancel"
    token, seen = CancelToken(), []
    token.on_cancel(lambda: seen.append(1))
    token.cancel()
    token.cancel()
    token.on_cancel(lambda: seen.append(2))  # already cancelled: called at once
    assert token.cancelled and seen == [1, 2]


def run_twice(model: crossrt.RunnableModel, x: np.ndarray) -> list[np.ndarray]:
    """What code typed against the protocol does: run, run_async, infer, read its specs."""
    assert [s.name for s in model.inputs] == ["x"] and [s.name for s in model.outputs] == ["y"]
    first = model.run({"x": x})["y"]
    future = model.run_async({"x": x})
    assert isinstance(future, Future)
    third = asyncio.run(model.infer({"x": x}))["y"]
    assert model.statistics().requests >= 3
    return [first, future.result()["y"], third]


def test_loaded_and_staged_models_are_runnable_models() -> None:
    x = np.arange(4, dtype=np.float32)
    plain = crossrt.compile(add_one(4), "cpu")
    staged = crossrt.compile(add_one("n"), "cpu", stages=[{"x": [4]}, {"x": [8]}])
    with crossrt.Runtime() as rt:
        for exe in (plain, staged):
            model = rt.load(exe, cores=1)
            assert isinstance(model, crossrt.RunnableModel), type(model)
            for y in run_twice(model, x):
                np.testing.assert_array_equal(y, x + 1)
        assert type(rt.load(staged, cores=1)).__name__ == "StagedModel"


def test_an_object_missing_a_member_is_not_a_runnable_model() -> None:
    class OnlyRun:
        name = "m"
        inputs = outputs = ()

        def run(self, inputs: object) -> dict[str, np.ndarray]:
            return {}

    assert not isinstance(OnlyRun(), crossrt.RunnableModel)
