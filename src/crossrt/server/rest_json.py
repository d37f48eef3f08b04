"""JSON requests read without an object per number.

``json.loads`` makes a Python float (24 bytes) and a list slot (8) of every number: 16 MiB of
``"0.5,"`` cost 176 MiB, 11 times the body, before any check of the request's shape. Here a
large body is decoded with the standard library's pure-Python scanner, whose arrays this
module parses itself: an array of numbers (flat or nested) is kept as its text
(:class:`Numbers`), counted with ``str.count`` and checked against the input's shape before
anything is allocated for it, then parsed by NumPy straight into the tensor's dtype. The rest
of the document (names, shapes, parameters: small) is parsed as ``json`` would. Measured on
16 MiB of ``"0.5,"`` (4 Mi FP32 values): json 176 MiB and 1.9 s, this about 48 MiB (the text
once more, then the tensor) in about the same time.

python-rapidjson (in the lock) makes the same objects as json (194 MiB, 1.7 s), and orjson
is not in the lock.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

import numpy as np

SMALL = 64 * 1024
"""Bodies shorter than this are parsed by ``json.loads``: at most a few MiB either way, and
the C scanner is faster on small documents."""

MARKED = 1024
"""Arrays of numbers whose text is at least this long are kept as :class:`Numbers`."""

_FLAT = re.compile(r"[0-9eE.+\-,\s]*")
_NESTED = re.compile(r"[0-9eE.+\-,\s\[\]]*")
_BRACKET = re.compile(r"[\[\]]")


class Numbers:
    """An array of numbers of a JSON document, as its text (brackets replaced by spaces).

    Attributes:
        text: the numbers, separated by commas.
        count: how many there are, from the commas.
    """

    __slots__ = ("count", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.count = text.count(",") + 1 if text.strip() else 0

    def array(self, dtype: np.dtype[Any]) -> np.ndarray:
        """The numbers as a flat array of ``dtype``.

        Raises:
            ValueError: a value is not a number of that kind, out of its range, or the
                array's structure is not one of numbers separated by commas.
        """
        integral = dtype.kind in "iub"
        if integral and any(c in self.text for c in ".eE"):
            raise ValueError("a value is not a whole number")
        wide = np.dtype(np.uint64 if dtype.kind == "u" else np.int64) if integral else dtype
        if dtype.kind == "f" and dtype not in (np.float32, np.float64):
            wide = np.dtype(np.float64)  # float16, bfloat16: parsed wide, then cast
        values = np.fromstring(self.text, dtype=wide, sep=",")
        if len(values) != self.count:
            raise ValueError("the values are not numbers separated by commas")
        if wide == dtype:
            return values
        if integral and dtype.kind != "b" and len(values):
            info = np.iinfo(dtype)
            if values.min() < info.min or values.max() > info.max:
                raise ValueError(f"a value is out of range [{info.min}, {info.max}]")
        return values.astype(dtype)

    def plain(self) -> list[Any]:
        """The numbers as a flat list (for a place that takes a small list)."""
        return list(json.loads(f"[{self.text}]")) if self.count else []


def loads(body: bytes | bytearray | memoryview) -> Any:
    """The JSON document ``body``, its long arrays of numbers as :class:`Numbers`.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or not UTF-8.
    """
    if len(body) < SMALL:
        return json.loads(bytes(body))
    text = str(body, "utf-8")  # no copy of the bytes first; UnicodeDecodeError: ValueError
    return _Decoder().decode(text)


class _Decoder(json.JSONDecoder):
    def __init__(self) -> None:
        super().__init__()
        self.parse_array = _array
        # the pure-Python scanner calls parse_array; the C one parses arrays itself
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]


def _array(s_and_end: tuple[str, int], scan_once: Any) -> tuple[Any, int]:
    """``json.decoder.JSONArray``, but a long array of numbers is kept as its text."""
    s, start = s_and_end  # start: just after the '['
    end = _FLAT.match(s, start).end()  # type: ignore[union-attr]
    if end - start >= MARKED and s[end : end + 1] == "]":
        return Numbers(s[start:end]), end + 1
    if s[end : end + 1] == "[" and not s[start:end].strip():
        close = _nested_end(s, start - 1)
        if close is not None and close - start >= MARKED:
            inner = s[start:close].replace("[", " ").replace("]", " ")
            return Numbers(inner), close + 1
    array: tuple[Any, int] = json.decoder.JSONArray(s_and_end, scan_once)  # type: ignore[attr-defined]
    return array


def _nested_end(s: str, opening: int) -> int | None:
    """Where the nested array of numbers opened at ``opening`` closes; ``None`` when what
    it holds is not only numbers and brackets."""
    run = _NESTED.match(s, opening + 1).end()  # type: ignore[union-attr]
    depth = 1
    for bracket in _BRACKET.finditer(s, opening + 1, run + 1):
        depth += 1 if bracket.group() == "[" else -1
        if not depth:
            return bracket.start()
    return None
