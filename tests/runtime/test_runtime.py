"""The runtime: Runtime, LoadedModel.run input checks, handles, cores, outputs, threads."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest

import crossrt
from crossrt import (
    ClosedError,
    InvalidArgumentError,
    InvalidInputError,
    OutOfResourcesError,
    StatusCode,
)
from crossrt.errors import InvalidHandleError
from crossrt.model import GraphBuilder

DRIVERS = ("onnxruntime", "reference")
CORES = len(os.sched_getaffinity(0))


def _two_input_model() -> crossrt.Model:
    """image: float32 [2,3] (static) and count: int64 [?,3] (dynamic batch)."""
    b = GraphBuilder("two")
    image = b.input("image", "float32", [2, 3])
    count = b.input("count", "int64", [None, 3])
    b.output(b.op("Add", [image, b.constant(np.ones((2, 3), np.float32))], outputs=["shifted"]))
    b.output(b.op("Mul", [count, b.constant(np.int64(2))], outputs=["doubled"]))
    return b.finish()


def _mlp_model() -> crossrt.Model:
    """x: float32 [N,8] -> softmax(relu(x @ W + b)) [N,4]; y = x * 3 [N,8]."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", [None, 8])
    w = b.constant(rng.standard_normal((8, 4)).astype(np.float32))
    bias = b.constant(rng.standard_normal(4).astype(np.float32))
    h = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, w]), bias])])
    b.output(b.op("Softmax", [h], axis=-1, outputs=["probs"]))
    b.output(b.op("Mul", [x, b.constant(np.float32(3))], outputs=["tripled"]))
    return b.finish()


IMAGE = np.arange(6, dtype=np.float32).reshape(2, 3)
COUNT = np.arange(12, dtype=np.int64).reshape(4, 3)


@pytest.fixture(scope="module")
def executables():
    model = _two_input_model()
    return {d: crossrt.compile(model, driver=d) for d in DRIVERS}


@pytest.fixture(params=DRIVERS)
def loaded(request, executables):
    with crossrt.Runtime() as rt:
        yield rt.load(executables[request.param])


def _bad(loaded, inputs) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        loaded.run(inputs)
    err = info.value
    assert err.code is StatusCode.EXEC_BAD_INPUT
    assert isinstance(err, ValueError)
    return err


# -- input checks -----------------------------------------------------------------------------


def test_good_inputs_run(loaded):
    out = loaded.run({"image": IMAGE, "count": COUNT})
    assert list(out) == ["shifted", "doubled"]
    np.testing.assert_array_equal(out["shifted"], IMAGE + 1)
    np.testing.assert_array_equal(out["doubled"], COUNT * 2)
    assert out["shifted"].dtype == np.float32 and out["doubled"].dtype == np.int64


def test_list_in_input_order_runs(loaded):
    out = loaded.run([IMAGE, COUNT])
    np.testing.assert_array_equal(out["doubled"], COUNT * 2)


def test_missing_input(loaded):
    err = _bad(loaded, {"image": IMAGE})
    assert "missing input 'count'" in err.message
    assert "int64 [?,3]" in err.message  # what is expected
    assert "image (float32 [2,3])" in err.message  # what the model takes
    assert "give a value for each" in err.message  # the fix
    assert err.details["input"] == "count"


def test_unknown_input_with_did_you_mean(loaded):
    err = _bad(loaded, {"image": IMAGE, "cuont": COUNT})
    assert "unknown input 'cuont'" in err.message
    assert "did you mean 'count'?" in err.message
    assert "count (int64 [?,3])" in err.message
    assert err.details == {"input": "cuont", "expected": ["image", "count"]}


def test_unknown_input_without_close_match(loaded):
    err = _bad(loaded, {"image": IMAGE, "count": COUNT, "zzzzzz": COUNT})
    assert "unknown input 'zzzzzz'" in err.message
    assert "did you mean" not in err.message


