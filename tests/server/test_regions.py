"""Shared-memory regions belong to the user who registered them, each user with names of its
own; who a peer is comes from the kernel (or a token: tests/security). Real files and sockets
throughout: the ownership rules on files chowned to other users, and a client process running
as another user against the daemon."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
import region_client
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from serving import Daemon
from tritonclient.utils import InferenceServerException

from crossrt.server.peers import Peer, identify
from crossrt.server.regions import Regions, may_open
from crossrt.server.status import ServiceError

OTHER, STRANGER = 4242, 4343
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Path]:
    """A 4 KiB file in a folder standing for /dev/shm, owned by user OTHER, mode 0600."""
    path = tmp_path / "seg"
    path.write_bytes(b"\0" * 4096)
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, OTHER, OTHER)
    yield path


def peer(uid: int, gid: int | None = None) -> Peer:
    return Peer("unix-abstract:test", local=True, uid=uid, gid=gid if gid is not None else uid)


@root_only
def test_may_open_follows_owner_group_and_other_bits(segment: Path) -> None:
    st = segment.stat()
    assert may_open(st, OTHER, frozenset({OTHER}))
    assert not may_open(st, STRANGER, frozenset({STRANGER, OTHER}))  # 0600: group has nothing
    assert may_open(st, 0, frozenset({0}))
    segment.chmod(0o660)
    assert may_open(segment.stat(), STRANGER, frozenset({STRANGER, OTHER}))
    assert not may_open(segment.stat(), STRANGER, frozenset({STRANGER}))
    segment.chmod(0o644)  # others may read, not write: not enough
    assert not may_open(segment.stat(), STRANGER, frozenset({STRANGER}))


@root_only
def test_region_of_another_user_is_refused(segment: Path) -> None:
    regions = Regions(str(segment.parent))
    with pytest.raises(ServiceError) as info:
        regions.register("theirs", "/seg", 0, 4096, peer(STRANGER))
    assert info.value.status == grpc.StatusCode.PERMISSION_DENIED
    assert "may not open" in info.value.message
    regions.register("mine", "/seg", 0, 4096, peer(OTHER))
    data = np.arange(16, dtype=np.uint8)
    regions.write("mine", 8, data, peer(OTHER))
    assert regions.read("mine", 8, 16, peer(OTHER)).tolist() == data.tolist()
    for call in (  # another user's names are not the stranger's: it has no region "mine"
        lambda: regions.read("mine", 0, 16, peer(STRANGER)),
        lambda: regions.write("mine", 0, data, peer(STRANGER)),
        lambda: regions.unregister("mine", peer(STRANGER)),
    ):
        with pytest.raises(ServiceError) as info:
            call()
        assert info.value.status == grpc.StatusCode.NOT_FOUND
    assert regions.status("", peer(STRANGER)) == []
    assert [r.name for r in regions.status("", peer(OTHER))] == ["mine"]
    regions.unregister("", peer(OTHER))
    assert regions.status("", peer(OTHER)) == []


@root_only
def test_each_user_has_region_names_of_its_own(segment: Path) -> None:
    """Triton's clients use fixed names ("input0_data"): one user must not be able to take a
    name from another, nor learn that another uses it."""
    theirs = segment.with_name("theirs")
    theirs.write_bytes(b"\0" * 4096)
    os.chown(theirs, STRANGER, STRANGER)
    regions = Regions(str(segment.parent))
    regions.register("input0_data", "/seg", 0, 4096, peer(OTHER))
    regions.register("input0_data", "/theirs", 0, 4096, peer(STRANGER))  # no ALREADY_EXISTS
    regions.write("input0_data", 0, np.full(8, 1, np.uint8), peer(OTHER))
    regions.write("input0_data", 0, np.full(8, 2, np.uint8), peer(STRANGER))
    assert regions.read("input0_data", 0, 8, peer(OTHER)).tolist() == [1] * 8
    assert regions.read("input0_data", 0, 8, peer(STRANGER)).tolist() == [2] * 8
    regions.unregister("input0_data", peer(STRANGER))
    assert [r.key for r in regions.status("", peer(OTHER))] == ["/seg"]
    regions.close()


def test_region_refused_to_remote_and_unknown_peers(tmp_path: Path) -> None:
    (tmp_path / "seg").write_bytes(b"\0" * 64)
    regions = Regions(str(tmp_path))
    remote = identify("ipv4:10.1.2.3:5000", {})
    assert not remote.local
    for who, text, status in (
        (remote, "another host", grpc.StatusCode.PERMISSION_DENIED),
        (Peer("unix-abstract:x", True), "not a proven local user", grpc.StatusCode.UNAUTHENTICATED),
    ):
        with pytest.raises(ServiceError) as info:
            regions.register("r", "/seg", 0, 64, who)
        assert info.value.status == status
        assert text in info.value.message


def test_region_bounds_and_key_are_checked(tmp_path: Path) -> None:
    (tmp_path / "seg").write_bytes(b"\0" * 64)
    regions = Regions(str(tmp_path))
    me = peer(os.geteuid(), os.getegid())
    with pytest.raises(ServiceError, match="past the end"):
        regions.register("r", "/seg", 32, 64, me)
    for key in ("/../etc/passwd", "/a/b", "", "/"):
        with pytest.raises(ServiceError, match="not a shared-memory name"):
            regions.register("r", key, 0, 1, me)
    (tmp_path / "link").symlink_to(tmp_path / "seg")
    with pytest.raises(ServiceError, match="cannot open"):
        regions.register("r", "/link", 0, 1, me)
    regions.register("r", "/seg", 16, 32, me)
    with pytest.raises(ServiceError, match="past its end"):
        regions.read("r", 16, 17, me)
    os.truncate(tmp_path / "seg", 8)  # the client shrinks its file: an error, not SIGBUS
    for call in (
        lambda: regions.read("r", 0, 8, me),
        lambda: regions.write("r", 0, np.zeros(8, np.uint8), me),
    ):
        with pytest.raises(ServiceError) as info:
            call()
        assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    regions.close()


def test_a_loopback_tcp_peer_is_local_and_anonymous() -> None:
    """Nothing is looked up from a client's address (a TIME_WAIT row in /proc/net/tcp says
    uid 0 for a port anyone may bind next): over TCP only a token says who it is."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        host, port = client.getsockname()
        for address in (f"ipv4:{host}:{port}", f"ipv6:[::ffff:{host}]:{port}"):
            found = identify(address, {})
            assert (found.local, found.uid, found.pid, found.operator) == (True, None, 0, False)
        client.close()
        accepted.close()
    regions = Regions("/dev/shm")
    with pytest.raises(ServiceError) as info:
        regions.register("r", "/x", 0, 1, identify("ipv4:127.0.0.1:4000", {}))
    assert info.value.status == grpc.StatusCode.UNAUTHENTICATED
    assert "in the request" in info.value.message


