"""``server/rest_json.py``: JSON requests whose long arrays of numbers are read into tensors
without a Python object per number. The same values as ``json.loads``, or a ValueError."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossrt.server import json_numbers, rest_json
from crossrt.server.rest_json import Numbers


@pytest.fixture(autouse=True, params=["simdjson whole", "chunks"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both of the paths a body from WHOLE on may take: simdjson on the whole
    body (up to SIMD_WHOLE), and the scanner with chunks of text parsed apart (above it)."""
    if request.param == "chunks":
        monkeypatch.setattr(rest_json, "SIMD_WHOLE", 0)
    return str(request.param)


def _doc(data: object, **extra: object) -> bytes:
    """A request body long enough to be read by the scanner (WHOLE and more)."""
    doc = {"inputs": [{"name": "x", "shape": [1], "data": data}], **extra}
    body = json.dumps(doc).encode()
    return body + b" " * max(0, rest_json.WHOLE - len(body))


def test_long_arrays_become_numbers_and_the_rest_is_json() -> None:
    values = np.arange(5000, dtype=np.float32) / 8
    parsed = rest_json.loads(_doc(values.tolist(), parameters={"a": [1, 2], "s": "x"}))
    assert parsed["parameters"] == {"a": [1, 2], "s": "x"}  # short arrays stay lists
    data = parsed["inputs"][0]["data"]
    assert isinstance(data, Numbers) and data.count == 5000
    np.testing.assert_array_equal(data.array(np.dtype(np.float32)), values)
    np.testing.assert_array_equal(data.plain(), values.tolist())


def test_nested_arrays_flatten_row_major_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest_json, "CHUNK", 97)  # many chunks, cut anywhere between rows
    rows = np.arange(6000, dtype=np.int64).reshape(60, 100) - 3000
    data = rest_json.loads(_doc(rows.tolist()))["inputs"][0]["data"]
    assert isinstance(data, Numbers) and data.count == 6000
    np.testing.assert_array_equal(data.array(np.dtype(np.int32)), rows.ravel())
    np.testing.assert_array_equal(data.array(np.dtype(np.float16)), rows.ravel().astype(np.float16))


@pytest.mark.parametrize(
    ("text", "dtype", "why"),
    [
        ("[" + "1, " * 3000 + "1.5]", np.int32, "not a whole number"),
        ("[" + "1, " * 3000 + "300]", np.int8, "out of range"),
        ("[" + "1, " * 3000 + "-1]", np.uint8, "out of range"),
        ("[" + "1, " * 3000 + "1-2]", np.float32, "not numbers separated by commas"),
        ("[" + "1, " * 3000 + ", 2]", np.float32, "no number"),  # NumPy read -1 there
        ("[" + "1, " * 3000 + "2, ]", np.float32, "no number"),
        ("[ ," + "1, " * 3000 + "2]", np.float32, "no number"),
        ("[[" + "1, " * 3000 + "2], []]", np.float32, "no number"),
        ("[[" + "1, " * 3000 + "2] [3]]", np.float32, "not numbers separated by commas"),
    ],
)
def test_what_is_not_a_number_of_the_type_is_a_value_error(
    text: str, dtype: type, why: str
) -> None:
    body = b'{"d": ' + text.encode() + b"}" + b" " * rest_json.WHOLE
    data = rest_json.loads(body)["d"]
    assert isinstance(data, Numbers)
    with pytest.raises(ValueError, match=why):
        data.array(np.dtype(dtype))


def test_what_is_not_json_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(ValueError):
        rest_json.loads(b'{"d": [' + b"1, " * 30000 + b"nope]}")
    with pytest.raises(ValueError):
        rest_json.loads(b'{"d": [' + b"1, " * 30000 + b"1}")
    nest = b"[" * 10_000 + b"]" * 10_000  # json: RecursionError
    assert len(nest) < rest_json.WHOLE
    with pytest.raises(ValueError):  # read whole: orjson refuses what nests over 1024 deep
        rest_json.loads(nest)
    deep = rest_json.loads(nest + b" " * rest_json.WHOLE)  # read in chunks: kept as text
    assert isinstance(deep, Numbers) and deep.count == 0