def test_wrong_dtype(loaded):
    err = _bad(loaded, {"image": IMAGE.astype(np.float64), "count": COUNT})
    assert "input 'image'" in err.message
    assert "expected float32 [2,3]" in err.message
    assert "got float64 [2,3]" in err.message
    assert ".astype(np.float32)" in err.message
    assert err.details == {
        "input": "image",
        "expected_dtype": "float32",
        "given_dtype": "float64",
    }


def test_wrong_dtype_on_dynamic_input(loaded):
    err = _bad(loaded, {"image": IMAGE, "count": COUNT.astype(np.int32)})
    assert "input 'count'" in err.message and "got int32 [4,3]" in err.message
    assert ".astype(np.int64)" in err.message


def test_none_as_an_input_says_it_is_none(loaded):
    err = _bad(loaded, {"image": None, "count": COUNT})
    assert err.message.startswith("input 'image' is None; pass an array of float32 [2,3]")
    assert "object" not in err.message  # not "got object []" from np.asarray(None)
    assert err.details == {"input": "image"}


def test_string_input_hint_is_valid_on_numpy_2():
    b = GraphBuilder("words")
    b.output(b.op("Identity", [b.input("words", "string", [2])], outputs=["same"]))
    with crossrt.Runtime() as rt:
        model = rt.load(b.finish())
        given = np.array([1, 2])
        with pytest.raises(InvalidInputError) as info:
            model.run({"words": given})
        assert ".astype(object)" in info.value.message
        assert "np.object" not in info.value.message  # gone in NumPy 2: the hint would fail
        out = model.run({"words": given.astype(str).astype(object)})  # the hint, applied
        assert list(out["same"]) == ["1", "2"]


def test_wrong_rank(loaded):
    err = _bad(loaded, {"image": IMAGE[None], "count": COUNT})
    assert "input 'image'" in err.message
    assert "expected float32 [2,3]" in err.message
    assert "got float32 [1,2,3]" in err.message
    assert "give it 2 dimensions" in err.message
    assert err.details["expected_shape"] == [2, 3]
    assert err.details["given_shape"] == [1, 2, 3]


def test_wrong_rank_on_dynamic_input(loaded):
    err = _bad(loaded, {"image": IMAGE, "count": COUNT.ravel()})
    assert "input 'count'" in err.message and "give it 2 dimensions" in err.message


def test_wrong_static_dim(loaded):
    err = _bad(loaded, {"image": np.zeros((2, 4), np.float32), "count": COUNT})
    assert "input 'image'" in err.message
    assert "expected float32 [2,3]" in err.message and "got float32 [2,4]" in err.message
    assert "dimension 1 must be 3" in err.message


def test_wrong_static_dim_of_dynamic_input(loaded):
    err = _bad(loaded, {"image": IMAGE, "count": np.zeros((4, 2), np.int64)})
    assert "input 'count'" in err.message and "dimension 1 must be 3" in err.message


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_dynamic_dim_accepts_any_size(loaded, batch):
    count = np.full((batch, 3), 7, np.int64)
    out = loaded.run({"image": IMAGE, "count": count})
    assert out["doubled"].shape == (batch, 3)
    assert (out["doubled"] == 14).all()


def test_list_of_wrong_length(loaded):
    err = _bad(loaded, [IMAGE])
    assert "got 1 inputs, the model takes 2" in err.message
    assert "image (float32 [2,3]), count (int64 [?,3])" in err.message
    assert "or a dict" in err.message
    assert err.details == {"expected": ["image", "count"], "given_count": 1}


def test_single_array_for_a_two_input_model(loaded):
    err = _bad(loaded, IMAGE)
    assert "got 1 inputs, the model takes 2" in err.message


def test_not_a_dict_or_list(loaded):
    err = _bad(loaded, "image")
    assert "not str" in err.message and "image (float32 [2,3])" in err.message


def test_python_lists_are_converted_to_the_model_dtype(loaded):
    out = loaded.run({"image": [[1, 2, 3], [4, 5, 6]], "count": [[1, 2, 3]]})
    assert out["shifted"].dtype == np.float32
    np.testing.assert_array_equal(out["shifted"], [[2, 3, 4], [5, 6, 7]])
    assert out["doubled"].dtype == np.int64
    np.testing.assert_array_equal(out["doubled"], [[2, 4, 6]])


