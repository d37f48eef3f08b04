"""The onnxruntime driver's GPU path without a GPU: ``gpu_memory`` and ``gpu_program`` run
over :class:`HostStandIn` (host memory behind the CUDA runtime's five calls) and a real ORT
session bound by address, as on ``cuda:N``. What only a GPU can show (the CUDA runtime's
copies, ORT's CUDA allocator) is in ``tests/gpu/``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import crossrt
from crossrt import InvalidArgumentError, InvalidInputError
from crossrt.drivers import get_driver
from crossrt.drivers.base import DeviceArray, DeviceInfo, DeviceKind, Residence
from crossrt.drivers.onnxruntime import gpu_memory
from crossrt.drivers.onnxruntime.gpu_memory import GpuMemory, HostStandIn
from crossrt.drivers.onnxruntime.gpu_program import GpuProgram
from crossrt.errors import InvalidHandleError


def _device(index: int = 0) -> DeviceInfo:
    return DeviceInfo(
        id=f"cuda:{index}", name="stand-in", vendor="NVIDIA", kind=DeviceKind.GPU,
        driver="onnxruntime", cores=1, memory_bytes=0,
    )  # fmt: skip


@pytest.fixture
def memory() -> GpuMemory:
    return GpuMemory(_device(), HostStandIn())


def _session(dynamic: bool = False) -> ort.InferenceSession:
    """y = x @ W + 1 (fixed [2, 3] -> [2, 4], or [n, 3] -> [n, 4]) and z = NonZero(x) (its
    shape known only after the run)."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "one"], ["y"]),
            helper.make_node("NonZero", ["x"], ["z"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n" if dynamic else 2, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n" if dynamic else 2, 4]),
            helper.make_tensor_value_info("z", TensorProto.INT64, [2, None]),
        ],
        [onnx.numpy_helper.from_array(w, "w"), helper.make_tensor("one", 1, [], [1.0])],
    )
    # IR 10: onnxruntime-gpu (1.31) reads IR 13 at most, onnx writes 14 by default.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _on_device(memory: GpuMemory, array: np.ndarray) -> DeviceArray:
    buffer = memory.allocate(array.nbytes + 16)
    memory.copy_in(buffer, memoryview(array.tobytes()), offset=16)
    return DeviceArray(buffer, memory.device.id, array.dtype, array.shape, offset=16)


def _host(memory: GpuMemory, value: DeviceArray) -> np.ndarray:
    out = np.empty(value.shape, value.dtype)
    memory.copy_out(memoryview(out).cast("B"), value.buffer, value.offset)
    return out


def test_buffers_are_zeroed_and_copies_land_at_their_offsets(memory: GpuMemory) -> None:
    a = memory.allocate(64)
    back = bytearray(64)
    memory.copy_out(memoryview(back), a)
    assert back == bytes(64)
    memory.copy_in(a, memoryview(b"abcd"), offset=10)
    b = memory.allocate(8)
    memory.copy_device(b, a, 4, dst_offset=2, src_offset=10)
    out = bytearray(8)
    memory.copy_out(memoryview(out), b)
    assert bytes(out) == b"\0\0abcd\0\0"


class CountingStandIn(HostStandIn):
    """Host memory that counts mallocs and frees, and runs out past ``room`` live blocks."""

    def __init__(self, room: int = 1 << 30) -> None:
        super().__init__()
        self.mallocs = self.frees = 0
        self.room = room

    def malloc(self, index: int, nbytes: int) -> int:
        if len(self._blocks) >= self.room:
            raise crossrt.OutOfResourcesError("the GPU is out of memory (a stand-in)")
        self.mallocs += 1
        return super().malloc(index, nbytes)

    def free(self, pointer: int) -> None:
        self.frees += 1
        super().free(pointer)


def test_freed_blocks_are_kept_and_given_again_zeroed() -> None:
    # On an H200 a cudaMalloc and a cudaFree (which waits for the whole GPU) per tensor per
    # run made crossrt's ResNet-50 1.3-1.4x raw ORT's time.
    api = CountingStandIn()
    memory = GpuMemory(_device(), api, cache_bytes=1000)
    first = memory.allocate(400)
    memory.copy_in(first, memoryview(b"\xff" * 400))
    pointer = first.pointer
    memory.free(first)
    assert api.frees == 0 and memory.kept_bytes == 400
    again = memory.allocate(400)
    assert again.pointer == pointer and api.mallocs == 1 and memory.kept_bytes == 0
    out = bytearray(400)
    memory.copy_out(memoryview(out), again)
    assert out == bytes(400)  # zeroed again
    other = memory.allocate(300)  # another size: a block of its own
    assert api.mallocs == 2
    big = memory.allocate(800)
    for buffer in (again, other, big):
        memory.free(buffer)
    assert memory.kept_bytes == 700 and api.frees == 1  # 800 more would pass the bound
    assert memory.release_kept() == 700 and api.frees == 3 and memory.kept_bytes == 0


