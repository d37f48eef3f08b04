"""ONNX Runtime's execution providers as crossrt drivers and devices.

A provider names a driver and a kind of device: ``CPUExecutionProvider`` is the
``onnxruntime`` driver on ``cpu``, ``CUDAExecutionProvider`` the ``onnxruntime`` driver on
``cuda`` (onnxruntime-gpu), ``OpenVINOExecutionProvider`` the ``openvino`` driver. crossrt's
other drivers have providers of their own (``CrossrtTorchExecutionProvider``...), so an ORT
program can name them too.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..drivers import available_drivers
from .capi.onnxruntime_pybind11_state import invalid_argument

ORT_PROVIDERS = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
    "DnnlExecutionProvider",
    "VitisAIExecutionProvider",
    "QNNExecutionProvider",
    "NnapiExecutionProvider",
    "VSINPUExecutionProvider",
    "JsExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
    "RknpuExecutionProvider",
    "WebNNExecutionProvider",
    "WebGpuExecutionProvider",
    "XnnpackExecutionProvider",
    "CANNExecutionProvider",
    "AzureExecutionProvider",
    "CPUExecutionProvider",
)
"""Every provider ONNX Runtime 1.32 knows (``onnxruntime.get_all_providers()``): one crossrt
cannot serve here is passed by with ORT's warning, a name outside it is an error."""

CPU = "CPUExecutionProvider"
# (driver, device kind) -> provider, for those ORT has a name for.
_ORT_NAMES = {
    ("onnxruntime", "cpu"): CPU,
    ("onnxruntime", "cuda"): "CUDAExecutionProvider",
    ("openvino", "cpu"): "OpenVINOExecutionProvider",
    ("openvino", "gpu"): "OpenVINOExecutionProvider",
    ("openvino", "npu"): "OpenVINOExecutionProvider",
}
# Drivers that auto never chooses are named by their provider, never listed as available.
_NOT_LISTED = {"reference", "sim"}


def provider_name(driver: str, device_kind: str) -> str:
    """The provider of a driver on a kind of device."""
    return _ORT_NAMES.get((driver, device_kind)) or f"Crossrt{driver.title()}ExecutionProvider"


@dataclass(frozen=True)
class Target:
    """Where a provider list compiles a model: ``device`` and ``driver`` (``None``:
    crossrt's default choice), the ``fallback`` devices for nodes the driver cannot run, and
    the providers and their options as the session reports them."""

    device: str | None
    driver: str | None
    fallback: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def served() -> dict[str, list[tuple[str, str]]]:
    """Per provider crossrt serves here, its ``(driver, device id)`` pairs, the drivers in
    crossrt's order of preference and each one's devices in its order."""
    found: dict[str, list[tuple[str, str]]] = {}
    for driver in available_drivers():
        for info in driver.devices():
            kind = info.id.partition(":")[0]
            found.setdefault(provider_name(driver.name, kind), []).append((driver.name, info.id))
    return found


def available_providers() -> list[str]:
    """The providers crossrt serves here: devices with their own memory first, then in
    crossrt's order of preference; the reference and simulated drivers are left out (they
    may still be named)."""
    names = [n for n, pairs in served().items() if pairs[0][0] not in _NOT_LISTED]
    cpu_like = {provider_name(d.name, "cpu") for d in available_drivers()}
    return sorted(names, key=lambda n: n in cpu_like)  # stable: preference kept within


def target(
    providers: Sequence[Any] | None, provider_options: Sequence[Mapping[str, Any]] | None
) -> Target:
    """Where ``providers`` (names, or ``(name, options)`` pairs, in priority order) compile.

    The first provider served here is the target; the others are its fallback, and ORT's
    CPU provider always is (ORT adds it to every session). A provider ORT knows that is not
    served here is passed by with ORT's warning; none left: ORT's CPU provider.

    Raises:
        InvalidArgument: a name neither ORT nor crossrt knows, or options that do not pair.
    """
    if not providers:
        return Target(None, None)
    if provider_options is not None and len(provider_options) != len(providers):
        raise invalid_argument(
            f"{len(provider_options)} provider_options for {len(providers)} providers: give "
            "one dict per provider, or none"
        )
    here = served()
    chosen: list[tuple[str, dict[str, str]]] = []
    for i, entry in enumerate(providers):
        name, options = (entry, {}) if isinstance(entry, str) else tuple(entry)
        if provider_options is not None:
            options = {**options, **provider_options[i]}
        if name in here:
            chosen.append((str(name), {str(k): str(v) for k, v in dict(options).items()}))
        elif name in ORT_PROVIDERS or name.startswith("Crossrt"):
            warnings.warn(  # ORT's words
                f"Specified provider '{name}' is not in available provider names."
                f"Available providers: '{', '.join(available_providers())}'",
                stacklevel=4,
            )
        else:
            raise invalid_argument(
                f"unknown execution provider {name!r}; known to ONNX Runtime: "
                f"{', '.join(ORT_PROVIDERS)}; served here: {', '.join(here)}"
            )
    if not chosen:
        chosen = [(CPU, {})] if CPU in here else []
    if not chosen:
        return Target(None, None)
    devices = [_device(name, options, here) for name, options in chosen]
    fallback = [d for _, d in devices[1:]]
    if chosen[0][0] != CPU and "cpu" not in fallback:
        fallback.append("cpu")  # ORT's CPU provider backs every session
    return Target(
        devices[0][1],
        devices[0][0],
        tuple(dict.fromkeys(d for d in fallback if d != devices[0][1])),
        tuple(name for name, _ in chosen),
        {name: options for name, options in chosen},
    )


def _device(
    name: str, options: Mapping[str, str], here: Mapping[str, list[tuple[str, str]]]
) -> tuple[str, str]:
    """``(driver, device)`` of a provider, its ``device_id`` (CUDA) or ``device_type``
    (OpenVINO: ``CPU``, ``GPU``, ``NPU``) option applied."""
    pairs = here[name]
    driver, device = pairs[0]
    kind = device.partition(":")[0]
    if "device_type" in options:
        kind = options["device_type"].split(".")[0].lower()
    if "device_id" in options:
        device = f"{kind}:{int(options['device_id'])}"
    elif "device_type" in options:
        device = kind
    if not any(d == device or d.partition(":")[0] == device for _, d in pairs):
        raise invalid_argument(
            f"{name} options {dict(options)} name device {device!r}; served here: "
            f"{', '.join(d for _, d in pairs)}"
        )
    return driver, device