def test_python_lists_are_still_shape_checked(loaded):
    err = _bad(loaded, {"image": [1.0, 2.0, 3.0], "count": COUNT})
    assert "input 'image'" in err.message and "give it 2 dimensions" in err.message


def test_numpy_scalar_keeps_its_dtype_and_is_refused():
    b = GraphBuilder("scalar")
    s = b.input("s", "float32", [])
    b.output(b.op("Neg", [s]))
    with crossrt.Runtime() as rt:
        loaded = rt.load(b.finish())
        assert loaded.run({"s": 2.5})[loaded.outputs[0].name] == np.float32(-2.5)
        with pytest.raises(InvalidInputError, match="got float64"):
            loaded.run({"s": np.float64(2.5)})


def test_mapping_that_is_not_a_dict_is_accepted(loaded):
    from types import MappingProxyType

    out = loaded.run(MappingProxyType({"image": IMAGE, "count": COUNT}))
    np.testing.assert_array_equal(out["shifted"], IMAGE + 1)


@pytest.mark.parametrize(
    ("dtype", "value"),
    [("int64", [[1.5, 2.7, 3.9]]), ("uint8", [[300, 1, 2]])],
    ids=["float-to-int", "int-overflow"],
)
def test_lossy_python_list_conversion_is_refused(dtype, value):
    b = GraphBuilder("ints")
    v = b.input("v", dtype, [None, 3])
    b.output(b.op("Identity", [v]))
    with crossrt.Runtime() as rt:
        loaded = rt.load(b.finish())
        with pytest.raises(InvalidInputError) as info:
            loaded.run({"v": value})
    assert "input 'v'" in info.value.message


def test_memmap_of_wrong_dtype_is_refused_like_an_ndarray(tmp_path, loaded):
    path = tmp_path / "image.npy"
    np.save(path, IMAGE.astype(np.float64))
    image = np.load(path, mmap_mode="r")
    assert isinstance(image, np.memmap)
    err = _bad(loaded, {"image": image, "count": COUNT})
    assert "got float64" in err.message


def test_memmap_of_right_dtype_runs(tmp_path, loaded):
    path = tmp_path / "image.npy"
    np.save(path, IMAGE)
    out = loaded.run({"image": np.load(path, mmap_mode="r"), "count": COUNT})
    np.testing.assert_array_equal(out["shifted"], IMAGE + 1)


# -- tensor_info ------------------------------------------------------------------------------


def test_tensor_info(loaded):
    infos = loaded.tensors.info()
    assert [(i.name, i.usage) for i in infos] == [
        ("image", "input"),
        ("count", "input"),
        ("shifted", "output"),
        ("doubled", "output"),
    ]
    by_name = {i.name: i for i in infos}
    assert by_name["image"].dtype == "float32"
    assert by_name["image"].shape == (2, 3)
    assert by_name["image"].size == 2 * 3 * 4
    assert by_name["count"].dtype == "int64"
    assert by_name["count"].shape[1] == 3 and not isinstance(by_name["count"].shape[0], int)
    assert by_name["count"].size is None  # dynamic
    assert by_name["shifted"].size == 24
    assert by_name["doubled"].size is None


def test_tensor_info_of_scalar_and_bytes_sizes():
    b = GraphBuilder("sizes")
    s = b.input("s", "int64", [])
    h = b.input("h", "float16", [4, 5])
    b.output(b.op("Identity", [s]))
    b.output(b.op("Identity", [h]))
    with crossrt.Runtime() as rt:
        infos = {i.name: i for i in rt.load(b.finish()).tensors.info()}
    assert infos["s"].shape == () and infos["s"].size == 8
    assert infos["h"].size == 4 * 5 * 2


