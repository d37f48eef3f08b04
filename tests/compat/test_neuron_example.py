"""Seed 002's first application, ``run_neff.c``, ported line by line to crossrt.compat.neuron:
load a model file, allocate input and output tensor sets from the tensor info, fill inputs
from files (zero-filled when none is given), execute, write each output to ``<name>.out``.
Its outputs must be crossrt's own API's, bit for bit."""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt.compat.neuron import (
    NRT_FAILURE,
    NRT_FRAMEWORK_TYPE_NO_FW,
    NRT_SUCCESS,
    NRT_TENSOR_PLACEMENT_DEVICE,
    NRT_TENSOR_USAGE_INPUT,
    NRT_TENSOR_USAGE_OUTPUT,
    nrt_add_tensor_to_tensor_set,
    nrt_allocate_tensor_set,
    nrt_close,
    nrt_destroy_tensor_set,
    nrt_execute,
    nrt_free_model_tensor_info,
    nrt_get_model_tensor_info,
    nrt_get_tensor_from_tensor_set,
    nrt_init,
    nrt_load,
    nrt_tensor_allocate,
    nrt_tensor_free,
    nrt_tensor_read,
    nrt_tensor_write,
    nrt_unload,
)
from crossrt.model import GraphBuilder

pytestmark = pytest.mark.usefixtures("runtime_dir")


def mmap_file(filepath: str) -> tuple[Any, int]:
    """The seed's mmap_file: the file's bytes mapped read-only, and its size."""
    try:
        with open(filepath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ), size
    except OSError as exc:
        print(f"Unable to open {filepath}: {exc.strerror}", file=sys.stderr)
        return None, 0


@dataclass
class input_tensor_info_t:  # the seed's struct
    name: str
    size: int
    data: Any


def allocate_tensors(info_array: Any, usage_type: int) -> tuple[int, Any]:
    result, out_tset = nrt_allocate_tensor_set()
    if result != NRT_SUCCESS:
        print("Couldn't allocate tensorset", file=sys.stderr)
    for tensor_idx in range(info_array.tensor_count):
        tensor_info = info_array.tensor_array[tensor_idx]
        if tensor_info.usage != usage_type:
            continue
        result, tensor = nrt_tensor_allocate(
            NRT_TENSOR_PLACEMENT_DEVICE, 0, tensor_info.size, tensor_info.name
        )
        if result != NRT_SUCCESS:
            print(f"Couldn't allocate tensor {tensor_info.name}", file=sys.stderr)
            return result, out_tset
        result = nrt_add_tensor_to_tensor_set(out_tset, tensor_info.name, tensor)
        if result != NRT_SUCCESS:
            print(f"Couldn't add tensor {tensor_info.name} to tensorset", file=sys.stderr)
            return result, out_tset
    return NRT_SUCCESS, out_tset


def iterate_tensors(tset: Any, info_array: Any, usage_type: int, handler: Any, args: Any) -> int:
    final_result = NRT_SUCCESS
    for tensor_idx in range(info_array.tensor_count):
        tensor_info = info_array.tensor_array[tensor_idx]
        if tensor_info.usage != usage_type:
            continue
        result, tensor = nrt_get_tensor_from_tensor_set(tset, tensor_info.name)
        if result != NRT_SUCCESS:
            print(f"Tensor {tensor_info.name} not found in tensor set", file=sys.stderr)
            continue
        keep_going, result = handler(tensor, tensor_info, args)
        if not keep_going:
            return result
        if final_result == NRT_SUCCESS and result != final_result:
            final_result = result
    return final_result


def handler_load_inputs(tensor: Any, tensor_info: Any, args: Any) -> tuple[bool, int]:
    input_found = False
    for entry in args:
        if entry.name != tensor_info.name:
            continue
        if entry.size != tensor_info.size:
            print(f"Input file for tensor {tensor_info.name} has incorrect size", file=sys.stderr)
            break
        res = nrt_tensor_write(tensor, entry.data, 0, tensor_info.size)
        if res != NRT_SUCCESS:
            print(f"Unable to write content to input tensor {tensor_info.name}", file=sys.stderr)
        else:
            input_found = True
    if not input_found:
        print(f"Input tensor {tensor_info.name} will be zero-filled", file=sys.stderr)
    return True, NRT_SUCCESS


def handler_save_outputs(tensor: Any, tensor_info: Any, args: Any) -> tuple[bool, int]:
    tensor_data = bytearray(tensor_info.size)
    result = nrt_tensor_read(tensor, tensor_data, 0, tensor_info.size)
    if result != NRT_SUCCESS:
        print(f"Unable to read tensor {tensor_info.name}", file=sys.stderr)
        return True, result
    filename = f"{tensor_info.name}.out"
    try:
        with open(filename, "wb") as f:
            f.write(tensor_data)
    except OSError:
        print(f"Unable to open {filename} for writing", file=sys.stderr)
        return True, NRT_FAILURE
    return True, NRT_SUCCESS


def handler_free_tensor(tensor: Any, tensor_info: Any, args: Any) -> tuple[bool, int]:
    nrt_tensor_free(tensor)
    return True, NRT_SUCCESS


