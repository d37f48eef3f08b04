"""The openvino driver's artifact: OpenVINO's exported compiled model behind a small header.

Layout (little-endian)::

    magic    8 bytes  b"CRXOVART"
    version  u32      FORMAT
    reserved u32      0
    names    u64      bytes of the index
    length   u64      bytes of the blob
    index    JSON {"inputs": [ONNX names], "outputs": [ONNX names]}, in the model's order,
             and "precision" where the blob was compiled at one other than the options'
             (bf16 beside int8: driver.py's _precision), for the import to use again
    blob     length bytes: CompiledModel.export_model()

The header lets ``load`` refuse a damaged or foreign artifact with a coded error before
OpenVINO reads it (OpenVINO checks its own blob too, and is told apart by the message).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from ...errors import InvalidContainerError, StatusCode, UnsupportedError

MAGIC = b"CRXOVART"
FORMAT = 1
_HEADER = struct.Struct("<8sIIQQ")
MAX_INDEX = 16 << 20


@dataclass(frozen=True)
class Unpacked:
    """An artifact's parts: the model's input and output names, OpenVINO's blob."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    blob: memoryview
    precision: str | None = None


PRECISIONS = ("bf16",)
"""The precisions an index may name."""


def pack(blob: bytes, inputs: list[str], outputs: list[str], precision: str | None = None) -> bytes:
    """The artifact holding OpenVINO's exported ``blob`` for a model of these inputs and
    outputs (OpenVINO may give a tensor several names: the index says which is the model's),
    compiled at ``precision`` where not the options' own."""
    fields: dict[str, object] = {"inputs": inputs, "outputs": outputs}
    if precision is not None:
        fields["precision"] = precision
    index = json.dumps(fields).encode()
    return _HEADER.pack(MAGIC, FORMAT, 0, len(index), len(blob)) + index + blob


def unpack(artifact: bytes | memoryview) -> Unpacked:
    """The parts of ``artifact``, after checking the header and the index.

    Raises:
        InvalidContainerError: not an openvino artifact, or truncated.
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) an artifact of another format.
    """
    view = memoryview(artifact).cast("B")
    if view.nbytes < _HEADER.size or bytes(view[:8]) != MAGIC:
        raise InvalidContainerError(
            "the openvino artifact does not start with its header: it is damaged or another "
            "driver's; recompile the model with `crossrt compile --driver openvino`",
            details={"driver": "openvino"},
        )
    _, version, _, names, length = _HEADER.unpack_from(view)
    if version != FORMAT:
        raise UnsupportedError(
            f"the openvino artifact is format {version}, this crossrt reads format {FORMAT}; "
            "recompile the model",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"driver": "openvino", "format": version},
        )
    if names > MAX_INDEX or _HEADER.size + names + length != view.nbytes:
        raise _damaged(f"its parts ({names} + {length} bytes) do not fill its {view.nbytes}")
    try:
        index = json.loads(bytes(view[_HEADER.size : _HEADER.size + names]))
        inputs, outputs = tuple(index["inputs"]), tuple(index["outputs"])
        precision = index.get("precision")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise _damaged("its index is not the JSON crossrt writes") from None
    if not all(isinstance(n, str) for n in (*inputs, *outputs)):
        raise _damaged("its index names are not strings")
    if precision is not None and precision not in PRECISIONS:
        raise _damaged(f"its index names precision {str(precision)[:20]!r}")
    return Unpacked(inputs, outputs, view[_HEADER.size + names :], precision)


def _damaged(why: str) -> InvalidContainerError:
    return InvalidContainerError(
        f"the openvino artifact is damaged: {why}; recompile the model",
        details={"driver": "openvino"},
    )