# -- handles and the runtime's life -----------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_unload_then_run_is_invalid_handle(executables, driver):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        assert loaded in rt.models and loaded.loaded
        loaded.unload()
        assert not loaded.loaded
        assert loaded not in rt.models
        with pytest.raises(InvalidHandleError) as info:
            loaded.run({"image": IMAGE, "count": COUNT})
        assert info.value.code is StatusCode.INVALID_HANDLE
        assert "unloaded" in info.value.message and "'two'" in info.value.message
        loaded.unload()  # twice is harmless
        with pytest.raises(InvalidHandleError):
            loaded.run({"image": IMAGE, "count": COUNT})
        # Other models of the runtime keep working.
        other = rt.load(executables[driver])
        assert other.run({"image": IMAGE, "count": COUNT})["shifted"].shape == (2, 3)


@pytest.mark.parametrize("driver", DRIVERS)
def test_close_then_run_is_closed(executables, driver):
    rt = crossrt.Runtime()
    loaded = rt.load(executables[driver])
    rt.close()
    assert rt.closed and not loaded.loaded and rt.models == []
    with pytest.raises(ClosedError) as info:
        loaded.run({"image": IMAGE, "count": COUNT})
    assert info.value.code is StatusCode.CLOSED
    assert "closed" in info.value.message and "new Runtime" in info.value.message
    loaded.unload()  # after close: no error, and the model stays closed
    with pytest.raises(ClosedError):
        loaded.run({"image": IMAGE, "count": COUNT})


def test_load_and_devices_after_close(executables):
    rt = crossrt.Runtime()
    rt.close()
    for call in (lambda: rt.load(executables["onnxruntime"]), rt.devices):
        with pytest.raises(ClosedError) as info:
            call()
        assert info.value.code is StatusCode.CLOSED
        assert "crossrt.Runtime()" in info.value.message


def test_close_twice_is_fine(executables):
    rt = crossrt.Runtime()
    rt.load(executables["reference"])
    rt.close()
    rt.close()
    assert rt.closed
    assert "closed" in repr(rt)


def test_context_manager_closes_even_on_error(executables):
    with pytest.raises(RuntimeError, match="boom"), crossrt.Runtime() as rt:
        loaded = rt.load(executables["onnxruntime"])
        raise RuntimeError("boom")
    assert rt.closed
    with pytest.raises(ClosedError):
        loaded.run({"image": IMAGE, "count": COUNT})


def test_a_model_is_called_by_the_name_it_was_loaded_under():
    """``load(name=)``: errors, observation snapshots (crossrt top) and the model say the
    name a person gave it, not the exporter's graph name."""
    from crossrt.runtime.observer import describe

    exe = crossrt.compile(_two_input_model())
    with crossrt.Runtime() as rt:
        named = rt.load(exe, name="counter")
        plain = rt.load(exe)
        assert (named.name, plain.name) == ("counter", exe.name)
        assert describe(named)["name"] == "counter"
        named.unload()
        with pytest.raises(InvalidHandleError, match="model 'counter' was unloaded"):
            named.run({"image": IMAGE, "count": COUNT})


def test_runtime_devices_lists_both_drivers():
    with crossrt.Runtime() as rt:
        devices = rt.devices()
    assert {(d.driver, d.id) for d in devices} >= {("onnxruntime", "cpu:0"), ("reference", "cpu:0")}


@pytest.mark.parametrize("driver", DRIVERS)
def test_unload_racing_with_run_gives_invalid_handle(executables, driver):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        check = loaded._checker.checked_feed

        def check_then_unload(inputs):
            # Deterministically reproduce the interleaving: another thread unloads the model
            # after run() has passed its handle check.
            feed = check(inputs)
            loaded.unload()
            return feed

        loaded._checker.checked_feed = check_then_unload
        with pytest.raises(InvalidHandleError):
            loaded.run({"image": IMAGE, "count": COUNT})


# -- cores ------------------------------------------------------------------------------------


def test_cores_count(executables):
    with crossrt.Runtime() as rt:
        assert rt.load(executables["onnxruntime"], cores=1).cores == (0,)
        assert rt.load(executables["onnxruntime"]).cores == tuple(range(CORES))
        assert rt.load(executables["onnxruntime"], cores=CORES).cores == tuple(range(CORES))


