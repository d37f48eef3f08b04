"""JSON requests read without an object per number.

``json.loads`` makes a Python float (24 bytes) and a list slot (8) of every number: 16 MiB of
``"0.5,"`` cost 176 MiB, 11 times the body, before any check of the request's shape. Here a
large body is decoded with the standard library's pure-Python scanner, whose arrays this
module parses itself: an array of numbers (flat or nested) is kept as the place of its text
in the document (:class:`Numbers`), counted with ``str.count`` and checked against the
input's shape before anything is allocated for it, then parsed by NumPy straight into the
tensor's dtype, a MiB of text at a time. The rest of the document (names, shapes,
parameters: small) is parsed as ``json`` would. The numbers themselves are read by orjson
(its C parser, 5-8x ``json``'s), a chunk of text at a time, and the chunk's list made into the
tensor's dtype at once; a body under :data:`WHOLE` is read by orjson whole, its arrays then
made into tensors by NumPy (no Python flattening): its objects cost at most ~11 times
``WHOLE``. ``benchmarks/json_requests.py`` (``results/json_requests.md``) measures them.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

import numpy as np
import orjson

WHOLE = 4 * 1024 * 1024
"""Bodies shorter than this are parsed by orjson whole (an object per number: at most ~44 MiB
for a request, against the 11x of a body up to ``max_json_bytes``)."""

MARKED = 1024
"""Arrays of numbers whose text is at least this long are kept as :class:`Numbers`."""

_FLAT = re.compile(r"[0-9eE.+\-,\s]*")
_NESTED = re.compile(r"[0-9eE.+\-,\s\[\]]*")
_BRACKET = re.compile(r"[\[\]]")


CHUNK = 1 << 20
"""Characters of numbers parsed at a time: the text is never copied whole."""

_DIGIT = re.compile(r"[0-9]")
_GAP = re.compile(r",\s+,")
"""An empty place between commas, which NumPy reads as -1 (``"1, , 2"``; so it does a
leading ``" ,1"`` and a trailing ``"1, "``)."""


class Numbers:
    """An array of numbers of a JSON document: where its text lies in the document, which
    it keeps (never a copy of its own).

    Attributes:
        count: how many numbers there are, from the commas.
    """

    __slots__ = ("_end", "_nested", "_start", "_text", "count")

    def __init__(self, text: str, start: int, end: int, nested: bool) -> None:
        self._text, self._start, self._end, self._nested = text, start, end, nested
        has_numbers = _DIGIT.search(text, start, end) is not None
        self.count = text.count(",", start, end) + 1 if has_numbers else 0

    def array(self, dtype: np.dtype[Any]) -> np.ndarray:
        """The numbers as a flat array of ``dtype``, parsed a chunk of the text at a time.

        Raises:
            ValueError: a value is not a number of that kind, out of its range, or the
                array's structure is not one of numbers separated by commas.
        """
        text, start, end = self._text, self._start, self._end
        integral = dtype.kind in "iub"
        if integral and any(text.find(c, start, end) >= 0 for c in ".eE"):
            raise ValueError("a value is not a whole number")
        wide = np.dtype(np.uint64 if dtype.kind == "u" else np.int64) if integral else dtype
        if dtype.kind == "f" and dtype not in (np.float32, np.float64):
            wide = np.dtype(np.float64)  # float16, bfloat16: parsed wide, then cast
        out = np.empty(self.count, dtype)
        done = 0
        while start < end and self.count:
            cut = text.rfind(",", start, start + CHUNK) if start + CHUNK < end else end
            cut = end if cut < 0 else cut
            piece = text[start:cut]
            if self._nested:
                piece = piece.replace("[", " ").replace("]", " ")
            piece = piece.strip()
            if piece.startswith(",") or piece.endswith(",") or _GAP.search(piece):
                raise ValueError("a place between commas holds no number")
            values = _parsed(piece, wide)
            if len(values) != piece.count(",") + 1 or done + len(values) > self.count:
                raise ValueError("the values are not numbers separated by commas")
            if integral and dtype.kind != "b" and wide != dtype and len(values):
                info = np.iinfo(dtype)
                if values.min() < info.min or values.max() > info.max:
                    raise ValueError(f"a value is out of range [{info.min}, {info.max}]")
            out[done : done + len(values)] = values
            done += len(values)
            start = cut + 1
        if done != self.count:
            raise ValueError("the values are not numbers separated by commas")
        return out

    def plain(self) -> list[Any]:
        """The numbers as a flat list (for a place that takes a small list)."""
        piece = self._text[self._start : self._end]
        if self._nested:
            piece = piece.replace("[", " ").replace("]", " ")
        return list(json.loads(f"[{piece}]")) if self.count else []


def loads(body: bytes | bytearray | memoryview) -> Any:
    """The JSON document ``body``, its long arrays of numbers as :class:`Numbers`.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or not UTF-8.
    """
    if len(body) < WHOLE:
        return orjson.loads(body)
    text = str(body, "utf-8")  # no copy of the bytes first; UnicodeDecodeError: ValueError
    return _Decoder().decode(text)


class _Decoder(json.JSONDecoder):
    def __init__(self) -> None:
        super().__init__()
        self.parse_array = _array
        # the pure-Python scanner calls parse_array; the C one parses arrays itself
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]


def _parsed(piece: str, dtype: np.dtype[Any]) -> np.ndarray:
    """Comma-separated numbers as an array of ``dtype``: orjson's parser, then one NumPy
    conversion of its list (a chunk's objects only, never the whole tensor's)."""
    try:
        return np.array(orjson.loads(f"[{piece}]"), dtype=dtype)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the values are not numbers separated by commas ({exc})") from None
    except OverflowError:
        raise ValueError(f"a value is out of range of {dtype}") from None


def tensor(data: Any, dtype: np.dtype[Any]) -> np.ndarray | None:
    """Nested lists of numbers (as orjson gives them) as a flat array of ``dtype``, made by
    NumPy in one step; ``None`` when they are not a regular nest of numbers of that kind
    (then the caller flattens them itself, and says what is wrong)."""
    if not isinstance(data, list):
        return None
    if dtype.kind in "fc":  # straight into the dtype: one pass, no float64 array first
        try:
            return np.array(data, dtype=dtype).reshape(-1)
        except (ValueError, TypeError, OverflowError):
            return None
    try:
        array = np.array(data)  # NumPy's own kind first: 1.5 or true must not become 1
    except (ValueError, TypeError, OverflowError):
        return None
    kind = array.dtype.kind
    if kind not in "biuf" or (dtype.kind in "iu" and kind not in "iu"):
        return None
    if (dtype.kind == "b") != (kind == "b"):
        return None
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            return None
    return array.astype(dtype, copy=False).reshape(-1)


def _array(s_and_end: tuple[str, int], scan_once: Any) -> tuple[Any, int]:
    """``json.decoder.JSONArray``, but a long array of numbers is kept as its text."""
    s, start = s_and_end  # start: just after the '['
    end = _numbers_end(s, start)
    if end is not None and end - start >= MARKED:
        return Numbers(s, start, end, nested=False), end + 1
    flat = _FLAT.match(s, start).end()  # type: ignore[union-attr]
    if s[flat : flat + 1] == "[" and not s[start:flat].strip():
        close = _nested_end(s, start - 1)
        if close is not None and close - start >= MARKED:
            return Numbers(s, start, close, nested=True), close + 1
    array: tuple[Any, int] = json.decoder.JSONArray(s_and_end, scan_once)  # type: ignore[attr-defined]
    return array


_NOT_NUMBERS = ("[", '"', "{", "t", "f", "n", "N", "I")
"""What an array of plain numbers cannot hold: a nest, a string, an object, true, false,
null, NaN, Infinity. Looked for with ``str.find`` (C's memchr): a regular expression over
tens of MiB of digits took longer than parsing them."""


def _numbers_end(s: str, start: int) -> int | None:
    """Where the flat array of numbers that starts at ``start`` closes, or ``None`` when it
    is something else. The numbers themselves are checked when they are parsed."""
    end = s.find("]", start)
    if end < 0 or any(s.find(c, start, end) >= 0 for c in _NOT_NUMBERS):
        return None
    return end


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
