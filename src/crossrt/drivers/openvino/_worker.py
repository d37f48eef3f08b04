"""The openvino driver's worker process: converts and compiles models with OpenVINO.

Run as a script (``python _worker.py``) by :mod:`.isolated`, never imported by crossrt: it
imports only OpenVINO, so it starts fast and does not re-run the user's main module (as
multiprocessing's ``spawn`` would). Requests come on stdin, answers go out on the process's
original stdout; anything OpenVINO prints goes to stderr instead.

A message is a 4-byte little-endian length, a JSON header of that length, then
``header["size"]`` bytes of payload.

The worker never outlives the process that started it (its pid is the one argument). The end
of its input is not enough: a child that process forked (a prefork server, a multiprocessing
pool) holds the write end of the request pipe too, and the worker waited on it forever (18
orphans of 32 MB piled up in one afternoon). So a thread waits on the parent's pidfd and ends
the process when the parent ends. Not ``PR_SET_PDEATHSIG``: that fires when the *thread* that
started the worker exits, and crossrt starts it from whichever thread compiles first.

OpenVINO's usage telemetry is kept out (:func:`_no_telemetry`): ``import openvino`` loads
``openvino_telemetry``, whose sender forks a ``multiprocessing`` child from a pool thread to
post to Google Analytics. A fork taken while this process's main thread held stdin's lock
(waiting for the next request) deadlocked in the child closing stdin; the worker then ended
and the child stayed, orphaned, forever. A compile must not talk to the network anyway.
"""

import json
import os
import select
import struct
import sys
import threading
import time
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


def _watch(parent: int) -> None:
    """Exit at once when ``parent`` ends (blocks: run it in a daemon thread)."""
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): ask once a second
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    if os.getppid() != parent:  # it ended before the pidfd was opened
        os._exit(0)
    select.select([pidfd], [], [])  # readable when the process has ended
    os._exit(0)


def _no_telemetry() -> None:
    """Make ``openvino_telemetry`` unimportable: OpenVINO then uses its own stub."""
    sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]


def main() -> None:
    if len(sys.argv) > 1:
        parent = int(sys.argv[1])
        threading.Thread(target=_watch, args=(parent,), daemon=True).start()
    answers = os.fdopen(os.dup(1), "wb")  # the protocol's; fd 1 becomes stderr's
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    _no_telemetry()
    import openvino

    core = openvino.Core()
    operations: dict[str, Any] = {"compile": _compile, "check_node": _check_node}
    while True:
        try:
            header, model = _receive(requests)
        except EOFError:
            # No interpreter shutdown: OpenVINO's thread pools and static objects need not be
            # torn down in a process that ends here.
            os._exit(0)
        operation = operations[header["op"]]
        answer, payload = operation(core, model, header["target"], header["config"])
        _send(answers, answer, payload)


if __name__ == "__main__":
    main()
