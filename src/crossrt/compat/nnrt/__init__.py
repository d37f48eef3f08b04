"""OpenHarmony Neural Network Runtime's C API (``OH_NN*``) over crossrt.

A thin translation layer, with no runtime of its own: ``OH_NNModel_*`` builds an ONNX graph
through :class:`crossrt.GraphBuilder`, ``OH_NNCompilation_Build`` is :func:`crossrt.compile`
(with its cache), an executor is a :class:`crossrt.LoadedModel`, and every ``NN_Tensor`` is a
shared-memory :class:`crossrt.Tensor` with an fd. C shapes become Python ones as
docs/compat-nnrt.md says: out-parameters come back as ``(OH_NN_ReturnCode, value)``,
constructors return the handle or ``None``, and no exception crosses the API. C's enum
constants (``OH_NN_SUCCESS``, ``OH_NN_FLOAT32``, ``OH_NN_OPS_CONV2D``,
``OH_NN_CONV2D_STRIDES``...) are module names too.
"""

from __future__ import annotations

from . import ops_api12  # noqa: F401  (REFUSED: the operations refused, and why)
from .cache_names import *  # noqa: F403
from .cache_names import __all__ as _cache_names_all
from .compilation import *  # noqa: F403
from .compilation import __all__ as _compilation_all
from .constants import *  # noqa: F403
from .devices import *  # noqa: F403
from .devices import __all__ as _devices_all
from .executor import *  # noqa: F403
from .executor import __all__ as _executor_all
from .legacy import *  # noqa: F403
from .legacy import __all__ as _legacy_all
from .model import *  # noqa: F403
from .model import __all__ as _model_all
from .optypes import *  # noqa: F403
from .optypes import __all__ as _optypes_all
from .quant import *  # noqa: F403
from .quant import __all__ as _quant_all
from .status import *  # noqa: F403
from .status import __all__ as _status_all
from .tensors import *  # noqa: F403
from .tensors import __all__ as _tensors_all
from .types import *  # noqa: F403
from .types import (
    OH_NN_DataType,
    OH_NN_DeviceType,
    OH_NN_Format,
    OH_NN_FuseType,
    OH_NN_PerformanceMode,
    OH_NN_Priority,
)
from .types import __all__ as _types_all

_ENUMS = (
    OH_NN_ReturnCode,  # noqa: F405
    OH_NN_DataType,
    OH_NN_Format,
    OH_NN_FuseType,
    OH_NN_PerformanceMode,
    OH_NN_Priority,
    OH_NN_DeviceType,
)
# C's enum constants as module names (OH_NN_SUCCESS, OH_NN_FLOAT32, OH_NN_FORMAT_NHWC...).
for _enum in _ENUMS:
    globals().update(_enum.__members__)

__all__ = [
    *_cache_names_all,
    *_compilation_all,
    *_devices_all,
    *_executor_all,
    *_legacy_all,
    *_model_all,
    *_optypes_all,
    *_quant_all,
    *_status_all,
    *_tensors_all,
    *_types_all,
]