def test_cores_list(executables):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables["onnxruntime"], cores=[CORES - 1])
        assert loaded.cores == (CORES - 1,)
        assert loaded.run({"image": IMAGE, "count": COUNT})["shifted"].shape == (2, 3)
        assert rt.load(executables["reference"], cores=(0,)).cores == (0,)


def test_too_many_cores(executables):
    with crossrt.Runtime() as rt, pytest.raises(OutOfResourcesError) as info:
        rt.load(executables["onnxruntime"], cores=CORES + 1)
    err = info.value
    assert err.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert int(err.code) == 9
    assert f"asked for {CORES + 1} cores" in err.message
    assert f"at most {CORES}" in err.message
    assert err.details == {"requested": CORES + 1, "available": CORES}


@pytest.mark.parametrize(
    "cores",
    [[CORES], [-1], [0, 0], [], ["0"], "0", 0, -2, True],
    ids=[
        "index-too-big",
        "negative-index",
        "duplicate",
        "empty",
        "str-in-list",
        "str",
        "zero",
        "negative",
        "bool",
    ],
)
def test_bad_cores(executables, cores):
    with crossrt.Runtime() as rt, pytest.raises(InvalidArgumentError) as info:
        rt.load(executables["onnxruntime"], cores=cores)
    assert info.value.code is StatusCode.INVALID
    assert "cores=" in info.value.message


@pytest.mark.parametrize("cores", [np.int64(1), 1.0], ids=["numpy-int", "float"])
def test_cores_of_other_number_types(executables, cores):
    with crossrt.Runtime() as rt:
        try:
            loaded = rt.load(executables["onnxruntime"], cores=cores)
        except crossrt.CrossrtError:
            return  # a clean refusal is acceptable
        assert loaded.cores == (0,)


def test_load_executable_refuses_compile_options(executables):
    with crossrt.Runtime() as rt:
        with pytest.raises(InvalidArgumentError, match="not to an Executable"):
            rt.load(executables["onnxruntime"], fp16=True)
        with pytest.raises(InvalidArgumentError, match="not to an Executable"):
            rt.load(executables["onnxruntime"], driver="reference")


# -- preallocated outputs ---------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_preallocated_outputs_are_written_in_place(executables, driver):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        shifted = np.full((2, 3), -1, np.float32)
        doubled = np.full((4, 3), -1, np.int64)
        out = loaded.run(
            {"image": IMAGE, "count": COUNT}, outputs={"shifted": shifted, "doubled": doubled}
        )
        assert out["shifted"] is shifted and out["doubled"] is doubled
        assert np.shares_memory(out["shifted"], shifted)
        np.testing.assert_array_equal(shifted, IMAGE + 1)
        np.testing.assert_array_equal(doubled, COUNT * 2)
        # A second run reuses the same buffers.
        out = loaded.run(
            {"image": IMAGE * 2, "count": COUNT}, outputs={"shifted": shifted, "doubled": doubled}
        )
        assert out["shifted"] is shifted
        np.testing.assert_array_equal(shifted, IMAGE * 2 + 1)


@pytest.mark.parametrize("driver", DRIVERS)
def test_some_outputs_preallocated(executables, driver):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        shifted = np.empty((2, 3), np.float32)
        out = loaded.run({"image": IMAGE, "count": COUNT}, outputs={"shifted": shifted})
        assert out["shifted"] is shifted
        np.testing.assert_array_equal(shifted, IMAGE + 1)
        np.testing.assert_array_equal(out["doubled"], COUNT * 2)


_BAD_OUTPUT_BUFFERS = {
    "wrong-shape": {"shifted": np.empty((3, 2), np.float32)},
    "wrong-dtype": {"shifted": np.empty((2, 3), np.float64)},
    "unknown-name": {"shiftd": np.empty((2, 3), np.float32)},
}


