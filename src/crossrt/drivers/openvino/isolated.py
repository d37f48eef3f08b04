"""OpenVINO's conversion and compilation of a model, in a worker process.

The ONNX frontend and the CPU plugin's compiler are native code, and crafted models crash
them (the fuzzer of tests/security found a SIGFPE and a SIGSEGV within a few thousand
models). A model is untrusted input, so crossrt never converts or compiles one in its own
process: a worker process per driver does it (``_worker.py``, a script that imports only
OpenVINO), and a crash there is a CompileError for that model, never the end of the user's
process. The worker starts on first use and again after a crash, and ends with the process
that started it (it watches that process's pidfd: ``_worker.py``), whoever else holds its
pipes.

Only bytes cross the pipes: the ONNX model in, OpenVINO's exported blob (or the error's
text) out, each message a length-prefixed JSON header and its payload.
"""

from __future__ import annotations

import atexit
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

_LENGTH = struct.Struct("<I")
_SCRIPT = Path(__file__).with_name("_worker.py")


class Crashed(Exception):
    """The worker died while OpenVINO handled the model."""


class Worker:
    """The process that converts and compiles for one driver; one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def compile(self, model: bytes, target: str, config: dict[str, Any]) -> tuple[bytes, str]:
        """OpenVINO's exported blob of ``model``, or ``b""`` and why not.

        Raises:
            Crashed: OpenVINO crashed the worker.
        """
        header, blob = self._call("compile", model, target, config)
        return blob, str(header.get("error", ""))

    def check_node(self, model: bytes, target: str, config: dict[str, Any]) -> tuple[str, str]:
        """``("", "")`` when the one-node ``model`` converts, is placed whole on ``target``
        and compiles; else the stage that failed (``convert``, ``place``, ``compile``) and
        the error's text.

        Raises:
            Crashed: OpenVINO crashed the worker.
        """
        header, _ = self._call("check_node", model, target, config)
        return str(header.get("stage", "")), str(header.get("error", ""))

    def _call(
        self, op: str, model: bytes, target: str, config: dict[str, Any]
    ) -> tuple[dict[str, Any], bytes]:
        with self._lock:
            process = self._start()
            assert process.stdin is not None and process.stdout is not None
            header = json.dumps({"op": op, "target": target, "config": config, "size": len(model)})
            try:
                process.stdin.write(_LENGTH.pack(len(header)) + header.encode() + model)
                process.stdin.flush()
                return _receive(process.stdout)
            except (OSError, EOFError, ValueError):
                self._stop()
                raise Crashed(
                    f"OpenVINO's worker process died on this model (exit {process.poll()})"
                ) from None

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, str(_SCRIPT), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # OpenVINO's own prints
            )
            atexit.register(self.close)
        return self._process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()

    def close(self) -> None:
        """Stop the worker."""
        with self._lock:
            self._stop()


def _receive(stream: IO[bytes]) -> tuple[dict[str, Any], bytes]:
    (length,) = _LENGTH.unpack(_read(stream, _LENGTH.size))
    header: dict[str, Any] = json.loads(_read(stream, length))
    return header, _read(stream, int(header.get("size", 0)))


def _read(stream: IO[bytes], n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
