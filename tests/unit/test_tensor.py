"""Tensors: descriptors, allocation, attach/detach, read/write bounds, slices, copies, DLPack,
the array interface, batched I/O and TensorSet."""

from __future__ import annotations

import array
import gc

import numpy as np
import pytest

import crossrt
from crossrt import (
    CrossrtError,
    InvalidArgumentError,
    StatusCode,
    Tensor,
    TensorSet,
    UnsupportedError,
    dtypes,
)
from crossrt.errors import InvalidHandleError, OperationForbiddenError
from crossrt.memory import Format, Placement, TensorDesc
from crossrt.model import TensorSpec
from crossrt.runtime.memory.allocator import allocator_for, host_allocator
from crossrt.runtime.memory.tensorset import TensorNotFoundError, read_batch, write_batch

FLOAT32 = dtypes.from_name("float32")


def _pattern(n: int) -> np.ndarray:
    return (np.arange(n) % 251).astype(np.uint8)


# -- descriptors ---------------------------------------------------------------------------


def test_desc_sizes_and_normalised_fields() -> None:
    desc = TensorDesc("x", np.float16, [2, 3, 4], Format.NCHW)
    assert desc.dtype is dtypes.from_name("float16")
    assert desc.shape == (2, 3, 4)
    assert (desc.element_count, desc.byte_size) == (24, 48)
    assert desc.format is Format.NCHW and not desc.is_dynamic


def test_desc_with_dynamic_dims_has_no_size() -> None:
    desc = TensorDesc("x", "float32", [None, 3])
    assert desc.shape == (-1, 3) and desc.is_dynamic
    with pytest.raises(InvalidArgumentError, match="dynamic"):
        _ = desc.byte_size


def test_desc_from_model_spec() -> None:
    desc = TensorDesc.from_spec(TensorSpec("img", FLOAT32, (None, 3, "H", 8)))
    assert desc == TensorDesc("img", "float32", [-1, 3, -1, 8])


@pytest.mark.parametrize("shape", [[2, -3], [1.5], [True], ["a"]])
def test_desc_refuses_bad_dims(shape: list[object]) -> None:
    with pytest.raises(InvalidArgumentError, match="not a size"):
        TensorDesc("x", "float32", shape)  # type: ignore[arg-type]


# -- allocation ----------------------------------------------------------------------------


def test_allocated_tensor_describes_itself_and_numpy_is_a_view() -> None:
    t = Tensor((2, 3), "float32", name="x", format=Format.NHWC)
    assert (t.name, t.dtype, t.shape, t.format) == ("x", FLOAT32, (2, 3), Format.NHWC)
    assert (t.element_count, t.byte_size, t.size) == (6, 24, 24)
    assert t.placement is Placement.DEVICE and t.device == "cpu:0" and t.is_host
    t.numpy()[1, 2] = 7.5
    out = np.zeros(1, np.float32)
    t.read(out, offset=20)
    assert out[0] == 7.5


@pytest.mark.parametrize("placement", [Placement.HOST, Placement.VIRTUAL])
def test_host_placements_use_the_host_allocator(placement: Placement) -> None:
    gc.collect()
    before = host_allocator().stats().bytes_in_use
    t = Tensor((4,), "int32", placement=placement)
    assert t.device == "host" and t.placement is placement
    assert host_allocator().stats().bytes_in_use == before + 16
    t.free()
    assert host_allocator().stats().bytes_in_use == before


def test_raw_allocation_then_shape() -> None:
    t = Tensor.allocate(64, name="raw")
    assert (t.dtype.name, t.shape, t.size) == ("uint8", (64,), 64)
    t.set_shape((4, 4), "float32")
    assert t.numpy().shape == (4, 4) and t.byte_size == 64
    with pytest.raises(InvalidArgumentError, match="needs 68 bytes but the tensor holds 64"):
        t.set_shape((17,), "float32")


def test_explicit_size_must_cover_the_elements() -> None:
    t = Tensor((2,), "float32", size=100)
    assert (t.byte_size, t.size) == (8, 100)
    with pytest.raises(InvalidArgumentError, match="size=4 is less than the 8 bytes"):
        Tensor((2,), "float32", size=4)


def test_from_desc_static_and_dynamic() -> None:
    t = Tensor.from_desc(TensorDesc("a", "int64", [3]))
    assert (t.name, t.shape, t.size) == ("a", (3,), 24)
    with pytest.raises(InvalidArgumentError, match="give size="):
        Tensor.from_desc(TensorDesc("d", "float32", [-1, 4]))
    d = Tensor.from_desc(TensorDesc("d", "float32", [-1, 4]), size=160)
    assert (d.shape, d.size) == ((0, 4), 160)


