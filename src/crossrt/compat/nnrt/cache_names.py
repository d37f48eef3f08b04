"""NNRt's cache file names: the ``ModelName`` extension and ``OH_NNModel_HasCache``.

NNRt writes a model's cache as ``<ModelName>cache_info.nncache`` (the version and the files)
beside its ``<ModelName><i>.nncache`` files. crossrt's cache entries are ``<key>.crm`` files
keyed by content (docs/cache.md); a build through a cache with ``ModelName`` also writes
``<ModelName>cache_info.nncache``, a small JSON record naming the entry, so that HasCache and
a ConstructForCache build with the same ModelName find that model among others in the
directory. The compiled model carries the name too (``crossrt cache ls`` shows it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import onnx

from ...executables import CompileCache
from ...model import Model
from .status import NNError, OH_NN_ReturnCode, invalid

__all__ = ["OH_NNModel_HasCache"]

INFO_SUFFIX = "cache_info.nncache"


def model_name(extensions: dict[str, bytes]) -> str | None:
    """The ``ModelName`` extension's value (C's trailing NULs dropped), or None when unset.

    Raises:
        NNError: INVALID_PARAMETER for a name that is not a plain file name.
    """
    raw = extensions.get("ModelName")
    if raw is None:
        return None
    try:
        name = raw.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("ModelName is not UTF-8 text") from None
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise invalid(f"ModelName {name!r} must be a plain file name (no '/', not empty)")
    return name


def renamed(model: Model, name: str) -> Model:
    """``model`` with its graph named ``name`` (the cache entry's model name)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    proto.graph.name = name
    return Model(proto, validate=False)


def _info_path(folder: str | os.PathLike[str], name: str) -> Path:
    return Path(folder) / f"{name}{INFO_SUFFIX}"


def write_info(folder: str, name: str, version: int) -> None:
    """Record the entry just built or read for ``name`` at ``version`` (the most recently
    used entry of that model name) in ``<name>cache_info.nncache``."""
    named = [e for e in CompileCache(folder, version).entries() if e.model == name]
    if not named:  # the cache could not be written (it was passed by with a warning)
        return
    entry = named[-1]
    record = {"model": name, "version": version, "key": entry.key, "device": entry.device}
    target = _info_path(folder, name)
    temp = target.with_name(f".tmp-{os.getpid()}-{target.name}")
    temp.write_text(json.dumps(record))
    os.replace(temp, target)  # readers see the old record or the new one, never half


def _read_info(folder: Any, name: Any) -> dict[str, Any] | None:
    if not isinstance(folder, str | os.PathLike) or not isinstance(name, str) or not name:
        return None
    if any(c in name for c in "/\\\0"):  # never a file outside the cache directory
        return None
    try:
        record = json.loads(_info_path(folder, name).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("version"), int)
    return record if ok and isinstance(record.get("key"), str) else None


def named_entry(folder: str, name: str, version: int) -> Path:
    """The ``.crm`` of the model cached as ``name`` at ``version``.

    Raises:
        NNError: INVALID_FILE when none is (or its file is gone); INVALID_PARAMETER when
            the cache holds it at a newer version.
    """
    record = _read_info(folder, name)
    if record is not None and record["version"] > version:
        raise invalid(f"the cache of {name!r} in {folder!r} is version {record['version']}")
    crm = Path(folder) / f"{record['key']}.crm" if record else None
    if record is None or record["version"] != version or crm is None or not crm.exists():
        raise NNError(
            OH_NN_ReturnCode.OH_NN_INVALID_FILE,
            f"the cache in {folder!r} holds no model named {name!r} at version {version}; "
            "build it with this ModelName first",
        )
    return crm


def OH_NNModel_HasCache(cacheDir: str, modelName: str, version: int) -> bool:
    """Whether ``cacheDir`` holds the model cached as ``modelName`` (the ModelName
    extension) at ``version``, its file present. Never raises: a bad argument is False."""
    record = _read_info(cacheDir, modelName)
    if record is None or isinstance(version, bool) or record["version"] != version:
        return False
    return (Path(cacheDir) / f"{record['key']}.crm").exists()
