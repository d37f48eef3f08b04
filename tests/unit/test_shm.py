"""Shared-memory tensors: memfd and POSIX segments, fd + offset + size, permissions, names.
Sharing with another process, and cleanup when the process that made a segment exits or
crashes, are tested in tests/system/test_shm_processes.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt import InvalidArgumentError, Tensor, UnsupportedError
from crossrt.memory import Placement
from crossrt.runtime.memory.shm import SharedMemorySegment, segment_name
from crossrt.runtime.memory.tensor import tensor_from_fd

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs Linux /dev/shm")


def _shm_names() -> set[str]:
    """This process's segments: crossrt names them crossrt-<pid namespace>-<pid>-... (other
    processes on the machine create and remove theirs meanwhile)."""
    return {n for n in os.listdir("/dev/shm") if f"-{os.getpid()}-" in n}


def test_memfd_tensor_has_fd_offset_size_and_owner_only_mode() -> None:
    t = crossrt.shared_tensor((4, 4), "float32", name="s")
    assert (t.offset, t.size, t.byte_size) == (0, 64, 64)
    assert t.placement is Placement.HOST and t.is_host
    assert t.fd is not None and stat.S_IMODE(os.fstat(t.fd).st_mode) == 0o600
    label = segment_name(t)
    assert label is not None and len(label) >= len("crossrt-") + 32  # 128 random bits
    assert label not in _shm_names()  # a memfd has no name in any file system
    assert Path(f"/proc/self/fd/{t.fd}").readlink().name.startswith(f"memfd:{label}")


def test_from_fd_maps_the_same_bytes_at_any_offset() -> None:
    t = crossrt.shared_tensor((1000,), "uint8")
    t.numpy()[:] = np.arange(1000) % 256
    view = Tensor.from_fd(t.fd, 16, 900, dtype="int32", shape=(4,), name="v")  # type: ignore[arg-type]
    assert (view.fd, view.offset, view.size, view.name) == (t.fd, 900, 16, "v")
    assert view.numpy().tobytes() == (np.arange(900, 916) % 256).astype(np.uint8).tobytes()
    view.numpy()[0] = -1
    assert t.numpy()[900:904].tolist() == [255] * 4
    view.free()
    os.fstat(t.fd)  # freeing a mapped tensor leaves the caller's descriptor open


def test_slices_of_shared_tensors_report_their_offset() -> None:
    t = crossrt.shared_tensor((64,), "uint8")
    s = t.slice(40, 8)
    assert (s.fd, s.offset, s.size) == (t.fd, 40, 8)


def test_from_fd_checks_the_descriptor_and_the_range() -> None:
    t = crossrt.shared_tensor((8,), "uint8")
    with pytest.raises(InvalidArgumentError, match="not an open file descriptor"):
        tensor_from_fd(987654, 8)
    with pytest.raises(InvalidArgumentError, match=r"beyond the end of the file, which holds 8"):
        tensor_from_fd(t.fd, 8, 4)  # type: ignore[arg-type]


def test_posix_segments_are_unlinked_right_after_mapping() -> None:
    before = _shm_names()
    t = crossrt.shared_tensor((16,), "uint8", kind="posix")
    assert _shm_names() == before and segment_name(t) is None
    t.numpy()[:] = 7
    assert tensor_from_fd(t.fd, 16).numpy().tolist() == [7] * 16  # type: ignore[arg-type]


def test_named_segment_lives_until_its_last_tensor_is_freed() -> None:
    t = crossrt.shared_tensor((16,), "uint8", keep_name=True)
    name = segment_name(t)
    assert name is not None and name in _shm_names()
    assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o600
    s = t.slice(0, 8)
    t.free()
    assert name in _shm_names()  # the slice still uses it
    s.free()
    assert name not in _shm_names()


def test_memfd_cannot_keep_a_name() -> None:
    with pytest.raises(UnsupportedError, match="no name to keep"):
        SharedMemorySegment(8, kind="memfd", keep_name=True)
    with pytest.raises(InvalidArgumentError, match="choose one of"):
        SharedMemorySegment(8, kind="sysv")


def test_shared_tensor_is_accounted_in_host_memory() -> None:
    host = crossrt.runtime.memory.allocator.host_allocator()
    before = host.stats().bytes_in_use
    t = crossrt.shared_tensor((256,), "float32")
    assert host.stats().bytes_in_use == before + 1024
    t.free()
    assert host.stats().bytes_in_use == before
