"""A tiny hostile model costs little to load, and running out of memory is a coded error
(issue 13 item 3): a 178-byte ``Range(0, 2**40, 1)`` into ``Add`` drove shape inference with
data propagation past 4 GiB; a MemoryError escaped raw; megabyte-long names were taken."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import GraphBuilder, InvalidModelError
from limit_models import detector_like, fanout, many_inputs, rank_model

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's"
)

_RANGE_MODEL = """
import onnx
from onnx import TensorProto, helper

def const(name, value):
    tensor = helper.make_tensor(name, TensorProto.INT64, [], [value])
    return helper.make_node("Constant", [], [name], value=tensor)

graph = helper.make_graph(
    [const("s", 0), const("l", 2**40), const("d", 1),
     helper.make_node("Range", ["s", "l", "d"], ["r"]),
     helper.make_node("Add", ["r", "r"], ["y"])],
    "g", [], [helper.make_tensor_value_info("y", TensorProto.INT64, ["n"])])
data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
"""

# Caps the address space at what the process has mapped after its imports plus HEADROOM
# bytes: whatever the machine, a load that tries to materialise gigabytes fails here.
_LIMIT = """
import resource

def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")

cap = mapped() + HEADROOM
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
"""


def _run_limited(body: str, headroom: int, before: str = "") -> subprocess.CompletedProcess[str]:
    script = "\n".join(
        [
            "import crossrt",
            textwrap.dedent(_RANGE_MODEL),
            textwrap.dedent(before),
            f"HEADROOM = {headroom}",
            textwrap.dedent(_LIMIT),
            textwrap.dedent(body),
        ]
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@linux_only
def test_range_into_add_loads_in_bounded_memory() -> None:
    done = _run_limited(
        """
        model = crossrt.load_model(data)
        print("loaded", len(data), [s.name for s in model.outputs])
        """,
        headroom=512 << 20,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded" in done.stdout
    assert "MemoryError" not in done.stderr


@linux_only
def test_running_out_of_memory_while_loading_is_a_coded_error() -> None:
    # The bytes exist before the cap; copying them in load_model cannot fit under it.
    done = _run_limited(
        """
        try:
            crossrt.load_model(big)
        except crossrt.CrossrtError as exc:
            print("coded", exc.code.name, type(exc).__name__)
        """,
        headroom=64 << 20,
        before="big = bytearray(256 << 20)",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "coded FAIL_HOST_MEM_ALLOC OutOfResourcesError" in done.stdout, done.stdout


def _model_with_dim(dim: str, name: str = "x") -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", [name], ["y"])],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [dim, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def test_a_megabyte_symbolic_dimension_name_is_refused() -> None:
    with pytest.raises(InvalidModelError, match="symbolic dimension name of 1,048,576"):
        crossrt.load_model(_model_with_dim("n" * (1 << 20)))


def test_a_megabyte_value_name_is_refused() -> None:
    with pytest.raises(InvalidModelError, match="value name of 1,048,576"):
        crossrt.load_model(_model_with_dim("batch", name="x" * (1 << 20)))


def test_names_of_ordinary_length_load() -> None:
    model = crossrt.load_model(_model_with_dim("b" * 256, name="x" * 4096))
    assert model.inputs[0].shape[0] == "b" * 256


def test_the_builder_refuses_a_megabyte_dimension_name() -> None:
    builder = GraphBuilder("long")
    x = builder.input("x", "float32", ["n" * (1 << 20), 4])
    builder.output(builder.op("Relu", [x]))
    with pytest.raises(InvalidModelError, match="symbolic dimension"):
        builder.finish()


def test_a_shape_computed_at_run_time_still_runs(rt: crossrt.Runtime) -> None:
    """Without data propagation, Reshape to a computed shape is symbolic until run time."""
    builder = GraphBuilder("flatten")
    x = builder.input("x", "float32", [None, 3, 4])
    shape = builder.op("Shape", [x])
    batch = builder.op(
        "Slice", [shape, builder.constant(np.array([0])), builder.constant(np.array([1]))]
    )
    flat = builder.op("Concat", [batch, builder.constant(np.array([-1]))], axis=0)
    builder.output(builder.op("Reshape", [x, flat]))
    exe = crossrt.compile(builder.finish(), device="cpu")
    loaded = rt.load(exe)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (out,) = loaded.run({"x": data}).values()
    np.testing.assert_array_equal(np.asarray(out), data.reshape(2, 12))


# -- limits that real files fit (issue 23, point 1) ---------------------------------------------
# One table (crossrt/model/limits.py) for load_model, compile, the .crm writer and reader, the
# cache and the daemon: a model is either compiled, saved, cached and served, or refused by
# load_model with the reason, whatever tool a user tries.


def test_exporter_written_dimension_names_compile_save_cache_and_run(tmp_path) -> None:
    """Refused on main: 'symbolic dimension name of 1,556 characters, more than the 256
    allowed ... rename it in the exporter'."""
    proto, expr = detector_like()
    assert len(expr) > 330
    data = proto.SerializeToString()
    (tmp_path / "det.onnx").write_bytes(data)
    model = crossrt.load_model(data)
    assert model.outputs[0].shape == ("batch", 3, expr, 2)
    exe = crossrt.compile(model, device="cpu")
    exe.save(tmp_path / "det.crm")
    assert crossrt.load_executable(tmp_path / "det.crm").outputs[0].shape[2] == expr
    cache = tmp_path / "cache"
    first = crossrt.compile(tmp_path / "det.onnx", device="cpu", cache_dir=cache)
    assert len(list(cache.rglob("*.crm"))) == 1
    again = crossrt.compile(tmp_path / "det.onnx", device="cpu", cache_dir=cache)
    assert again.outputs == first.outputs == exe.outputs
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 8)).astype(np.float32)
    with crossrt.Runtime() as rt:
        (out,) = rt.load(again).run({"images": x}).values()
    np.testing.assert_array_equal(out, x.reshape(1, 3, 4, 4, 2, 4).max(axis=(3, 5)))


