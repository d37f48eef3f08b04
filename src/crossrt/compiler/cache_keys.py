"""What a compile-cache key is made of, and how a model source is identified cheaply.

The key of an entry is a SHA-256 over everything the compiled result depends on: the model's
content hash (graph and weights), the driver's name and engine version, the device fingerprint
(kind, name, vendor, capabilities; not its memory or core count, which do not change an
artifact), the compile options, the fallback devices with every driver that could serve them,
the ``.crm`` format version, the key recipe's version and the user's cache version. The same
without the user version is the entry's *slot*: the model on a target, to which NNRt's version
rules apply.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..drivers.base import CompileOptions, DeviceInfo, Driver
from ..drivers.registry import available_drivers, parse_device
from ..errors import InvalidArgumentError, InvalidModelError
from ..model import Model, load_model
from .cache_store import stat_signature
from .container import FORMAT_VERSION

RECIPE = 1
"""Version of the key recipe and the directory layout; part of every key."""


def fingerprint(device: DeviceInfo) -> dict[str, Any]:
    """What of a device an artifact depends on: kind, name, vendor, capabilities, features."""
    info = device.to_dict()
    return {k: info[k] for k in ("kind", "name", "vendor", "capabilities", "features")}


def fallback_material(fallback: str | Sequence[str] | None) -> Any:
    """The fallback devices, and every driver that could serve them, at its version."""
    if fallback is None:
        return None
    wanted = [fallback] if isinstance(fallback, str) else list(fallback)
    kinds = [parse_device(d) for d in wanted]
    serving = sorted(
        [drv.name, drv.version, json.dumps(fingerprint(info), sort_keys=True)]
        for drv in available_drivers()
        for info in drv.devices()
        if parse_device(info.id)[0] in {kind for kind, _ in kinds}
    )
    return {"devices": [f"{k}:{i}" if i is not None else k for k, i in kinds], "drivers": serving}


def json_safe(value: Any) -> bool:
    """Whether ``value`` is plain JSON (so that it can be keyed and stored)."""
    try:
        json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def slot_of(
    content_hash: str,
    driver: Driver,
    device: DeviceInfo,
    options: CompileOptions,
    fallback: str | Sequence[str] | None = None,
) -> str:
    """The key of a model on a target, without the user version (hex SHA-256).

    Raises:
        InvalidArgumentError: ``options.extensions`` holds values JSON cannot express.
    """
    material = {
        "recipe": RECIPE,
        "format": FORMAT_VERSION,
        "model": content_hash,
        "driver": [driver.name, driver.version],
        "device": fingerprint(device),
        "options": options.to_dict(),
        "fallback": fallback_material(fallback),
    }
    if not json_safe(material):
        raise InvalidArgumentError(
            f"compile options {options.to_dict()!r} hold values JSON cannot express, so the "
            "cache cannot key them; give extensions as str, numbers, bools, lists and dicts, "
            "or compile without a cache",
            details={"options": repr(options)},
        )
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def key_of(slot: str, version: int) -> str:
    """The entry key of ``slot`` at user cache version ``version``."""
    return hashlib.sha256(f"{slot}:v{version}".encode()).hexdigest()


def digest_identity(digest: str) -> str:
    """The identity of file or buffer bytes of SHA-256 ``digest``, as an entry records the
    sources it was compiled from."""
    return f"bytes:{digest}"


def file_identity(path: Path, st: os.stat_result) -> str:
    """The identity of file ``path`` with status ``st`` (its real path, device, inode, size and
    times), as an entry records the sources it was compiled from."""
    text = json.dumps([os.path.realpath(path), stat_signature(st)])
    return f"file:{hashlib.sha256(text.encode()).hexdigest()}"


@dataclass
class SourceId:
    """A model source, identified as cheaply as possible.

    A file is read (once) only when its bytes are needed: to hash them, or to load the model.

    Attributes:
        source: what the caller gave (bytes-like sources as ``bytes``).
        content_hash: the model's content hash when known without validation (a Model or an
            ``onnx.ModelProto`` was given).
        model: the model when one was given or parsed.
        validated: whether ``model`` is validated.
        path: the file, for a path source.
        file_stat: the file's status when it was read, when it did not change while read.
    """

    source: Any
    content_hash: str | None = None
    model: Model | None = None
    validated: bool = False
    path: Path | None = None
    file_stat: os.stat_result | None = None
    _data: bytes | None = None
    _digest: str | None = None

    def identities(self) -> list[str]:
        """What identifies this source's bytes, as far as they were read: the digest, and the
        file with its status when it provably did not change while read."""
        found = [] if self._digest is None else [digest_identity(self._digest)]
        if self.path is not None and self.file_stat is not None:
            found.append(file_identity(self.path, self.file_stat))
        return found

    @property
    def digest(self) -> str | None:
        """SHA-256 of the file's or buffer's bytes; ``None`` for other sources or a file that
        cannot be read (loading it then says why)."""
        if self._digest is None and self._bytes() is not None:
            self._digest = hashlib.sha256(self._bytes() or b"").hexdigest()
        return self._digest

    def _bytes(self) -> bytes | None:
        if self._data is None and isinstance(self.source, bytes):
            self._data = self.source
        elif self._data is None and self.path is not None:
            try:
                self._data, self.file_stat = _read_file(self.path)
            except OSError:
                return None
        return self._data

    def load(self) -> tuple[Model, bool]:
        """The validated model, and whether :attr:`digest` alone identifies it (bytes with no
        external data beside the file).

        Raises:
            ModelNotFoundError, InvalidModelError: as :func:`crossrt.load_model`.
        """
        if self.model is not None:
            return (self.model if self.validated else Model(self.model.proto)), False
        data = self._bytes()
        if data is None or self.path is None:
            return load_model(self.source), data is not None
        try:
            raw = load_model(data, validate=False)
        except InvalidModelError:
            return load_model(self.path), False  # raises again, naming the file
        tensors = onnx.external_data_helper._get_all_tensors(raw.proto)
        if any(onnx.external_data_helper.uses_external_data(t) for t in tensors):
            return load_model(self.path), False
        return Model(raw.proto), True  # validates what was hashed, without parsing it again


def identify(source: Any) -> SourceId:
    """Identify a model source without validating it; a file is not even read yet."""
    if isinstance(source, Model):
        return SourceId(source, source.content_hash, model=source, validated=True)
    if isinstance(source, onnx.ModelProto):
        model = load_model(source, validate=False)
        return SourceId(source, model.content_hash, model=model)
    if isinstance(source, bytes | bytearray | memoryview):
        return SourceId(bytes(source))
    if isinstance(source, str | os.PathLike):
        return SourceId(source, path=Path(source))
    return SourceId(source)


def _read_file(path: Path) -> tuple[bytes, os.stat_result | None]:
    """A file's bytes, and its status when it provably did not change while read."""
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        data = f.read()
        after = os.fstat(f.fileno())
    same = stat_signature(before) == stat_signature(after) and len(data) == before.st_size
    return data, before if same else None
