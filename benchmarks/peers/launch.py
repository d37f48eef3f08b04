"""Starting, checking and stopping the servers benchmarks/serve_peers.py compares: crossrt
serve, and each peer from its own virtualenv (``benchmarks/.peers/NAME``, built from
``NAME.txt``'s pins on first use) running the scripts of this folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

PEERS_SRC = Path(__file__).resolve().parent
PEERS_ENV = PEERS_SRC.parent / ".peers"
PEERS = ("kserve", "mlserver", "ray")
INFER = "/inference.GRPCInferenceService/ModelInfer"


def free_address() -> str:
    """A free loopback ``HOST:PORT``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def check(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], who: str) -> None:
    for key, want in expected.items():
        if key not in got:
            raise SystemExit(f"{who}: no output {key!r} in the answer ({sorted(got)})")
        scale = float(np.abs(want).max()) or 1.0
        err = float(np.abs(got[key].reshape(want.shape) - want).max()) / scale
        if err > 1e-4:
            raise SystemExit(f"{who}: output {key!r} differs from onnxruntime's by {err:.2e}")


def http_infer(address: str, name: str, body: bytes) -> dict[str, np.ndarray]:
    request = urllib.request.Request(
        f"http://{address}/v2/models/{name}/infer", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        answer = json.loads(r.read())
    return {o["name"]: np.asarray(o["data"], np.float32) for o in answer["outputs"]}


def grpc_infer(address: str, name: str, frame: bytes) -> dict[str, np.ndarray]:
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)]) as ch:
        call = ch.unary_unary(INFER)  # bytes in, bytes out: the exact message h2load sends
        raw = call(frame[5:], metadata=[("application", name)], timeout=30)
    reply = pb.ModelInferResponse.FromString(raw)
    got = {}
    for k, out in enumerate(reply.outputs):
        if reply.raw_output_contents:
            got[out.name] = np.frombuffer(reply.raw_output_contents[k], np.float32)
        else:
            got[out.name] = np.asarray(out.contents.fp32_contents, np.float32)
    return got


def peer_python(peer: str) -> Path:
    """The peer's virtualenv interpreter, the venv built from its pins when missing."""
    env = PEERS_ENV / peer
    python = env / "bin" / "python"
    stamp = env / "pins.txt"
    pins = (PEERS_SRC / f"{peer}.txt").read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == pins:
        return python
    print(f"building {env} from {PEERS_SRC / f'{peer}.txt'} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "-r", str(PEERS_SRC / f"{peer}.txt")]
    subprocess.run(pip, check=True)
    stamp.write_text(pins)
    return python


def ray_protos(python: Path) -> Path:
    """grpc_service_v2_pb2(_grpc).py for Ray's gRPC proxy, generated with the ray venv's
    own grpc_tools (installed there on first use) so they match its protobuf."""
    out = PEERS_ENV / "ray-protos"
    if not (out / "grpc_service_v2_pb2_grpc.py").exists():
        probe = subprocess.run([str(python), "-c", "import grpc_tools"], capture_output=True)
        if probe.returncode:
            subprocess.run([str(python), "-m", "pip", "install", "-q", "grpcio-tools"], check=True)
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "grpc_tools.protoc",
                f"-I{PEERS_SRC}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(PEERS_SRC / "grpc_service_v2.proto"),
            ],
            check=True,
        )
    return out


