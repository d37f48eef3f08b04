"""JSON requests read without an object per number, and answers written likewise.

``json.loads`` makes a Python float (24 bytes) and a list slot (8) of every number: 16 MiB of
``"0.5,"`` cost 176 MiB, 11 times the body, before any check of the request's shape; orjson
too (12x), if 4-5x faster. Here a body is decoded with the standard library's pure-Python
scanner, whose arrays this module parses itself: an array of numbers (flat or nested) is
kept as the place of its text in the document (:class:`Numbers`), and the rest of the
document (names, shapes, parameters: small) is parsed as ``json`` would. The numbers are
read by simdjson's parser (pysimdjson) a chunk of text at a time, each chunk straight into a
typed buffer (int64, uint64 or float64: no Python object per number) and from it into the
tensor, which is allocated for the count the input's shape gives once the text is long
enough to hold it; the count is checked as the chunks are read. A chunk simdjson refuses is
read again by orjson, whose answer is the same as for a body read whole, or whose error names
the fault. A body under :data:`WHOLE` (64 KiB), or one under :data:`STRINGS` of which the scanner
would make more than a value a KiB itself (many strings, short arrays), is read by orjson
whole, its arrays then made into tensors by NumPy (no Python flattening). A body from
:data:`WHOLE` to :data:`SIMD_WHOLE` (1 MiB) is read by simdjson whole instead, where the
scanner's start cost more than the parse: its long arrays of numbers straight into typed
buffers (:class:`Parsed`), the rest made Python's. Answers are written by orjson from the
output arrays' memory (:func:`writable`), which the service keeps out of the protobuf
answer for the HTTP front.

``benchmarks/json_requests.py`` (``results/json_requests.md``, a loaded 2-vCPU VM; each row
its own process): 20 MiB of ``"0.5, "`` read in 0.12-0.17 s (orjson.loads alone 0.25-0.35 s,
with NumPy's conversion to the tensor 0.39-0.61 s) for 39-42 MiB of RSS (orjson: 244); 81
MiB of random float32s in 0.21-0.24 s (orjson: 0.30-0.43 / 0.55-0.81 s) for 99-104 MiB
(orjson: 305); a ResNet input (2.9 MiB) in 0.47-0.64 of orjson.loads' time. An 80 KiB input
(4 Ki FP32), paired call by call in one process: 1.01x orjson.loads alone (which makes no
tensor), 0.64x orjson with NumPy. Answers of 4 Mi values: 0.72-1.05x orjson.dumps(array).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

import numpy as np
import orjson
import simdjson

from .json_numbers import (
    BUFFER,
    WIDE,
    NotFinite,
    Numbers,
    Parsed,
    WrongCount,
    check_range,
    finite,
    keep_parser,
    simdjson_whole,
    take_parser,
)

__all__ = [
    "NotFinite",
    "Numbers",
    "Parsed",
    "TextNumbers",
    "WrongCount",
    "flat_tensor",
    "loads",
    "tensor",
    "writable",
]

WHOLE = 64 * 1024
"""Bodies shorter than this are parsed by orjson whole: below, the scanner's start costs more
than simdjson saves (equal at ~80 KiB: 0.1 ms)."""

SIMD_WHOLE = 1024 * 1024
"""Bodies from :data:`WHOLE` to this are parsed by simdjson whole, an input's data straight
into a typed buffer (:class:`Parsed`): no scanner in Python, whose start cost more than the
parse below ~200 KiB (80 KiB: 1.3-1.6x orjson.loads' time, simdjson whole 0.7x). A body
simdjson refuses, or whose data it cannot give as numbers, is read as a larger one is (the
same errors)."""

STRINGS = 4 * 1024 * 1024
"""Bodies shorter than this are parsed by orjson whole after all (an object per value: at most
~44 MiB for a request) once the scanner has made more than :data:`PER_VALUE` values of their
bytes itself, each a Python call (many strings: BYTES data; many short arrays)."""

PER_VALUE = 1024
"""Bytes of body for each value the scanner may make before orjson reads the body instead."""

MARKED = 1024
"""Arrays of numbers whose text is at least this long are kept as :class:`Numbers`."""

_FLAT = re.compile(r"[0-9eE.+\-,\s]*")
_NESTED = re.compile(r"[0-9eE.+\-,\s\[\]]*")
_BRACKET = re.compile(r"[\[\]]")


CHUNK = 1 << 18
"""Characters of numbers parsed at a time: the text is never copied whole, and a chunk's
parse (its copy, simdjson's tape and the buffer: ~4x the chunk) stays in the CPU's cache
(256 KiB: 40 ms for 4 Mi values of "0.5, ", 1 MiB: 62 ms)."""

_DIGIT = re.compile(r"[0-9]")
_GAP = re.compile(r",\s+,")
"""An empty place between commas (``"1, , 2"``), named as such when a chunk is refused."""


class TextNumbers(Numbers):
    """An array of numbers of a JSON document: where its text lies in the document, which
    it keeps (never a copy of its own)."""

    __slots__ = ("_end", "_nested", "_start", "_text")

    def __init__(self, text: str, start: int, end: int, nested: bool) -> None:
        self._text, self._start, self._end, self._nested = text, start, end, nested

    @property
    def count(self) -> int:
        """How many numbers there are, from the commas (a pass over the text: :meth:`array`
        given the count it needs counts as it parses instead)."""
        text, start, end = self._text, self._start, self._end
        if _DIGIT.search(text, start, end) is None:
            return 0
        return text.count(",", start, end) + 1

    def array(self, dtype: np.dtype[Any], count: int | None = None) -> np.ndarray:
        """The numbers as a flat array of ``dtype``, parsed a chunk of the text at a time.

        Args:
            dtype: the array's type.
            count: how many values are needed (the input's shape); ``None``: as many as
                there are, counted first.

        Raises:
            WrongCount: the array holds another number of values than ``count``.
            ValueError: a value is not a number of that kind, out of its range, or the
                array's structure is not one of numbers separated by commas.
        """
        text, start, end = self._text, self._start, self._end
        if count is None or count == 0 or 2 * count - 1 > end - start:
            # a number takes a character, and a comma one more: too few characters for
            # ``count`` are refused before the tensor is allocated
            count, expected = self.count, count
            if expected is not None and expected != count:
                raise WrongCount(count, expected)
        out = np.empty(count, dtype)
        done = 0
        while start < end and count:
            cut = text.rfind(",", start, start + CHUNK) if start + CHUNK < end else end
            cut = end if cut < 0 else cut
            piece = text[start:cut]
            if self._nested:
                piece = piece.replace("[", " ").replace("]", " ")
            values = _parsed(piece, dtype)
            if done + len(values) > count:
                raise WrongCount(self.count, count)
            with np.errstate(over="ignore"):  # past float32's range: inf, refused by finite
                out[done : done + len(values)] = values
            done += len(values)
            start = cut + 1
        if done != count:
            raise WrongCount(self.count, count)
        return finite(out)

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
    if len(body) < SIMD_WHOLE:
        doc = simdjson_whole(body, keep=len(body) <= 2 * CHUNK)
        if doc is not None:
            return doc
    text = str(body, "utf-8")  # no copy of the bytes first; UnicodeDecodeError: ValueError
    if len(body) >= STRINGS:
        return _Decoder(None).decode(text)
    try:
        return _Decoder(64 + len(body) // PER_VALUE).decode(text)
    except _Costly:
        return orjson.loads(body)


class _Costly(Exception):
    """The scanner made more values than its budget: orjson reads the body instead."""


class _Decoder(json.JSONDecoder):
    def __init__(self, budget: int | None) -> None:
        super().__init__(parse_constant=_constant)
        if budget is not None:  # each string and number the scanner makes counted
            left = [budget]

            def counted(parse: Any) -> Any:
                def parse_counted(*args: Any) -> Any:
                    left[0] -= 1
                    if left[0] < 0:
                        raise _Costly
                    return parse(*args)

                return parse_counted

            self.parse_string = counted(json.decoder.scanstring)  # type: ignore[attr-defined]
            self.parse_float = counted(float)
            self.parse_int = counted(int)
        self.parse_array = _array
        # the pure-Python scanner calls parse_array; the C one parses arrays itself
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]


def _constant(name: str) -> float:
    """NaN, Infinity and -Infinity refused, as orjson refuses them in a shorter body."""
    raise ValueError(f"{name} is not a JSON number; send such a tensor as binary data")


def _parsed(piece: str, dtype: np.dtype[Any]) -> np.ndarray:
    """Comma-separated numbers as an array of int64 (uint64 for an unsigned ``dtype``, float64
    for a float), checked to fit ``dtype``: simdjson's parser writes them into a buffer of
    that type, no Python object per number. On any error of its own the chunk is read again
    by :func:`_parsed_by_orjson`, which says what is wrong."""
    family = dtype.kind if dtype.kind in "biu" else "f"  # float16, bfloat16: read as float64
    parser = take_parser()
    try:
        array = parser.parse(f"[{piece}]")
        assert isinstance(array, simdjson.Array)  # the text in brackets: an array or an error
        values = np.frombuffer(array.as_buffer(of_type=BUFFER[family]), WIDE[family])
    except (ValueError, TypeError, RuntimeError):  # each of simdjson's errors is one of these
        # simdjson refuses integers past 64 bits that JSON allows (orjson reads them as
        # floats), and its error codes (TAPE_ERROR) do not say which rule a chunk broke
        values = _parsed_by_orjson(piece, dtype, family)
    finally:
        array = None  # the parser parses the next chunk only once its proxies are gone
        keep_parser(parser, len(piece) <= 2 * CHUNK)  # not one grown past that
    if dtype.kind in "iu" and dtype.itemsize < 8:  # the buffer's own type otherwise
        check_range(values, dtype)
    return values


_TAKEN = {"f": (float, int), "i": (int,), "u": (int,), "b": (bool, int)}
_WHAT = {"f": "a number", "i": "a whole number", "u": "a whole number", "b": "true or false"}
"""The Python types (as orjson and json give them) a family takes, and their words."""


def _parsed_by_orjson(piece: str, dtype: np.dtype[Any], family: str) -> np.ndarray:
    """What :func:`_parsed` gives, by orjson's parser and one NumPy conversion of its list
    (a chunk's objects only, never the whole tensor's); a ValueError that names the fault."""
    piece = piece.strip()
    if piece.startswith(",") or piece.endswith(",") or _GAP.search(piece):
        raise ValueError("a place between commas holds no number")
    try:
        values = orjson.loads(f"[{piece}]")
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the values are not numbers separated by commas ({exc})") from None
    _check_kinds(values, dtype, family)
    try:
        return np.array(values, dtype=WIDE[family])
    except OverflowError:
        raise ValueError(f"a value is out of range of {dtype}") from None


def _check_kinds(values: list[Any], dtype: np.dtype[Any], family: str) -> None:
    """Refuses what NumPy would take in silence: 1.5 or 1e3 as 1 or 1000, true as 1 for an
    integer type, null as NaN."""
    taken, none = _TAKEN[family], object()  # none: null is a value to find here
    wrong = next((value for value in values if type(value) not in taken), none)
    if wrong is none:
        return
    if isinstance(wrong, float) and wrong.is_integer() and abs(wrong) >= 2**63:
        raise ValueError(f"a value is out of range of {dtype}")  # orjson's float of a long int
    raise ValueError(f"a value is not {_WHAT[family]}: {str(wrong)[:40]}")


def flat_tensor(values: list[Any], dtype: np.dtype[Any]) -> np.ndarray:
    """A flat list of JSON values (what :func:`tensor` did not take: a ragged nest, mixed
    kinds) as an array of ``dtype``, each value checked to be one of its kind.

    Raises:
        ValueError: a value is not of the kind (``1.5`` for an integer type, ``true`` for a
            number, ``null``), or out of the type's range.
    """
    family = dtype.kind if dtype.kind in "biu" else "f"
    _check_kinds(values, dtype, family)
    with np.errstate(over="ignore"):  # refused by finite
        return finite(np.asarray(values, dtype=dtype))


def writable(values: np.ndarray) -> np.ndarray | list[Any]:
    """An output's values as orjson writes them (``OPT_SERIALIZE_NUMPY``): from the array's
    memory, no Python number per value, a float as the shortest text that reads back as the
    same value. float16 and bfloat16 are written as float32 (every half is one, and its text
    reads back as the same half; orjson's float16 and a list were 2-3x slower); a type
    orjson does not write becomes a list."""
    dtype = values.dtype
    if dtype.kind in "biu" or dtype in (np.float32, np.float64):
        return values
    if dtype.itemsize == 2 and np.can_cast(dtype, np.float32):  # float16, bfloat16
        return values.astype(np.float32)
    return list(values.tolist())


def tensor(data: Any, dtype: np.dtype[Any]) -> np.ndarray | None:
    """Nested lists of numbers (as orjson gives them) as a flat array of ``dtype``, made by
    NumPy in one step; ``None`` when they are not a regular nest of numbers of that kind
    (then the caller flattens them itself, and says what is wrong).

    Raises:
        NotFinite: a float is past the dtype's range, or null.
    """
    if not isinstance(data, list):
        return None
    if dtype.kind in "fc":  # straight into the dtype: one pass, no float64 array first
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # refused by finite
                values = np.array(data, dtype=dtype).reshape(-1)
        except (ValueError, TypeError, OverflowError):
            return None
        return finite(values)
    try:
        array = np.array(data)  # NumPy's own kind first: 1.5 or true must not become 1
    except (ValueError, TypeError, OverflowError):
        return None
    kind = array.dtype.kind
    if kind not in "biuf" or (dtype.kind in "iu" and kind not in "iu"):
        return None
    if (dtype.kind == "b") != (kind == "b"):
        return None
    if dtype.kind in "iu":
        try:
            check_range(array.reshape(-1), dtype)
        except ValueError:
            return None
    with np.errstate(over="ignore"):
        return finite(array.astype(dtype, copy=False).reshape(-1))


def _array(s_and_end: tuple[str, int], scan_once: Any) -> tuple[Any, int]:
    """``json.decoder.JSONArray``, but a long array of numbers is kept as its text."""
    s, start = s_and_end  # start: just after the '['
    end = _numbers_end(s, start)
    if end is not None and end - start >= MARKED:
        return TextNumbers(s, start, end, nested=False), end + 1
    flat = _FLAT.match(s, start).end()  # type: ignore[union-attr]
    if s[flat : flat + 1] == "[" and not s[start:flat].strip():
        close = _nested_end(s, start - 1)
        if close is not None and close - start >= MARKED:
            return TextNumbers(s, start, close, nested=True), close + 1
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
