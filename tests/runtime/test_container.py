"""The ``.crm`` container: round trips (in a new process), zero-copy loads, several networks,
and a precise CrossrtError for every way a file can be wrong."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import mmap
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import crossrt
from crm_layout import build, edit, patch_header, prelude, split
from crossrt import (
    DeviceUnavailableError,
    InvalidArgumentError,
    ModelNotFoundError,
    StatusCode,
    TensorSpec,
    UnsupportedError,
)
from crossrt.compiler import read_container
from crossrt.config import settings
from crossrt.drivers import CompileOptions, registry
from crossrt.errors import InvalidContainerError, InvalidOptionError
from crossrt.model import GraphBuilder
from crossrt.tools import run as run_tool

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits" / "digits.onnx"
IMAGES = ROOT / "examples" / "digits" / "test_images.npy"


@pytest.fixture(scope="module")
def digits() -> crossrt.Executable:
    return crossrt.compile(DIGITS, driver="onnxruntime")


@pytest.fixture(scope="module")
def digits_bytes(digits) -> bytes:
    return digits.to_bytes()


def _run(exe: crossrt.Executable, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with crossrt.Runtime() as rt:
        return rt.load(exe, cores=1).run(feed)


def _flip(data: bytes, position: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[position] ^= 1 << bit
    return bytes(out)


# -- round trips ------------------------------------------------------------------------------

_CHILD = r"""
import json, sys
import numpy as np
import crossrt

path, inputs, out = sys.argv[1:]
report = {}
with crossrt.Runtime() as rt:
    for name in crossrt.compiler.list_networks(path):
        exe = crossrt.load_executable(path, name)
        feed = np.load(f"{inputs}/{name}.npz", allow_pickle=False)
        result = rt.load(exe, cores=1).run({s.name: feed[s.name] for s in exe.inputs})
        np.savez(f"{out}/{name}.npz", *result.values())
        report[name] = {
            "outputs": list(result),
            "artifact": type(exe.nodes[0].artifact).__name__,
            "content_hash": exe.content_hash,
        }