def test_string_tensors_are_refused() -> None:
    with pytest.raises(UnsupportedError, match="no fixed size"):
        Tensor((2,), "string")


# -- attach, detach, free ------------------------------------------------------------------


def test_attach_numpy_without_copy_both_ways() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor.from_buffer(arr, name="a")
    assert (t.dtype, t.shape, t.placement) == (FLOAT32, (2, 3), Placement.HOST)
    assert t.address == arr.ctypes.data
    t.write(np.array([9], np.float32), offset=4)
    assert arr[0, 1] == 9
    arr[1, 2] = -1
    assert t.numpy()[1, 2] == -1


def test_empty_then_attach_then_detach_then_attach_again() -> None:
    t = Tensor.allocate_empty("e")
    assert t.size == 0
    with pytest.raises(InvalidHandleError, match="has no memory"):
        t.read(bytearray(1))
    buf = bytearray(b"abcdef")
    t.attach_buffer(buf)
    assert (t.dtype.name, t.shape) == ("uint8", (6,))
    t.write(b"XY", offset=2)
    assert buf == bytearray(b"abXYef")
    t.detach()
    assert t.size == 0
    with pytest.raises(InvalidHandleError):
        t.numpy()
    t.attach_buffer(np.zeros(3, np.int16))
    assert (t.dtype.name, t.shape) == ("int16", (3,))


def test_attach_keeps_a_descriptor_and_needs_room_for_it() -> None:
    t = Tensor.allocate_empty(desc=TensorDesc("d", "float32", [2, 2]))
    t.attach_buffer(bytearray(32))
    assert (t.name, t.dtype, t.shape, t.size) == ("d", FLOAT32, (2, 2), 32)
    with pytest.raises(InvalidArgumentError, match="needs 16 bytes but the buffer holds 8"):
        t.attach_buffer(bytearray(8))


def test_attach_replaces_and_frees_owned_memory() -> None:
    allocator = allocator_for("cpu:0")
    gc.collect()  # tensors other tests left to the collector
    before = allocator.stats().bytes_in_use
    t = Tensor((256,), "uint8")
    assert allocator.stats().bytes_in_use == before + 256
    t.attach_buffer(bytearray(256))
    assert allocator.stats().bytes_in_use == before


def test_typed_memoryview_and_raw_buffers() -> None:
    floats = array.array("f", [1.0, 2.0, 3.0])
    t = Tensor.from_buffer(memoryview(floats))
    assert (t.dtype, t.shape) == (FLOAT32, (3,))
    t.numpy()[0] = 5
    assert floats[0] == 5
    raw = Tensor.from_buffer(bytearray(12), dtype="int32", shape=(3,))
    assert raw.numpy().tolist() == [0, 0, 0]


def test_read_only_buffer_refuses_writes_and_keeps_its_bytes() -> None:
    t = Tensor.from_buffer(b"abcd")
    with pytest.raises(OperationForbiddenError, match="read-only"):
        t.write(b"zz")
    with pytest.raises(OperationForbiddenError):
        t.memset(0)
    assert t.numpy().tobytes() == b"abcd"


