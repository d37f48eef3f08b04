"""Sophgo BMRuntime and BMLIB over crossrt (seed 004): ``bm_*`` device and memory calls,
the ``bmrt_*`` C API, and the C++ classes ``Context`` / ``Network`` / ``Tensor``.

A program written for BMRuntime ports line by line::

    status, bm_handle = bm_dev_request(0)
    p_bmrt = bmrt_create(bm_handle)
    bmrt_load_bmodel(p_bmrt, "pnet.crm")
    ...
    ret = bmrt_launch_tensor(p_bmrt, "PNet", input_tensors, 1, output_tensors, 2)
    status = bm_thread_sync(bm_handle)

docs/compat-bmruntime.md lists every function, and the status mapping both ways.
"""

from .cpp import *  # noqa: F403
from .cpp import __all__ as _cpp_all
from .device import *  # noqa: F403
from .device import __all__ as _device_all
from .launch import *  # noqa: F403
from .launch import __all__ as _launch_all
from .runtime import *  # noqa: F403
from .runtime import __all__ as _runtime_all
from .status import *  # noqa: F403
from .status import __all__ as _status_all
from .types import *  # noqa: F403
from .types import __all__ as _types_all

__all__ = [*_cpp_all, *_device_all, *_launch_all, *_runtime_all, *_status_all, *_types_all]
