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
from crossrt.choice import auto, decision, oracle, probe
from crossrt.drivers import driver_statuses
from crossrt.tools import compile as compile_tool
from crossrt.tools import inspect as inspect_tool
from crossrt.tools.common import decision_lines
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


def _kept(measured: list[dict[str, object]]) -> dict[str, object]:
    """The candidate the rule keeps: the first (the default) unless another's median time
    against it is below 1 by more than the spread of its rounds."""
    default, *others = measured
    assert "vs_default" not in default and all("spread" in r for r in others)
    wins = [r for r in others if 1 - r["vs_default"] > r["spread"]]  # type: ignore[operator]
    return min(wins, key=lambda r: r["vs_default"]) if wins else default  # type: ignore[return-value]


@pytest.fixture(scope="module")
def relu_auto() -> crossrt.Executable:
    """``relu()`` compiled with ``device="auto"``, once per file: each auto compile runs the
    reference in a child process (half a second of CPU); the tests that only read the
    decision share this one."""
    return crossrt.compile(relu(), device="auto", auto_seconds=FAST)


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
    assert all(r["relative"] >= 1.0 for r in measured.values())
    # The default (ONNX Runtime, first) stays unless another beats it by more than the noise.
    kept = _kept([r for r in exe.decision["candidates"] if r.get("status") == "ok"])
    assert exe.decision["chosen"] == {
        "driver": kept["driver"],
        "device": kept["device"],
        "precision": None,
    }
    assert exe.nodes[0].driver == kept["driver"]
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


def test_auto_never_lowers_precision_below_what_is_allowed(
    relu_auto: crossrt.Executable,
) -> None:
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
    assert all("precision" not in row for row in _rows(relu_auto).values())  # fp32


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
    best = _kept(measured)
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


def test_the_decision_travels_in_the_crm(tmp_path: Path, relu_auto: crossrt.Executable) -> None:
    exe = relu_auto
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


def test_a_win_within_the_noise_keeps_the_default() -> None:
    default = {"driver": "onnxruntime", "device": "cpu:0", "median_ms": 10.0}
    close = {"driver": "openvino", "device": "cpu:0", "median_ms": 9.7}
    close.update(vs_default=0.97, spread=0.05)
    assert not probe.beats_default(close) and decision.kept([default, close]) is default
    why = decision.why([default, close], default, "reference within 0.0001")
    assert why.startswith("the default, 10.000 ms: no other of 2 candidates")
    assert "openvino cpu:0 9.700 ms, 0.970x the default's time, spread 0.050" in why
    clear = {**close, "vs_default": 0.8, "rounds": 12}
    assert probe.beats_default(clear) and decision.kept([default, close, clear]) is clear
    assert "by more than the noise" in decision.why([default, clear], clear, "reference")


def test_the_rounds_spread_is_reported(relu_auto: crossrt.Executable) -> None:
    if not _installed("openvino"):
        pytest.skip("needs a second engine (openvino)")
    exe = relu_auto
    rows = {r["driver"]: r for r in exe.decision["candidates"] if r.get("status") == "ok"}
    assert rows["openvino"]["spread"] >= 0 and rows["openvino"]["rounds"] >= 3
    assert rows["openvino"]["vs_default"] > 0 and "vs_default" not in rows["onnxruntime"]
    lines = decision_lines(exe.decision)  # the CLI's table shows it
    assert "vs default" in lines[0] and "±" in next(x for x in lines if "openvino" in x)


def _dynamic(metadata: str | None = None) -> crossrt.Model:
    b = crossrt.GraphBuilder("dyn")
    x = b.input("x", "float32", ["n", 3])
    b.output(b.op("Relu", [x]))
    model = b.finish()
    if metadata is not None:
        model.proto.metadata_props.add(key="crossrt.probe_shapes", value=metadata)
    return model


def test_a_guessed_probe_shape_is_said() -> None:
    exe = crossrt.compile(_dynamic(), device="auto", auto_seconds=FAST)
    assert exe.decision["probe"] == {"x": [1, 3]} and exe.decision["probe_guessed"] == ["x"]
    assert (
        "measured on a guessed shape (x [1, 3]: each dynamic dimension 1)" in (exe.decision["why"])
    )
    assert "probe_shapes={name: shape}" in exe.decision["why"]
    given = crossrt.compile(
        _dynamic(), device="auto", probe_shapes={"x": (4, 3)}, auto_seconds=FAST
    )
    assert given.decision["probe_guessed"] == [] and "guessed" not in given.decision["why"]


def test_the_models_metadata_gives_the_probe_shapes() -> None:
    exe = crossrt.compile(_dynamic("x=6x3"), device="auto", auto_seconds=FAST)
    assert exe.decision["probe"] == {"x": [6, 3]} and exe.decision["probe_guessed"] == []
    with pytest.raises(InvalidOptionError, match=r"metadata crossrt\.probe_shapes='y=6x3'"):
        crossrt.compile(_dynamic("y=6x3"), device="auto", auto_seconds=FAST)


def test_the_callers_shapes_come_before_the_models_metadata() -> None:
    # Stages, then probe_shapes over both (a test of its own: each auto compile runs the
    # reference in a child process).
    staged = crossrt.compile(
        _dynamic("x=6x3"), device="auto", stages=[{"x": [2, 3]}], auto_seconds=FAST
    )
    assert staged.decision["probe"] == {"x": [2, 3]}
    shaped = crossrt.compile(
        _dynamic("x=6x3"),
        device="auto",
        stages=[{"x": [2, 3]}, {"x": [5, 3]}],
        probe_shapes={"x": (5, 3)},
        auto_seconds=FAST,
    )
    assert shaped.decision["probe"] == {"x": [5, 3]}


@pytest.mark.parametrize(
    ("args", "said", "unsaid"),
    [
        (["-d", "auto", "--driver", "onnxruntime"], "--device auto chooses the driver; drop "
         "--driver onnxruntime, or name a device such as --device cpu", "driver="),
        (["-d", "cpu", "--probe-shape", "x=2x3"], "--probe-shape and --auto-seconds apply to "
         "--device auto only", "probe_shapes="),
        (["-d", "auto", "--probe-shape", "y=2x3"], "--probe-shape y=...: (2, 3); give an input",
         "probe_shapes"),
        (["-d", "auto", "--auto-seconds", "-1"], "--auto-seconds -1.0: give a number", "="),
    ],
)  # fmt: skip
def test_the_cli_names_flags_not_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str, unsaid: str
) -> None:
    source = tmp_path / "dyn.onnx"
    onnx.save(_dynamic().proto, source)
    assert compile_tool.main([str(source), *args, "-o", str(tmp_path / "dyn.crm")]) == 1
    err = capsys.readouterr().err
    assert said in err and unsaid not in err.split("]: ", 1)[1]


def test_the_cli_says_a_guessed_shape_in_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "dyn.onnx"
    onnx.save(_dynamic().proto, source)
    argv = [str(source), "-d", "auto", "--auto-seconds", str(FAST), "-o", str(tmp_path / "d.crm")]
    assert compile_tool.main(argv) == 0
    out = capsys.readouterr().out
    assert "guessed shape" in out and "--probe-shape NAME=DxD" in out and "probe_shapes=" not in out