@pytest.mark.parametrize(
    ("buffer", "message"),
    [
        (np.zeros((4, 4), np.float32)[:, ::2], "not C-contiguous"),
        (np.array([object()]), "Python objects"),
        (object(), "not a buffer"),
    ],
)
def test_unusable_buffers_are_refused(buffer: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Tensor.from_buffer(buffer)


def test_freed_tensor_refuses_everything_and_free_twice_is_fine() -> None:
    t = Tensor((2,), "float32", name="gone")
    t.free()
    t.free()
    assert t.freed and "freed" in repr(t)
    for call in (lambda: t.numpy(), lambda: t.read(bytearray(4)), lambda: t.slice(0, 4)):
        with pytest.raises(InvalidHandleError, match="'gone' was freed"):
            call()


# -- read, write, bounds ---------------------------------------------------------------------


def test_read_write_with_offsets_and_sizes() -> None:
    t = Tensor.allocate(16)
    t.write(_pattern(16))
    part = bytearray(4)
    t.read(part, offset=8)
    assert bytes(part) == bytes(_pattern(16)[8:12])
    t.write(b"\xff\xff\xff", offset=1, size=2)
    assert t.numpy()[:4].tolist() == [0, 255, 255, 3]


@pytest.mark.parametrize(
    ("offset", "size"), [(15, 2), (16, 1), (0, 17), (-1, 1), (0, -2), (True, 1), (1.0, 1)]
)
def test_out_of_range_write_is_invalid_and_writes_nothing(offset: object, size: object) -> None:
    t = Tensor.allocate(16)
    t.write(_pattern(16))
    with pytest.raises(InvalidArgumentError) as info:
        t.write(np.full(20, 7, np.uint8), offset=offset, size=size)  # type: ignore[arg-type]
    assert info.value.code is StatusCode.INVALID
    assert np.array_equal(t.numpy(), _pattern(16))


def test_out_of_range_read_names_the_tensor_and_the_limit() -> None:
    t = Tensor.allocate(8, name="small")
    with pytest.raises(InvalidArgumentError, match=r"'small': read of 4 bytes at offset 6"):
        t.read(bytearray(4), offset=6)


def test_size_larger_than_the_buffer_and_read_into_read_only_are_invalid() -> None:
    t = Tensor.allocate(8)
    with pytest.raises(InvalidArgumentError, match="the buffer holds 2 bytes"):
        t.write(b"ab", size=4)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        t.read(b"abcd")


# -- slices --------------------------------------------------------------------------------


def test_slice_shares_memory_with_its_source() -> None:
    t = Tensor.allocate(16)
    t.write(_pattern(16))
    s = t.slice(4, 8, name="mid")
    assert (s.name, s.size, s.offset) == ("mid", 8, 4)
    assert s.numpy().tolist() == _pattern(16)[4:12].tolist()
    s.memset(0)
    assert t.numpy()[4:12].tolist() == [0] * 8 and t.numpy()[12] == 12
    typed = t.slice(0, 8, dtype="int32", shape=(2,))
    assert typed.shape == (2,) and typed.dtype.name == "int32"


def test_slice_outlives_its_source_and_memory_goes_with_the_last_user() -> None:
    allocator = allocator_for("cpu:0")
    gc.collect()  # tensors other tests left to the collector
    before = allocator.stats().bytes_in_use
    t = Tensor.allocate(1024)
    t.write(_pattern(1024))
    s = t.slice(100, 10).slice(2, 4)
    del t
    gc.collect()
    assert allocator.stats().bytes_in_use == before + 1024  # still held by the slice
    assert s.numpy().tolist() == _pattern(1024)[102:106].tolist()
    s.write(b"\x01\x02\x03\x04")
    assert s.numpy().tolist() == [1, 2, 3, 4]
    s.free()
    assert allocator.stats().bytes_in_use == before


def test_explicitly_freed_source_keeps_slices_valid() -> None:
    t = Tensor.allocate(32)
    t.write(_pattern(32))
    s = t.slice(16, 16)
    t.free()
    assert s.numpy().tolist() == _pattern(32)[16:].tolist()


def test_slice_out_of_range_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError, match="out of range"):
        Tensor.allocate(8).slice(4, 5)


# -- copy and memset -------------------------------------------------------------------------


def test_copy_to_with_offsets() -> None:
    a, b = Tensor.allocate(8), Tensor.allocate(8)
    a.write(_pattern(8))
    b.memset(0)
    a.copy_to(b, src_offset=2, dst_offset=4, size=3)
    assert b.numpy().tolist() == [0, 0, 0, 0, 2, 3, 4, 0]
    with pytest.raises(InvalidArgumentError, match="destination"):
        a.copy_to(b, dst_offset=6, size=3)
    assert b.numpy().tolist() == [0, 0, 0, 0, 2, 3, 4, 0]


def test_copy_between_overlapping_slices_behaves_like_memmove() -> None:
    t = Tensor.allocate(10)
    t.write(_pattern(10))
    t.slice(0, 8).copy_to(t.slice(2, 8))
    assert t.numpy().tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]


def test_memset_ranges_and_values() -> None:
    t = Tensor.allocate(6)
    t.memset(1)
    t.memset(9, offset=2, size=2)
    assert t.numpy().tolist() == [1, 1, 9, 9, 1, 1]
    with pytest.raises(InvalidArgumentError, match="not a byte"):
        t.memset(256)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        t.memset(0, offset=5, size=2)
    assert t.numpy().tolist() == [1, 1, 9, 9, 1, 1]


