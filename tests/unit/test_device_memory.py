"""The BMLib-style device memory API: malloc/free, memcpy s2d/d2s/d2d, memset, mmap with
flush/invalidate; on host-coherent CPU memory and on a test double whose memory is not
host-coherent, where skipping invalidate or flush is caught."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt import InvalidArgumentError, OutOfResourcesError, Tensor, UnsupportedError
from crossrt.compat.bmlib import POISON, Device, DeviceMemory
from crossrt.drivers import DeviceInfo, DeviceKind, Driver, registry
from crossrt.errors import InvalidHandleError, OperationForbiddenError
from crossrt.memory import Placement
from crossrt.runtime.memory.allocator import copied_bytes
from crossrt.runtime.memory.tensorset import TensorSet

# Allocation failures dump their log into the test's own directory, not the real one.
pytestmark = pytest.mark.usefixtures("runtime_dir")


class _Block:
    """Memory the host cannot address: only the driver's copy hooks reach it."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(nbytes)


class SeparateMemoryDriver(Driver):
    """A device with its own memory (1 MiB), runs nothing."""

    name = "separate"

    @property
    def version(self) -> str:
        return "1"

    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                id="sep:0",
                name="separate memory",
                vendor="tests",
                kind=DeviceKind.ACCELERATOR,
                driver=self.name,
                cores=1,
                memory_bytes=1 << 20,
            )
        ]

    def supported_nodes(self, model: Any, device: DeviceInfo) -> list[bool]:
        return [False] * len(model.nodes)

    def compile(self, model: Any, device: DeviceInfo, options: Any) -> bytes:
        raise NotImplementedError

    def load(
        self,
        artifact: bytes,
        device: DeviceInfo,
        cores: Sequence[int],
        options: Any,
        **_: Any,
    ) -> Any:
        raise NotImplementedError

    def allocate(self, device: DeviceInfo, nbytes: int) -> Any:
        return _Block(nbytes)

    def free(self, device: DeviceInfo, buffer: Any) -> None:
        buffer.data = None

    def copy_in(self, device: DeviceInfo, dst: Any, src: memoryview, offset: int = 0) -> None:
        dst.data[offset : offset + src.nbytes] = src.cast("B")

    def copy_out(self, device: DeviceInfo, dst: memoryview, src: Any, offset: int = 0) -> None:
        out = dst.cast("B")
        out[:] = src.data[offset : offset + out.nbytes]

    def copy_device(
        self,
        device: DeviceInfo,
        dst: Any,
        src: Any,
        nbytes: int,
        dst_offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        dst.data[dst_offset : dst_offset + nbytes] = src.data[src_offset : src_offset + nbytes]


@pytest.fixture
def sep(rt: crossrt.Runtime, monkeypatch: pytest.MonkeyPatch) -> Device:
    registry.driver_statuses()  # load the real ones first
    driver = SeparateMemoryDriver()
    assert registry._statuses is not None
    monkeypatch.setitem(
        registry._statuses, driver.name, registry.DriverStatus(driver.name, "tests", driver)
    )
    return Device.open("sep:0")


def _pattern(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


# -- coherent CPU memory -----------------------------------------------------------------


def test_cpu_device_is_coherent(rt: crossrt.Runtime) -> None:
    dev = Device.open("cpu:0")
    assert dev.coherent and dev.id == "cpu:0" and "coherent" in repr(dev)


def test_malloc_memcpy_and_free_with_sizes_and_offsets(rt: crossrt.Runtime) -> None:
    dev = Device.open("cpu")
    before = dev.stats().bytes_in_use
    a, b = dev.malloc(16, name="a"), dev.malloc(16, name="b")
    assert (a.size, a.device, a.name) == (16, "cpu:0", "a")
    assert dev.stats().bytes_in_use == before + 32
    dev.memcpy_s2d(a, _pattern(16))
    dev.memcpy_s2d(a, b"\xee\xee\xee", size=2, dst_offset=4)
    out = bytearray(16)
    dev.memcpy_d2s(out, a)
    assert out[3:7] == bytes([3, 0xEE, 0xEE, 6])
    dev.memset(b, 0)
    dev.memcpy_d2d(b, a, size=4, dst_offset=8, src_offset=4)
    part = bytearray(4)
    dev.memcpy_d2s(part, b, size=4, src_offset=8)
    assert bytes(part) == bytes([0xEE, 0xEE, 6, 7])
    dev.free(a)
    dev.free(a)
    dev.free(b)
    assert dev.stats().bytes_in_use == before


def test_coherent_mmap_is_the_memory_and_flush_invalidate_are_no_ops(rt: crossrt.Runtime) -> None:
    dev = Device.open("cpu:0")
    mem = dev.malloc(8)
    view = dev.mmap(mem)
    view[:] = _pattern(8)
    out = bytearray(8)
    dev.memcpy_d2s(out, mem)  # no flush needed
    assert bytes(out) == _pattern(8)
    dev.memcpy_s2d(mem, b"\x09" * 8)
    dev.flush(mem)
    dev.invalidate(mem)
    assert bytes(view) == b"\x09" * 8  # no invalidate needed either
    dev.munmap(mem)


@pytest.mark.parametrize(
    "call",
    [
        lambda d, m: d.memcpy_s2d(m, b"x" * 9),
        lambda d, m: d.memcpy_s2d(m, b"xx", dst_offset=7),
        lambda d, m: d.memcpy_d2s(bytearray(4), m, size=4, src_offset=6),
        lambda d, m: d.memcpy_d2s(bytearray(2), m),
        lambda d, m: d.memcpy_d2d(m, m, size=4, dst_offset=6),
        lambda d, m: d.memset(m, 1, size=9),
        lambda d, m: d.memset(m, 300),
        lambda d, m: d.flush(m, offset=9),
    ],
)
def test_out_of_range_operations_are_invalid_and_change_nothing(rt: crossrt.Runtime, call) -> None:
    dev = Device.open("cpu:0")
    mem = dev.malloc(8)
    dev.memcpy_s2d(mem, _pattern(8))
    with pytest.raises(InvalidArgumentError):
        call(dev, mem)
    out = bytearray(8)
    dev.memcpy_d2s(out, mem)
    assert bytes(out) == _pattern(8)


def test_freed_or_foreign_memory_is_refused(rt: crossrt.Runtime, sep: Device) -> None:
    dev = Device.open("cpu:0")
    mem = dev.malloc(8)
    with pytest.raises(InvalidArgumentError, match="belongs to cpu:0, not sep:0"):
        sep.memset(mem, 0)
    dev.free(mem)
    assert mem.freed
    with pytest.raises(InvalidHandleError, match="was freed"):
        dev.memset(mem, 0)
    with pytest.raises(InvalidArgumentError, match="expected DeviceMemory"):
        dev.memset(bytearray(8), 0)  # type: ignore[arg-type]


def test_tensor_over_device_memory_leaves_freeing_to_the_owner(rt: crossrt.Runtime) -> None:
    dev = Device.open("cpu:0")
    mem = dev.malloc(16)
    dev.memset(mem, 0)
    t = dev.tensor(mem, "int32", (2,), offset=8, name="t")
    assert (t.placement, t.device, t.shape, t.offset) == (Placement.DEVICE, "cpu:0", (2,), 8)
    t.numpy()[:] = [5, 6]
    out = np.zeros(4, np.int32)
    dev.memcpy_d2s(out, mem)
    assert out.tolist() == [0, 0, 5, 6]
    t.free()
    assert not mem.freed
    dev.free(mem)


# -- memory that is not host-coherent ------------------------------------------------------


def test_separate_memory_device_is_not_coherent(sep: Device) -> None:
    assert not sep.coherent
    mem = sep.malloc(32, name="m")
    sep.memcpy_s2d(mem, _pattern(32))
    out = bytearray(32)
    sep.memcpy_d2s(out, mem)
    assert bytes(out) == _pattern(32)


def test_reading_a_mapping_without_invalidate_sees_poison(sep: Device) -> None:
    mem = sep.malloc(16)
    sep.memcpy_s2d(mem, _pattern(16))
    view = sep.mmap(mem)
    assert bytes(view) == _pattern(16)  # nothing cached yet: a new mapping reads the device
    sep.memcpy_s2d(mem, b"\x02" * 16)
    assert bytes(view) == bytes([POISON]) * 16  # never stale plausible bytes
    sep.invalidate(mem)
    assert bytes(view) == b"\x02" * 16
    sep.memcpy_s2d(mem, b"\x01" * 16)  # the device changes it again
    assert bytes(view) == bytes([POISON]) * 16
    sep.invalidate(mem, offset=0, size=8)
    assert bytes(view) == b"\x01" * 8 + bytes([POISON]) * 8


def test_a_device_op_after_host_writes_without_flush_is_refused(sep: Device) -> None:
    mem = sep.malloc(8, name="w")
    sep.memset(mem, 0)
    view = sep.mmap(mem)
    sep.invalidate(mem)
    view[0:4] = b"host"
    out = bytearray(8)
    for call in (
        lambda: sep.memcpy_d2s(out, mem),
        lambda: sep.memcpy_s2d(mem, b"dev"),
        lambda: sep.memset(mem, 1),
        lambda: sep.memcpy_d2d(sep.malloc(8), mem),
        lambda: sep.invalidate(mem),
        lambda: sep.munmap(mem),
    ):
        with pytest.raises(OperationForbiddenError, match=r"'w'.*without flush"):
            call()
    sep.flush(mem)
    sep.memcpy_d2s(out, mem)
    assert bytes(out) == b"host\x00\x00\x00\x00"
    sep.munmap(mem)


def test_flush_over_newer_device_writes_is_refused(sep: Device) -> None:
    mem = sep.malloc(8)
    view = sep.mmap(mem)
    sep.invalidate(mem)
    sep.memcpy_s2d(mem, b"device!!")  # the mapping is stale now (and poisoned)
    view[0] = 1
    with pytest.raises(OperationForbiddenError, match="invalidate before writing"):
        sep.flush(mem)


def test_a_new_mapping_written_and_flushed_reaches_the_device(sep: Device) -> None:
    # Seed 004's mmap example: mmap, write, flush, with no invalidate before the write.
    mem = sep.malloc(8)
    sep.memcpy_s2d(mem, b"\x00" * 8)
    view = sep.mmap(mem)
    view[:] = bytes([POISON]) * 4 + b"host"  # poison-valued bytes are data too
    sep.flush(mem)
    out = bytearray(8)
    sep.memcpy_d2s(out, mem)
    assert bytes(out) == bytes([POISON]) * 4 + b"host"


def test_flush_with_nothing_written_is_a_no_op(sep: Device) -> None:
    mem = sep.malloc(4)
    sep.memcpy_s2d(mem, b"abcd")
    sep.mmap(mem)
    sep.flush(mem)  # a clean (poisoned) mapping writes nothing back
    out = bytearray(4)
    sep.memcpy_d2s(out, mem)
    assert bytes(out) == b"abcd"


def test_device_limit_and_the_memlog_dump(sep: Device) -> None:
    keep = sep.malloc(1 << 19)
    with pytest.raises(OutOfResourcesError, match=r"sep:0 has 524288 of its 1048576") as info:
        sep.malloc(1 << 20)
    assert info.value.details["memlog"]
    sep.free(keep)


def test_tensors_on_separate_memory_go_through_the_driver(sep: Device) -> None:
    t = Tensor((4,), "float32", device="sep:0")
    assert (t.device, t.is_host) == ("sep:0", False)
    t.write(np.array([1, 2, 3, 4], np.float32))
    copy = t.numpy()
    assert copy.tolist() == [1, 2, 3, 4]
    copy[0] = 9
    assert t.numpy()[0] == 1  # numpy() of device memory is a copy, not a view
    s = t.slice(4, 8, dtype="float32", shape=(2,))
    assert s.numpy().tolist() == [2, 3]
    host = Tensor((4,), "float32")
    t.copy_to(host)
    assert host.numpy().tolist() == [1, 2, 3, 4]
    with pytest.raises(UnsupportedError, match="host cannot address"):
        np.from_dlpack(t)


def test_a_separate_memory_tensor_as_a_cpu_model_input_is_staged_and_counted(
    rt: crossrt.Runtime, sep: Device
) -> None:
    from crossrt.model import GraphBuilder

    b = GraphBuilder("double")
    x = b.input("x", "float32", [4])
    b.output(b.op("Add", [x, x], outputs=["y"]))
    model = rt.load(b.finish(), "cpu")
    t = Tensor((4,), "float32", device="sep:0")
    t.write(np.array([1, 2, 3, 4], np.float32))
    before = copied_bytes()
    out = model.run(TensorSet({"x": t}), outputs=TensorSet({"y": Tensor((4,), "float32")}))
    assert copied_bytes() - before == 16
    assert out["y"].numpy().tolist() == [2, 4, 6, 8]


def test_device_memory_repr_and_size(sep: Device) -> None:
    mem = sep.malloc(8, name="r")
    assert isinstance(mem, DeviceMemory) and "8 bytes on sep:0" in repr(mem)
    sep.free(mem)
    assert "freed" in repr(mem)
