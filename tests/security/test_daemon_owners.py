"""What one user of a shared ``crossrt serve`` cannot do to another: take over their model
(crossrt.v1 Unload / Load / Stop), drive the operator's repository, destroy their core group,
squat the relay's connection names, or hold every connection. A real daemon, real users."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
import tritonclient.grpc as tc
from as_user import AsUser, Lines, User, needs_root, once
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

import crossrt
from crossrt.errors import CrossrtError
from crossrt.server.lane import HEADER, MAGIC, Frames
from crossrt.server.proto import runtime_pb2 as v1
from server.serving import Daemon, free_port, make_repository, start_daemon
from small_models import add_one

pytestmark = needs_root


def _start(folder: Path, name: str, *args: str) -> Daemon:
    base = folder / name
    base.mkdir()
    base.chmod(0o711)
    config = base / "serve.toml"
    config.write_text('socket_mode = "0666"\n')
    return start_daemon(base, make_repository(base / "models"), ["-c", str(config), *args])


@pytest.fixture(scope="module")
def daemon(folder: Path) -> Iterator[Daemon]:
    d = _start(folder, "explicit", "--model-control", "explicit")
    yield d
    assert d.stop() == 0, "".join(d.log)


def code_of(call: Any) -> str:
    try:
        call()
    except CrossrtError as exc:
        return type(exc).__name__ + ": " + str(exc)
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


def owner(lines: Lines, url: str, name: str, data: bytes, grouped: bool = True) -> None:
    """Load ``data`` as ``name`` (on a core group of its own, ``grouped``), say so, then
    answer each input sent with the model's output, until told to stop."""
    from crossrt.server.client import connect

    with connect(url) as remote:
        group = remote.create_core_group(1) if grouped else None
        model = remote.load(data, name=name, group=group)
        if group is not None:
            model.start()
        lines.send({"loaded": name, "group": group.id if group else 0})
        while (doc := lines.recv(120)) != "stop":
            x = np.array(doc, np.float32)
            lines.send({"y": model.run(x)["y"].tolist()})
        with contextlib.suppress(CrossrtError):  # given way to the repository's, maybe
            model.unload()
        if group is not None:
            group.destroy()
        lines.send("stopped")


def attacker(url: str, name: str, group: int, data: bytes) -> dict[str, str]:
    from crossrt.server.client import connect

    with connect(url) as rt:
        return {
            "v1.Unload": code_of(lambda: rt.call("v1.Unload", v1.ModelRequest(name=name))),
            "v1.Stop": code_of(lambda: rt.call("v1.Stop", v1.ModelRequest(name=name))),
            "unload": code_of(
                lambda: rt.call(
                    "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=name)
                )
            ),
            "load": code_of(lambda: rt.call("v1.Load", v1.LoadRequest(name=name, model=data))),
            "destroy": code_of(lambda: rt.call("v1.DestroyCoreGroup", v1.CoreGroup(id=group))),
            "repository unload": code_of(
                lambda: rt.call(
                    "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="tiny")
                )
            ),
            "repository load": code_of(
                lambda: rt.call(
                    "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="relu")
                )
            ),
        }


def test_another_users_model_cannot_be_taken_over(daemon: Daemon, people: list[User]) -> None:
    victim, thief = people
    mine = crossrt.compile(add_one(3), "cpu").to_bytes()
    theirs = crossrt.compile(add_one(3), "cpu").to_bytes()
    with AsUser(victim, owner, daemon.url, "victim", mine) as child:
        loaded = child.recv()
        assert loaded.get("loaded") == "victim", loaded
        got = once(thief, attacker, daemon.url, "victim", loaded["group"], theirs)
        for call in ("v1.Unload", "v1.Stop", "unload"):
            assert got[call].startswith("OperationForbiddenError"), (call, got)
        assert got["destroy"].startswith("ModelNotFoundError"), got  # not told from none
        assert "exists" in got["load"] or "served already" in got["load"], got
        for call in ("repository unload", "repository load"):
            assert got[call].startswith("OperationForbiddenError"), (call, got)
        child.send([2, 3, 4])
        assert child.recv() == {"y": [3.0, 4.0, 5.0]}
        child.send("stop")
        assert child.recv() == "stopped"
    assert not tc.InferenceServerClient(daemon.url).is_model_ready("relu")


def test_the_operators_repository_wins_a_name(daemon: Daemon, people: list[User]) -> None:
    user = people[0]
    data = crossrt.compile(add_one(3), "cpu").to_bytes()
    with AsUser(user, owner, daemon.url, "later", data, False) as child:
        assert child.recv().get("loaded") == "later"
        crossrt.compile(add_one(5), "cpu").save(daemon.repository / "later.crm")
        client = tc.InferenceServerClient(daemon.url)
        client.load_model("later")  # the operator's: the user's model gives way
        shape = list(client.get_model_metadata("later").inputs[0].shape)
        assert shape == [5]
        child.send("stop")
        child.recv()
        client.unload_model("later")


def test_under_model_control_none_the_repository_is_not_driven(folder: Path) -> None:
    port = free_port()
    d = _start(folder, "none", "--model-control", "none", "--http", f"127.0.0.1:{port}")
    try:
        client = d.client()  # root over the Unix socket: the operator, refused all the same
        for call in (lambda: client.unload_model("tiny"), lambda: client.load_model("relu")):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "not allowed" in info.value.message()
        for what in ("unload", "load"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v2/repository/models/tiny/{what}", data=b"{}"
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 503
        assert client.is_model_ready("tiny")
    finally:
        assert d.stop() == 0, "".join(d.log)


# -- the relay -------------------------------------------------------------------------------


def _names_of(pid: int) -> list[str]:
    """The abstract socket names process ``pid`` has bound (``/proc/net/unix``, which anyone
    may read, joined with the process's descriptors)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    names = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[6] in inodes and fields[7].startswith("@"):
            names.append(fields[7][1:])
    return names


def test_squatting_the_relays_names_blocks_no_one(daemon: Daemon) -> None:
    # A channel of its own (gRPC shares connections between channels to one target).
    fresh = [("grpc.use_local_subchannel_pool", 1)]
    first = tc.InferenceServerClient(daemon.url, channel_args=fresh)
    assert first.is_server_live()  # one relayed connection open: its name is visible
    names = _names_of(daemon.proc.pid)
    assert any(name.startswith("crossrt-peer-") for name in names), names
    squatted = []
    for name in names:
        found = re.fullmatch(r"(crossrt-peer-[0-9a-f]+)-(\d+)", name)
        if found is None:
            continue  # nothing to predict
        prefix, serial = found.group(1), int(found.group(2))
        for n in range(serial + 1, serial + 301):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.bind(f"\0{prefix}-{n}")
                squatted.append(s)
            except OSError:
                s.close()
    try:
        for _ in range(5):
            client = tc.InferenceServerClient(daemon.url, channel_args=fresh)
            assert client.is_server_live(client_timeout=30)
            client.close()
    finally:
        for s in squatted:
            s.close()
        first.close()


def hold(lines: Lines, path: str, count: int) -> None:
    """Open ``count`` lane connections and keep them, saying how many were greeted."""
    kept, greeted = [], 0
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(MAGIC + HEADER.pack(0, 0))
        try:
            status, _ = Frames(sock).read()
        except (OSError, EOFError):
            status = -1
        greeted += status == 0
        kept.append(sock)
    lines.send({"greeted": greeted})
    lines.recv(120)


def test_one_user_cannot_hold_every_connection(folder: Path, people: list[User]) -> None:
    d = _start(folder, "hog", "--max-connections", "8")
    try:
        with AsUser(people[1], hold, d.socket, 8) as hog:
            got = hog.recv()
            assert got == {"greeted": 4}, got  # half of max_connections
            with socket.socket(socket.AF_UNIX) as sock:  # another user still gets in
                sock.settimeout(30)
                sock.connect(d.socket)
                sock.sendall(MAGIC + HEADER.pack(0, 0))
                assert Frames(sock).read()[0] == 0
            assert d.client().is_server_live()
            hog.send("done")
    finally:
        assert d.stop() == 0, "".join(d.log)


def test_idle_connections_are_closed(folder: Path) -> None:
    d = _start(folder, "idle", "--idle-timeout", "1")
    try:
        with socket.socket(socket.AF_UNIX) as lane, socket.socket(socket.AF_UNIX) as h2:
            lane.settimeout(30)
            lane.connect(d.socket)
            lane.sendall(MAGIC + HEADER.pack(0, 0))
            frames = Frames(lane)
            assert frames.read()[0] == 0
            h2.settimeout(30)
            h2.connect(d.socket)
            h2.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            with pytest.raises(EOFError):
                frames.read()  # the daemon closed it: it stayed idle past the timeout
            while h2.recv(65536):
                pass  # gRPC's settings, then the end
        # a connection in use is not idle
        client = d.client()
        x = tc.InferInput("x", [4, 8], "FP32")
        x.set_data_from_numpy(np.ones((4, 8), np.float32))
        assert client.infer("tiny", [x]).as_numpy("y").shape == (4, 8)
    finally:
        assert d.stop() == 0, "".join(d.log)


def test_core_group_ids_are_not_sequential(daemon: Daemon) -> None:
    from crossrt.server.client import connect

    with connect(daemon.url) as rt:
        a = rt.create_core_group(1)
        a.destroy()
        b = rt.create_core_group(1)
        b.destroy()
        assert abs(int(b.id) - int(a.id)) > 1_000_000


def make_group(url: str) -> list[int]:
    from crossrt.server.client import connect

    with connect(url) as rt:
        return list(rt.create_core_group(1).indices)


def test_a_dead_clients_core_group_gives_its_cores_back(daemon: Daemon, people: list[User]) -> None:
    from crossrt.server.client import connect

    indices = once(people[0], make_group, daemon.url)  # made, then its process ended
    deadline = time.monotonic() + 60
    with connect(daemon.url) as rt:
        while True:
            try:
                rt.create_core_group(indices=indices).destroy()
                break
            except CrossrtError:
                assert time.monotonic() < deadline, "the dead client's group kept its cores"
                time.sleep(0.2)  # the daemon looks for dead clients every few seconds
