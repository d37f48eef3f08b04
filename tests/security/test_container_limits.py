"""A hostile ``.crm`` header is refused within bounded memory (issue 13, item 3).

A header is JSON, and parsed JSON costs 5 to 25 times its size in Python objects: a 74 MiB
header of 4 million entries peaked at 1.2 GiB. The reader refuses a header over its byte or
value limits from the prelude and the raw bytes, before any JSON is parsed, and refuses
lists longer than a real container needs and names longer than any exporter writes
(65,536 characters; the header's size bounds them all together), naming the limit and the
value. The writer refuses the same, so crossrt never
writes a file it would refuse to read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

import crossrt
from crossrt import InvalidArgumentError, StatusCode
from crossrt.errors import InvalidContainerError
from crossrt.model import GraphBuilder
from limit_models import fanout

MiB = 1 << 20


@pytest.fixture(scope="module")
def tiny() -> crossrt.Executable:
    b = GraphBuilder("tiny")
    x = b.input("x", "float32", ["N", 3])
    b.output(b.op("Relu", [x], outputs=["y"]))
    return crossrt.compile(b.finish(), driver="onnxruntime")


@pytest.fixture(scope="module")
def tiny_bytes(tiny: crossrt.Executable) -> bytes:
    return tiny.to_bytes()


def _header(data: bytes) -> dict[str, Any]:
    (length,) = struct.unpack_from("<Q", data, 16)
    header: dict[str, Any] = json.loads(data[64 : 64 + length])
    return header


def _container(text: bytes, length: int | None = None) -> bytes:
    """A format-3 prelude and ``text`` as its header, with the header's hash right: what
    a hostile writer makes to reach the JSON behind the hash."""
    digest = hashlib.sha256(text).digest()
    prelude = struct.pack("<8sIIQ32s8x", b"CROSSRTM", 3, 0, len(text), digest)
    return prelude + text


def _refused(data: bytes | bytearray) -> tuple[InvalidContainerError, int, float]:
    """The error reading ``data`` raises, the peak of Python memory the read allocated, and
    the seconds it took."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(InvalidContainerError) as info:
            crossrt.load_executable(data)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code is StatusCode.INVALID
    return info.value, peak, seconds


def test_a_header_of_4_million_entries_is_refused_before_it_is_parsed():
    # 12 MiB of "{}," is under the byte limit: the value count refuses it. Parsed, it would
    # be 4 million dicts (~300 MiB).
    entries = 4_000_000
    text = b'{"networks":[' + b"{}," * (entries - 1) + b"{}]}"
    err, peak, _ = _refused(_container(text))
    values = 1 + sum(text.count(c) for c in (b",", b":", b"[", b"{"))  # as the reader counts
    assert f"holds up to {values:,} JSON values" in err.message
    assert "more than the 1,048,576" in err.message
    assert "re-create it" in err.message
    assert peak < 2 * len(text), f"the refused read allocated {peak / MiB:.0f} MiB"


def test_a_74_mib_header_is_refused_from_its_stated_length():
    # The file of issue 13: 4 million small objects, 74 MiB, hash right.
    entries = 4_000_000
    text = b'{"networks":[' + b'{"n":"x","v":1234},' * (entries - 1) + b'{"n":"x","v":1}]}'
    assert len(text) > 70 * MiB
    err, peak, _ = _refused(_container(text))
    assert f"{len(text):,} bytes" in err.message and "16 MiB" in err.message
    assert peak < 1 * MiB, f"the refused read allocated {peak / MiB:.0f} MiB"


def test_a_header_length_beyond_the_file_is_still_refused_as_over_the_limit():
    data = bytearray(_container(b"{}"))
    data[16:24] = struct.pack("<Q", 1 << 62)
    err, peak, _ = _refused(data)
    assert f"{1 << 62:,} bytes" in err.message and "16 MiB" in err.message
    assert peak < 1 * MiB


def _network(h: dict[str, Any]) -> dict[str, Any]:
    return h["networks"][0]


def _node(h: dict[str, Any]) -> dict[str, Any]:
    return h["networks"][0]["nodes"][0]


