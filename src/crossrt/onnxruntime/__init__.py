"""ONNX Runtime's Python inference API over crossrt: ``import crossrt.onnxruntime as ort``.

An ONNX Runtime program runs unchanged after that one import, on crossrt underneath: its
device choice and drivers (``providers`` name them), compile cache, ``.crm`` files (a session
takes one as a model path) and statistics (``session.model``). ``docs/onnxruntime-api.md``
lists what maps to what and what differs.

Example:
    >>> import crossrt.onnxruntime as ort
    >>> sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    >>> scores = sess.run(["scores"], {"x": x})[0]
"""

from __future__ import annotations

from .. import __version__ as crossrt_version
from . import capi
from .capi.onnxruntime_pybind11_state import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoaded,
    NoModel,
    NoSuchFile,
    RuntimeException,
)
from .iobinding import IOBinding
from .options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
)
from .providers import ORT_PROVIDERS, available_providers
from .session import InferenceSession, ModelMetadata, NodeArg, shared_runtime
from .values import OrtValue

try:
    import onnxruntime as _ort

    __version__: str = str(_ort.__version__)
    """The ONNX Runtime version whose API (and behaviour) this module follows: the installed
    one's, else crossrt's."""
except ImportError:  # OpenVINO alone: the API is still crossrt's
    __version__ = crossrt_version

_severity = 2


def get_available_providers() -> list[str]:
    """The providers crossrt serves here: devices with memory of their own first, then in
    crossrt's order of preference (passing them all picks what crossrt would)."""
    return available_providers()


def get_all_providers() -> list[str]:
    """Every provider ONNX Runtime knows."""
    return list(ORT_PROVIDERS)


def get_device() -> str:
    """``"GPU"`` when a provider with device memory is served here, else ``"CPU"``."""
    cpu = {"CPUExecutionProvider", "OpenVINOExecutionProvider"}
    return "GPU" if any(p not in cpu for p in available_providers()) else "CPU"


def get_version_string() -> str:
    """:data:`__version__`."""
    return __version__


def set_default_logger_severity(severity: int) -> None:
    """Kept for ORT's API: crossrt's engines log as ``CROSSRT_LOG_LEVEL`` says."""
    global _severity
    _severity = int(severity)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Kept for ORT's API (no effect)."""


def set_seed(seed: int) -> None:
    """Kept for ORT's API (no effect: crossrt's engines run no random operators seeded
    from here)."""


__all__ = [
    "EPFail",
    "EngineError",
    "ExecutionMode",
    "ExecutionOrder",
    "Fail",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoaded",
    "ModelMetadata",
    "NoModel",
    "NoSuchFile",
    "NodeArg",
    "OrtValue",
    "RunOptions",
    "RuntimeException",
    "SessionOptions",
    "__version__",
    "capi",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "get_version_string",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_seed",
    "shared_runtime",
]