print(json.dumps(report))
"""


def _round_trip_in_new_process(
    tmp_path: Path, networks: dict[str, crossrt.Executable], feeds: dict[str, dict]
) -> None:
    """Save ``networks`` to one .crm, run each in a fresh interpreter, compare bit for bit."""
    path = tmp_path / "model.crm"
    crossrt.compiler.save_executables(networks, path)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    expected = {}
    for name, exe in networks.items():
        np.savez(tmp_path / "in" / f"{name}.npz", **feeds[name])
        expected[name] = _run(exe, feeds[name])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "in"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(report) == sorted(networks)
    for name, want in expected.items():
        assert report[name]["outputs"] == list(want)
        assert report[name]["artifact"] == "memoryview"  # loaded from the mmap, not compiled
        assert report[name]["content_hash"] == networks[name].content_hash
        got = np.load(tmp_path / "out" / f"{name}.npz", allow_pickle=False)
        for i, (out_name, value) in enumerate(want.items()):
            assert got[f"arr_{i}"].dtype == value.dtype, (name, out_name)
            np.testing.assert_array_equal(got[f"arr_{i}"], value, err_msg=f"{name}/{out_name}")


def test_digits_round_trip_in_a_new_process_gives_identical_outputs(tmp_path, digits):
    images = np.load(IMAGES)
    _round_trip_in_new_process(tmp_path, {"digits": digits}, {"digits": {"input": images}})


def _dist_models(dist_name: str, folder: str) -> list[Path]:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist_name} is not installed; `pip install --no-deps {dist_name}`")
    paths = sorted(
        Path(str(dist.locate_file(f)))
        for f in dist.files or ()
        if str(f).startswith(folder) and str(f).endswith(".onnx")
    )
    if not paths:
        pytest.skip(f"{dist_name} ships no .onnx under {folder}")
    return paths


_IMAGE_SHAPES = {"_det_": (1, 3, 160, 160), "_rec_": (1, 3, 48, 160), "_cls_": (1, 3, 48, 192)}


def _feed(path: Path, specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    """Deterministic inputs of realistic shapes (images, 512-sample audio windows, state)."""
    rng = np.random.default_rng(7)
    feed = {}
    for spec in specs:
        assert spec.dtype is not None and spec.shape is not None
        if spec.name == "sr":
            feed[spec.name] = np.array(16000, dtype=spec.dtype.numpy)
            continue
        image = next((s for k, s in _IMAGE_SHAPES.items() if k in path.name), None)
        if image is not None and spec.name == "x":
            shape = image
        else:
            shape = tuple(
                d
                if isinstance(d, int) and d > 0
                else 512
                if (spec.name == "input" and axis == 1)
                else 4
                if (spec.name == "input" and axis == 0 and "sequence" in path.name)
                else 1
                for axis, d in enumerate(spec.shape)
            )
        scale = 1.0 if spec.name in ("input", "x") else 0.1
        feed[spec.name] = (rng.uniform(-1, 1, shape) * scale).astype(spec.dtype.numpy)
    return feed


@pytest.mark.parametrize(
    ("dist", "folder"),
    [("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/"), ("silero-vad", "silero_vad/data/")],
)
def test_real_models_round_trip_in_a_new_process(tmp_path, dist, folder):
    paths = _dist_models(dist, folder)
    # Several networks in one file, named by file (their model names collide).
    networks = {p.stem: crossrt.compile(p, driver="onnxruntime") for p in paths}
    feeds = {p.stem: _feed(p, networks[p.stem].inputs) for p in paths}
    _round_trip_in_new_process(tmp_path, networks, feeds)


def test_loaded_executable_equals_the_compiled_one(tmp_path, digits):
    digits.save(tmp_path / "d.crm")
    loaded = crossrt.load_executable(tmp_path / "d.crm")
    assert loaded == digits
    assert loaded.describe() == digits.describe()
    assert loaded.options == digits.options
    assert loaded.inputs[0] == TensorSpec("input", crossrt.dtypes.from_name("float32"), (None, 64))


def test_non_default_options_and_symbolic_dims_round_trip():
    b = GraphBuilder("sym")
    x = b.input("x", "float32", ["N", 3])
    b.output(b.op("Relu", [x]))
    exe = crossrt.compile(b.finish(), performance_mode="LOW", driver="onnxruntime")
    loaded = crossrt.load_executable(exe.to_bytes())
    assert loaded.options.performance_mode is crossrt.drivers.PerformanceMode.LOW
    assert loaded.inputs[0].shape == ("N", 3)
    assert loaded == exe


def test_to_bytes_is_deterministic_and_equals_the_saved_file(tmp_path, digits, digits_bytes):
    digits.save(tmp_path / "d.crm")
    assert (tmp_path / "d.crm").read_bytes() == digits_bytes == digits.to_bytes()
    assert crossrt.compiler.executables_to_bytes([digits]) == digits_bytes


def test_layout_matches_the_documented_format(digits_bytes):
    magic, version, flags, length, digest = struct.unpack_from("<8sIIQ32s8x", digits_bytes)
    assert (magic, version, flags) == (b"CROSSRTM", 3, 0)
    assert digits_bytes[56:64] == bytes(8)
    text = digits_bytes[64 : 64 + length]
    assert hashlib.sha256(text).digest() == digest
    header = json.loads(text)
    assert header["producer"] == {"name": "crossrt", "version": crossrt.__version__}
    assert header["format_version"] == 3
    (net,) = header["networks"]
    assert net["stages"] == [] and net["cores_required"] == 1
    assert set(net["nodes"][0]) >= {"name", "driver", "driver_version", "section", "cores"}
    (section,) = header["sections"]
    assert section["offset"] % 4096 == 0 and section["offset"] >= 64 + length
    assert section["offset"] + section["length"] == len(digits_bytes)
    blob = digits_bytes[section["offset"] :]
    assert len(blob) < 16 << 20  # one chunk: the digest of its digest
    one = hashlib.sha256(hashlib.sha256(blob).digest()).digest()
    assert section["sha256"] == one.hex()
    assert header["sections_sha256"] == hashlib.sha256(one).hexdigest()
    # A file written by this independent writer loads too.
    assert crossrt.load_executable(build(*split(digits_bytes))) == crossrt.load_executable(
        digits_bytes
    )


# -- zero copy --------------------------------------------------------------------------------


def _shares(view: memoryview | bytes, buffer: Any) -> bool:
    return np.shares_memory(np.frombuffer(view, np.uint8), np.frombuffer(buffer, np.uint8))


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview"])
def test_loading_from_memory_does_not_copy_the_artifact(digits, digits_bytes, kind):
    buffer = {
        "bytes": lambda: digits_bytes,
        "bytearray": lambda: bytearray(digits_bytes),
        "memoryview": lambda: memoryview(bytearray(digits_bytes)),
    }[kind]()
    exe = crossrt.load_executable(buffer)
    artifact = exe.nodes[0].artifact
    assert isinstance(artifact, memoryview) and artifact.readonly is (kind == "bytes")
    assert _shares(artifact, buffer)
    assert bytes(artifact) == digits.nodes[0].artifact
    images = np.load(IMAGES)[:16]
    expected = _run(digits, {"input": images})
    got = _run(exe, {"input": images})
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_loading_a_file_maps_it_read_only(tmp_path, digits):
    digits.save(tmp_path / "d.crm")
    artifact = crossrt.load_executable(str(tmp_path / "d.crm")).nodes[0].artifact
    assert isinstance(artifact, memoryview) and artifact.readonly
    assert isinstance(artifact.obj, mmap.mmap)
    with pytest.raises(TypeError):
        artifact[0] = 0  # type: ignore[index]


def test_a_two_dimensional_memoryview_is_read_as_bytes(digits_bytes):
    buffer = bytearray(digits_bytes)
    exe = crossrt.load_executable(memoryview(buffer).cast("B", shape=[1, len(buffer)]))
    assert _shares(exe.nodes[0].artifact, buffer)


def test_a_strided_buffer_is_refused(digits_bytes):
    strided = memoryview(np.frombuffer(digits_bytes * 2, np.uint8)[::2])
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        crossrt.load_executable(strided)


# -- several networks -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two(digits) -> bytes:
    ref = crossrt.compile(DIGITS, driver="reference")
    return crossrt.compiler.executables_to_bytes({"fast": digits, "exact": ref})


def test_networks_are_chosen_by_name(two):
    assert crossrt.compiler.list_networks(two) == ["fast", "exact"]
    assert crossrt.load_executable(two, "exact").nodes[0].driver == "reference"
    assert crossrt.load_executable(two, network="fast").nodes[0].driver == "onnxruntime"
    images = np.load(IMAGES)[:8]
    a = _run(crossrt.load_executable(two, "fast"), {"input": images})
    b = _run(crossrt.load_executable(two, "exact"), {"input": images})
    np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.parametrize("name", [None, "nope"])
def test_an_ambiguous_or_unknown_network_lists_the_names(two, name):
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.load_executable(two, name)
    assert info.value.code is StatusCode.INVALID
    assert "'fast'" in info.value.message and "'exact'" in info.value.message
    assert info.value.details["networks"] == ["fast", "exact"]


def test_identical_artifacts_are_stored_once(digits):
    data = crossrt.compiler.executables_to_bytes({"a": digits, "b": digits})
    header, blobs = split(data)
    assert len(blobs) == 1
    assert [n["nodes"][0]["section"] for n in header["networks"]] == [0, 0]
    assert crossrt.load_executable(data, "b") == dataclasses.replace(digits, name="b")


def test_same_model_names_are_refused_unless_named(digits):
    with pytest.raises(InvalidArgumentError, match="two networks are called 'digits_mlp'"):
        crossrt.compiler.executables_to_bytes([digits, digits])


@pytest.mark.parametrize(
    ("value", "fragment"),
    [([], "no executables"), (["x"], "cannot write a str"), ({"": None}, "cannot write")],
)
def test_writing_bad_arguments_is_refused(value, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        crossrt.compiler.executables_to_bytes(value)


def test_options_json_cannot_hold_are_refused(digits):
    bad = dataclasses.replace(digits, options=CompileOptions(extensions={"x": float("nan")}))
    with pytest.raises(InvalidArgumentError, match="JSON values"):
        bad.to_bytes()


def test_a_multi_node_executable_round_trips_with_its_dataflow():
    def part(name: str, op: str, src: str, dst: str) -> crossrt.Executable:
        b = GraphBuilder(name)
        b.output(b.op(op, [b.input(src, "float32", [2])], outputs=[dst]))
        return crossrt.compile(b.finish(), driver="onnxruntime")

    first, second = part("a", "Relu", "x", "h"), part("b", "Neg", "h", "y")
    nodes = (
        dataclasses.replace(first.nodes[0], name="n0"),
        dataclasses.replace(second.nodes[0], name="n1", driver="reference", cores=2),
    )
    exe = dataclasses.replace(first, name="two", outputs=second.outputs, nodes=nodes)
    loaded = crossrt.load_executable(exe.to_bytes(), check_drivers=False)
    assert loaded == exe
    assert loaded.cores_required == 2
    assert [n.inputs for n in loaded.nodes] == [("x",), ("h",)]
    # A node reading a tensor nobody produced is refused.
    broken = edit(exe.to_bytes(), lambda h: h["networks"][0]["nodes"].reverse())
    with pytest.raises(InvalidContainerError, match="reads 'h', which is neither"):
        read_container(broken)


# -- errors -----------------------------------------------------------------------------------


def _error(source: Any, cls: type[Exception] = InvalidContainerError, **kwargs: Any):
    with pytest.raises(cls) as info:
        crossrt.load_executable(source, **kwargs)
    assert isinstance(info.value, crossrt.CrossrtError)
    return info.value


def test_wrong_magic(digits_bytes):
    err = _error(b"NOTACRM!" + digits_bytes[8:])
    assert err.code is StatusCode.INVALID
    assert "does not start with b'CROSSRTM'" in err.message and "re-create it" in err.message


def test_an_onnx_model_is_not_a_container():
    err = _error(DIGITS)
    assert "crossrt.compile" in err.message


@pytest.mark.parametrize("keep", [0, 1, 63, 64, 100, -100, -1])
def test_a_truncated_file(digits_bytes, keep):
    err = _error(digits_bytes[: keep % len(digits_bytes)])
    assert err.code is StatusCode.INVALID
    assert "truncated" in err.message


def test_trailing_bytes_are_refused(digits_bytes):
    assert "5 bytes follow the last section" in _error(digits_bytes + b"extra").message


def test_a_flipped_header_bit_fails_the_header_hash(digits_bytes):
    err = _error(_flip(digits_bytes, 100, 3))
    assert "header's SHA-256 does not match" in err.message


def test_a_flipped_section_bit_fails_the_section_hash(digits_bytes):
    err = _error(_flip(digits_bytes, len(digits_bytes) - 10))
    assert err.code is StatusCode.INVALID
    assert "section 0 (node 'onnxruntime_0' of network 'digits_mlp'" in err.message
    assert "fails its SHA-256 check" in err.message


@pytest.mark.parametrize("position", [56, 63])
def test_reserved_prelude_bytes_must_be_zero(digits_bytes, position):
    assert "reserved bytes" in _error(_flip(digits_bytes, position)).message


def test_a_flipped_padding_bit_is_found(digits_bytes):
    header, _ = split(digits_bytes)
    (length,) = struct.unpack_from("<Q", digits_bytes, 16)
    if header["sections"][0]["offset"] == 64 + length:
        pytest.skip("no padding between header and section")
    assert "is not zero" in _error(_flip(digits_bytes, 64 + length)).message


@pytest.mark.parametrize(("field", "value"), [(8, 4), (8, 999), (12, 1)])
def test_a_newer_format_version_or_flag_says_upgrade(digits_bytes, field, value):
    data = bytearray(digits_bytes)
    data[field : field + 4] = struct.pack("<I", value)
    err = _error(bytes(data), UnsupportedError)
    assert err.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    assert "reads format version 3 only" in err.message and "upgrade crossrt" in err.message


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_format_says_compile_again(digits_bytes, version):
    # One format until 1.0: files of formats 1 and 2 (crossrt before format 3) are not read.
    data = bytearray(digits_bytes)
    data[8:12] = struct.pack("<I", version)
    err = _error(bytes(data), UnsupportedError)
    assert err.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    assert f"format version {version}, written by an older crossrt" in err.message
    assert "reads format version 3 only" in err.message
    assert "compile the model again with this crossrt" in err.message
    assert err.details["format_version"] == version


def test_format_version_zero_is_corrupt(digits_bytes):
    data = bytearray(digits_bytes)
    data[8:12] = bytes(4)
    err = _error(bytes(data))
    assert err.code is StatusCode.INVALID and "format version 0" in err.message


def test_an_unregistered_driver(digits_bytes):
    data = edit(digits_bytes, lambda h: h["networks"][0]["nodes"][0].update(driver="tpu9000"))
    err = _error(data, DeviceUnavailableError)
    assert err.code is StatusCode.DRIVER_UNAVAILABLE
    assert "needs driver 'tpu9000', which is not registered" in err.message
    assert "install the package that registers the 'tpu9000'" in err.message
    assert crossrt.load_executable(data, check_drivers=False).nodes[0].driver == "tpu9000"


def test_an_unavailable_driver(monkeypatch, digits_bytes):
    monkeypatch.setenv("CROSSRT_DISABLE_DRIVERS", "onnxruntime")
    monkeypatch.setattr(registry, "_statuses", None)
    err = _error(digits_bytes, DeviceUnavailableError)
    assert err.code is StatusCode.DRIVER_UNAVAILABLE
    assert "driver 'onnxruntime'" in err.message and "CROSSRT_DISABLE_DRIVERS" in err.message
    assert "remove 'onnxruntime' from CROSSRT_DISABLE_DRIVERS" in err.message
    monkeypatch.setattr(registry, "_statuses", None)


def test_a_driver_whose_engine_is_missing_says_what_to_install(monkeypatch, tmp_path, digits_bytes):
    # The hint comes from the driver (install_hint) or from the module its import misses.
    (tmp_path / "ghost_driver.py").write_text("import ghost_engine_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry._BUILTIN, "ghost", "ghost_driver:GhostDriver")
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setattr(registry, "_complete", None)
    data = edit(digits_bytes, lambda h: h["networks"][0]["nodes"][0].update(driver="ghost"))
    err = _error(data, DeviceUnavailableError)
    assert "pip install ghost_engine_not_installed" in err.message
    assert registry.driver_status("onnxruntime").install_hint  # every builtin says something
    monkeypatch.setattr(registry, "_statuses", None)
    monkeypatch.setattr(registry, "_complete", None)


def test_a_driver_version_mismatch_says_recompile(digits_bytes):
    data = edit(digits_bytes, lambda h: h["networks"][0]["nodes"][0].update(driver_version="0.0.1"))
    err = _error(data, UnsupportedError)
    assert err.code is StatusCode.UNSUPPORTED_NEFF_VERSION
    for part in ("'onnxruntime'", "version 0.0.1", f"version {ort.__version__} is installed"):
        assert part in err.message
    assert "recompile with `crossrt compile`" in err.message
    assert err.details == {
        "driver": "onnxruntime",
        "compiled": "0.0.1",
        "installed": ort.__version__,
    }


def test_missing_file_and_directory(tmp_path):
    assert _error(tmp_path / "nope.crm", ModelNotFoundError).code is StatusCode.NOT_FOUND
    assert "cannot read the container" in _error(tmp_path, InvalidArgumentError).message
    assert "cannot read a container from a int" in _error(3, InvalidArgumentError).message
    (tmp_path / "empty.crm").write_bytes(b"")
    assert "truncated: 0 bytes" in _error(tmp_path / "empty.crm").message


def _net(h: dict[str, Any]) -> dict[str, Any]:
    return h["networks"][0]


def _node(h: dict[str, Any]) -> dict[str, Any]:
    return h["networks"][0]["nodes"][0]


# (change to the header, a fragment of the message); rebuilt with a valid layout and hashes.
HEADER_ERRORS = [
    (lambda h: h.pop("networks"), "header field networks is missing"),
    (lambda h: h.update(networks=[]), "networks should be a non-empty list"),
    (lambda h: h.update(format_version=1), "format_version is 1, the prelude 3"),
    (lambda h: h["producer"].update(version=1), "producer.version should be a string, not 1"),
    (lambda h: _net(h).update(name=7), "networks[0].name should be a non-empty string"),
    (lambda h: _net(h).update(device="cpu:x"), "networks[0].device should be a device"),
    (lambda h: _net(h).update(device_kind="gpu"), "device 'cpu:0' is 'cpu'"),
    (lambda h: _net(h)["inputs"][0].update(dtype="float99"), "inputs[0]: tensor spec field"),
    (lambda h: _net(h)["inputs"][0].update(shape=[-1, 64]), "'input': shape must be null or"),
    (lambda h: _net(h)["inputs"].append(_net(h)["inputs"][0]), "names a tensor twice"),
    (lambda h: _net(h)["options"].update(turbo=True), "options: unknown compile option"),
    (lambda h: _net(h)["options"].update(fp16="yes"), "options: compile option fp16"),
    (lambda h: _net(h).update(cores_required=0), "cores_required should be an integer >= 1"),
    (lambda h: _net(h).update(cores_required=3), "cores_required is 3, but a node needs 1"),
    (lambda h: _net(h).update(stages={}), "stages should be a list"),
    (lambda h: _net(h).update(stages=[{"inputs": 1}]), "stages[0] should be an object"),
    (lambda h: _net(h).update(nodes=[]), "nodes should be a non-empty list"),
    (lambda h: _node(h).update(section=1), "section should be a section index from 0 to 0"),
    (lambda h: _node(h).update(section=True), "section should be a section index"),
    (lambda h: _node(h).update(section=-1), "section should be a section index"),
    (lambda h: _node(h).update(cores=1.5), "cores should be an integer >= 1, not 1.5"),
    (lambda h: _node(h).update(inputs="input"), "inputs should be a list of tensor names"),
    (lambda h: _node(h)["op_types"].update(Add=-1), "op_types should be an object"),
    (lambda h: _node(h).update(target=["cpu"]), "target should be an object of strings"),
    (lambda h: _node(h).update(target={"cpu": 1}), "target should be an object of strings"),
    (lambda h: _node(h).update(outputs=["label"]), "no node produces the network output"),
    (lambda h: _net(h)["nodes"].append(_node(h)), "two nodes called 'onnxruntime_0'"),
    (lambda h: h["networks"].append(_net(h)), "two networks are called 'digits_mlp'"),
]


@pytest.mark.parametrize(("change", "fragment"), HEADER_ERRORS)
def test_each_header_field_is_validated(digits_bytes, change, fragment):
    err = _error(edit(digits_bytes, change))
    assert err.code is StatusCode.INVALID
    assert fragment in err.message
    assert "re-create it" in err.message


def test_an_unused_section_is_refused(digits_bytes):
    header, blobs = split(digits_bytes)
    assert "section 1 is used by no node" in _error(build(header, [*blobs, b"x"])).message


# (change to the section table in place, a fragment of the message).
TABLE_ERRORS = [
    (lambda s: s[0].update(offset=s[0]["offset"] + 1), "is not a multiple of 4096"),
    # Sections at multiples of 64, as crossrt wrote before they started at pages: not read.
    (lambda s: s[0].update(offset=s[0]["offset"] + 64), "is not a multiple of 4096"),
    (lambda s: s[0].update(offset=s[0]["offset"] - 4096), "overlaps the header"),
    (lambda s: s[0].update(length=s[0]["length"] + 1), "truncated: sections[0] ends at"),
    (lambda s: s[0].update(length=s[0]["length"] - 1), "1 bytes follow the last section"),
    (lambda s: s[0].update(sha256="AB" * 32), "sha256 should be a SHA-256"),
    (lambda s: s[0].update(offset="1216"), "offset should be an integer >= 0"),
]


@pytest.mark.parametrize(("change", "fragment"), TABLE_ERRORS)
def test_each_section_offset_and_length_is_validated(digits_bytes, change, fragment):
    data = patch_header(digits_bytes, lambda h: change(h["sections"]))
    err = _error(data)
    assert fragment in err.message


def test_overlapping_sections_are_refused(digits_bytes):
    header, blobs = split(digits_bytes)
    two = build(header, [*blobs, b"x" * 100])
    data = patch_header(two, lambda h: h["sections"][1].update(offset=h["sections"][0]["offset"]))
    assert "sections[1] at offset" in _error(data).message
    assert "overlaps section 0" in _error(data).message


def test_a_wrong_sections_sha256(digits_bytes):
    data = patch_header(digits_bytes, lambda h: h.update(sections_sha256="0" * 64))
    assert "sections_sha256 does not match" in _error(data).message
    assert crossrt.load_executable(data, validate_hash=False)


def test_a_section_digest_of_a_legacy_format_is_refused(digits_bytes):
    # Formats 1 and 2 hashed a section's bytes once, not its chunks' digests.
    _, blobs = split(digits_bytes)
    data = edit_sections(digits_bytes, hashlib.sha256(blobs[0]).hexdigest())
    err = _error(data)
    assert "section 0" in err.message and "fails its SHA-256 check" in err.message


def edit_sections(data: bytes, digest: str) -> bytes:
    """``data`` with section 0's ``sha256`` replaced (``sections_sha256`` kept consistent)."""
    header, _ = split(data)
    header["sections"][0]["sha256"] = digest
    rest = [bytes.fromhex(s["sha256"]) for s in header["sections"]]
    header["sections_sha256"] = hashlib.sha256(b"".join(rest)).hexdigest()
    return patch_header(
        data,
        lambda h: h.update(sections=header["sections"], sections_sha256=header["sections_sha256"]),
    )


