"""DLPack and the CUDA array interface for tensors in a GPU's memory, without a GPU.

``cuda:0`` is served here by the onnxruntime driver over :class:`HostStandIn` (host memory
behind the CUDA runtime's calls), so every address below can be read back on the host: the
capsule's structure, the interface's address and the adopted memory are checked byte for
byte. ``tests/gpu/`` does the same with torch on a real GPU."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator

import numpy as np
import pytest

import crossrt
from crossrt.drivers import get_driver
from crossrt.drivers.base import DeviceInfo, DeviceKind
from crossrt.drivers.onnxruntime import gpu_memory
from crossrt.runtime.memory import allocator, dlpack


@pytest.fixture
def stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    device = DeviceInfo(
        id="cuda:0", name="stand-in", vendor="NVIDIA", kind=DeviceKind.GPU,
        driver="onnxruntime", cores=1, memory_bytes=1 << 30,
    )  # fmt: skip
    memory = gpu_memory.GpuMemory(device, gpu_memory.HostStandIn())
    monkeypatch.setitem(gpu_memory._MEMORIES, device.id, memory)
    monkeypatch.setitem(
        allocator._resolved, device.id, allocator.Allocator(get_driver("onnxruntime"), device)
    )
    yield device.id


class _Managed(ctypes.Structure):
    _fields_ = [  # the head of DLManagedTensor: its DLTensor
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


def _read(address: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = (ctypes.c_char * size).from_address(address)
    return np.frombuffer(bytes(raw), dtype).reshape(shape)


def test_a_host_capsule_reads_back_in_numpy() -> None:
    """The DLManagedTensor layout, as NumPy (a real consumer) reads it."""

    class Producer:
        def __init__(self, array: np.ndarray) -> None:
            self.array = array

        def __dlpack__(self, **_: object) -> object:
            a = self.array
            return dlpack.capsule(a.ctypes.data, a.shape, a.dtype, (dlpack.KDL_CPU, 0), a)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (dlpack.KDL_CPU, 0)

    before = dlpack.live()
    for array in (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([True, False])):
        got = np.from_dlpack(Producer(array))
        np.testing.assert_array_equal(got, array)
        assert dlpack.live() == before + 1  # held by NumPy
        del got
        gc.collect()
        assert dlpack.live() == before  # NumPy called the deleter
    Producer(np.zeros(2)).__dlpack__()  # dropped unconsumed: deleted too
    gc.collect()
    assert dlpack.live() == before


def test_a_gpu_tensor_exports_its_address(stand_in_gpu: str) -> None:
    t = crossrt.Tensor([2, 3], "float32", device=stand_in_gpu)
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    t.write(values)
    assert not t.is_host and t.__dlpack_device__() == (dlpack.KDL_CUDA, 0)
    interface = t.__cuda_array_interface__
    assert interface["shape"] == (2, 3) and interface["typestr"] == "<f4"
    assert interface["version"] == 3 and interface["strides"] is None
    np.testing.assert_array_equal(_read(interface["data"][0], (2, 3), "<f4"), values)
    capsule = t.__dlpack__()
    pointer_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )
    head = _Managed.from_address(pointer_of(capsule, b"dltensor"))
    assert (head.device_type, head.device_id, head.ndim) == (dlpack.KDL_CUDA, 0, 2)
    assert (head.code, head.bits, head.lanes) == (2, 32, 1)  # kDLFloat, 32 bits
    assert [head.shape[0], head.shape[1]] == [2, 3] and head.data == interface["data"][0]
    np.testing.assert_array_equal(_read(head.data, (2, 3), "<f4"), values)
    del capsule
    gc.collect()


def test_a_host_tensor_has_no_cuda_interface() -> None:
    t = crossrt.Tensor([2], "float32")
    assert t.__dlpack_device__() == (dlpack.KDL_CPU, 0)
    assert not hasattr(t, "__cuda_array_interface__")


class _GpuArray:
    """What torch and cupy show of a GPU array: DLPack's device and the CUDA interface."""

    def __init__(self, array: np.ndarray, strides: tuple[int, ...] | None = None) -> None:
        self.array = array  # stand-in GPU memory is host memory
        self.strides = strides

    def __dlpack__(self, **_: object) -> object:
        raise AssertionError("crossrt reads the CUDA array interface, not the capsule")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.KDL_CUDA, 0)

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        a = self.array
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                "strides": self.strides, "version": 3}  # fmt: skip


def test_a_gpu_array_comes_in_without_a_copy(stand_in_gpu: str) -> None:
    source = _GpuArray(np.arange(8, dtype=np.int32).reshape(2, 4))
    t = crossrt.from_dlpack(source, name="x")
    assert t.device == stand_in_gpu and not t.is_host and t.shape == (2, 4)
    assert t.__cuda_array_interface__["data"][0] == source.array.ctypes.data  # the same memory
    source.array[0, 0] = 42
    assert t.numpy()[0, 0] == 42
    t.free()  # lets go of the source array; its memory stays its owner's


def test_a_strided_gpu_array_is_refused(stand_in_gpu: str) -> None:
    source = _GpuArray(np.zeros((2, 4), np.float32), strides=(4, 8))
    with pytest.raises(crossrt.UnsupportedError, match="contiguous"):
        crossrt.from_dlpack(source)