def _numbers(text: str) -> Numbers:
    """``text`` (a JSON array) as the document's long array, read by the chunked path."""
    data = rest_json.loads(b'{"d": ' + text.encode() + b"}" + b" " * rest_json.WHOLE)["d"]
    assert isinstance(data, Numbers)
    return data


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("BOOL", [0, 1] * 600),
        ("INT8", [-128, 127, 0] * 400),
        ("INT16", [-(2**15), 2**15 - 1] * 600),
        ("INT32", [-(2**31), 2**31 - 1] * 600),
        ("INT64", [-(2**63), 2**63 - 1, 0] * 400),
        ("UINT8", [0, 255] * 600),
        ("UINT16", [0, 2**16 - 1] * 600),
        ("UINT32", [0, 2**32 - 1] * 600),
        ("UINT64", [0, 2**64 - 1, 2**63] * 400),
        ("FP16", [0.5, -65504.0, 1e-3] * 400),
        ("BF16", [0.5, -3.0e38, 1e-3] * 400),
        ("FP32", [0.1, -3.4028234663852886e38, 1.401298464324817e-45] * 400),
        ("FP64", [0.1, -1.7976931348623157e308, 5e-324, -0.0, 2**53 + 1] * 240),
    ],
)
def test_every_kserve_datatype_reads_as_numpy_reads_the_values(
    datatype: str, values: list[float]
) -> None:
    from crossrt import dtypes

    dtype = np.dtype(dtypes.from_kserve(datatype).numpy)
    data = _numbers(json.dumps(values))
    got = data.array(dtype, len(values))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.array(values, dtype=dtype))
    if dtype.kind == "f":  # -0.0 keeps its sign
        assert np.array_equal(np.signbit(got), np.signbit(np.array(values, dtype=dtype)))


def test_an_integer_past_64_bits_is_a_float_as_orjson_reads_it() -> None:
    # simdjson refuses it; the chunk is read again by orjson, as a body read whole is
    values = [1.5] * 500 + [2**64, -(2**70)] + [2.5] * 500
    got = _numbers(json.dumps(values)).array(np.dtype(np.float64))
    np.testing.assert_array_equal(got, np.array(values, dtype=np.float64))


@pytest.mark.parametrize(
    ("bad", "dtype", "why"),
    [
        ("1.2.3", np.float32, "not numbers separated by commas"),
        ("--1", np.float32, "not numbers separated by commas"),
        ("1e", np.float64, "not numbers separated by commas"),
        ("01", np.float32, "not numbers separated by commas"),  # JSON has no leading zeros
        ("+1", np.float32, "not numbers separated by commas"),
        ("1 2", np.float32, "not numbers separated by commas"),
        ("1e3", np.int64, "not a whole number"),
        ("128", np.int8, "out of range"),
        ("-129", np.int8, "out of range"),
        ("9223372036854775808", np.int64, "out of range"),
        ("-1", np.uint64, "out of range"),
        ("18446744073709551616", np.uint64, "out of range"),
        ("1" * 30, np.int64, "out of range"),
        ("1" * 400, np.float64, "infinity"),
    ],
)
def test_a_bad_value_mid_array_across_chunks_is_named(
    monkeypatch: pytest.MonkeyPatch, bad: str, dtype: type, why: str
) -> None:
    monkeypatch.setattr(rest_json, "CHUNK", 1000)  # the bad value in the 3rd chunk of ~6
    text = "[" + "1, " * 800 + bad + ", 2" * 1000 + "]"
    data = _numbers(text)
    with pytest.raises(ValueError, match=why):
        data.array(np.dtype(dtype))


def test_a_wrong_count_is_named_with_the_count_held() -> None:
    data = _numbers("[" + "1.5, " * 2999 + "1.5]")
    for asked in (2999, 3001, 1, 10**15):  # 10**15: refused before anything is allocated
        with pytest.raises(rest_json.WrongCount) as raised:
            data.array(np.dtype(np.float32), asked)
        assert raised.value.count == 3000
    np.testing.assert_array_equal(data.array(np.dtype(np.float32), 3000), np.full(3000, 1.5))
    empty = rest_json.loads(b'{"d": [' + b" " * 3000 + b"]}" + b" " * rest_json.WHOLE)["d"]
    if isinstance(empty, Numbers):  # kept as text
        with pytest.raises(rest_json.WrongCount):
            empty.array(np.dtype(np.float32), 1)
    else:  # parsed: an empty list (rest.py counts 0 values)
        assert empty == []


def test_ragged_nests_read_row_major_as_a_body_read_whole() -> None:
    rows = [[float(i)] * (1 + i % 7) for i in range(400)]  # rows of 1..7 values
    flat = [v for row in rows for v in row]
    data = _numbers(json.dumps(rows))
    np.testing.assert_array_equal(data.array(np.dtype(np.float32), len(flat)), flat)
    with pytest.raises(ValueError, match="not numbers separated by commas"):
        _numbers("[[" + "1, " * 600 + "2] [3], [4]]").array(np.dtype(np.float32))