def test_a_section_of_several_chunks_is_hashed_chunk_by_chunk_and_checked(digits_bytes):
    header, blobs = split(digits_bytes)
    big = blobs[0] + bytes((16 << 20) * 2 + 5 - len(blobs[0]))  # 3 chunks; padding after
    data = build(header, [big])
    (entry,) = json.loads(data[64 : 64 + struct.unpack_from("<Q", data, 16)[0]])["sections"]
    chunks = [big[at : at + (16 << 20)] for at in range(0, len(big), 16 << 20)]
    assert len(chunks) == 3
    expected = hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in chunks)).hexdigest()
    assert entry["sha256"] == expected
    assert read_container(data, validate_hash=True).hashes_checked
    flipped = bytearray(data)
    flipped[entry["offset"] + (16 << 20) + 7] ^= 1  # a byte of the middle chunk
    assert "section 0" in _error(bytes(flipped)).message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b"[1, 2]", "header is a JSON list"),
        (b'{"a": 1, "a": 2}', "a key appears twice"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
        (b"{", "not valid JSON"),
    ],
)
def test_a_header_that_is_not_a_json_object(text, fragment):
    assert fragment in _error(prelude(text) + text).message


# -- hash validation setting ------------------------------------------------------------------


def test_validate_hash_off_skips_section_hashes_not_the_header(monkeypatch, tmp_path, digits):
    digits.save(tmp_path / "d.crm")
    good = (tmp_path / "d.crm").read_bytes()
    (tmp_path / "section.crm").write_bytes(_flip(good, len(good) - 10))
    (tmp_path / "header.crm").write_bytes(_flip(good, 100))
    monkeypatch.setenv("CROSSRT_VALIDATE_HASH", "0")
    assert crossrt.load_executable(tmp_path / "section.crm").name == "digits_mlp"
    assert not read_container(tmp_path / "section.crm").hashes_checked
    assert "header's SHA-256" in _error(tmp_path / "header.crm").message
    # The argument overrides the setting, both ways.
    assert "fails its SHA-256" in _error(tmp_path / "section.crm", validate_hash=True).message
    monkeypatch.setenv("CROSSRT_VALIDATE_HASH", "yes")
    assert "fails its SHA-256" in _error(tmp_path / "section.crm").message
    assert crossrt.load_executable(tmp_path / "section.crm", validate_hash=False)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("TRUE", True), ("yes", True), ("", True), ("0", False), ("no", False)],
)
def test_validate_hash_setting_values(value, expected):
    assert settings({"CROSSRT_VALIDATE_HASH": value}).validate_hash is expected
    assert settings({}).validate_hash is True