# -- DLPack and the array interface --------------------------------------------------------


def test_dlpack_out_to_numpy_is_a_view() -> None:
    t = Tensor((3,), "float32")
    t.numpy()[:] = [1, 2, 3]
    assert t.__dlpack_device__() == (1, 0)
    arr = np.from_dlpack(t)
    assert arr.ctypes.data == t.address
    arr[0] = 10
    assert t.numpy()[0] == 10


def test_dlpack_in_from_numpy_is_a_view_and_round_trips() -> None:
    arr = np.arange(4, dtype=np.int64)
    t = crossrt.from_dlpack(arr, name="d")
    assert (t.name, t.dtype.name, t.shape, t.address) == ("d", "int64", (4,), arr.ctypes.data)
    back = np.from_dlpack(t)
    assert back.ctypes.data == arr.ctypes.data
    back[3] = 99
    assert arr[3] == 99


def test_read_only_tensor_exports_read_only() -> None:
    back = np.from_dlpack(Tensor.from_buffer(b"\x01\x02"))
    assert back.tolist() == [1, 2] and not back.flags.writeable


def test_from_dlpack_refuses_objects_without_it() -> None:
    with pytest.raises(InvalidArgumentError, match="does not implement __dlpack__"):
        crossrt.from_dlpack(bytearray(2))


def test_torch_round_trip_without_copies() -> None:
    torch = pytest.importorskip("torch")
    src = torch.arange(6, dtype=torch.float32)
    t = crossrt.from_dlpack(src)
    assert t.address == src.data_ptr() and t.dtype == FLOAT32
    back = torch.from_dlpack(t)
    assert back.data_ptr() == src.data_ptr()
    back[0] = 42
    assert src[0].item() == 42


def test_array_interface_gives_a_view_that_survives_free() -> None:
    t = Tensor((2, 2), "float32", placement=Placement.HOST)
    t.numpy()[:] = [[1, 2], [3, 4]]
    arr = np.asarray(t)
    assert arr.ctypes.data == t.address and arr.shape == (2, 2)
    t.free()
    del t
    gc.collect()
    assert arr.tolist() == [[1, 2], [3, 4]]  # the view keeps the bytes


# -- batches -------------------------------------------------------------------------------


def test_read_and_write_batch() -> None:
    a, b = Tensor.allocate(4), Tensor.allocate(4)
    write_batch([(a, 0, None, b"\x01\x02\x03\x04"), (b, 2, 2, b"\x09\x08\x07")])
    out_a, out_b = bytearray(2), bytearray(4)
    read_batch([(a, 1, 2, out_a), (b, 0, None, out_b)])
    assert bytes(out_a) == b"\x02\x03" and bytes(out_b)[2:] == b"\x09\x08"


def test_a_bad_op_in_a_write_batch_writes_nothing() -> None:
    a, b = Tensor.allocate(4), Tensor.allocate(4)
    a.memset(0)
    b.memset(0)
    with pytest.raises(InvalidArgumentError, match="write op 1"):
        write_batch([(a, 0, None, b"\x05\x05"), (b, 3, None, b"\x05\x05")])
    assert a.numpy().tolist() == [0, 0, 0, 0] and b.numpy().tolist() == [0, 0, 0, 0]


# -- TensorSet -----------------------------------------------------------------------------


def test_tensor_set_add_replace_get_remove_iterate() -> None:
    x, y = Tensor((1,), "float32"), Tensor((2,), "float32")
    ts = TensorSet({"x": x})
    ts.add("y", y)
    assert len(ts) == 2 and list(ts) == ["x", "y"] and ts["x"] is x
    replacement = ts.add("x", y)
    assert replacement is y and ts["x"] is y and len(ts) == 2
    assert ts.remove("x") is y and "x" not in ts and ts.get("x") is None
    with pytest.raises(TensorNotFoundError) as info:
        ts["nope"]
    assert isinstance(info.value, KeyError) and isinstance(info.value, CrossrtError)
    assert info.value.code is StatusCode.NOT_FOUND and "holds y" in str(info.value)


def test_tensor_set_attaches_arrays_without_copy() -> None:
    arr = np.zeros(3, np.float32)
    ts = TensorSet()
    ts["a"] = arr
    ts["a"].numpy()[1] = 4
    assert arr[1] == 4 and ts["a"].name == "a"
    with pytest.raises(InvalidArgumentError, match="non-empty name"):
        ts.add("", arr)