def main(argv: list[str]) -> int:
    """run_neff's main, as the seed writes it (``exit(-1)`` is ``return -1``)."""
    if len(argv) < 2:
        print("usage: exec_test file.neff [input_1_name] [input_1_file] ...", file=sys.stderr)
        return -1
    neff_data, neff_size = mmap_file(argv[1])
    if neff_data is None:
        print(f"Unable to map file {argv[1]}", file=sys.stderr)
        return -1
    input_tensor_info_array = []
    for idx in range(2, len(argv), 2):
        if idx + 1 >= len(argv):
            break
        input_data, size = mmap_file(argv[idx + 1])
        if input_data is None:
            continue
        input_tensor_info_array.append(input_tensor_info_t(argv[idx], size, input_data))

    result = nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "")
    if result != NRT_SUCCESS:
        print(f"NRTLIB could not be initialized, error: {int(result)}", file=sys.stderr)
        return -1
    print("Loading NEFF")
    result, model = nrt_load(neff_data, neff_size, -1, -1)
    if result != NRT_SUCCESS:
        print("Unable to load NEFF", file=sys.stderr)
        return -1
    print("Getting IO tensor information")
    result, tensor_info_array = nrt_get_model_tensor_info(model)
    if result != NRT_SUCCESS:
        print("Unable to get model tensor information", file=sys.stderr)
        return -1
    print(f"Creating I/O data ({tensor_info_array.tensor_count} tensors)")
    result, inputs = allocate_tensors(tensor_info_array, NRT_TENSOR_USAGE_INPUT)
    if result != NRT_SUCCESS:
        print("Error allocating input tensors", file=sys.stderr)
        return -1
    result, outputs = allocate_tensors(tensor_info_array, NRT_TENSOR_USAGE_OUTPUT)
    if result != NRT_SUCCESS:
        print("Error allocating output tensors", file=sys.stderr)
        return -1
    iterate_tensors(
        inputs, tensor_info_array, NRT_TENSOR_USAGE_INPUT, handler_load_inputs,
        input_tensor_info_array,
    )  # fmt: skip
    result = nrt_execute(model, inputs, outputs)
    if result != NRT_SUCCESS:
        print(f"Error during model execution: {int(result)}", file=sys.stderr)
        return -1
    result = iterate_tensors(
        outputs, tensor_info_array, NRT_TENSOR_USAGE_OUTPUT, handler_save_outputs, None
    )
    if result != NRT_SUCCESS:
        print("Error saving outputs to files", file=sys.stderr)
    result = nrt_unload(model)
    if result != NRT_SUCCESS:
        print("Unable to unload NEFF", file=sys.stderr)
    print("Freeing tensors")
    iterate_tensors(inputs, tensor_info_array, NRT_TENSOR_USAGE_INPUT, handler_free_tensor, None)
    iterate_tensors(outputs, tensor_info_array, NRT_TENSOR_USAGE_OUTPUT, handler_free_tensor, None)
    nrt_destroy_tensor_set(inputs)
    nrt_destroy_tensor_set(outputs)
    print("Deallocating model tensor info")
    nrt_free_model_tensor_info(tensor_info_array)
    print("Deallocating inputs tensor info")
    for entry in input_tensor_info_array:
        entry.data.close()
    neff_data.close()
    print("Cleaning up the runtime")
    nrt_close()
    print("DONE")
    return 0


# -- the test ----------------------------------------------------------------------------------


def _model() -> crossrt.Model:
    """Two inputs, two outputs: a convolution with a bias, and its ReLU."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("run_neff")
    image = b.input("image", "float32", [1, 3, 8, 8])
    bias = b.input("bias", "float32", [1, 4, 1, 1])
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    conv = b.op("Conv", [image, w], pads=[1, 1, 1, 1])
    net = b.op("Add", [conv, bias])
    b.output(b.op("Identity", [net]))
    b.output(b.op("Relu", [net]))
    return b.finish()


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    here = Path.cwd()
    os.chdir(tmp_path)  # run_neff writes <name>.out in the working directory
    try:
        yield tmp_path
    finally:
        os.chdir(here)


def test_run_neff_matches_crossrt(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exe = crossrt.compile(_model(), "cpu")
    exe.save(in_tmp / "my.crm")
    image = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (in_tmp / "image.bin").write_bytes(image.tobytes())

    assert main(["run_neff", "my.crm", "image", "image.bin"]) == 0
    printed = capsys.readouterr()
    assert printed.out.splitlines()[-1] == "DONE"
    assert "Input tensor bias will be zero-filled" in printed.err

    with crossrt.Runtime() as rt:
        expected = rt.load(exe).run({"image": image, "bias": np.zeros((1, 4, 1, 1), np.float32)})
    assert len(expected) == 2
    for name, value in expected.items():
        got = (in_tmp / f"{name}.out").read_bytes()
        assert got == np.ascontiguousarray(value).tobytes(), name


def test_run_neff_fails_as_the_seed_does_on_a_missing_file(in_tmp: Path) -> None:
    assert main(["run_neff", "missing.crm"]) == -1
    assert main(["run_neff"]) == -1