def _pairs(count: int) -> bytes:
    """``count`` inputs, each into its own Relu and output."""
    graph = helper.make_graph(
        [helper.make_node("Relu", [f"x{i}"], [f"y{i}"]) for i in range(count)],
        "pairs",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1]) for i in range(count)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1]) for i in range(count)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def test_forty_thousand_inputs_compile_save_and_load_from_the_cache(tmp_path) -> None:
    data = many_inputs(40_000).SerializeToString()
    (tmp_path / "many.onnx").write_bytes(data)
    cache = tmp_path / "cache"
    exe = crossrt.compile(tmp_path / "many.onnx", device="cpu", cache_dir=cache)
    (entry,) = cache.rglob("*.crm")
    back = crossrt.load_executable(entry)
    assert len(back.inputs) == 40_000 and back.inputs == exe.inputs
    feed = {f"x{i}": np.full(1, 1.0, np.float32) for i in range(40_000)}
    with crossrt.Runtime() as rt:
        (out,) = rt.load(back).run(feed).values()
    assert out.tolist() == [40_000.0]


def test_forty_thousand_inputs_each_with_its_output_are_refused_on_load() -> None:
    """The model of issue 23: 40,000 inputs and 40,000 outputs take 1.1 million JSON values to
    describe. On main it compiled, and the writer refused it (so the cache and the daemon):
    the real cap was ~31k pairs. Now load_model refuses it, and so every tool, with the
    header's limit in the message."""
    from crossrt.model import limits

    data = _pairs(40_000)
    with pytest.raises(InvalidModelError) as info:
        crossrt.load_model(data)
    message = info.value.message
    assert "40,000 inputs, 40,000 outputs" in message and "could never be saved" in message
    assert f"JSON values, more than the {limits.SIGNATURE_VALUES:,}" in message