def test_out_of_memory_frees_the_kept_blocks_and_tries_again() -> None:
    api = CountingStandIn(room=2)
    memory = GpuMemory(_device(), api)
    a, b = memory.allocate(64), memory.allocate(64)
    memory.free(a)
    memory.free(b)
    c = memory.allocate(128)  # two kept blocks fill the room: freed, then it fits
    assert c.size == 128 and memory.kept_bytes == 0 and api.frees == 2
    d = memory.allocate(128)
    with pytest.raises(crossrt.OutOfResourcesError):
        memory.allocate(128)
    memory.free(c)
    memory.free(d)


def test_bad_handles_and_ranges_are_refused(memory: GpuMemory) -> None:
    a = memory.allocate(8)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        memory.copy_in(a, memoryview(b"x" * 9))
    other = GpuMemory(_device(1), HostStandIn()).allocate(8)
    with pytest.raises(crossrt.errors.OperationForbiddenError, match="cuda:1"):
        memory.copy_in(other, memoryview(b"x"))
    memory.free(a)
    with pytest.raises(InvalidHandleError, match="freed"):
        memory.free(a)
    with pytest.raises(InvalidHandleError, match="freed"):
        memory.copy_out(memoryview(bytearray(1)), a)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_run_reads_and_writes_device_memory_by_address(memory: GpuMemory, dynamic: bool) -> None:
    session = _session(dynamic)
    program = GpuProgram(session, memory)
    assert program.residence() == {n: Residence.DEVICE for n in ("x", "y", "z")}
    x = np.array([[1, 0, 2], [0, 3, 0]], np.float32)
    want_y, want_z = session.run(None, {"x": x})
    got = program.run({"x": _on_device(memory, x)})
    assert all(isinstance(v, DeviceArray) and v.device == "cuda:0" for v in got.values())
    np.testing.assert_allclose(_host(memory, got["y"]), want_y)
    np.testing.assert_array_equal(_host(memory, got["z"]), want_z)  # ORT's own block, adopted
    assert got["z"].buffer.owner is not None
    for value in got.values():
        memory.free(value.buffer)


def test_outputs_go_into_the_buffers_given(memory: GpuMemory) -> None:
    program = GpuProgram(_session(), memory)
    x = np.ones((2, 3), np.float32)
    y = DeviceArray(memory.allocate(32), "cuda:0", np.dtype(np.float32), (2, 4))
    got = program.run({"x": _on_device(memory, x)}, {"y": y})
    assert got["y"] is y
    np.testing.assert_allclose(_host(memory, y), x @ (np.arange(12).reshape(3, 4) / 10) + 1)


def test_wrong_buffers_are_refused(memory: GpuMemory) -> None:
    program = GpuProgram(_session(), memory)
    x = _on_device(memory, np.ones((2, 3), np.float32))
    wrong = DeviceArray(memory.allocate(32), "cuda:0", np.dtype(np.int32), (2, 4))
    with pytest.raises(InvalidInputError, match="float32"):
        program.run({"x": x}, {"y": wrong})
    short = DeviceArray(memory.allocate(8), "cuda:0", np.dtype(np.float32), (2, 3))
    with pytest.raises(Exception, match="input 'x'"):
        program.run({"x": short})
    with pytest.raises(InvalidInputError, match="DeviceArray"):
        program.run({"x": x}, {"y": np.zeros((2, 4), np.float32)})


def test_the_driver_serves_a_cuda_devices_memory_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    device = _device()
    stand_in = GpuMemory(device, HostStandIn())
    monkeypatch.setitem(gpu_memory._MEMORIES, device.id, stand_in)
    driver = get_driver("onnxruntime")
    buffer = driver.allocate(device, 16)
    assert isinstance(buffer, gpu_memory.GpuBuffer) and buffer.device == "cuda:0"
    driver.copy_in(device, buffer, memoryview(b"0123456789abcdef"))
    out = bytearray(4)
    driver.copy_out(device, memoryview(out), buffer, 12)
    assert bytes(out) == b"cdef"
    driver.free(device, buffer)
    host = driver.allocate(driver.devices()[0], 4)  # the CPU's memory stays host memory
    assert isinstance(host, np.ndarray)