def test_validate_hash_setting_refuses_other_values():
    with pytest.raises(InvalidOptionError, match="CROSSRT_VALIDATE_HASH='maybe'"):
        _ = settings({"CROSSRT_VALIDATE_HASH": "maybe"}).validate_hash


# -- saving -----------------------------------------------------------------------------------


def test_save_replaces_atomically_and_an_open_mapping_keeps_the_old_file(tmp_path, digits):
    path = tmp_path / "m.crm"
    digits.save(path)
    old = crossrt.load_executable(path)
    ref = crossrt.compile(DIGITS, driver="reference")
    ref.save(path)  # replaces the file under the open mapping
    assert crossrt.load_executable(path).nodes[0].driver == "reference"
    assert bytes(old.nodes[0].artifact) == digits.nodes[0].artifact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.crm"]  # no temporary left behind


def test_save_to_a_missing_directory(tmp_path, digits):
    with pytest.raises(InvalidArgumentError, match="cannot write the container") as info:
        digits.save(tmp_path / "no" / "m.crm")
    assert info.value.details["path"].endswith("m.crm")
    assert list(tmp_path.iterdir()) == []


def test_saved_file_mode_follows_the_umask(tmp_path, digits):
    old = os.umask(0o022)
    try:
        digits.save(tmp_path / "m.crm")
    finally:
        os.umask(old)
    assert (tmp_path / "m.crm").stat().st_mode & 0o777 == 0o644


