"""``crossrt container``: Sophgo's model_tool --combine / --extract / --dump / --weight on .crm
files, run as a user runs them (the CLI's main), each result checked by loading and running
what it wrote, or against the bytes and the weights it names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import crossrt
from crossrt.tools import container


def _matmul(name: str, seed: int) -> onnx.ModelProto:
    """x @ W with a 64x32 float32 weight: stored beside the graph, so listed as a weight."""
    w = np.random.default_rng(seed).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        name,
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def crms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("crms")
    paths = {}
    for name, seed in (("first", 1), ("second", 2)):
        paths[name] = folder / f"{name}.crm"
        crossrt.compile(_matmul(name, seed)).save(paths[name])
    return paths


def _answers(path: Path, network: str) -> np.ndarray:
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    with crossrt.Runtime() as rt:
        return rt.load(crossrt.load_executable(path, network)).run({"x": x})["y"]


def test_combine_then_extract_gives_back_networks_that_run_as_before(crms, tmp_path, capsys):
    both = tmp_path / "both.crm"
    assert (
        container.main(["combine", str(crms["first"]), str(crms["second"]), "-o", str(both)]) == 0
    )
    assert crossrt.compiler.list_networks(both) == ["first", "second"]
    assert "2 networks (first, second)" in capsys.readouterr().out
    out = tmp_path / "nets"
    assert container.main(["extract", str(both), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["first.crm", "second.crm"]
    for name in ("first", "second"):
        np.testing.assert_array_equal(
            _answers(out / f"{name}.crm", name), _answers(crms[name], name)
        )
        np.testing.assert_array_equal(_answers(both, name), _answers(crms[name], name))


def test_combine_refuses_a_name_twice_and_renames_on_request(crms, tmp_path, capsys):
    out = tmp_path / "x.crm"
    again = tmp_path / "again.crm"
    again.write_bytes(crms["first"].read_bytes())
    assert container.main(["combine", str(crms["first"]), str(again), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "network 'first' is in both" in err and "rename one as NAME=FILE" in err
    assert not out.exists()
    assert container.main(["combine", str(crms["first"]), str(crms["first"]), "-o", str(out)]) == 1
    assert "given twice" in capsys.readouterr().err
    assert container.main(["combine", str(crms["first"]), f"copy={again}", "-o", str(out)]) == 0
    assert crossrt.compiler.list_networks(out) == ["first", "copy"]
    np.testing.assert_array_equal(_answers(out, "copy"), _answers(crms["first"], "first"))


def test_weights_name_the_bytes_where_each_weight_lies(crms, capsys):
    assert container.main(["weights", str(crms["first"]), "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["driver"] == "onnxruntime"
    (weight,) = [w for w in node["weights"] if w["shape"] == [64, 32]]
    stored = crms["first"].read_bytes()[weight["file_offset"] :][: weight["bytes"]]
    expected = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    np.testing.assert_array_equal(np.frombuffer(stored, np.float32).reshape(64, 32), expected)
    assert container.main(["weights", str(crms["first"])]) == 0
    assert f"float32 [64, 32] [{weight['file_offset']:#x}," in capsys.readouterr().out


def test_dump_copies_a_byte_range_and_refuses_one_past_the_end(crms, tmp_path, capsys):
    data = crms["first"].read_bytes()
    out = tmp_path / "part.bin"
    assert container.main(["dump", str(crms["first"]), "0x8", "16", str(out)]) == 0
    assert out.read_bytes() == data[8:24]
    assert container.main(["dump", str(crms["first"]), "8", str(len(data)), str(out)]) == 1
    assert "not inside" in capsys.readouterr().err
    assert container.main(["dump", str(crms["first"]), "eight", "1", str(out)]) == 1
    assert "is not a number" in capsys.readouterr().err


def test_a_corrupt_container_is_refused_and_nothing_is_written(crms, tmp_path, capsys):
    bad = tmp_path / "bad.crm"
    data = bytearray(crms["second"].read_bytes())
    data[-100] ^= 0xFF  # inside the last section: its SHA-256 no longer matches
    bad.write_bytes(bytes(data))
    out = tmp_path / "out.crm"
    assert container.main(["combine", str(crms["first"]), str(bad), "-o", str(out)]) == 1
    assert "fails its SHA-256 check" in capsys.readouterr().err
    assert not out.exists()
    assert container.main(["extract", str(bad), "-o", str(tmp_path / "n")]) == 1
    assert not (tmp_path / "n").exists()


def test_the_command_is_listed_in_crossrt_help(capsys):
    from crossrt.tools import cli

    assert cli.main(["--help"]) == 0
    assert "container" in capsys.readouterr().out
