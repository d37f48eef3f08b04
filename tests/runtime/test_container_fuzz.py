"""Fuzzing the ``.crm`` loader: whatever the bytes, it returns an Executable or raises a
CrossrtError; never another exception, never a hang.

Byte-level mutations (bit flips, truncations, insertions) mostly stop at a hash or a layout
check, so header edits recompute the header's SHA-256 (and, in one variant, the whole
layout) to reach the JSON validation behind them.
"""

from __future__ import annotations

import contextlib
import io
import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crossrt
from crm_layout import align, build, prelude
from crossrt.compiler import read_container
from crossrt.model import GraphBuilder
from crossrt.tools import inspect as inspect_tool

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays stable
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _small_container() -> bytes:
    """Two networks (two drivers, shared-free sections) from a tiny model: fast to hash."""
    b = GraphBuilder("tiny")
    x = b.input("x", "float32", ["N", 3])
    b.output(b.op("Relu", [x], outputs=["y"]))
    model = b.finish()
    return crossrt.compiler.executables_to_bytes(
        {
            "ort": crossrt.compile(model, driver="onnxruntime"),
            "ref": crossrt.compile(model, driver="reference", performance_mode="NONE"),
        }
    )


VALID = _small_container()
_LENGTH = struct.unpack_from("<Q", VALID, 16)[0]
HEADER: dict[str, Any] = json.loads(VALID[64 : 64 + _LENGTH])
BLOBS = [VALID[s["offset"] : s["offset"] + s["length"]] for s in HEADER["sections"]]


def _in_place(header: Any) -> bytes:
    """The edited header with its hash recomputed; the sections' bytes stay where they were."""
    text = json.dumps(header, separators=(",", ":")).encode()
    room = HEADER["sections"][0]["offset"] - 64
    if len(text) <= room:
        text += b" " * (room - len(text))
        return prelude(text) + text + VALID[64 + room :]
    pad = bytes(align(64 + len(text)) - 64 - len(text))
    return prelude(text) + text + pad + VALID[64 + room :]


def _relaid(header: Any) -> bytes:
    """The edited header with valid offsets and hashes where it still has a section table."""
    if not isinstance(header, dict) or not isinstance(header.get("sections"), list):
        return _in_place(header)
    return build(header, BLOBS)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside the header (dict keys and list indices)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*prefix, i))
    return found


PATHS = _paths(HEADER)[1:]

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "cpu:0", "gpu", "onnxruntime", "float32", "NONE", "x", "y"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def header_edits(draw: st.DrawFn) -> bytes:
    header = json.loads(json.dumps(HEADER))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = header
        try:
            for step in path[:-1]:
                parent = parent[step]
            action = draw(st.sampled_from(["replace", "delete", "insert"]))
            if action == "replace":
                parent[path[-1]] = draw(JSON_VALUES)
            elif action == "delete":
                del parent[path[-1]]
            elif isinstance(parent, list):
                parent.insert(path[-1], draw(JSON_VALUES))
            else:
                parent[draw(st.text(max_size=8))] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or retyped this path
    relayout = draw(st.booleans())
    return _relaid(header) if relayout else _in_place(header)


@st.composite
def byte_mutations(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    # Half the positions in the prelude and header, where a change matters most.
    where = st.integers(0, len(data) - 1) | st.integers(0, 64 + _LENGTH)
    if kind == "flip":
        for position in draw(st.lists(where, min_size=1, max_size=8)):
            data[position] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del data[draw(where) :]
    elif kind == "insert":
        position = draw(where)
        data[position:position] = draw(st.binary(min_size=1, max_size=80))
    else:
        position = draw(where)
        chunk = draw(st.binary(min_size=1, max_size=16))
        data[position : position + len(chunk)] = chunk
    return bytes(data)


def _check(data: bytes, tmp: Path) -> None:
    try:
        container = read_container(data)
    except crossrt.CrossrtError:
        return
    # A container the reader accepts is whole: inspect prints all of it...
    path = tmp / "fuzz.crm"
    path.write_bytes(data)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert inspect_tool.main([str(path)]) == 0
        assert inspect_tool.main([str(path), "--json"]) == 0
    # ...and each network loads, or fails on its drivers with a CrossrtError.
    for name in container.names:
        with contextlib.suppress(crossrt.CrossrtError):
            assert crossrt.load_executable(data, name).describe()["name"] == name


@pytest.fixture(scope="module")
def tmp() -> Any:
    with tempfile.TemporaryDirectory(prefix="crossrt-fuzz-") as d:
        yield Path(d)


def test_the_unmutated_container_loads():
    assert crossrt.compiler.list_networks(VALID) == ["ort", "ref"]
    assert crossrt.load_executable(VALID, "ref").nodes[0].driver == "reference"


@FUZZ
@given(data=byte_mutations())
def test_byte_mutations_raise_only_crossrt_errors(tmp, data):
    _check(data, tmp)


@FUZZ
@given(data=header_edits())
def test_header_edits_with_a_valid_hash_raise_only_crossrt_errors(tmp, data):
    _check(data, tmp)


def test_header_edits_reach_the_json_validation(tmp):
    """The edits are not all stopped by the hash: most fail on a field, some still load."""
    messages: list[str] = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(data=header_edits())
    def collect(data: bytes) -> None:
        try:
            read_container(data)
            messages.append("loaded")
        except crossrt.CrossrtError as exc:
            messages.append(exc.message)

    collect()
    assert not any("header's SHA-256" in m for m in messages)
    assert sum("header field" in m for m in messages) > len(messages) // 4
    assert "loaded" in messages
