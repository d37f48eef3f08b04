"""AWS Neuron Runtime (libnrt, seed 002) over crossrt: ``nrt_*`` calls, ``NRT_STATUS`` values,
tensor sets and the ``NEURON_RT_*`` variables.

A program written for libnrt ports line by line::

    from crossrt.compat.neuron import *

    result = nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "")
    result, model = nrt_load(neff_data, neff_size, -1, -1)   # neff_data: a .crm's bytes
    result, tensor_info_array = nrt_get_model_tensor_info(model)
    ...
    result = nrt_execute(model, inputs, outputs)

Out-parameters come back as ``(status, value)``; no exception crosses the API. docs/compat.md
lists every function of the seed, and the status mapping both ways.

The modules, one family each: ``runtime`` (init, load, execute, counts, memory
statistics), ``tensors``, ``async_exec`` (the legacy async mode), ``nrta`` and
``execution_units`` (the explicit async API), ``collectives`` (the global communicator,
barrier, all-gather over ``crossrt.collectives``), ``cc`` (``nrta_cc_*``), ``sendrecv``
(``nrt_async_sendrecv_*``), ``profiling``
(profiles, traces, continuous profiling), ``inspect`` and ``inspect_config`` (inspect
sessions and their options).
"""

from .async_exec import *  # noqa: F403
from .async_exec import __all__ as _async_exec_all
from .cc import *  # noqa: F403
from .cc import __all__ as _cc_all
from .collectives import *  # noqa: F403
from .collectives import __all__ as _collectives_all
from .env import *  # noqa: F403
from .env import __all__ as _env_all
from .inspect import *  # noqa: F403
from .inspect import __all__ as _inspect_all
from .inspect_config import *  # noqa: F403
from .inspect_config import __all__ as _inspect_config_all
from .nrta import *  # noqa: F403
from .nrta import __all__ as _nrta_all
from .profiling import *  # noqa: F403
from .profiling import __all__ as _profiling_all
from .runtime import *  # noqa: F403
from .runtime import __all__ as _runtime_all
from .sendrecv import *  # noqa: F403
from .sendrecv import __all__ as _sendrecv_all
from .status import *  # noqa: F403
from .status import __all__ as _status_all
from .tensors import *  # noqa: F403
from .tensors import __all__ as _tensors_all
from .types import *  # noqa: F403
from .types import __all__ as _types_all

__all__ = [
    *_async_exec_all,
    *_cc_all,
    *_collectives_all,
    *_env_all,
    *_inspect_all,
    *_inspect_config_all,
    *_nrta_all,
    *_profiling_all,
    *_runtime_all,
    *_sendrecv_all,
    *_status_all,
    *_tensors_all,
    *_types_all,
]
