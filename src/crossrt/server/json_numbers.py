"""Arrays of numbers read from JSON into typed arrays, with no Python object per number.

What the two ways :mod:`.rest_json` reads a body share: :class:`Numbers` (an array of a
request kept out of Python's lists until its input's type is known), the checks a tensor's
values pass (:class:`WrongCount`, :func:`finite`), simdjson's parsers kept between requests,
and the whole-body read (:func:`simdjson_whole`: bodies up to ``rest_json.SIMD_WHOLE``,
their long arrays of numbers as :class:`Parsed`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import simdjson


class WrongCount(ValueError):
    """The array does not hold the number of values asked for.

    Attributes:
        count: how many it holds.
    """

    def __init__(self, count: int, expected: int) -> None:
        super().__init__(f"the data hold {count} values, {expected} are needed")
        self.count = count


class Numbers:
    """A long array of numbers of a request, read into a tensor once its type is known."""

    __slots__ = ()

    @property
    def count(self) -> int:
        """How many numbers there are."""
        raise NotImplementedError

    def array(self, dtype: np.dtype[Any], count: int | None = None) -> np.ndarray:
        """The numbers as a flat array of ``dtype``.

        Args:
            dtype: the array's type.
            count: how many values are needed (the input's shape); ``None``: as many as
                there are.

        Raises:
            WrongCount: the array holds another number of values than ``count``.
            ValueError: a value is not a number of that kind, or out of its range.
        """
        raise NotImplementedError

    def plain(self) -> list[Any]:
        """The numbers as a flat list (for a place that takes a small list)."""
        raise NotImplementedError


class NotFinite(ValueError):
    """A float tensor read from JSON holds a value that is not a finite number."""


def finite(values: np.ndarray) -> np.ndarray:
    """``values``, refused when a float among them is not finite: JSON has no NaN nor
    Infinity, so such a value is one past its type's range (``1e39`` as float32, ``70000``
    as float16) or a ``null`` NumPy made NaN.

    Raises:
        NotFinite: naming the type.
    """
    if values.dtype.kind not in "biu" and values.size and not np.isfinite(values).all():
        raise NotFinite(f"a value is null or out of range of {values.dtype}")
    return values


IDLE: list[simdjson.Parser] = []
"""Parsers between two chunks, each keeping its buffers (the chunk's copy, its tape and
structure: 3.8 MiB after a chunk of ``"0,"``, the densest): a new parser's first chunks took
2.5x as long, its buffers' pages new."""

IDLE_PARSERS = 2
"""At most this many parsers are kept idle (7.6 MiB at most): a chunk's parse holds the GIL,
so only a thread between two chunks takes another."""


def take_parser() -> simdjson.Parser:
    """An idle parser, or a new one."""
    try:
        return IDLE.pop()  # atomic under the GIL, as append is: no two threads get one
    except IndexError:
        return simdjson.Parser()


def keep_parser(parser: simdjson.Parser, small: bool) -> None:
    """Keep ``parser`` idle for the next parse, if ``small`` (it has not grown past what an
    idle parser may hold) and fewer than :data:`IDLE_PARSERS` are."""
    if small and len(IDLE) < IDLE_PARSERS:
        IDLE.append(parser)


BUFFER: dict[str, Literal["d", "i", "u"]] = {"f": "d", "i": "i", "b": "i", "u": "u"}
WIDE = {
    "f": np.dtype(np.float64),
    "i": np.dtype(np.int64),
    "b": np.dtype(np.int64),
    "u": np.dtype(np.uint64),
}
"""For each family of dtypes (bool, signed, unsigned, float): the type of pysimdjson's
buffer (``'d'``: double), and NumPy's of the same."""


def check_range(values: np.ndarray, dtype: np.dtype[Any]) -> None:
    """Refuse integer ``values`` that do not all fit the integer ``dtype``.

    Raises:
        ValueError: naming the range.
    """
    info = np.iinfo(dtype)
    if len(values) and (values.min() < info.min or values.max() > info.max):
        raise ValueError(f"a value is out of range [{info.min}, {info.max}]")


class Parsed(Numbers):
    """A long array of numbers already parsed (by simdjson, the body whole): its values in
    the widest array of their kind (int64, or uint64 past int64's range, or float64), made
    into an input's type by :meth:`array` with the checks of :class:`Numbers`."""

    __slots__ = ("_values",)

    def __init__(self, values: np.ndarray) -> None:
        self._values = values

    @property
    def count(self) -> int:
        return len(self._values)

    def array(self, dtype: np.dtype[Any], count: int | None = None) -> np.ndarray:
        values = self._values
        if count is not None and count != len(values):
            raise WrongCount(len(values), count)
        if dtype.kind in "iu":
            if values.dtype.kind == "f":
                raise ValueError("a value is not a whole number")
            check_range(values, dtype)
        with np.errstate(over="ignore"):  # past float32's range: inf, refused by finite
            return finite(values.astype(dtype))

    def plain(self) -> list[Any]:
        return list(self._values.tolist())


LONG = 256
"""Arrays of at least this many values that simdjson reads as numbers are kept as
:class:`Parsed` (about what ``rest_json.MARKED``'s 1024 characters of text hold)."""


def simdjson_whole(body: bytes | bytearray | memoryview, keep: bool) -> Any:
    """``body`` parsed by simdjson whole, its long arrays of numbers as :class:`Parsed`;
    ``None`` when simdjson refuses the body (NaN, an integer past 64 bits, a number past
    float64's range, bad syntax, too deep) or a nest of numbers holds an empty row: the
    caller reads it as a larger body, which names the fault. ``keep``: the parser may be
    kept idle after (it has not grown past what idle parsers may hold)."""
    parser = take_parser()
    try:
        return _plain(parser.parse(bytes(body)))
    except (_Irregular, ValueError, RuntimeError, RecursionError):
        return None
    finally:  # every proxy of the document is gone here: the parser may parse again
        keep_parser(parser, keep)


class _Irregular(Exception):
    """A nest of numbers with an empty row, or duplicate keys: left to the scanner's path,
    which names the one and keeps the last of the others."""


def _plain(value: Any) -> Any:
    """A simdjson value as Python's, a long array of numbers as :class:`Parsed`."""
    if isinstance(value, simdjson.Object):
        # items() would give Python values, made whole: each key's value is asked instead,
        # which is the first of duplicate keys (JSON's readers keep the last): left to them
        keys = list(value.keys())
        if len(set(keys)) != len(keys):
            raise _Irregular
        return {key: _plain(value[key]) for key in keys}
    if not isinstance(value, simdjson.Array):
        return value
    if len(value) >= LONG or (len(value) and isinstance(value[0], simdjson.Array)):
        for family in ("i", "u", "f"):  # int64 first: float64 would round past 2**53
            try:
                values = np.frombuffer(value.as_buffer(of_type=BUFFER[family]), WIDE[family])
            except (TypeError, ValueError):  # not all numbers, or not all of this kind
                continue
            if len(values) >= LONG:
                _check_rows(value)
                return Parsed(values)
            break
        else:
            if len(value) >= LONG:  # strings (BYTES data), objects: made by simdjson in C
                return value.as_list()
    return [_plain(v) for v in value]


def _check_rows(array: Any) -> None:
    """Raise :class:`_Irregular` when a nested array of numbers has an empty row."""
    stack = [array]
    while stack:
        rows = stack.pop()
        if len(rows) == 0:
            raise _Irregular
        if isinstance(rows[0], simdjson.Array):
            stack.extend(rows)
