"""KServe's own Python SDK models, to check the manifests of deploy/kserve/ against.

The ``kserve`` package (0.21) holds the SDK's models (``V1alpha1ClusterServingRuntime``,
``V1beta1InferenceService``, ...), and its ``__init__`` starts by importing its model server:
FastAPI, uvicorn, pandas and more, pinned below what the lock holds (psutil < 6 where crossrt's
tools extra needs 7). The Makefile installs it with ``--no-deps`` (``SDK_WHEELS``), with the
Kubernetes client whose models the SDK's name for pods and containers (``V1Container``,
``V1ObjectMeta``: pydantic models that refuse unknown fields), and the lock holds only what
those models import (six, pydantic, PyYAML). :func:`sdk` imports the two model packages
without running the packages' ``__init__``.

:func:`typed` builds the SDK object of a manifest as the SDK's own deserializer does (each
field by its ``openapi_types``), refusing what that would drop silently: an unknown field, or
a value of the wrong type. :func:`plain` turns it back into the manifest's form.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from typing import Any

PRIMITIVES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
}


def _bare(name: str) -> None:
    """Make package ``name`` importable from without running its ``__init__``."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    # origin None: a namespace package, as this tests/kserve folder would be found
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not installed (make installs it: SDK_WHEELS)")
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = package


def sdk() -> tuple[Any, Any]:
    """``kserve.models`` and ``kubernetes.client.models``.

    Raises:
        ImportError: the kserve SDK or the Kubernetes client is not installed.
    """
    for name in ("kserve", "kubernetes", "kubernetes.client"):
        _bare(name)
    return importlib.import_module("kserve.models"), importlib.import_module(
        "kubernetes.client.models"
    )


def typed(data: Any, kind: str, where: str = "") -> Any:
    """``data`` (a manifest's part) as the SDK type ``kind`` (``'V1beta1InferenceService'``,
    ``'list[V1Container]'``, ``'dict(str, str)'``, ``'int'``...).

    Raises:
        ValueError: a field the type does not have, a value of another type, or a required
            field missing (the SDK's own check).
    """
    where = where or kind
    if data is None:
        return None
    if kind.startswith("list["):
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {data!r}")
        inner = kind[5:-1]
        return [typed(item, inner, f"{where}[{i}]") for i, item in enumerate(data)]
    if kind.startswith("dict("):
        inner = re.match(r"dict\(([^,]*), (.*)\)", kind).group(2)  # type: ignore[union-attr]
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {data!r}")
        return {k: typed(v, inner, f"{where}.{k}") for k, v in data.items()}
    if kind == "object":
        return data
    if kind in PRIMITIVES:
        if not isinstance(data, PRIMITIVES[kind]) or (kind != "bool" and isinstance(data, bool)):
            raise ValueError(f"{where}: expected {kind}, got {data!r}")
        return data
    serving, kubernetes = sdk()
    if hasattr(serving, kind):
        cls = getattr(serving, kind)
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a {kind} mapping, got {data!r}")
        names = {cls.attribute_map[a]: a for a in cls.openapi_types}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{where}: {kind} has no field(s) {unknown}")
        values = {
            names[k]: typed(v, cls.openapi_types[names[k]], f"{where}.{k}") for k, v in data.items()
        }
        return cls(**values)
    # A Kubernetes type: pydantic, which refuses unknown fields and checks every type.
    return getattr(kubernetes, kind).model_validate(data)


def plain(obj: Any) -> Any:
    """An SDK object back in its manifest's form (camelCase keys, unset fields left out)."""
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if hasattr(obj, "openapi_types"):
        return {
            obj.attribute_map[a]: plain(getattr(obj, a))
            for a in obj.openapi_types
            if getattr(obj, a) is not None
        }
    if hasattr(obj, "model_dump"):
        return obj.model_dump(by_alias=True, exclude_none=True, mode="json")
    return obj
