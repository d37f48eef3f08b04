"""``compile(device="auto")``: every candidate measured, the fastest one whose outputs match
the reference kept, the decision recorded in the executable, the ``.crm`` and the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import InvalidArgumentError, InvalidOptionError, UnsupportedError
from crossrt.drivers import driver_statuses
from crossrt.runtime import auto, oracle
from crossrt.tools import compile as compile_tool
from crossrt.tools import inspect as inspect_tool
from small_models import relu

FAST = 0.05  # seconds of timing: enough for the minimum rounds on these small models


def _installed(name: str) -> bool:
    return any(s.name == name and s.driver is not None for s in driver_statuses())


def _normalizer_max() -> onnx.ModelProto:
    """Normalizer(norm="MAX"): ONNX Runtime divides by the row's max, the ONNX reference (and
    OpenVINO) by its largest magnitude, so ORT's outputs differ from the reference's."""
    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="MAX")
    graph = helper.make_graph(
        [node],
        "normalizer_max",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)]
    return helper.make_model(graph, opset_imports=opsets)


def _rows(exe: crossrt.Executable) -> dict[str, dict[str, object]]:
    assert exe.decision is not None
    return {row["driver"]: row for row in exe.decision["candidates"]}


def test_auto_measures_every_engine_and_keeps_the_fastest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exe = crossrt.compile(relu(), device="auto", auto_seconds=FAST)
    rows = _rows(exe)
    assert rows["onnxruntime"]["status"] == "ok"
    assert rows["reference"]["status"] == "not measured"  # the oracle, never a candidate
    measured = {name: r for name, r in rows.items() if r["status"] == "ok"}
    if _installed("openvino"):
        assert "openvino" in measured
    assert all(r["runs"] >= 3 for r in measured.values())
    # The choice follows each round's ratios to that round's fastest block (drift-proof).
    assert all(r["relative"] >= 1.0 for r in measured.values())
    fastest = min(measured.values(), key=lambda r: (r["relative"], r["median_ms"]))
    assert exe.decision["chosen"] == {
        "driver": fastest["driver"],
        "device": fastest["device"],
        "precision": None,
    }
    assert exe.nodes[0].driver == fastest["driver"]
    assert exe.decision["why"] in exe.placement[0]["chosen_by"]
    err = capsys.readouterr().err
    assert "crossrt auto: timing" in err and "chose" in err  # the progress lines
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    with crossrt.Runtime() as rt:
        (y,) = rt.load(exe).run({"x": x}).values()
        assert np.array_equal(y, np.maximum(x, 0))


def test_auto_never_picks_outputs_that_differ_from_the_reference() -> None:
    if _installed("openvino"):
        exe = crossrt.compile(_normalizer_max(), device="auto", auto_seconds=FAST)
        rows = _rows(exe)
        assert rows["onnxruntime"]["status"] == "differs"
        assert exe.decision["chosen"]["driver"] == "openvino"
    else:
        with pytest.raises(UnsupportedError, match="differs"):
            crossrt.compile(_normalizer_max(), device="auto", auto_seconds=FAST)


def test_a_models_tolerance_is_its_metadata() -> None:
    model = _normalizer_max()
    helper.set_model_props(model, {"crossrt.tolerance": "10"})  # any answer passes
    exe = crossrt.compile(model, device="auto", auto_seconds=FAST)
    assert exe.decision["tolerance"] == 10.0
    assert _rows(exe)["onnxruntime"]["status"] == "ok"
    helper.set_model_props(model, {"crossrt.tolerance": "loose"})
    with pytest.raises(InvalidOptionError, match=r"crossrt\.tolerance"):
        crossrt.compile(model, device="auto", auto_seconds=FAST)


def test_auto_never_lowers_precision_below_what_is_allowed() -> None:
    # bf16 is a permission: onnxruntime, which has no bf16, competes in the model's own fp32,
    # and no driver computes in a precision it was not asked for.
    exe = crossrt.compile(relu(), device="auto", precision="bf16", auto_seconds=FAST)
    rows = _rows(exe)
    assert rows["onnxruntime"]["status"] == "ok"
    assert rows["onnxruntime"]["precision"] == "model's own"
    assert exe.decision is not None and exe.decision["precision"] == "bf16"
    assert exe.decision["tolerance"] == auto.TOLERANCES["bf16"]
    chosen = exe.decision["chosen"]
    if chosen["driver"] == "onnxruntime":
        assert chosen["precision"] is None and exe.options.precision is None
        assert "model's own precision" in exe.decision["why"]
    else:
        assert chosen["precision"] == "bf16" and exe.options.precision == "bf16"
    fp32 = crossrt.compile(relu(), device="auto", auto_seconds=FAST)
    assert all("precision" not in row for row in _rows(fp32).values())


def test_a_reduced_precision_competes_with_the_same_drivers_own() -> None:
    # On a CPU whose bf16 is slower than its fp32 (an Intel core without AMX), asking for bf16
    # must not make auto slower than fp32: the driver that has bf16 is measured both ways.
    if not _installed("openvino"):
        pytest.skip("needs a driver with bf16 (openvino)")
    exe = crossrt.compile(relu(), device="auto", precision="bf16", auto_seconds=FAST)
    assert exe.decision is not None
    rows = [(r["driver"], r["precision"]) for r in exe.decision["candidates"] if "runs" in r]
    assert sorted(rows) == [
        ("onnxruntime", "model's own"),
        ("openvino", "bf16"),
        ("openvino", "model's own"),
    ]
    measured = [r for r in exe.decision["candidates"] if r.get("status") == "ok"]
    best = min(measured, key=lambda r: (r["relative"], r["median_ms"]))
    chosen = exe.decision["chosen"]
    assert (chosen["driver"], chosen["precision"] or "model's own") == (
        best["driver"],
        best["precision"],
    )
    assert exe.options.precision == chosen["precision"]


def test_a_cached_decision_compiles_the_precision_chosen(tmp_path: Path) -> None:
    if not _installed("openvino"):
        pytest.skip("needs a driver with bf16 (openvino)")
    kwargs = dict(device="auto", precision="bf16", cache_dir=tmp_path, auto_seconds=FAST)
    first = crossrt.compile(relu(), **kwargs)  # type: ignore[arg-type]
    again = crossrt.compile(relu(), **kwargs)  # type: ignore[arg-type]
    assert again.decision is not None and again.decision["cached"] is True
    assert again.decision["chosen"] == first.decision["chosen"]
    assert (again.nodes[0].driver, again.options.precision) == (
        first.nodes[0].driver,
        first.options.precision,
    )


def test_the_decision_is_measured_once_per_model_options_and_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = crossrt.compile(relu(), device="auto", cache_dir=tmp_path, auto_seconds=FAST)
    assert "timing" in capsys.readouterr().err
    again = crossrt.compile(relu(), device="auto", cache_dir=tmp_path, auto_seconds=FAST)
    err = capsys.readouterr().err
    assert "timing" not in err and "from the compile cache" in err
    assert again.decision["cached"] is True
    assert again.decision["chosen"] == first.decision["chosen"]
    assert again.decision["candidates"] == first.decision["candidates"]
    # Other options are another decision.
    crossrt.compile(
        relu(), device="auto", cache_dir=tmp_path, auto_seconds=FAST, performance_mode="LOW"
    )
    assert "timing" in capsys.readouterr().err


def test_the_decision_travels_in_the_crm(tmp_path: Path) -> None:
    exe = crossrt.compile(relu(), device="auto", auto_seconds=FAST)
    path = tmp_path / "relu.crm"
    exe.save(path)
    loaded = crossrt.load_executable(path)
    assert loaded.decision == exe.decision
    assert crossrt.compile(relu(), "cpu").decision is None


def test_a_probe_gives_the_shapes_measured() -> None:
    model = crossrt.GraphBuilder("dyn")
    x = model.input("x", "float32", ["n", 4])
    model.output(model.op("Relu", [x]))
    probe = {"x": np.ones((8, 4), np.float32)}
    exe = crossrt.compile(model.finish(), device="auto", probe=probe, auto_seconds=FAST)
    assert exe.decision["probe"] == {"x": [8, 4]}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "auto", "driver": "onnxruntime"}, "chooses the driver"),
        ({"device": "auto", "auto_seconds": 0}, "auto_seconds"),
        ({"device": "cpu", "auto_seconds": 1.0}, "apply to device='auto' only"),
        ({"device": "cpu", "probe": {}}, "apply to device='auto' only"),
    ],
)
def test_auto_arguments_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        crossrt.compile(relu(), **kwargs)  # type: ignore[arg-type]


def test_load_does_not_choose(rt: crossrt.Runtime) -> None:
    with pytest.raises(InvalidArgumentError, match=r"crossrt.compile\(model, device='auto'\)"):
        rt.load(relu(), device="auto")


def test_the_cli_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "relu.onnx"
    onnx.save(relu().proto, source)
    out = tmp_path / "relu.crm"
    argv = [str(source), "-d", "auto", "--auto-seconds", str(FAST), "-o", str(out)]
    assert compile_tool.main(argv) == 0
    printed = capsys.readouterr().out
    assert "device='auto' measured:" in printed
    assert "onnxruntime  cpu:0    ok" in printed and "chose " in printed
    assert inspect_tool.main([str(out)]) == 0
    assert "DEVICE='AUTO' DECISION" in capsys.readouterr().out


def test_errors_are_judged_per_output() -> None:
    ref = {"y": np.array([100.0, 0.0], np.float32), "k": np.array([1, 2])}
    assert oracle.compare({"y": ref["y"] + 0.5, "k": ref["k"]}, ref) == (0.5, 100.0)
    assert oracle.compare({"y": ref["y"], "k": np.array([1, 3])}, ref)[0] == float("inf")
    nan = {"y": np.array([np.nan, 0.0], np.float32), "k": ref["k"]}
    assert oracle.compare(nan, ref)[0] == float("inf")
    assert oracle.compare({"y": ref["y"][:1], "k": ref["k"]}, ref)[0] == float("inf")


def test_probe_shapes_set_the_dynamic_dimensions_measured() -> None:
    b = crossrt.GraphBuilder("dyn")
    x = b.input("x", "float32", ["n", 3])
    b.output(b.op("Relu", [x]))
    exe = crossrt.compile(b.finish(), device="auto", probe_shapes={"x": (5, 3)}, auto_seconds=FAST)
    assert exe.decision is not None and exe.decision["probe"] == {"x": [5, 3]}
    with pytest.raises(InvalidOptionError, match="probe_shapes"):
        crossrt.compile(relu(), device="auto", probe_shapes={"nope": (1,)}, auto_seconds=FAST)
    with pytest.raises(InvalidOptionError, match="device='auto' only"):
        crossrt.compile(relu(), "cpu", probe_shapes={"x": (2, 3)})
