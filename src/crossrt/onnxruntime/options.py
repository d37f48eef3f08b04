"""``SessionOptions``, ``RunOptions`` and ONNX Runtime's option enums, as crossrt reads them.

Every field ORT's classes have can be set and read back, so a program that sets them runs
unchanged; those with a meaning here change what crossrt does (docs/onnxruntime-api.md has
the table), the others are kept and have no effect.
"""

from __future__ import annotations

import enum
from typing import Any

from ..drivers import CancelToken
from .capi.onnxruntime_pybind11_state import invalid_argument, not_implemented


class GraphOptimizationLevel(enum.IntEnum):
    """ORT's optimization levels. crossrt's drivers optimize when they compile: below
    ``ORT_ENABLE_ALL`` the model is compiled portable (ORT's EXTENDED optimizations, no
    layouts tied to this CPU)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """ORT's execution modes; crossrt runs a model's nodes as its placement says (kept only)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """ORT's node orders (kept only)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class SessionOptions:
    """ORT's session options.

    Fields with a meaning here: ``intra_op_num_threads`` (> 0: the cores the model is loaded
    on, at most this runtime's), ``graph_optimization_level`` (see
    :class:`GraphOptimizationLevel`), ``enable_profiling`` and ``profile_file_prefix`` (a
    crossrt :class:`~crossrt.profiling.Profile` of the session, written by ``end_profiling()`` as a
    Chrome trace). The others are kept.
    """

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self._dimensions: dict[str, int] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Keep a session config entry (``session.*`` keys have no effect here)."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """A config entry set before. Raises ORT's ``InvalidArgument`` for one never set."""
        if key not in self._config:
            raise invalid_argument(f"SessionOptions has no config entry {key!r}")
        return self._config[key]

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        """Keep a free dimension's value (kept only: crossrt checks each run's shapes)."""
        self._dimensions[str(name)] = int(value)

    def register_custom_ops_library(self, path: str) -> None:
        """Custom operator libraries are ORT's own: no crossrt driver loads them."""
        raise not_implemented(
            f"custom operator library {path!r}: crossrt's drivers do not load ORT custom "
            "operators; use onnxruntime itself for this model, or express the operator in ONNX"
        )


class RunOptions:
    """ORT's run options. ``terminate = True`` stops the runs that use these options (a
    waiting one is dropped, a running one stopped where the engine can, as a crossrt
    :class:`~crossrt.CancelToken`) and makes new ones fail with ``Fail`` until it is set back
    to False. ``log_*``, ``logid`` and ``only_execute_path_to_fetches`` are kept."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self._token = CancelToken()
        self._config: dict[str, str] = {}

    @property
    def terminate(self) -> bool:
        """Whether runs with these options are to stop."""
        return self._token.cancelled

    @terminate.setter
    def terminate(self, value: bool) -> None:
        if value:
            self._token.cancel()
        elif self._token.cancelled:
            self._token = CancelToken()  # a token is one-shot: later runs get a fresh one

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Keep a run config entry."""
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        """A config entry set before."""
        if key not in self._config:
            raise invalid_argument(f"RunOptions has no config entry {key!r}")
        return self._config[key]

    def add_active_adapter(self, adapter: Any) -> None:
        """LoRA adapters are ORT's own."""
        raise not_implemented("LoRA adapters are not served by crossrt; use onnxruntime")
