"""``benchmarks/models.py`` for the tests that build its models small (``benchmarks/`` is not a
package): ``from benchmark_models import models``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "models.py"
    spec = importlib.util.spec_from_file_location("crossrt_benchmark_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


models = _load()
