"""Starting a real ``crossrt serve`` for the tests: a subprocess on a Unix socket of its own,
with a model repository of ``.crm`` files; conftest.py's fixtures stop it with SIGTERM."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import tritonclient.grpc as tc
from onnx import TensorProto, helper

import crossrt
from concurrency_models import tiny
from small_models import add_one, relu

READY_SECONDS = 60.0
EXPLICIT = ("--model-control", "explicit", "--load-model", "*")
"""Every model of the repository loaded at start, and RepositoryModelLoad and Unload served
(the default model control, none, refuses them as Triton does)."""


@dataclass
class Daemon:
    """A running daemon and what the tests need to reach it."""

    proc: subprocess.Popen[str]
    socket: str
    repository: Path
    log: list[str] = field(default_factory=list)
    metrics: str | None = None
    tcp: str | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self) -> tc.InferenceServerClient:
        return tc.InferenceServerClient(self.url)

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def text_model() -> onnx.ModelProto:
    """Strings in, strings out (KServe BYTES): ``same`` = ``text`` [n], ``first`` = its first
    element [1]."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["text"], ["same"]),
            helper.make_node("Slice", ["text", "zero", "one"], ["first"]),
        ],
        "text",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
        [
            helper.make_tensor_value_info("same", TensorProto.STRING, ["n"]),
            helper.make_tensor_value_info("first", TensorProto.STRING, [1]),
        ],
        [
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def make_repository(folder: Path) -> Path:
    """tiny.crm (flat), relu/2/model.crm (Triton layout), adder.crm (dynamic [n]), text.crm
    (strings)."""
    folder.mkdir(parents=True, exist_ok=True)
    crossrt.compile(text_model(), "cpu").save(folder / "text.crm")
    crossrt.compile(tiny(), "cpu").save(folder / "tiny.crm")
    (folder / "relu" / "2").mkdir(parents=True, exist_ok=True)
    crossrt.compile(relu(), "cpu").save(folder / "relu" / "2" / "model.crm")
    crossrt.compile(add_one("n"), "cpu").save(folder / "adder.crm")
    return folder


def start_shared_daemon(base: Path, user: str, token: str) -> Daemon:
    """A daemon in ``base`` (made 0711) on a Unix socket every user may open (0666), whose
    tokens file gives ``token`` to ``user``, serving a repository with its models loaded."""
    base.mkdir()
    base.chmod(0o711)
    file = base / "tokens.toml"
    file.write_text(f'[[tokens]]\ntoken = "{token}"\nuser = "{user}"\n')
    file.chmod(0o600)
    config = base / "serve.toml"
    config.write_text(f'socket_mode = "0666"\ntokens = "{file}"\n')
    args = ["-c", str(config), "--model-control", "explicit", "--load-model", "*"]
    return start_daemon(base, make_repository(base / "models"), args)


def start_daemon(
    folder: Path,
    repository: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    files: int | None = None,
    default_socket: bool = False,
) -> Daemon:
    """``python -m crossrt serve -x`` on ``folder/d.sock``; returns once it logs ``ready``.
    ``files``: its limit on open files, soft and hard. ``default_socket``: no ``-g unix:``,
    the daemon's default socket (``folder/run/crossrt.sock``) instead."""
    sock = str(folder / ("run/crossrt.sock" if default_socket else "d.sock"))
    command = [sys.executable, "-m", "crossrt", "serve", "-x"]
    command += [] if default_socket else ["-g", f"unix:{sock}"]
    command += ["--model-repository", str(repository), *args]
    environ = dict(os.environ, CROSSRT_RUNTIME_DIR=str(folder / "run"), **(env or {}))

    def limit_files() -> None:
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=environ,
        preexec_fn=limit_files if files is not None else None,
    )
    daemon = Daemon(proc, sock, repository)
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            daemon.log.append(line)
            # "... INFO ready", not "... model NAME version 1 is ready": the daemon is ready
            # once every model it loads at start is (waiting on the first model's line raced
            # the others' loads, and a load under --model-control none is refused).
            if line.rstrip().endswith(" INFO ready"):
                ready.set()
        ready.set()  # it ended

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_SECONDS) or proc.poll() is not None:
        proc.kill()
        raise AssertionError("the daemon did not become ready:\n" + "".join(daemon.log))
    return daemon
