"""crossrt: a cross-hardware neural-network runtime.

Build or import a model, compile it for a device through that device's driver, load it and
run it::

    import crossrt

    exe = crossrt.compile("model.onnx", device="cpu")
    with crossrt.Runtime() as rt:
        model = rt.load(exe)
        outputs = model.run({"x": x})

The API comes in three tiers, each name in one of them:

- ``crossrt`` (this module, ``__all__``): what an application uses to compile, load and run
  models, in-process or on a daemon, and the errors it catches most;
- ``crossrt.drivers``: the contract a driver author implements (``Driver``, ``Program``,
  ``DeviceInfo``, ``CompileOptions``, ``Capabilities``...) and its registration;
- the rest in its own module: every error in ``crossrt.errors``, the compile cache in
  ``crossrt.compiler.cache``, multi-network containers in ``crossrt.compiler``, profiles and
  tensor information in ``crossrt.runtime``; what layers built over the runtime use in
  ``crossrt.memory``, ``crossrt.profiling`` and ``crossrt.executables``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import config, dtypes
from .cancel import CancelToken
from .choice import compile
from .compiler import Executable, load_executable
from .dtypes import DType
from .errors import (
    ClosedError,
    CompileError,
    CrossrtError,
    DeadlineExceededError,
    DeviceUnavailableError,
    ExecutionError,
    InvalidArgumentError,
    InvalidInputError,
    InvalidModelError,
    InvalidOptionError,
    ModelNotFoundError,
    OutOfResourcesError,
    StatusCode,
    UnsupportedError,
)
from .model import GraphBuilder, Model, TensorSpec, load_model
from .runtime import LoadedModel, Runtime
from .runtime.memory.tensor import Tensor, shared_tensor
from .runtime.memory.tensorset import TensorSet, from_dlpack
from .runtime.runnable import RunnableModel

config.apply_log_level()

# Names the root exported before the tiers were named once (issue 25): each lives in one module
# now, and asking the root for one says which.
_MOVED = {
    **dict.fromkeys(
        ("InvalidContainerError", "InvalidHandleError", "OperationForbiddenError"), "errors"
    ),
    **dict.fromkeys(
        (
            "Capabilities",
            "CompileOptions",
            "DeviceInfo",
            "DeviceKind",
            "Driver",
            "PerformanceMode",
            "Priority",
            "Program",
            "driver_statuses",
        ),
        "drivers",
    ),
    **dict.fromkeys(
        ("ExecutableNode", "executables_to_bytes", "list_networks", "save_executables"),
        "compiler",
    ),
    **dict.fromkeys(("CacheEntry", "CacheStats", "CompileCache", "cache_stats"), "compiler.cache"),
    "Profile": "profiling",
    "TensorInfo": "runtime",
    "Request": "runtime.request",
    "CoreGroup": "runtime.cores.groups",
    **dict.fromkeys(("Format", "Placement", "TensorDesc"), "memory"),
    "tensor_from_fd": "runtime.memory.tensor",
    **dict.fromkeys(("read_batch", "write_batch", "MemoryStats", "OwnerStats"), "memory"),
}


def __getattr__(name: str) -> object:
    # connect needs the serve extra (grpcio, tritonclient): imported on first use so that
    # `import crossrt` works without it.
    if name in ("connect", "RemoteRuntime", "private_socket"):
        try:
            from .server import client, private_sockets
        except ImportError as e:
            raise ImportError(
                f"crossrt.{name} needs the serve extra: pip install 'crossrt[serve]' ({e})"
            ) from e
        return getattr(private_sockets if name == "private_socket" else client, name)
    if name in _MOVED:
        raise AttributeError(
            f"crossrt.{name} is not part of the users' API; it lives in "
            f"crossrt.{_MOVED[name]}: from crossrt.{_MOVED[name]} import {name}"
        )
    raise AttributeError(f"module 'crossrt' has no attribute {name!r}")


try:
    __version__ = _version("crossrt")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"


__all__ = [
    "CancelToken",
    "ClosedError",
    "CompileError",
    "CrossrtError",
    "DType",
    "DeadlineExceededError",
    "DeviceUnavailableError",
    "Executable",
    "ExecutionError",
    "GraphBuilder",
    "InvalidArgumentError",
    "InvalidInputError",
    "InvalidModelError",
    "InvalidOptionError",
    "LoadedModel",
    "Model",
    "ModelNotFoundError",
    "OutOfResourcesError",
    "RemoteRuntime",
    "RunnableModel",
    "Runtime",
    "StatusCode",
    "Tensor",
    "TensorSet",
    "TensorSpec",
    "UnsupportedError",
    "__version__",
    "compile",
    "connect",
    "dtypes",
    "from_dlpack",
    "load_executable",
    "load_model",
    "private_socket",
    "shared_tensor",
]
