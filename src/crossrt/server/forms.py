"""What a model's inputs and outputs are served as over KServe (docs/daemon.md, "Sequence and
map outputs"): tensors of KServe datatypes as they are; maps, or sequences of maps, of numbers
or strings (sklearn's ZipMap) as BYTES, one JSON text per map; a model with any other input
or output is refused at load, so that what the metadata says is what a request gets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from ..model import TensorSpec

# Outputs that are not tensors but maps of numbers, or sequences of them (a ZipMap's
# seq(map(int64|string, tensor(float))): a classifier's probabilities per class), are served
# as KServe BYTES, one element per map: its JSON text, keys as strings (docs/daemon.md).
_JSON_FORM = re.compile(r"(seq\()?map\((int64|string),tensor\((float|double|int64|string)\)\)\)?")


def is_json_form(spec: TensorSpec) -> bool:
    """Whether output ``spec`` is served as BYTES of JSON maps (a ZipMap's)."""
    return spec.kind in ("sequence", "map") and bool(
        spec.value_type and _JSON_FORM.fullmatch(spec.value_type)
    )


def unservable(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> list[str]:
    """Why each of a model's inputs and outputs that cannot cross KServe cannot; ``[]`` when
    all can. A model with any is refused at load, so that no request finds out."""
    why = []
    for where, spec in [("input", s) for s in inputs] + [("output", s) for s in outputs]:
        if where == "output" and is_json_form(spec):
            continue
        named = f"{where} {spec.name[:100]!r}"
        if spec.kind != "tensor":
            why.append(f"{named} is a {spec.value_type or spec.kind}")
        elif spec.dtype is None or spec.dtype.kserve is None:
            why.append(f"{named} is {spec.describe()}, without a KServe datatype")
    return why


def check_servable(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """Refuse a model with an input or output KServe cannot carry, saying which and why.

    Raises:
        UnsupportedError: naming each such input and output.
    """
    why = unservable(inputs, outputs)
    if why:
        raise UnsupportedError(
            f"model {name!r} cannot be served: {'; '.join(why[:5])}"
            f"{f'; and {len(why) - 5} more' if len(why) > 5 else ''}. crossrt serve carries "
            "tensors of KServe datatypes, and maps (or sequences of maps) of numbers as BYTES "
            "of JSON (docs/daemon.md); run this model in-process (crossrt.Runtime().load)",
            details={"model": name, "refused": why},
        )


def json_elements(spec: TensorSpec, value: Any) -> np.ndarray:
    """A map output, or a sequence of maps, as an object array of JSON texts (keys as
    strings), one per map."""
    maps = [value] if spec.kind == "map" else list(value)
    texts = [json.dumps({str(k): _plain(v) for k, v in m.items()}) for m in maps]
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
