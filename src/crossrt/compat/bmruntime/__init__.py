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

from .bmodel import *  # noqa: F403
from .bmodel import __all__ as _bmodel_all
from .copies import *  # noqa: F403
from .copies import __all__ as _copies_all
from .cpp import *  # noqa: F403
from .cpp import __all__ as _cpp_all
from .device import *  # noqa: F403
from .device import __all__ as _device_all
from .facts import *  # noqa: F403
from .facts import __all__ as _facts_all
from .launch import *  # noqa: F403
from .launch import __all__ as _launch_all
from .multicore import *  # noqa: F403
from .multicore import __all__ as _multicore_all
from .parallel import *  # noqa: F403
from .parallel import __all__ as _parallel_all
from .runtime import *  # noqa: F403
from .runtime import __all__ as _runtime_all
from .status import *  # noqa: F403
from .status import __all__ as _status_all
from .sync import *  # noqa: F403
from .sync import __all__ as _sync_all
from .types import *  # noqa: F403
from .types import __all__ as _types_all

__all__ = [
    *_bmodel_all,
    *_copies_all,
    *_cpp_all,
    *_device_all,
    *_facts_all,
    *_launch_all,
    *_multicore_all,
    *_parallel_all,
    *_runtime_all,
    *_status_all,
    *_sync_all,
    *_types_all,
]
