"""``server/rest_json.py``: JSON requests whose long arrays of numbers are read into tensors
without a Python object per number. The same values as ``json.loads``, or a ValueError."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossrt.server import rest_json
from crossrt.server.rest_json import Numbers


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