def test_names_are_bounded_by_their_total_in_a_header_not_each_ones_length() -> None:
    """600 outputs named with 16,000 characters each: every name is within the limit on one
    name, and together they are 19 MB, more than a header holds (on main the model compiled
    and could not be saved, so neither cached nor served). load_model refuses it, so every
    tool does, naming the header's limit."""
    from crossrt.model import limits

    data = fanout(600, name_length=16_000)
    with pytest.raises(InvalidModelError) as info:
        crossrt.load_model(data)
    message = info.value.message
    assert "600 outputs" in message and "could never be saved, cached or served" in message
    assert f"more than the {limits.SIGNATURE_BYTES:,}" in message
    with pytest.raises(InvalidModelError, match="could never be saved"):
        crossrt.compile(data, device="cpu")
    crossrt.compile(fanout(300, name_length=16_000), device="cpu").to_bytes()  # 9.6 MB: fits


def test_more_inputs_than_a_model_may_have_are_refused_on_load() -> None:
    from crossrt.model import limits

    with pytest.raises(InvalidModelError, match="it has 65,537 inputs, more than the 65,536"):
        crossrt.load_model(many_inputs(limits.MAX_TENSORS + 1))


def test_a_signature_just_within_the_budget_is_written_and_one_more_output_is_not() -> None:
    """The budget is the writer's own count on the writer's own encoding, with room for the
    rest of a one-node header: the most outputs load_model lets through can be saved. Rank-6
    outputs with a dynamic dim cost 19 values each, so the value budget binds before the
    65,536 outputs a model may have."""
    from crossrt.model import TensorSpec, limits

    tiny = crossrt.compile(fanout(1), device="cpu")
    (x,) = tiny.inputs
    wide = dataclasses.replace(tiny.outputs[0], shape=("n", 4, 4, 4, 4, 4))

    def outputs(count: int) -> list[TensorSpec]:  # names of one width: each costs the same
        return [dataclasses.replace(wide, name=f"y{i:06d}") for i in range(count)]

    def cost(count: int) -> int:
        specs = [s.to_dict() for s in outputs(count)]
        return limits.signature_cost([x.to_dict()], specs, tiny.metadata)[1]

    per_output = cost(2) - cost(1)
    most = 1 + (limits.SIGNATURE_VALUES - cost(1)) // per_output
    assert most < limits.MAX_TENSORS
    specs = outputs(most + 1)
    breach = limits.signature_breach([x.to_dict()], [s.to_dict() for s in specs], {})
    assert breach is not None and "JSON values" in breach
    del specs[-1]
    assert limits.signature_breach([x.to_dict()], [s.to_dict() for s in specs], {}) is None
    node = dataclasses.replace(tiny.nodes[0], outputs=tuple(s.name for s in specs))
    exe = dataclasses.replace(tiny, outputs=tuple(specs), nodes=(node,))
    back = crossrt.load_executable(exe.to_bytes(), check_drivers=False)
    assert len(back.outputs) == most > 40_000


def test_a_rank_65_input_is_refused_on_load_as_numpy_cannot_hold_it() -> None:
    """On main it compiled, and the .crm writer refused it ('65 dims, more than the 64')."""
    data = rank_model(65, 65)
    with pytest.raises(InvalidModelError) as info:
        crossrt.load_model(data)
    assert "input 'x' has 65 dimensions, more than the 64 a NumPy array holds" in str(info.value)
    with pytest.raises(InvalidModelError, match="65 dimensions"):
        crossrt.compile(data, device="cpu")


def test_rank_65_inside_a_graph_compiles_saves_and_runs(tmp_path) -> None:
    exe = crossrt.compile(rank_model(2, 65), device="cpu")
    exe.save(tmp_path / "deep.crm")
    with crossrt.Runtime() as rt:
        (out,) = (
            rt.load(crossrt.load_executable(tmp_path / "deep.crm"))
            .run({"x": np.full((1, 1), -2.0, np.float32)})
            .values()
        )
    assert out.tolist() == [[0.0]]
