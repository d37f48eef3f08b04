"""A ``.crm`` container's JSON header: encoded, decoded within limits, and read field by field.

Nothing from the file is trusted. Parsed JSON costs 5 to 25 times its size in Python objects
(a 74 MiB header of 4 million entries took 1.2 GiB), so the header's size and the number of
values it can hold are checked on the raw bytes, before it is parsed, and the length of every
list after, before anything walks it. Then every value's type is checked before use. A failure
names the field by its path in the header (``networks[0].nodes[1].section``) and what it
should be. The writer checks the same limits, so crossrt never writes a file it would refuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InvalidArgumentError, InvalidContainerError
from ..model import limits
from ..model.limits import (
    MAX_NAME,
    MAX_NETWORKS,
    MAX_NODES,
    MAX_RANK,
    MAX_SECTIONS,
    MAX_STAGES,
    MAX_TENSORS,
    count_values,
    encode_json,
)

# The limits are one table, shared with load_model, compile and the daemon (model/limits.py).
# A real header is small: ResNet-50's and BERT-base's are 1.1 to 1.4 KB (one node each), and a
# node adds about 300 bytes and 40 values.
MAX_HEADER_BYTES = limits.HEADER_BYTES
MAX_HEADER_VALUES = limits.HEADER_VALUES

_MISSING = object()
_HEX = frozenset("0123456789abcdef")


def corrupt(why: str) -> InvalidContainerError:
    """The error for a container that fails validation, saying why and what to do."""
    return InvalidContainerError(
        f"not a valid .crm container: {why}; re-create it with `crossrt compile` or Executable.save"
    )


def size_breach(length: int) -> str | None:
    """What is wrong with a header of ``length`` bytes, or ``None`` when it is within limits."""
    if length <= MAX_HEADER_BYTES:
        return None
    return (
        f"its header is {length:,} bytes, more than the {MAX_HEADER_BYTES >> 20} MiB "
        f"({MAX_HEADER_BYTES:,} bytes) a header may hold"
    )


def encode_header(header: dict[str, Any]) -> bytes:
    """The header as compact UTF-8 JSON (strict: no NaN, str keys only), within the limits.

    Raises:
        InvalidArgumentError: a value JSON cannot represent, or a limit a reader would refuse.
    """
    breach = limit_breach(header)
    if breach is None:
        try:
            data = encode_json(header)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the executables cannot be written: {exc}; compile options (extensions) must "
                "hold only JSON values (str, finite numbers, bool, None, lists, dicts with str "
                "keys)"
            ) from None
        breach = size_breach(len(data)) or _values_breach(data)
        if breach is None:
            return data
    raise InvalidArgumentError(
        f"the executables cannot be written: {breach}; store fewer networks in one file, or "
        "compile a model with fewer inputs, outputs, placement regions or metadata "
        "(docs/container.md, Limits)"
    )


def decode_header(text: memoryview) -> dict[str, Any]:
    """Parse the header bytes (their SHA-256 already checked) into a JSON object within the
    limits: size and value count before parsing, list lengths and names after.

    Raises:
        InvalidContainerError: the header breaks a limit, is not UTF-8 JSON, or not an object.
    """
    data = bytes(text)
    breach = size_breach(len(data)) or _values_breach(data)
    if breach is not None:
        raise corrupt(breach)
    try:
        doc = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError as exc:
        raise corrupt(f"the header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise corrupt("the header's JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, a duplicate key, NaN, an overlong integer
        raise corrupt(f"the header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise corrupt(f"the header is a JSON {type(doc).__name__}, not an object")
    breach = limit_breach(doc)
    if breach is not None:
        raise corrupt(breach)
    return doc


def _values_breach(data: bytes) -> str | None:
    values = count_values(data)
    if values <= MAX_HEADER_VALUES:
        return None
    return (
        f"the header holds up to {values:,} JSON values (its ',', ':', '[' and '{{' counted "
        f"before parsing), more than the {MAX_HEADER_VALUES:,} a header may hold"
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# -- limits on lists and names -----------------------------------------------------------------


def limit_breach(header: Any) -> str | None:
    """The first list in ``header`` longer than its limit, or dimension name longer than
    ``limits.MAX_NAME``, as a message; ``None`` when all are within them.

    A field of the wrong type is skipped (validation names it later), and a list is walked
    only after its length passed, so this costs at most what the limits allow.
    """
    return next((breach for breach in _breaches(header) if breach), None)


def _breaches(header: Any) -> Iterator[str | None]:
    if not isinstance(header, dict):
        return
    yield _long(header, "networks", "", MAX_NETWORKS)
    yield _long(header, "sections", "", MAX_SECTIONS)
    for i, net in _entries(header, "networks"):
        where = f"networks[{i}]"
        yield from _specs(net, "inputs", where)
        yield from _specs(net, "outputs", where)
        yield from _nodes(net, where)
        yield _long(net, "stages", where, MAX_STAGES)
        for j, stage in _entries(net, "stages"):
            at = f"{where}.stages[{j}]"
            yield _long(stage, "inputs", at, MAX_TENSORS)
            shapes = stage.get("inputs")
            if isinstance(shapes, dict):
                for name, shape in shapes.items():
                    yield from _dims(shape, f"{at}.inputs[{_shown(name)}]")
            yield from _specs(stage, "outputs", at)
            yield from _nodes(stage, at)


def _entries(obj: dict[str, Any], key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    value = obj.get(key)
    if isinstance(value, list):
        yield from ((i, v) for i, v in enumerate(value) if isinstance(v, dict))


def _long(obj: dict[str, Any], key: str, where: str, limit: int) -> str | None:
    value = obj.get(key)
    if not isinstance(value, list | dict) or len(value) <= limit:
        return None
    path = f"{where}.{key}" if where else key
    return f"header field {path} holds {len(value):,} entries, more than the {limit:,} allowed"


def _specs(obj: dict[str, Any], key: str, where: str) -> Iterator[str | None]:
    yield _long(obj, key, where, MAX_TENSORS)
    for k, spec in _entries(obj, key):
        yield from _dims(spec.get("shape"), f"{where}.{key}[{k}].shape")


def _nodes(obj: dict[str, Any], where: str) -> Iterator[str | None]:
    yield _long(obj, "nodes", where, MAX_NODES)
    for k, node in _entries(obj, "nodes"):
        yield _long(node, "inputs", f"{where}.nodes[{k}]", MAX_TENSORS)
        yield _long(node, "outputs", f"{where}.nodes[{k}]", MAX_TENSORS)


def _dims(shape: Any, path: str) -> Iterator[str | None]:
    if not isinstance(shape, list):
        return
    if len(shape) > MAX_RANK:
        yield f"header field {path} holds {len(shape):,} dims, more than the {MAX_RANK} allowed"
    for d, dim in enumerate(shape):
        if isinstance(dim, str) and len(dim) > MAX_NAME:
            yield (
                f"header field {path}[{d}] is a dimension name of {len(dim):,} characters, more "
                f"than the {MAX_NAME:,} allowed"
            )


def _shown(name: Any) -> str:
    # A key from a file could be huge: show its start only.
    return repr(name) if len(repr(name)) <= 40 else f"{repr(name)[:36]}...'"


# -- reading fields ----------------------------------------------------------------------------


def field(
    obj: dict[str, Any], key: str, where: str, expected: str, ok: Callable[[Any], bool]
) -> Any:
    """``obj[key]``, checked by ``ok``.

    Args:
        obj: a header object.
        key: the field.
        where: the object's path in the header (``networks[0]``), ``""`` at the top.
        expected: what the field should be, for the message (``"an integer >= 1"``).
        ok: whether a value is what is expected.

    Raises:
        InvalidContainerError: the field is missing, or ``ok`` refuses it.
    """
    path = f"{where}.{key}" if where else key
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise corrupt(f"header field {path} is missing; it should be {expected}")
    if not ok(value):
        raise bad_field(path, expected, value)
    return value


def bad_field(path: str, expected: str, value: Any) -> InvalidContainerError:
    """The error for the header field at ``path`` holding ``value`` instead of ``expected``."""
    # Only scalars are shown: a nested value from a file could be huge.
    scalar = value is None or isinstance(value, str | int | float)
    shown = repr(value)[:60] if scalar else f"a {type(value).__name__}"
    return corrupt(f"header field {path} should be {expected}, not {shown}")


def is_int(v: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_count(v: Any) -> bool:
    """An integer >= 0."""
    return is_int(v) and v >= 0


def is_positive(v: Any) -> bool:
    """An integer >= 1."""
    return is_int(v) and v >= 1


def is_str(v: Any) -> bool:
    """A string."""
    return isinstance(v, str)


def is_name(v: Any) -> bool:
    """A non-empty string."""
    return isinstance(v, str) and bool(v)


def is_names(v: Any) -> bool:
    """A list of non-empty strings."""
    return isinstance(v, list) and all(is_name(t) for t in v)


def is_dict(v: Any) -> bool:
    """A JSON object."""
    return isinstance(v, dict)


def is_list(v: Any) -> bool:
    """A JSON list."""
    return isinstance(v, list)


def is_nonempty_list(v: Any) -> bool:
    """A JSON list with an entry."""
    return isinstance(v, list) and bool(v)


def is_sha(v: Any) -> bool:
    """A SHA-256 digest: 64 lowercase hex digits."""
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX
