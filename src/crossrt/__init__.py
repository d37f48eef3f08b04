"""crossrt: a cross-hardware neural-network runtime.

Build or import a model, compile it for a device through that device's driver, load it and
run it::

    import crossrt

    exe = crossrt.compile("model.onnx", device="cpu")
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        outputs = model.run({"x": x})
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import config, dtypes
from .compiler import (
    Executable,
    ExecutableNode,
    executables_to_bytes,
    list_networks,
    load_executable,
    save_executables,
)
from .compiler.cache import CacheEntry, CacheStats, CompileCache, cache_stats
from .drivers import (
    CancelToken,
    Capabilities,
    CompileOptions,
    DeviceInfo,
    DeviceKind,
    Driver,
    PerformanceMode,
    Priority,
    Program,
    driver_statuses,
)
from .dtypes import DType
from .errors import (
    ClosedError,
    CompileError,
    CrossrtError,
    DeadlineExceededError,
    DeviceUnavailableError,
    ExecutionError,
    InvalidArgumentError,
    InvalidContainerError,
    InvalidHandleError,
    InvalidInputError,
    InvalidModelError,
    InvalidOptionError,
    ModelNotFoundError,
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
    UnsupportedError,
)
from .model import GraphBuilder, Model, TensorSpec, load_model
from .runtime import LoadedModel, Profile, Runtime, TensorInfo
from .runtime.auto import compile
from .runtime.cores.groups import CoreGroup
from .runtime.memory.allocator import MemoryStats, OwnerStats
from .runtime.memory.tensor import Tensor, shared_tensor, tensor_from_fd
from .runtime.memory.tensordesc import Format, Placement, TensorDesc
from .runtime.memory.tensorset import TensorSet, from_dlpack, read_batch, write_batch
from .runtime.request import Request

config.apply_log_level()


def __getattr__(name: str) -> object:
    # connect needs the serve extra (grpcio, tritonclient): imported on first use so that
    # `import crossrt` works without it.
    if name in ("connect", "RemoteRuntime"):
        try:
            from .server import client
        except ImportError as e:
            raise ImportError(
                f"crossrt.{name} needs the serve extra: pip install 'crossrt[serve]' ({e})"
            ) from e
        return getattr(client, name)
    raise AttributeError(f"module 'crossrt' has no attribute {name!r}")


try:
    __version__ = _version("crossrt")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"

__all__ = [
    "CacheEntry",
    "CacheStats",
    "CancelToken",
    "Capabilities",
    "ClosedError",
    "CompileCache",
    "CompileError",
    "CompileOptions",
    "CoreGroup",
    "CrossrtError",
    "DType",
    "DeadlineExceededError",
    "DeviceInfo",
    "DeviceKind",
    "DeviceUnavailableError",
    "Driver",
    "Executable",
    "ExecutableNode",
    "ExecutionError",
    "Format",
    "GraphBuilder",
    "InvalidArgumentError",
    "InvalidContainerError",
    "InvalidHandleError",
    "InvalidInputError",
    "InvalidModelError",
    "InvalidOptionError",
    "LoadedModel",
    "MemoryStats",
    "Model",
    "ModelNotFoundError",
    "OperationForbiddenError",
    "OutOfResourcesError",
    "OwnerStats",
    "PerformanceMode",
    "Placement",
    "Priority",
    "Profile",
    "Program",
    "RemoteRuntime",
    "Request",
    "Runtime",
    "StatusCode",
    "Tensor",
    "TensorDesc",
    "TensorInfo",
    "TensorSet",
    "TensorSpec",
    "UnsupportedError",
    "__version__",
    "cache_stats",
    "compile",
    "connect",
    "driver_statuses",
    "dtypes",
    "executables_to_bytes",
    "from_dlpack",
    "list_networks",
    "load_executable",
    "load_model",
    "read_batch",
    "save_executables",
    "shared_tensor",
    "tensor_from_fd",
    "write_batch",
]