class Server:
    """A server process (its own session, so the whole tree stops together)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        http: str,
        grpc_at: str | None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.http, self.grpc = name, http, grpc_at
        # Open for the server's life (closed in stop()): its output, quoted if it fails.
        self.log = tempfile.NamedTemporaryFile(prefix=f"peers-{name}-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )

    def wait_ready(self, requests: dict[str, dict[str, Any]], timeout: float) -> None:
        """Until every model answers over HTTP (and gRPC) with onnxruntime's outputs."""
        deadline = time.monotonic() + timeout
        for name, req in requests.items():
            while True:
                try:
                    check(
                        http_infer(self.http, name, req["json"]),
                        req["expected"],
                        f"{self.name} HTTP {name}",
                    )
                    break
                except urllib.error.HTTPError as e:  # up, but answering with an error
                    if e.code in (404, 503) and time.monotonic() < deadline:
                        time.sleep(0.5)  # the model (or Ray's route) not there yet
                        continue
                    body = e.read()[:2000].decode(errors="replace")
                    raise SystemExit(f"{self.name} HTTP {name}: {e}: {body}") from e
                except (OSError, KeyError, ValueError) as e:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        tail = Path(self.log.name).read_text()[-3000:]
                        raise SystemExit(f"{self.name} not ready ({e}):\n{tail}") from e
                    time.sleep(0.5)  # polling a starting server: nothing to wait on
            if self.grpc:
                check(
                    grpc_infer(self.grpc, name, req["grpc"]),
                    req["expected"],
                    f"{self.name} gRPC {name}",
                )

    def tree(self) -> set[int]:
        """The server's process and its descendants (Ray's raylet and workers among them)."""
        parents: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, IndexError):  # gone meanwhile
                    stat = (d / "stat").read_text()
                    parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        tree, grew = {self.proc.pid}, True
        while grew:
            more = {p for p, pp in parents.items() if pp in tree} - tree
            tree |= more
            grew = bool(more)
        return tree

    def pss_mib(self) -> float:
        """PSS of the server's process tree (MiB)."""
        kib = 0
        for pid in self.tree():
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
                found = re.search(r"^Pss:\s+(\d+)", text, re.M)
                kib += int(found.group(1)) if found else 0
        return kib / 1024

    def stop(self) -> None:
        """SIGTERM to the server's session (SIGKILL after 30 s), then SIGKILL to whatever of
        its tree outlived it in sessions of its own."""
        tree = self.tree()
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        for pid in tree - {self.proc.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()


def start(peer: str, paths: dict[str, Path], instances: int, folder: Path) -> Server:
    http, grpc_at = free_address(), free_address()
    specs = [f"{n}={p}" for n, p in paths.items()]
    if peer == "crossrt":
        command = [
            sys.executable,
            "-m",
            "crossrt",
            "serve",
            "-x",
            "-l",
            "warning",
            "-g",
            f"unix:{folder}/crossrt.sock",
            "-g",
            grpc_at,
            "--http",
            http,
            "--load-parameter",
            f"instances={instances}",
        ]
        for spec in specs:
            command += ["--model", spec]
        env = {"CROSSRT_RUNTIME_DIR": str(folder / "crossrt-run")}
        return Server(peer, command, http, grpc_at, env)
    python = str(peer_python(peer))
    port = lambda address: address.rsplit(":", 1)[1]  # noqa: E731
    if peer == "kserve":
        command = [
            python,
            str(PEERS_SRC / "kserve_server.py"),
            "--http-port",
            port(http),
            "--grpc-port",
            port(grpc_at),
            "--instances",
            str(instances),
            *specs,
        ]
        return Server(peer, command, http, grpc_at)
    if peer == "mlserver":
        repo = folder / "mlserver"
        for name, path in paths.items():
            (repo / name).mkdir(parents=True)
            (repo / name / "model-settings.json").write_text(
                json.dumps(
                    {
                        "name": name,
                        "implementation": "mlserver_runtime.OnnxModel",
                        "parameters": {"uri": str(path)},
                    }
                )
            )
        (repo / "settings.json").write_text(
            json.dumps(
                {
                    "host": "127.0.0.1",
                    "http_port": int(port(http)),
                    "grpc_port": int(port(grpc_at)),
                    "metrics_port": int(port(free_address())),
                    "parallel_workers": instances,
                }
            )
        )
        mlserver = str(Path(python).parent / "mlserver")
        env = {"PYTHONPATH": str(PEERS_SRC)}
        return Server(peer, [mlserver, "start", str(repo)], http, grpc_at, env, cwd=repo)
    if peer == "ray":
        protos = ray_protos(Path(python))
        command = [
            python,
            str(PEERS_SRC / "ray_server.py"),
            "--http-port",
            port(http),
            "--grpc-port",
            port(grpc_at),
            "--instances",
            str(instances),
            *specs,
        ]
        env = {"PYTHONPATH": str(protos), "RAY_USAGE_STATS_ENABLED": "0"}
        return Server(peer, command, http, grpc_at, env)
    raise SystemExit(f"unknown peer {peer!r}; choose from crossrt, {', '.join(PEERS)}")
