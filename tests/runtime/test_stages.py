"""Shape stages: one network compiled for several static input shapes, each run going to the
stage its shapes match, kept through a ``.crm`` round trip and shown by ``crossrt inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
from crm_layout import edit
from crossrt import InvalidInputError, InvalidOptionError, StatusCode
from crossrt.model import GraphBuilder
from crossrt.tools import inspect as inspect_tool

STAGES = [{"x": [1, 3, 4]}, {"x": [8, 3, 4]}]


def _model() -> crossrt.Model:
    # A batch-dynamic model whose result depends on every element: x @ w, then Relu.
    b = GraphBuilder("staged", opset=21)
    x = b.input("x", "float32", ["N", 3, 4])
    w = b.constant(np.arange(20, dtype=np.float32).reshape(4, 5) / 10 - 1, name="w")
    b.output(b.op("Relu", [b.op("MatMul", [x, w])]))
    return b.finish()


@pytest.fixture(scope="module")
def staged() -> crossrt.Executable:
    return crossrt.compile(_model(), "cpu", driver="onnxruntime", stages=STAGES)


@pytest.fixture(scope="module")
def plain() -> crossrt.Executable:
    return crossrt.compile(_model(), "cpu", driver="onnxruntime")


def _feed(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return {"x": rng.standard_normal((batch, 3, 4)).astype(np.float32)}


def _run(exe: crossrt.Executable, feed: dict[str, Any]) -> dict[str, np.ndarray]:
    with crossrt.Runtime() as rt:
        return rt.load(exe, cores=1).run(feed)


def test_staged_executable_describes_each_stage_with_static_shapes(staged):
    assert [s.inputs[0].shape for s in staged.stages] == [(1, 3, 4), (8, 3, 4)]
    # Shape inference fixed the outputs of each stage; the network keeps the dynamic ones.
    assert [s.outputs[0].shape for s in staged.stages] == [(1, 3, 5), (8, 3, 5)]
    assert staged.inputs[0].shape == ("N", 3, 4)
    assert staged.nodes == staged.stages[0].nodes
    assert staged.describe()["stages"] == [{"x": [1, 3, 4]}, {"x": [8, 3, 4]}]


@pytest.mark.parametrize("batch", [1, 8])
def test_each_stage_runs_and_matches_an_unstaged_compile(staged, plain, batch):
    feed = _feed(batch)
    got = _run(staged, feed)
    want = _run(plain, feed)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == (batch, 3, 5)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_run_async_goes_to_the_matching_stage(staged, plain):
    with crossrt.Runtime() as rt:
        model = rt.load(staged, cores=1)
        got = model.run_async(_feed(8)).result()
    want = _run(plain, _feed(8))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_a_shape_no_stage_takes_is_refused_listing_the_stages(staged):
    with crossrt.Runtime() as rt:
        model = rt.load(staged, cores=1)
        with pytest.raises(InvalidInputError) as err:
            model.run(_feed(2))
        assert err.value.code is StatusCode.EXEC_BAD_INPUT
        assert "no stage of 'staged' takes x [2,3,4]" in err.value.message
        assert "stages: x [1,3,4]; x [8,3,4]" in err.value.message
        with pytest.raises(InvalidInputError, match="no stage"):
            model.run_async(_feed(2))
        model.unload()
        with pytest.raises(crossrt.errors.InvalidHandleError):
            model.run(_feed(1))


def test_save_and_load_round_trip_keeps_the_stages(staged, tmp_path: Path):
    path = tmp_path / "staged.crm"
    staged.save(path)
    loaded = crossrt.load_executable(path)
    assert [s.inputs for s in loaded.stages] == [s.inputs for s in staged.stages]
    assert [s.outputs for s in loaded.stages] == [s.outputs for s in staged.stages]
    for batch in (1, 8):
        got, want = _run(loaded, _feed(batch)), _run(staged, _feed(batch))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    with pytest.raises(InvalidInputError, match=r"stages: x \[1,3,4\]; x \[8,3,4\]"):
        _run(loaded, _feed(3))


def test_a_plain_executable_saves_no_stages(plain):
    from crossrt.compiler import read_container

    container = read_container(plain.to_bytes())
    assert container.header["networks"][0]["stages"] == []
    assert container.networks[0].stages == ()


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([], "non-empty list"),
        ({"x": [1, 3, 4]}, "non-empty list"),
        ([{"y": [1, 3, 4]}], "names unknown input 'y'"),
        ([{}], "lacks 'x'"),
        ([{"x": [1, 3]}], "has rank 2"),
        ([{"x": [1, 5, 4]}], "sets dim 1 to 5, but the model fixes it to 3"),
        ([{"x": [0, 3, 4]}], "whole numbers >= 1"),
        ([{"x": "1,3,4"}], "give a list"),
        ([{"x": [1, 3, 4]}, {"x": (1, 3, 4)}], "stage 1 of 'staged' repeats stage 0"),
    ],
)
def test_bad_stage_specs_are_refused(stages, message):
    with pytest.raises(InvalidOptionError, match=message) as err:
        crossrt.compile(_model(), "cpu", driver="onnxruntime", stages=stages)
    assert err.value.code is StatusCode.INVALID_OPTION


def test_inspect_lists_the_stages(staged, tmp_path: Path, capsys):
    path = tmp_path / "staged.crm"
    staged.save(path)
    assert inspect_tool.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "stages          2: x [1,3,4]; x [8,3,4]" in out


def _edited(staged: crossrt.Executable, change: Any) -> bytes:
    """The staged container with its header changed and its layout and hashes made valid."""
    return edit(staged.to_bytes(), change)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h: h["networks"][0]["stages"][1]["nodes"][0].update(section=99), "section"),
        (lambda h: h["networks"][0]["stages"][0]["nodes"][0].update(name="other"), "stages"),
        (lambda h: h["networks"][0]["stages"][1]["inputs"].update(x=[8, 3]), "x"),
        (lambda h: h["networks"][0]["stages"][1].pop("nodes"), "nodes"),
    ],
    ids=["bad-section", "nodes-differ-from-first-stage", "bad-shape", "missing-nodes"],
)
def test_a_tampered_stage_entry_is_refused(staged, change, message):
    with pytest.raises(crossrt.errors.InvalidContainerError) as info:
        crossrt.load_executable(_edited(staged, change))
    assert info.value.code is StatusCode.INVALID
    assert message in info.value.message