def test_a_truncated_body_is_not_json() -> None:
    body = _doc(np.arange(5000).tolist()).rstrip()
    for cut in (len(body) // 2, len(body) - 3, len(body) - 1):
        with pytest.raises(ValueError):
            rest_json.loads(body[:cut] + b" " * rest_json.WHOLE)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("padding", [0, rest_json.WHOLE, rest_json.STRINGS])
def test_nan_and_infinity_are_refused_at_every_size(constant: str, padding: int) -> None:
    body = b'{"d": [' + b"1, " * 600 + constant.encode() + b"]}"
    with pytest.raises(ValueError):
        rest_json.loads(body + b" " * padding)


@pytest.mark.parametrize("padding", [0, rest_json.WHOLE, rest_json.STRINGS])
def test_the_last_of_duplicate_keys_counts_at_every_size(padding: int) -> None:
    body = b'{"d": 1, "e": [' + b"1, " * 600 + b'1], "d": 2}'
    assert rest_json.loads(body + b" " * padding)["d"] == 2


def test_many_strings_are_read_by_orjson_under_strings(path: str) -> None:
    # BYTES data: the scanner would read each string with a Python call; past its budget the
    # body is read by orjson whole (its long arrays as lists), the same values as json.loads.
    # simdjson, reading a body whole, makes the strings in C and keeps the numbers.
    numbers = list(range(3000))
    doc = {"inputs": [{"name": "s", "data": [f"s{i}" for i in range(9000)]}, {"data": numbers}]}
    body = json.dumps(doc).encode()
    assert rest_json.WHOLE < len(body) < rest_json.STRINGS
    parsed = rest_json.loads(body)
    if path == "chunks":
        assert parsed == doc  # lists throughout: orjson's
    else:
        assert parsed["inputs"][0] == doc["inputs"][0]
        kept = parsed["inputs"][1]["data"]
        np.testing.assert_array_equal(kept.array(np.dtype(np.int64)), numbers)
    few = {"inputs": [{"name": "s", "data": [f"s{i}" for i in range(50)]}, {"data": numbers}]}
    body = json.dumps(few).encode() + b" " * rest_json.WHOLE
    assert isinstance(rest_json.loads(body)["inputs"][1]["data"], Numbers)
    # from STRINGS on, memory first: the long array is kept as text all the same
    body = json.dumps(doc).encode() + b" " * rest_json.STRINGS
    parsed = rest_json.loads(body)
    assert parsed["inputs"][0] == doc["inputs"][0]
    assert isinstance(parsed["inputs"][1]["data"], Numbers)


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "FP32", "FP64", "INT8", "UINT64", "BOOL"])
def test_answers_are_written_from_the_array_and_read_back_the_same(datatype: str) -> None:
    import orjson

    from crossrt import dtypes

    dtype = np.dtype(dtypes.from_kserve(datatype).numpy)
    rng = np.random.default_rng(0)
    if dtype.kind == "b":
        values = rng.random(1000) > 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.array([info.min, info.max, 0] * 300, dtype=dtype)
    else:  # every kind of value: tiny, huge (within a half's range for halves), fractions, -0
        scale = 4 if dtype.itemsize == 2 else 30
        wide = rng.standard_normal(900) * 10.0 ** rng.integers(-scale, scale, 900)
        values = np.concatenate([wide, [-0.0, 0.1, 1 / 3]]).astype(dtype)
    written = rest_json.writable(values)
    assert isinstance(written, np.ndarray)  # orjson writes it from memory, no list
    text = orjson.dumps({"data": written}, option=orjson.OPT_SERIALIZE_NUMPY)
    back = np.array(json.loads(text)["data"], dtype=dtype)
    np.testing.assert_array_equal(back, values)
    if dtype.kind in "fV":
        assert np.array_equal(
            np.signbit(back.astype(np.float64)), np.signbit(values.astype(np.float64))
        )


