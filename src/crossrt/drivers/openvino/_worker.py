"""The openvino driver's worker process: converts and compiles models with OpenVINO.

Run as a script (``python _worker.py``) by :mod:`.isolated`, never imported by crossrt: it
imports only OpenVINO, so it starts fast and does not re-run the user's main module (as
multiprocessing's ``spawn`` would). Requests come on stdin, answers go out on the process's
original stdout; anything OpenVINO prints goes to stderr instead.

A message is a 4-byte little-endian length, a JSON header of that length, then
``header["size"]`` bytes of payload.
"""

import json
import os
import struct
import sys
from typing import Any, BinaryIO

_LENGTH = struct.Struct("<I")


def _read(stream: BinaryIO, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _receive(stream: BinaryIO) -> tuple[dict[str, Any], bytes]:
    (length,) = _LENGTH.unpack(_read(stream, _LENGTH.size))
    header: dict[str, Any] = json.loads(_read(stream, length))
    return header, _read(stream, int(header.get("size", 0)))


def _send(stream: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    header = dict(header, size=len(payload))
    text = json.dumps(header).encode()
    stream.write(_LENGTH.pack(len(text)) + text + payload)
    stream.flush()


def _compile(core: Any, model: bytes, target: str, config: Any) -> tuple[dict[str, str], bytes]:
    try:
        converted = core.read_model(model)
        compiled = core.compile_model(converted, target, config)
        return {"error": ""}, bytes(compiled.export_model().getvalue())
    except Exception as exc:
        return {"error": str(exc)}, b""


def _check_node(core: Any, model: bytes, target: str, config: Any) -> tuple[dict[str, str], bytes]:
    try:
        converted = core.read_model(model)
    except Exception as exc:
        return {"stage": "convert", "error": str(exc)}, b""
    try:
        placed = core.query_model(converted, target)
        if any(op.get_friendly_name() not in placed for op in converted.get_ops()):
            return {"stage": "place", "error": ""}, b""
        core.compile_model(converted, target, config)
    except Exception as exc:
        return {"stage": "compile", "error": str(exc)}, b""
    return {"stage": "", "error": ""}, b""


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the protocol's; fd 1 becomes stderr's
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    import openvino

    core = openvino.Core()
    operations: dict[str, Any] = {"compile": _compile, "check_node": _check_node}
    while True:
        try:
            header, model = _receive(requests)
        except EOFError:
            return
        operation = operations[header["op"]]
        answer, payload = operation(core, model, header["target"], header["config"])
        _send(answers, answer, payload)


if __name__ == "__main__":
    main()
