"""The ``sim`` driver's artifact: the host engine's artifact behind a small header.

Layout (integers little-endian)::

    magic "CRSIMART" | format u32 | header length N u32 | JSON header (N bytes)
    | zero padding to a multiple of 4096 | the host engine's artifact

The header names the engine that compiled the artifact and its version (a load needs that
engine at that version), the model's operator count (what the latency model charges a run)
and its inputs and outputs (which of them live in device memory, the shapes of the outputs a
run can allocate before it computes). The engine's artifact starts at a page (4096 bytes):
ONNX Runtime's artifact places the weights its kernels pre-packed at pages so that ORT maps
them from a ``.crm`` file (whose sections start at pages) instead of copying them into every
session; an artifact inside ours must keep them there.

Every artifact a driver loads may come from a file someone else wrote: the header is checked
field by field, and a damaged one is an ``InvalidContainerError`` that says to recompile,
never a crash inside the engine.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from ..errors import InvalidArgumentError, InvalidContainerError, StatusCode, UnsupportedError
from ..model.spec import TensorSpec

MAGIC = b"CRSIMART"
FORMAT = 1
"""The version of this layout; the sim driver's version starts with it."""

_PRELUDE = struct.Struct("<8sII")
_ALIGN = 4096  # see the module docstring
_FIELDS = {"engine": str, "engine_version": str, "ops": int, "inputs": list, "outputs": list}


@dataclass(frozen=True)
class Header:
    """What a sim artifact says of itself.

    Attributes:
        engine: the host engine's driver (``"onnxruntime"``).
        engine_version: its version when it compiled the artifact.
        ops: the model's operators, what the latency model charges a run for.
        inputs: the model's inputs.
        outputs: the model's outputs.
    """

    engine: str
    engine_version: str
    ops: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def pack(header: Header, inner: bytes) -> bytes:
    """The sim artifact: ``header``, then the engine's artifact ``inner``."""
    text = json.dumps(
        {
            "engine": header.engine,
            "engine_version": header.engine_version,
            "ops": header.ops,
            "inputs": [spec.to_dict() for spec in header.inputs],
            "outputs": [spec.to_dict() for spec in header.outputs],
        },
        separators=(",", ":"),
    ).encode()
    start = _start(len(text))
    padding = bytes(start - _PRELUDE.size - len(text))
    return b"".join((_PRELUDE.pack(MAGIC, FORMAT, len(text)), text, padding, inner))


def unpack(artifact: bytes | memoryview) -> tuple[Header, int]:
    """The header of a sim artifact, checked, and where the engine's artifact starts.

    Raises:
        InvalidContainerError: it is not a sim artifact, or it is truncated or damaged.
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) another format of the header.
    """
    view = memoryview(artifact).cast("B")
    if len(view) < _PRELUDE.size or bytes(view[: len(MAGIC)]) != MAGIC:
        raise _corrupt(f"it does not start with {MAGIC!r}")
    _, version, length = _PRELUDE.unpack_from(view)
    if version != FORMAT:
        raise UnsupportedError(
            f"the sim artifact is format {version}; this crossrt reads format {FORMAT}; "
            "recompile the model with `crossrt compile`",
            code=StatusCode.UNSUPPORTED_NEFF_VERSION,
            details={"driver": "sim", "artifact_format": version},
        )
    start = _start(length)
    if start > len(view):
        raise _corrupt(f"it is truncated: {len(view)} bytes, its header ends at byte {start}")
    try:
        fields = json.loads(bytes(view[_PRELUDE.size : _PRELUDE.size + length]))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _corrupt("its header is not valid JSON") from None
    if not isinstance(fields, dict):
        raise _corrupt("its header is not a JSON object")
    for key, kind in _FIELDS.items():
        value = fields.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _corrupt(f"its header field {key!r} is missing or not {kind.__name__}")
    if fields["ops"] < 0:
        raise _corrupt("its header field 'ops' is negative")
    try:
        inputs, outputs = (
            tuple(TensorSpec.from_dict(spec) for spec in fields[key])
            for key in ("inputs", "outputs")
        )
    except InvalidArgumentError as exc:
        raise _corrupt(f"a tensor in its header is malformed ({exc.message})") from None
    return Header(fields["engine"], fields["engine_version"], fields["ops"], inputs, outputs), start


def _start(length: int) -> int:
    """Where the engine's artifact starts after a header of ``length`` bytes."""
    return -(-(_PRELUDE.size + length) // _ALIGN) * _ALIGN


def _corrupt(why: str) -> InvalidContainerError:
    return InvalidContainerError(
        f"the sim artifact is corrupt: {why}; recompile the model with `crossrt compile`",
        details={"driver": "sim"},
    )