def in_child(daemon: Daemon, case: str, key: str, uid: int | None = None) -> dict[str, Any]:
    """Run ``region_client.py``'s ``case`` in another process and return its dict.

    As this user: a new interpreter (a fork of this process, whose gRPC and ONNX Runtime
    threads run, can hang inside gRPC). As user ``uid`` (group 0: the socket is 0660
    root:root, so its group lets that user connect): a fork that drops to that user, since the
    interpreter under /root is not that user's to run; a child that never answers is killed.
    """
    if uid is None:
        script = str(Path(__file__).with_name("region_client.py"))
        done = subprocess.run(
            [sys.executable, "-B", script, daemon.url, case, key],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = done.stdout.strip().splitlines()
        return dict(json.loads(lines[-1])) if lines else {"error": done.stderr[-500:]}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(0)
            os.setuid(uid)
            result = region_client.CASES[case](
                tc.InferenceServerClient(daemon.url), key, daemon.url
            )
        except BaseException as exc:
            result = {"error": repr(exc)}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        while select.select([pipe], [], [], 60)[0] and (chunk := pipe.read1(65536)):
            chunks.append(chunk)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return dict(json.loads(b"".join(chunks) or b'{"error": "no answer"}'))


@root_only
def test_another_user_cannot_use_or_register_what_is_not_theirs(
    daemon: Daemon, client: tc.InferenceServerClient
) -> None:
    key = f"/crossrt-root-{os.getpid()}"
    mine = shm.create_shared_memory_region("root-region", key, 256)
    try:
        client.register_system_shared_memory("root-region", key, 256)

        got = in_child(daemon, "other_user", key, uid=OTHER)
        assert got["use"] == "StatusCode.NOT_FOUND"  # its names are its own
        assert got["use_lane"].startswith("ModelNotFoundError"), got["use_lane"]
        assert got["register_root_file"] == "StatusCode.PERMISSION_DENIED"
        assert got["unregister"] == "StatusCode.NOT_FOUND"
        assert got["listed"] == []
        assert got["register_own"] == "OK"
        expected = (
            np.ones((4, 8), np.float32) @ (np.arange(64, dtype=np.float32).reshape(8, 8) / 64) + 1
        )
        np.testing.assert_allclose(np.array(got["y"]), expected, rtol=1e-6)
        assert "root-region" in client.get_system_shared_memory_status().regions
    finally:
        client.unregister_system_shared_memory("root-region")
        shm.destroy_shared_memory_region(mine)


def test_regions_of_a_dead_process_are_released(
    daemon: Daemon, client: tc.InferenceServerClient
) -> None:
    key = f"/crossrt-dead-{os.getpid()}"
    handle = shm.create_shared_memory_region("dead-region", key, 64)
    try:
        got = in_child(daemon, "dead_process", key)
        # registered, then its process ended (others of this user's, such as the lane's memfd
        # segments an earlier test of this module left registered, may be listed beside it)
        assert "dead-region" in got["listed"], got["listed"]
        assert "dead-region" not in client.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(handle)


def test_the_socket_is_0660(daemon: Daemon) -> None:
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o660
    with pytest.raises(InferenceServerException) as info:
        daemon.client().register_system_shared_memory("x", "/no-such-segment-here", 8)
    assert info.value.status() == "StatusCode.NOT_FOUND"
