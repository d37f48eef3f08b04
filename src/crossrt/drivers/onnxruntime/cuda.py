"""NVIDIA GPUs through onnxruntime-gpu: a provider choice inside the onnxruntime driver.

With onnxruntime-gpu installed (the ``cuda`` extra, docs/drivers.md), ORT offers the
``CUDAExecutionProvider`` and the driver serves ``cuda:N``, one per GPU the NVIDIA kernel
driver lists (in PCI bus order, CUDA's default). A session for ``cuda:N`` runs on that GPU,
with ORT placing on the CPU the few nodes the CUDA provider has no kernel for;
``extensions={"tensorrt": True}`` puts the TensorRT provider first where ORT has it. The
artifact of a GPU compile is ORT's portable (EXTENDED) optimization: ORT applies the
device-specific rest when the session is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
from typing import Any

import onnxruntime as ort

from ...errors import DeviceUnavailableError, InvalidOptionError
from ...host import nvidia_gpu_memory, nvidia_gpus
from ..base import Capabilities, CompileOptions, DeviceInfo, DeviceKind

log = logging.getLogger("crossrt")
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"
EXTENSIONS = ("tensorrt",)
"""The ``extensions`` a ``cuda`` device takes."""


def devices(
    driver: str, gpus: list[str] | None = None, memory: list[int] | None = None
) -> list[DeviceInfo]:
    """The ``cuda:N`` devices, when ORT has the CUDA provider (else none): ``gpus`` their
    names and ``memory`` their bytes (default: what the NVIDIA driver says; 0 where unknown)."""
    if CUDA not in ort.get_available_providers():
        return []
    names = nvidia_gpus() if gpus is None else gpus
    totals = nvidia_gpu_memory() if memory is None else memory
    # ORT's CUDA kernels take float16; its TensorRT provider, when present, int8 too.
    caps = Capabilities(fp16=True, cache_export=True)
    return [
        DeviceInfo(
            id=f"cuda:{index}",
            name=name,
            vendor="NVIDIA",
            kind=DeviceKind.GPU,
            driver=driver,
            cores=1,
            memory_bytes=totals[index] if index < len(totals) else 0,
            capabilities=caps,
            features=("cuda",),
        )
        for index, name in enumerate(names)
    ]


def is_cuda(device: DeviceInfo) -> bool:
    """Whether ``device`` is one of this module's."""
    return device.id.startswith("cuda:")


def index_of(device: DeviceInfo) -> int:
    """N of ``cuda:N``: the CUDA device index."""
    return int(device.id.partition(":")[2] or 0)


@functools.cache
def load_libraries() -> None:
    """Load the CUDA and cuDNN libraries ORT's CUDA provider links against, once, from the
    NVIDIA wheels where they are installed (``ort.preload_dlls``, as ORT asks of pip installs):
    onnxruntime-gpu finds them by itself only beside it in the same site-packages. ORT's
    warnings (printed) go to the log instead."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            ort.preload_dlls()
    except Exception as exc:  # an ORT without it, or a system CUDA: the session finds it or not
        log.debug("onnxruntime.preload_dlls: %s", exc)
    if printed.getvalue().strip():
        log.warning("onnxruntime.preload_dlls: %s", " ".join(printed.getvalue().split()))


def providers(device: DeviceInfo, options: CompileOptions) -> list[Any]:
    """The providers of a session for ``device``, in ORT's priority order, with options."""
    if not is_cuda(device):
        return [CPU]
    load_libraries()
    index = index_of(device)
    chosen: list[Any] = []
    if options.extensions.get("tensorrt"):
        chosen.append((TENSORRT, {"device_id": index}))
    chosen += [(CUDA, {"device_id": index}), CPU]
    return chosen


def check_session(session: Any, device: DeviceInfo) -> None:
    """Refuse a session for a ``cuda:N`` device that ORT made without its CUDA provider.

    Where the CUDA or cuDNN libraries do not load, ORT logs a warning and makes the session
    on the CPU alone, even told not to fall back: the model would run, silently, on another
    device than the one compiled for.

    Raises:
        DeviceUnavailableError: the session has no CUDA provider.
    """
    if is_cuda(device) and CUDA not in session.get_providers():
        raise DeviceUnavailableError(
            f"ONNX Runtime {ort.__version__} did not start its CUDA provider for {device.id}: "
            "the CUDA 13 and cuDNN 9 libraries it loads are missing or do not match (set "
            "CROSSRT_LOG_LEVEL=WARNING to see ORT's reason); install them (NVIDIA's wheels: "
            "make cuda, or pip install 'crossrt[cuda]'), or compile for 'cpu'",
            details={"device": device.id, "providers": list(session.get_providers())},
        )


def check_extensions(driver: str, device: DeviceInfo, options: CompileOptions) -> CompileOptions:
    """``options`` without the extensions this module takes, once they are checked.

    Raises:
        InvalidOptionError: an extension on a CPU device, or TensorRT asked for where ORT
            has no TensorRT provider, or a value that is not a bool.
    """
    mine = {k: v for k, v in options.extensions.items() if k in EXTENSIONS}
    if not mine:
        return options
    if not is_cuda(device):
        raise InvalidOptionError(
            f"extension tensorrt applies to cuda devices, not {device.id}; drop it",
            details={"option": "extensions", "driver": driver},
        )
    if not isinstance(mine["tensorrt"], bool):
        raise InvalidOptionError(
            f"extensions={{'tensorrt': {mine['tensorrt']!r}}}: give True or False",
            details={"option": "extensions"},
        )
    if mine["tensorrt"] and TENSORRT not in ort.get_available_providers():
        raise InvalidOptionError(
            "extension tensorrt: this ONNX Runtime has no TensorRT provider; install "
            "onnxruntime-gpu with TensorRT, or drop the extension",
            details={"option": "extensions", "driver": driver},
        )
    rest = {k: v for k, v in options.extensions.items() if k not in EXTENSIONS}
    return dataclasses.replace(options, extensions=rest)