def test_threads_parsing_at_once_each_get_their_own_values() -> None:
    # idle parsers are shared between requests: never two threads on one at once
    import threading

    arrays = [_numbers(json.dumps(list(range(i, i + 4000)))) for i in range(8)]
    got: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(arrays))

    def parse(i: int) -> None:
        start.wait(timeout=30)
        for _ in range(20):
            got[i] = arrays[i].array(np.dtype(np.int64), 4000)

    threads = [threading.Thread(target=parse, args=(i,)) for i in range(len(arrays))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for i in range(len(arrays)):
        np.testing.assert_array_equal(got[i], np.arange(i, i + 4000))
    assert len(json_numbers.IDLE) <= json_numbers.IDLE_PARSERS


@pytest.mark.parametrize(
    ("value", "datatype"),
    [("1e39", "FP32"), ("70000", "FP16"), ("1e39", "BF16"), ("-1e309", "FP64")],
)
def test_a_float_past_its_types_range_is_refused_at_every_size(value: str, datatype: str) -> None:
    from crossrt import dtypes

    dtype = np.dtype(dtypes.from_kserve(datatype).numpy)
    if datatype != "FP64":  # -1e309: no float64, orjson refuses the body
        with pytest.raises(rest_json.NotFinite, match="out of range"):
            rest_json.tensor([1.5, float(value)], dtype)  # a body read whole
    text = "[" + "1.5, " * 600 + value + "]"
    with pytest.raises(ValueError, match=r"out of range|infinity"):
        _numbers(text).array(dtype, 601)


def test_null_in_float_data_is_refused_not_made_nan() -> None:
    with pytest.raises(rest_json.NotFinite, match="null"):
        rest_json.tensor([[1.5, None], [2.5, 3.5]], np.dtype(np.float32))
    with pytest.raises(rest_json.NotFinite, match="null"):
        rest_json.finite(np.array([1.0, None], dtype=np.float64))
    ragged = [[1.5], [2.5, 3.5]]  # not NumPy's nest: the caller flattens it
    assert rest_json.tensor(ragged, np.dtype(np.float32)) is None


@pytest.mark.parametrize(
    ("data", "dtype", "why"),
    [
        ([1.5, 1], np.int8, "not a whole number: 1.5"),  # NumPy made it 1
        ([1000.0, 2], np.int64, "not a whole number: 1000.0"),  # 1e3
        ([True, 0.5], np.bool_, "not true or false: 0.5"),
        ([1, True], np.float32, "not a number: True"),
        ([1, None], np.float32, "not a number: None"),  # NumPy made it NaN
        ([1, 1e39], np.float32, "out of range of float32"),  # NumPy made it inf
    ],
)
def test_a_flattened_list_refuses_what_numpy_takes_in_silence(
    data: list[object], dtype: type, why: str
) -> None:
    # what rest.py flattens itself: a ragged nest or mixed kinds, which tensor() does not take
    with pytest.raises(ValueError, match=why):
        rest_json.flat_tensor(data, np.dtype(dtype))


def test_a_flattened_list_of_the_right_kinds_is_the_tensor() -> None:
    got = rest_json.flat_tensor([True, False, 1], np.dtype(np.bool_))
    np.testing.assert_array_equal(got, [True, False, True])
    got = rest_json.flat_tensor([1, 2.5, -3], np.dtype(np.float16))
    np.testing.assert_array_equal(got, np.array([1, 2.5, -3], np.float16))
    np.testing.assert_array_equal(
        rest_json.flat_tensor([2**64 - 1], np.dtype(np.uint64)), [2**64 - 1]
    )


def test_a_body_under_simd_whole_is_parsed_whole_and_exact(path: str) -> None:
    # An 80 KiB request took 1.3-1.6x orjson.loads' time through the scanner; simdjson whole,
    # 0.6x. Integers stay exact past float64's 2**53 (int64 first), unsigned past int64's.
    big = [2**60 + i for i in range(300)]
    unsigned = [2**63 + i for i in range(300)]
    body = _doc(big, parameters={"u": unsigned})
    assert len(body) < rest_json.SIMD_WHOLE or path == "chunks"
    parsed = rest_json.loads(body)
    data, more = parsed["inputs"][0]["data"], parsed["parameters"]["u"]
    assert isinstance(data, rest_json.Parsed) == (path == "simdjson whole")
    np.testing.assert_array_equal(data.array(np.dtype(np.int64)), np.array(big, np.int64))
    np.testing.assert_array_equal(more.array(np.dtype(np.uint64)), np.array(unsigned, np.uint64))
    with pytest.raises(ValueError, match="out of range"):
        more.array(np.dtype(np.int64))
    with pytest.raises(ValueError, match="out of range"):
        rest_json.loads(_doc([-1] * 300))["inputs"][0]["data"].array(np.dtype(np.uint64))
