"""A tiny hostile model costs little to load, and running out of memory is a coded error
(issue 13 item 3): a 178-byte ``Range(0, 2**40, 1)`` into ``Add`` drove shape inference with
data propagation past 4 GiB; a MemoryError escaped raw; megabyte-long names were taken."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import GraphBuilder, InvalidModelError

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
