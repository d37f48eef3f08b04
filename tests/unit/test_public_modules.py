"""The runtime's public modules for layers built over it (crossrt.memory, crossrt.profiling,
crossrt.executables; docs/runtime-api.md): each name is documented, and
``Tensor.from_allocation`` views device memory its owner keeps."""

from __future__ import annotations

import gc
import importlib
import re
import weakref
from pathlib import Path

import numpy as np
import pytest

from crossrt.errors import InvalidArgumentError, OperationForbiddenError
from crossrt.memory import Format, Placement, Tensor, allocator_for

# Allocation failures dump their log into the test's own directory, not the real one.
pytestmark = pytest.mark.usefixtures("runtime_dir")

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime-api.md"
FACES = ("crossrt.memory", "crossrt.profiling", "crossrt.executables")


@pytest.mark.parametrize("name", FACES)
def test_every_public_name_exists_and_is_documented(name: str) -> None:
    module = importlib.import_module(name)
    page = DOC.read_text(encoding="utf-8")
    section = page.split(f"## `{name}`", 1)
    assert len(section) == 2, f"docs/runtime-api.md has no '## `{name}`' section"
    body = section[1].split("\n## ", 1)[0]
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"
    undocumented = [n for n in module.__all__ if not re.search(rf"`{re.escape(n)}\b", body)]
    assert not undocumented, f"{name}: not in its docs/runtime-api.md section: {undocumented}"
    assert module.__doc__ and name in module.__doc__


class _Handle:
    """The owner's handle of the memory (bmlib's DeviceMemory)."""


def test_a_tensor_over_an_allocation_leaves_it_to_its_owner() -> None:
    block = allocator_for("cpu").allocate(16, name="block")
    keep = _Handle()
    kept = weakref.ref(keep)
    try:
        t = Tensor.from_allocation(block, "int32", (2,), offset=8, name="t", keepalive=keep)
        del keep
        gc.collect()
        assert kept() is not None, "the tensor must keep its keepalive referenced"
        assert (t.placement, t.device, t.shape, t.offset, t.size, t.name) == (
            Placement.DEVICE,
            block.allocator.device.id,
            (2,),
            8,
            8,
            "t",
        )
        assert t.format is Format.ND
        t.write(np.array([5, 6], np.int32))
        out = np.zeros(16, np.uint8)
        block.copy_out(out)
        assert out.view(np.int32).tolist() == [0, 0, 5, 6]
        t.free()
        gc.collect()
        assert not block.freed
    finally:
        block.free()


@pytest.mark.parametrize(
    ("shape", "offset", "match"),
    [
        ((3,), 8, r"12 bytes .* at offset 8 .* 16-byte allocation"),
        ((1,), -1, "offset=-1 must be a whole number"),
        ((1,), 16, r"4 bytes .* at offset 16"),
    ],
    ids=["too-long", "negative-offset", "past-the-end"],
)
def test_a_tensor_beyond_its_allocation_is_refused(
    shape: tuple[int, ...], offset: int, match: str
) -> None:
    block = allocator_for("cpu").allocate(16)
    try:
        with pytest.raises(InvalidArgumentError, match=match):
            Tensor.from_allocation(block, "int32", shape, offset=offset)
    finally:
        block.free()


def test_a_tensor_over_a_freed_allocation_is_refused() -> None:
    block = allocator_for("cpu").allocate(16, name="gone")
    block.free()
    with pytest.raises(OperationForbiddenError, match="'gone' was freed"):
        Tensor.from_allocation(block, "uint8", (4,))