# (change to the header, the field it names, the value, the limit).
LIMITS: list[tuple[Callable[[dict[str, Any]], Any], str, int, int]] = [
    (lambda h: h.update(networks=[{}] * 1025), "networks", 1025, 1024),
    (lambda h: h.update(sections=[{}] * 65537), "sections", 65537, 65536),
    (lambda h: _network(h).update(nodes=[{}] * 4097), "networks[0].nodes", 4097, 4096),
    (lambda h: _network(h).update(stages=[{}] * 257), "networks[0].stages", 257, 256),
    (
        lambda h: _network(h).update(stages=[{"nodes": [{}] * 4097}]),
        "networks[0].stages[0].nodes",
        4097,
        4096,
    ),
    (lambda h: _node(h).update(inputs=["x"] * 65537), "networks[0].nodes[0].inputs", 65537, 65536),
    (
        lambda h: _network(h).update(outputs=[{"name": "y"}] * 65537),
        "networks[0].outputs",
        65537,
        65536,
    ),
    (
        lambda h: _network(h)["inputs"][0].update(shape=[1] * 65),
        "networks[0].inputs[0].shape",
        65,
        64,
    ),
    (
        lambda h: _network(h).update(stages=[{"inputs": {"x": [1] * 65}}]),
        "networks[0].stages[0].inputs['x']",
        65,
        64,
    ),
]


@pytest.mark.parametrize(
    ("change", "field", "value", "limit"), LIMITS, ids=[f for _, f, _, _ in LIMITS]
)
def test_each_list_is_bounded(tiny_bytes, change, field, value, limit):
    header = _header(tiny_bytes)
    change(header)
    err, _, _ = _refused(_container(json.dumps(header).encode()))
    assert f"header field {field} holds {value:,}" in err.message
    assert f"more than the {limit:,}" in err.message


def test_a_million_character_dimension_name_is_refused(tiny_bytes):
    # Limits are checked before the section table: this header needs no sections.
    name = "N" * 1_000_000
    header = _header(tiny_bytes)
    _network(header)["inputs"][0]["shape"][0] = name
    err, _, _ = _refused(_container(json.dumps(header).encode()))
    assert "networks[0].inputs[0].shape[0]" in err.message
    assert "1,000,000 characters" in err.message and "more than the 65,536" in err.message
    assert name not in err.message  # the name itself is not echoed


def test_a_dimension_name_of_65536_characters_round_trips(tiny):
    # A torch exporter writes a detector's dimension names as shape expressions: 330
    # characters and more (issue 23); on main 256 was the limit.
    spec = dataclasses.replace(tiny.inputs[0], shape=("N" * 65536, 3))
    exe = dataclasses.replace(tiny, inputs=(spec,))
    assert crossrt.load_executable(exe.to_bytes()).inputs == (spec,)


def test_writing_a_million_character_dimension_name_is_refused(tiny, tmp_path):
    spec = dataclasses.replace(tiny.inputs[0], shape=("N" * 1_000_000, 3))
    exe = dataclasses.replace(tiny, inputs=(spec,))
    with pytest.raises(InvalidArgumentError) as info:
        exe.save(tmp_path / "big.crm")
    assert "inputs[0].shape[0]" in info.value.message and "65,536" in info.value.message
    assert "cannot be written" in info.value.message
    assert not list(tmp_path.iterdir())


def test_writing_a_header_over_16_mib_is_refused(tiny):
    exe = dataclasses.replace(tiny, metadata={"labels": "x" * (17 * MiB)})
    with pytest.raises(InvalidArgumentError) as info:
        exe.to_bytes()
    assert "16 MiB" in info.value.message and "cannot be written" in info.value.message


def test_compile_refuses_what_save_would_so_a_compiled_model_can_be_cached_and_served():
    """1,200 outputs of 4,000-character names (4.8 MB) load; compiled with a shape stage, the
    header holds them four times (the network's and the stage's specs and node lists), over
    16 MiB. On main compile returned an executable that save, the cache and the daemon then
    refused; now compile refuses it, with the writer's message."""
    data = fanout(1200, name_length=4000)
    assert len(crossrt.load_model(data).outputs) == 1200  # within what one network holds
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.compile(data, device="cpu", stages=[{"x": [2, 4]}])
    message = info.value.message
    assert "could not be saved, cached or served" in message and "16 MiB" in message


def test_more_stages_than_a_container_holds_are_refused_before_compiling():
    b = GraphBuilder("staged")
    x = b.input("x", "float32", ["N", 3])
    b.output(b.op("Relu", [x], outputs=["y"]))
    with pytest.raises(crossrt.InvalidOptionError, match="257 given, more than the 256"):
        crossrt.compile(b.finish(), device="cpu", stages=[{"x": [n, 3]} for n in range(1, 258)])