# -- TensorSpec.from_dict ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        TensorSpec("x", crossrt.dtypes.from_name("float32"), (None, "N", 3)),
        TensorSpec("s", crossrt.dtypes.from_name("int64"), ()),
        TensorSpec("seq", None, None, "sequence"),
        TensorSpec("b", crossrt.dtypes.from_name("bfloat16"), None),
    ],
)
def test_tensor_spec_round_trips_through_its_dict(spec):
    assert TensorSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(
    "data",
    [[], {}, {"name": 1}, {"name": "x", "kind": 2}, {"name": "x", "dtype": "f4"}],
)
def test_tensor_spec_from_a_bad_dict(data):
    with pytest.raises(InvalidArgumentError, match="tensor spec field"):
        TensorSpec.from_dict(data)


# -- crossrt run on a .crm --------------------------------------------------------------------


def test_crossrt_run_accepts_a_container(tmp_path, capsys, digits, two):
    images = np.load(IMAGES)[:4]
    np.save(tmp_path / "x.npy", images)
    digits.save(tmp_path / "d.crm")
    argv = [str(tmp_path / "d.crm"), "-i", f"input={tmp_path / 'x.npy'}", "-o", str(tmp_path)]
    assert run_tool.main(argv) == 0, capsys.readouterr().err
    expected = _run(digits, {"input": images})
    np.testing.assert_array_equal(np.load(tmp_path / "label.npy"), expected["label"])
    (tmp_path / "two.crm").write_bytes(two)
    assert run_tool.main([str(tmp_path / "two.crm"), "-o", str(tmp_path)]) == 1
    assert "choose one with network=NAME" in capsys.readouterr().err
    assert (
        run_tool.main([str(tmp_path / "two.crm"), "--network", "exact", "-o", str(tmp_path)]) == 0
    )
    assert "(reference)" in capsys.readouterr().out


def test_a_node_carries_its_drivers_description_of_the_artifact(digits_bytes):
    exe = crossrt.load_executable(digits_bytes)
    assert exe.nodes[0].target["optimization"] == "all"
    assert exe.nodes[0].describe()["target"] == exe.nodes[0].target
    untargeted = edit(digits_bytes, lambda h: _node(h).pop("target"))  # files from before
    assert crossrt.load_executable(untargeted).nodes[0].target == {}
