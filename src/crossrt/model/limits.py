"""The limits on what a model and a ``.crm`` header may hold: one table, used by
:func:`~crossrt.model.load_model`, the ``.crm`` writer and reader (``compiler/header.py``),
``compile`` (and so the cache) and the daemon, so that a model is accepted or refused at the
same limit everywhere, with the same message (docs/security.md, Limits).

Two kinds of limit:

- What a ``.crm`` header costs to parse: its bytes and its JSON values, counted on the raw
  bytes before parsing (parsed JSON costs 5 to 25 times its size in Python objects), and the
  length of each list, checked before anything walks it.
- What a model needs of that header: its inputs, outputs (names, shapes, dimension names) and
  metadata are written into the header of every container that holds it. :func:`load_model`
  measures them as the writer encodes them, so a model whose description alone could never be
  saved is refused when it is loaded, not after it compiled. Names are bounded by these
  totals, not one name's length: exporters write long names (a torch exporter writes a
  detector's dimension names as shape expressions of 330 characters and more).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

HEADER_BYTES = 16 << 20
"""The largest header: room for a big model's metadata (a label list, a tokenizer's)."""
HEADER_VALUES = 1 << 20
"""The most JSON values a header may hold, counted on its bytes before parsing (at worst a
header within both costs under 100 MiB to parse: 84 MiB measured, a million distinct
strings; 1.2 GiB for a 74 MiB header of 4 million entries without them)."""
HEADER_RESERVE_BYTES = 64 << 10
HEADER_RESERVE_VALUES = 4096
"""What a one-node header needs besides the model's inputs, outputs and metadata (producer,
options, node fields, the engine's target, the section table: 1.5 KB and 60 values measured),
many times over."""
SIGNATURE_BYTES = HEADER_BYTES - HEADER_RESERVE_BYTES
SIGNATURE_VALUES = HEADER_VALUES - HEADER_RESERVE_VALUES
"""What a model's inputs, outputs and metadata may take of a header, as the writer encodes
them, with one node that names each input and output once: the smallest header the model can
have. A model over it could never be saved, cached or served, so it is refused on load."""

MAX_NAME = 65536
"""Characters of one name: a value, node, graph or function name, or a symbolic dimension
name. A torch exporter wrote a detector's dimension names as shape expressions of 330
characters (issue 23), 200 times less; this bounds what one copy of a name costs (messages,
logs, engines' tables), and the totals above bound all of them together."""
MAX_RANK = 64
"""Dimensions of a model's input or output: the most a NumPy array holds (NumPy 2's
``NPY_MAXDIMS``), and inputs and outputs are NumPy arrays. Values inside a graph may have
more."""

MAX_NETWORKS = 1024
"""Networks in one container."""
MAX_STAGES = 256
"""Shape stages per network (a bmodel has a handful)."""
MAX_NODES = 4096
"""Nodes per network or stage: placement regions of one model."""
MAX_SECTIONS = 65536
"""Sections of one container."""
MAX_TENSORS = 65536
"""Inputs, or outputs, of a model; entries of a list of tensors in a header (a network's,
stage's or node's inputs or outputs), checked before the list is walked. Real models have a
few (an LLM with its KV cache a few hundred): a 40,000-input model is saved and served."""


def encode_json(doc: Any) -> bytes:
    """``doc`` as the ``.crm`` writer encodes JSON: compact UTF-8, no NaN.

    Raises:
        TypeError, ValueError: a value JSON cannot represent.
    """
    text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def count_values(data: bytes) -> int:
    """An upper bound on the JSON values in ``data``: every value but the outermost follows a
    ``[``, ``{``, ``,`` or ``:`` (counted inside strings too): a few C-speed passes."""
    return 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))


def signature_cost(
    inputs: Iterable[Mapping[str, Any]],
    outputs: Iterable[Mapping[str, Any]],
    metadata: Mapping[str, str],
) -> tuple[int, int]:
    """``(bytes, JSON values)`` that a model's inputs and outputs (each as
    ``TensorSpec.to_dict`` gives it) and metadata take in a ``.crm`` header, with one node
    naming each input and output once."""
    ins, outs = list(inputs), list(outputs)
    doc = {
        "inputs": ins,
        "outputs": outs,
        "metadata": dict(metadata),
        "nodes": [{"inputs": [s["name"] for s in ins], "outputs": [s["name"] for s in outs]}],
    }
    data = encode_json(doc)
    return len(data), count_values(data)


def signature_breach(
    inputs: Iterable[Mapping[str, Any]],
    outputs: Iterable[Mapping[str, Any]],
    metadata: Mapping[str, str],
) -> str | None:
    """What is wrong with a model whose signature would not fit in a header, or ``None``."""
    ins, outs = list(inputs), list(outputs)
    for count, what in ((len(ins), "inputs"), (len(outs), "outputs")):
        if count > MAX_TENSORS:
            return (
                f"it has {count:,} {what}, more than the {MAX_TENSORS:,} a compiled model may "
                "have (docs/security.md, Limits), so it could never be saved, cached or served; "
                f"join {what} into fewer, larger tensors"
            )
    size, values = signature_cost(ins, outs, metadata)
    if size <= SIGNATURE_BYTES and values <= SIGNATURE_VALUES:
        return None
    what = (
        f"{size:,} bytes, more than the {SIGNATURE_BYTES:,}"
        if size > SIGNATURE_BYTES
        else f"{values:,} JSON values, more than the {SIGNATURE_VALUES:,}"
    )
    return (
        f"its {len(ins):,} inputs, {len(outs):,} outputs and metadata take {what} a compiled "
        "model's header holds for them (docs/security.md, Limits), so it could never be "
        "saved, cached or served; join inputs or outputs into fewer, larger tensors, or "
        "shorten their names or the metadata"
    )
