"""Zero copy into engines: Tensors and TensorSets as run inputs and outputs, results written
in the caller's buffers with no runtime copy, runtime-allocated outputs, dynamic outputs,
output shapes per thread and input dimension ranges."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import (
    InvalidArgumentError,
    InvalidInputError,
    InvalidModelError,
    OutOfResourcesError,
    Tensor,
    TensorSet,
)
from crossrt.errors import OperationForbiddenError
from crossrt.memory import Placement, TensorDesc
from crossrt.model import GraphBuilder
from crossrt.runtime.memory.allocator import copied_bytes
from small_models import add_one, sequence_length

DRIVERS = ("onnxruntime", "reference")
N = 1024
# Allocation failures dump their log into the test's own directory, not the real one.
pytestmark = pytest.mark.usefixtures("runtime_dir")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _x() -> np.ndarray:
    return np.arange(N, dtype=np.float32)


def test_ort_output_lands_in_the_callers_buffer_with_zero_copies(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu", driver="onnxruntime")
    x = Tensor.from_buffer(_x(), name="x")
    y = Tensor((N,), "float32", name="y")
    where = y.address
    before = copied_bytes()
    result = model.run({"x": x}, outputs={"y": y})
    assert copied_bytes() == before
    assert result["y"] is y and y.address == where
    assert np.array_equal(y.numpy(), _x() + 1)


def test_attached_numpy_output_is_written_in_place(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu", driver="onnxruntime")
    out = np.zeros(N, np.float32)
    before = copied_bytes()
    model.run(TensorSet({"x": _x()}), outputs={"y": Tensor.from_buffer(out)})
    assert copied_bytes() == before
    assert np.array_equal(out, _x() + 1)


def test_tensor_outputs_on_every_driver(rt: crossrt.Runtime, driver: str) -> None:
    model = rt.load(add_one(N), "cpu", driver=driver)
    y = Tensor((N,), "float32")
    assert model.run(Tensor.from_buffer(_x()), outputs={"y": y})["y"] is y
    assert np.array_equal(y.numpy(), _x() + 1)


def test_plain_arrays_still_come_back_as_arrays(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    result = model.run({"x": _x()})
    assert type(result["y"]) is np.ndarray
    out = np.empty(N, np.float32)
    assert model.run({"x": _x()}, outputs={"y": out})["y"] is out


def test_tensor_set_outputs_are_filled_by_the_runtime(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    outs = TensorSet()
    before = copied_bytes()
    returned = model.run(TensorSet({"x": _x()}), outputs=outs)
    assert returned is outs and list(outs) == ["y"]
    y = outs["y"]
    assert (y.placement, y.device, y.shape) == (Placement.DEVICE, "cpu:0", (N,))
    assert np.array_equal(y.numpy(), _x() + 1)
    assert copied_bytes() == before  # the engine's result is adopted, not copied
    assert model.memory.stats().bytes_in_use == 4 * N
    model.run({"x": _x()}, outputs=outs)  # reused: written in place this time
    assert outs["y"] is y
    y.free()
    assert model.memory.stats().bytes_in_use == 0


def test_none_asks_the_runtime_to_allocate(rt: crossrt.Runtime, driver: str) -> None:
    model = rt.load(add_one(N), "cpu", driver=driver)
    y = model.run({"x": _x()}, outputs={"y": None})["y"]
    assert isinstance(y, Tensor) and np.array_equal(y.numpy(), _x() + 1)
    assert model.memory.stats().allocations == 1


def test_runtime_allocation_respects_the_model_budget(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    model.memory.set_budget(N)  # a quarter of the output
    with pytest.raises(OutOfResourcesError, match=r"model 'add_one' cannot allocate 'y'"):
        model.run({"x": _x()}, outputs={"y": None})


def test_output_tensor_too_small_is_refused_before_the_run(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    with pytest.raises(InvalidArgumentError, match=r"\(4096 bytes\) but the tensor given holds 40"):
        model.run({"x": _x()}, outputs={"y": Tensor((10,), "float32")})


def test_larger_raw_memory_takes_the_outputs_shape(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    raw = Tensor.allocate(8 * N)  # nrt_tensor_allocate: bytes, no dtype yet
    model.run({"x": _x()}, outputs={"y": raw})
    assert (raw.dtype.name, raw.shape, raw.size) == ("float32", (N,), 8 * N)
    assert np.array_equal(raw.numpy(), _x() + 1)


@pytest.mark.parametrize("device", ["cpu", "sim:0"])
def test_raw_memory_is_taken_as_the_input_by_its_bytes(rt: crossrt.Runtime, device: str) -> None:
    # nrt_tensor_allocate's tensors have no type: a run reads their bytes as the input's.
    model = rt.load(add_one(N), device)
    raw = Tensor.allocate(4 * N, device=device)
    raw.write(_x().tobytes())
    (out,) = model.run({"x": raw}).values()
    assert np.array_equal(np.asarray(out), _x() + 1)
    assert (raw.dtype.name, raw.shape) == ("uint8", (4 * N,))  # the caller's tensor unchanged
    with pytest.raises(InvalidInputError, match="holds 4092 bytes, the input float32"):
        model.run({"x": Tensor.allocate(4 * N - 4, device=device)})


def test_output_tensor_of_the_wrong_dtype_is_refused(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    with pytest.raises(InvalidInputError, match="is float64, the output is float32"):
        model.run({"x": _x()}, outputs={"y": Tensor((N,), "float64")})


def test_unknown_output_name_is_refused(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    with pytest.raises(InvalidInputError, match="unknown output 'z'"):
        model.run({"x": _x()}, outputs={"z": None})


def test_input_tensors_are_checked_like_arrays(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu")
    with pytest.raises(InvalidInputError, match="expected float32 \\[1024\\], got int32"):
        model.run(Tensor((N,), "int32"))
    with pytest.raises(InvalidInputError, match="dimension 0 must be 1024"):
        model.run({"x": Tensor((3,), "float32")})


# -- dynamic outputs ---------------------------------------------------------------------


def test_dynamic_output_is_copied_into_a_tensor_that_fits(rt: crossrt.Runtime, driver: str) -> None:
    model = rt.load(add_one("N"), "cpu", driver=driver)
    y = Tensor.from_desc(TensorDesc("y", "float32", [-1]), size=400)
    before = copied_bytes()
    model.run({"x": np.ones(50, np.float32)}, outputs={"y": y})
    assert copied_bytes() - before == 200
    assert y.shape == (50,) and y.numpy().tolist() == [2.0] * 50
    model.run({"x": np.ones(100, np.float32)}, outputs={"y": y})
    assert y.shape == (100,)


def test_dynamic_output_too_small_names_the_size_needed(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one("N"), "cpu")
    y = Tensor.from_desc(TensorDesc("y", "float32", [-1]), size=16)
    with pytest.raises(InvalidArgumentError, match=r"is float32 \[10\] \(40 bytes\).*holds 16"):
        model.run({"x": np.ones(10, np.float32)}, outputs={"y": y})


def test_dynamic_output_allocated_by_the_runtime(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one("N"), "cpu")
    y = model.run({"x": np.ones(7, np.float32)}, outputs={"y": None})["y"]
    assert y.shape == (7,) and y.size == 28


def test_output_shapes_are_per_thread(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one("N"), "cpu")
    with pytest.raises(OperationForbiddenError, match="has not run it yet"):
        model.tensors.output_shapes()
    model.run({"x": np.ones(3, np.float32)})
    assert model.tensors.output_shapes() == {"y": (3,)}
    seen: dict[str, object] = {}

    def other() -> None:
        try:
            model.tensors.output_shapes()
        except OperationForbiddenError:
            seen["before"] = "refused"
        model.run({"x": np.ones(5, np.float32)}, outputs={"y": None})
        seen["after"] = model.tensors.output_shapes()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(timeout=60)
    assert seen == {"before": "refused", "after": {"y": (5,)}}
    assert model.tensors.output_shapes() == {"y": (3,)}


def test_static_output_shapes_need_no_run(rt: crossrt.Runtime) -> None:
    assert rt.load(add_one(N), "cpu").tensors.output_shapes() == {"y": (N,)}


# -- input dimension ranges -----------------------------------------------------------------


def _dynamic_proto(ranges: str | None) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "ranged",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 3])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    if ranges is not None:
        proto.metadata_props.add(key="crossrt.dim_ranges", value=ranges)
    return proto


def test_dim_ranges_default_from_the_shapes(rt: crossrt.Runtime) -> None:
    model = rt.load(_dynamic_proto(None), "cpu")
    assert model.tensors.dim_ranges() == {"a": ((1, None), (3, 3)), "b": ((1, 1), (3, 3))}


@pytest.mark.parametrize("driver", DRIVERS)
def test_dim_ranges_declared_in_metadata(rt: crossrt.Runtime, driver: str) -> None:
    ranges = json.dumps({"a": [[2, 64], [3, 3]]})
    model = rt.load(_dynamic_proto(ranges), "cpu", driver=driver)
    assert model.tensors.dim_ranges() == {"a": ((2, 64), (3, 3)), "b": ((1, 1), (3, 3))}


def test_dim_ranges_survive_the_offline_file(rt: crossrt.Runtime, tmp_path: Path) -> None:
    # Kept in the executable (the .crm header), not read back from a driver's artifact.
    ranges = json.dumps({"a": [[2, 64], [3, 3]]})
    path = tmp_path / "m.crm"
    crossrt.compile(crossrt.load_model(_dynamic_proto(ranges)), "cpu").save(path)
    model = rt.load(crossrt.load_executable(path))
    assert model.tensors.dim_ranges()["a"] == ((2, 64), (3, 3))


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ("{not json", "not JSON"),
        ('{"zz": [[1, 2], [3, 3]]}', "'zz', which is not an input"),
        ('{"a": [[1, 2]]}', "one \\[min, max\\] per dimension"),
        ('{"a": [[5, 2], [3, 3]]}', "0 <= min <= max"),
        ('{"a": [[1, 2], [1, 4]]}', "dimension 1 is static"),
    ],
)
def test_bad_dim_range_declarations(rt: crossrt.Runtime, ranges: str, message: str) -> None:
    model = rt.load(_dynamic_proto(ranges), "cpu")
    with pytest.raises(InvalidModelError, match=message):
        model.tensors.dim_ranges()


# -- reusing an ONNX Runtime binding ---------------------------------------------------------


def test_a_reused_binding_reads_the_inputs_current_bytes(rt: crossrt.Runtime) -> None:
    model = rt.load(add_one(N), "cpu", driver="onnxruntime")
    x, y = np.zeros(N, np.float32), np.empty(N, np.float32)
    feed, outs = {"x": x}, {"y": y}
    for value in (1.0, 5.0, -2.0):  # the same objects each time: the binding is reused
        x[:] = value
        model.run(feed, outs)
        assert np.all(y == value + 1)


def test_an_array_reshaped_in_place_is_bound_again(rt: crossrt.Runtime) -> None:
    b = GraphBuilder("transpose")
    b.output(b.op("Transpose", [b.input("x", "float32", [None, None])], outputs=["y"]))
    model = rt.load(b.finish(), "cpu", driver="onnxruntime")
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.empty((4, 2), np.float32)
    feed, outs = {"x": x}, {"y": y}
    model.run(feed, outs)
    assert np.array_equal(y, x.T)
    x.shape, y.shape = (4, 2), (2, 4)  # the same objects with new shapes: a stale binding
    model.run(feed, outs)  # would transpose a 2x4 into a 4x2 layout
    assert np.array_equal(y, x.T)


def test_outputs_the_engine_allocated_are_never_overwritten(rt: crossrt.Runtime) -> None:
    b = GraphBuilder("two_out")
    x = b.input("x", "float32", [N])
    b.output(b.op("Add", [x, b.constant(np.float32(1))], outputs=["y"]))
    b.output(b.op("Mul", [x, b.constant(np.float32(2))], outputs=["z"]))
    model = rt.load(b.finish(), "cpu", driver="onnxruntime")
    x_arr, y_arr = np.zeros(N, np.float32), np.empty(N, np.float32)
    feed, outs = {"x": x_arr}, {"y": y_arr}  # z is left to the engine
    first = model.run(feed, outs)["z"]
    x_arr[:] = 10
    second = model.run(feed, outs)["z"]
    assert np.all(first == 0) and np.all(second == 20) and np.all(y_arr == 11)


def test_outputs_given_with_a_sequence_input_ort_cannot_bind(rt: crossrt.Runtime) -> None:
    proto = sequence_length()
    model = rt.load(proto, "cpu", driver="onnxruntime")
    y, n = np.empty(2, np.float32), np.empty((), np.int64)
    seq = [np.ones(3, np.float32), np.ones(2, np.float32)]
    result = model.run({"s": seq, "x": np.arange(2, dtype=np.float32)}, outputs={"y": y, "n": n})
    assert result["y"] is y and y.tolist() == [0, 1] and int(n) == 2