@pytest.mark.parametrize("case", list(_BAD_OUTPUT_BUFFERS))
@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_preallocated_outputs_are_refused_cleanly(executables, driver, case):
    buffers = _BAD_OUTPUT_BUFFERS[case]
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        with pytest.raises(crossrt.CrossrtError) as info:
            loaded.run({"image": IMAGE, "count": COUNT}, outputs=buffers)
    assert info.value.code in (StatusCode.EXEC_BAD_INPUT, StatusCode.INVALID)
    assert next(iter(buffers)) in info.value.message


@pytest.mark.parametrize("driver", DRIVERS)
def test_non_contiguous_output_buffer_is_refused(executables, driver):
    with crossrt.Runtime() as rt:
        loaded = rt.load(executables[driver])
        backing = np.zeros((2, 6), np.float32)
        shifted = backing[:, ::2]
        with pytest.raises(crossrt.InvalidInputError, match="C-contiguous") as info:
            loaded.run({"image": IMAGE, "count": COUNT}, outputs={"shifted": shifted})
    assert info.value.code is crossrt.StatusCode.EXEC_BAD_INPUT
    np.testing.assert_array_equal(backing, 0)  # nothing written


# -- threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_eight_threads_two_hundred_runs_each(driver):
    threads, runs = 8, 200
    rng = np.random.default_rng(1234)
    batches = rng.integers(1, 5, size=(threads, runs))
    inputs = [
        [rng.standard_normal((int(batches[t, i]), 8)).astype(np.float32) for i in range(runs)]
        for t in range(threads)
    ]
    with crossrt.Runtime() as rt:
        loaded = rt.load(_mlp_model(), driver=driver)
        expected = [[loaded.run({"x": x}) for x in per_thread] for per_thread in inputs]

        def worker(t: int) -> int:
            for i, x in enumerate(inputs[t]):
                got = loaded.run({"x": x})
                for name, want in expected[t][i].items():
                    np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7)
            return t

        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(worker, t) for t in range(threads)]
            done = [f.result(timeout=60) for f in futures]
    assert sorted(done) == list(range(threads))
    # The inputs really differ, so a mixed-up result would have been caught.
    assert not np.allclose(expected[0][0]["tripled"][:1], expected[1][0]["tripled"][:1])


# -- what can be loaded -----------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("kind", ["path", "str-path", "bytes", "model", "proto", "executable"])
def test_load_from_every_source(tmp_path, driver, kind):
    model = _two_input_model()
    path = tmp_path / "two.onnx"
    model.save(path)
    source = {
        "path": path,
        "str-path": str(path),
        "bytes": model.to_bytes(),
        "model": model,
        "proto": model.proto,
        "executable": None,
    }[kind]
    with crossrt.Runtime() as rt:
        if kind == "executable":
            loaded = rt.load(crossrt.compile(model, driver=driver))
        else:
            loaded = rt.load(source, driver=driver)
        assert loaded.executable.nodes[0].driver == driver
        assert loaded.device.id == "cpu:0"
        assert loaded.name == "two"
        assert [s.name for s in loaded.inputs] == ["image", "count"]
        out = loaded.run({"image": IMAGE, "count": COUNT})
    np.testing.assert_array_equal(out["shifted"], IMAGE + 1)
    np.testing.assert_array_equal(out["doubled"], COUNT * 2)


def test_load_missing_path():
    with crossrt.Runtime() as rt, pytest.raises(crossrt.ModelNotFoundError) as info:
        rt.load("/nonexistent/model.onnx")
    assert info.value.code is StatusCode.NOT_FOUND
    assert "/nonexistent/model.onnx" in info.value.message


def test_load_with_compile_options_and_device(executables):
    with crossrt.Runtime() as rt:
        loaded = rt.load(_two_input_model(), "cpu:0", performance_mode="low")
        assert loaded.executable.options.performance_mode is crossrt.drivers.PerformanceMode.LOW
        with pytest.raises(crossrt.InvalidOptionError, match="bf16"):
            rt.load(_two_input_model(), precision="bf16")
        with pytest.raises(crossrt.DeviceUnavailableError, match="'tpu'"):
            rt.load(executables["onnxruntime"], "tpu")
