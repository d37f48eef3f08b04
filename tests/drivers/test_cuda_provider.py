"""The onnxruntime driver's CUDA path, as far as it runs without a GPU: the GPUs the NVIDIA
driver lists, the providers a session gets, the TensorRT extension, and the error that names
what to install. tests/gpu/ runs models on a GPU where there is one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import crossrt
from crossrt.drivers import CompileOptions, DeviceKind, get_driver
from crossrt.drivers.onnxruntime import artifact as ort_artifact
from crossrt.drivers.onnxruntime import cuda, support
from crossrt.host import nvidia_gpu_memory, nvidia_gpus
from crossrt.runtime.memory.allocator import Allocator
from small_models import relu


def _gpu_device(index: int = 1) -> crossrt.drivers.DeviceInfo:
    cpu = next(d for d in get_driver("onnxruntime").devices() if d.id == "cpu:0")
    return crossrt.drivers.DeviceInfo(
        id=f"cuda:{index}",
        name="NVIDIA H100",
        vendor="NVIDIA",
        kind=DeviceKind.GPU,
        driver="onnxruntime",
        cores=1,
        memory_bytes=0,
        capabilities=cpu.capabilities,
    )


def test_gpus_are_read_from_the_kernel_driver(tmp_path: Path) -> None:
    for bus, model in (("0000:41:00.0", "NVIDIA A100"), ("0000:01:00.0", "NVIDIA H100")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   42\n")
    assert nvidia_gpus(tmp_path) == ["NVIDIA H100", "NVIDIA A100"]  # PCI bus order
    assert nvidia_gpus(tmp_path / "absent", smi="no-such-nvidia-smi") == []


def test_without_the_kernel_drivers_files_nvidia_smi_lists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sandbox (gVisor) shows no /proc/driver/nvidia; nvidia-smi still answers.
    smi = tmp_path / "fake-nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H200\\nNVIDIA H100 80GB HBM3\\n'\n")
    smi.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    absent = tmp_path / "absent"
    assert nvidia_gpus(absent, smi=str(smi)) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    # CUDA numbers only the devices it is shown, in the order given, up to a bad entry.
    for visible, shown in (
        ("1", ["NVIDIA H100 80GB HBM3"]),
        ("1,0", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]),
        ("", []),
        ("0,7,1", ["NVIDIA H200"]),
        ("GPU-8f1c,1", ["NVIDIA GPU", "NVIDIA H100 80GB HBM3"]),
    ):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert nvidia_gpus(absent, smi=str(smi)) == shown, visible
    broken = tmp_path / "broken-nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    broken.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvidia_gpus(absent, smi=str(broken)) == []


def test_the_memory_of_each_gpu_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "fake-nvidia-smi-memory"
    smi.write_text("#!/bin/sh\nprintf '143771\\n81559\\n'\n")
    smi.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvidia_gpu_memory(smi=str(smi)) == [143771 << 20, 81559 << 20]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c,0")
    assert nvidia_gpu_memory(smi=str(smi)) == [0, 143771 << 20]
    assert nvidia_gpu_memory(smi="no-such-nvidia-smi") == []


def test_a_gpu_device_has_its_memory_and_allocates_without_a_known_total() -> None:
    # The device machine's H200 had memory_bytes 0, which the allocator took as its limit:
    # every Tensor(device="cuda:0") was refused, "cuda:0 has 0 of its 0 bytes left".
    with_provider = cuda.CUDA in ort.get_available_providers()
    listed = cuda.devices("onnxruntime", ["NVIDIA H200", "NVIDIA H100"], [1 << 30])
    if with_provider:
        assert [d.memory_bytes for d in listed] == [1 << 30, 0]
    unknown = dataclasses.replace(get_driver("onnxruntime").devices()[0], memory_bytes=0)
    books = Allocator(get_driver("onnxruntime"), unknown)
    allocation = books.allocate(8192)
    assert books.stats().limit_bytes == 0 and books.stats().bytes_in_use == 8192
    books.free(allocation)


def test_cuda_devices_only_with_the_cuda_provider() -> None:
    listed = cuda.devices("onnxruntime", ["NVIDIA H100", "NVIDIA H100"])
    if cuda.CUDA not in ort.get_available_providers():
        assert listed == []
        return
    assert [d.id for d in listed] == ["cuda:0", "cuda:1"]
    assert all(d.kind is DeviceKind.GPU and d.capabilities.fp16 for d in listed)


def test_sessions_get_the_providers_of_their_device() -> None:
    cpu = next(d for d in get_driver("onnxruntime").devices() if d.id == "cpu:0")
    assert cuda.providers(cpu, CompileOptions()) == [cuda.CPU]
    gpu = _gpu_device(1)
    assert cuda.providers(gpu, CompileOptions()) == [(cuda.CUDA, {"device_id": 1}), cuda.CPU]
    trt = cuda.providers(gpu, CompileOptions(extensions={"tensorrt": True}))
    assert trt[0] == (cuda.TENSORRT, {"device_id": 1}) and trt[1][0] == cuda.CUDA


def test_the_tensorrt_extension_is_checked() -> None:
    cpu = next(d for d in get_driver("onnxruntime").devices() if d.id == "cpu:0")
    with pytest.raises(crossrt.InvalidOptionError, match="applies to cuda devices"):
        cuda.check_extensions("onnxruntime", cpu, CompileOptions(extensions={"tensorrt": True}))
    with pytest.raises(crossrt.InvalidOptionError, match="True or False"):
        cuda.check_extensions(
            "onnxruntime", _gpu_device(), CompileOptions(extensions={"tensorrt": "yes"})
        )
    plain = cuda.check_extensions(
        "onnxruntime", _gpu_device(), CompileOptions(extensions={"tensorrt": False})
    )
    assert plain.extensions == {}


def test_no_gpu_names_what_to_install() -> None:
    if any(d.id.startswith("cuda:") for d in get_driver("onnxruntime").devices()):
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(crossrt.DeviceUnavailableError) as info:
        crossrt.compile(relu(), "cuda")
    assert "onnxruntime-gpu" in info.value.message


def test_a_build_with_gpu_providers_lists_its_cpu_kernels_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # onnxruntime-gpu, asked for its kernels, creates its TensorRT provider and dies where
    # TensorRT is absent: such a build is asked in a subprocess (here, the CPU build posing
    # as one gives the same list).
    if not set(ort.get_available_providers()) <= support._BUILT_IN:
        # A real GPU build asks its subprocess, which dies where TensorRT is not installed
        # (the device machine's H200): then no list, and each node is asked of a session.
        kernels = support._cpu_kernels()
        assert kernels == [] or len(kernels) > 500
        return
    in_process = support._cpu_kernels()
    providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: providers)
    apart = support._cpu_kernels()
    assert sorted(map(str, apart)) == sorted(map(str, in_process)) and len(apart) > 500
    monkeypatch.setattr(support, "_KERNELS_SCRIPT", "import os; os.abort()")  # it died
    assert support._cpu_kernels() == []


def test_without_a_kernel_list_each_node_is_asked_of_ort() -> None:
    # Where the list cannot be read, a session of the node alone says whether ORT runs it.
    registry = dataclasses.replace(support.build_registry(), kernels=None)
    for dtype, runs in (("float32", True), ("int16", False)):
        b = crossrt.GraphBuilder("probe")
        x = b.input("x", dtype, [2, 3])
        b.output(b.op("Relu", [x]))
        (why,) = support.unsupported_reasons(b.finish(), registry)
        assert (why is None) == runs, why
        if not runs:
            assert why is not None and "no CPU kernel for Relu" in why


def test_a_cuda_session_without_the_cuda_provider_is_refused() -> None:
    # ORT makes the session on the CPU alone when the CUDA libraries do not load (a warning,
    # even with fallback off): crossrt refuses it rather than run elsewhere than compiled for.
    class Session:
        def __init__(self, providers: list[str]) -> None:
            self._providers = providers

        def get_providers(self) -> list[str]:
            return self._providers

    gpu = _gpu_device(0)
    cuda.check_session(Session([cuda.CUDA, cuda.CPU]), gpu)
    with pytest.raises(crossrt.DeviceUnavailableError, match="did not start its CUDA provider"):
        cuda.check_session(Session([cuda.CPU]), gpu)
    cpu = next(d for d in get_driver("onnxruntime").devices() if d.id == "cpu:0")
    cuda.check_session(Session([cuda.CPU]), cpu)


def _conv_relu() -> crossrt.Model:
    rng = np.random.default_rng(0)
    b = crossrt.GraphBuilder("conv_relu")
    x = b.input("x", "float32", [1, 3, 16, 16])
    w = b.constant(rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    b.output(b.op("Relu", [b.op("Conv", [x, w], pads=[1, 1, 1, 1])]))
    return b.finish()


def test_a_gpu_artifact_holds_no_fusion_made_for_the_cpu_kernels() -> None:
    # On the device machine's H200, artifacts optimized at EXTENDED by a CPU session (Conv+Relu
    # fused into com.microsoft FusedConv for ORT's CPU kernels) ran ResNet-50 2.25x slower
    # than raw ORT on CUDA. A GPU artifact stops at BASIC; the CUDA provider fuses at load.
    driver = get_driver("onnxruntime")
    artifact = driver.compile(_conv_relu(), _gpu_device(0), CompileOptions())
    unpacked = ort_artifact.unpack(artifact)
    graph = onnx.load_from_string(bytes(unpacked.graph)).graph
    assert unpacked.level == "basic"
    assert {n.op_type for n in graph.node} == {"Conv", "Relu"}
    assert driver.describe_artifact(artifact)["optimization"] == "basic"
    cpu = next(d for d in driver.devices() if d.id == "cpu:0")
    portable = ort_artifact.unpack(driver.compile(_conv_relu(), cpu, CompileOptions(portable=True)))
    assert "FusedConv" in {
        n.op_type for n in onnx.load_from_string(bytes(portable.graph)).graph.node
    }
