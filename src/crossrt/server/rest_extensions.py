"""Triton's HTTP paths beside inference (:mod:`.rest` routes them here): the model
configuration and the system and CUDA shared-memory extensions, answered as Triton's HTTP
API answers them (tritonclient.http and perf_analyzer ``-i http`` read these).

- ``GET /v2/models/NAME[/versions/V]/config``: the ModelConfig as JSON, Triton's field names,
  enums by name, every field present and 64-bit integers as numbers.
- ``GET /v2/systemsharedmemory[/region/NAME]/status``: ``[{"name", "key", "offset",
  "byte_size"}]``, the caller's user's regions; ``POST .../region/NAME/register`` (``{"key",
  "offset", "byte_size"}``) and ``POST /v2/systemsharedmemory[/region/NAME]/unregister``.
- ``/v2/cudasharedmemory/...``: the same paths; without CUDA shared memory in this daemon the
  status is ``[]``, unregistering finds nothing to do, and registering is refused (400).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2 as pb

from .kserve import NO_CUDA_REGIONS, InferenceService
from .peers import Peer
from .rest_checks import json_count
from .status import ServiceError

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _bad(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def model_config(service: InferenceService, name: str, version: str) -> dict[str, Any]:
    """``GET .../config``: the model's configuration as Triton's HTTP API gives it."""
    request = pb.ModelConfigRequest(name=name, version=version)
    config = service.ModelConfig(request, None).config
    doc = MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(config.DESCRIPTOR, doc)


def _numbers(descriptor: Descriptor, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its 64-bit integers as JSON numbers (protobuf's JSON writes them as
    strings; Triton's HTTP answers, and the clients that read ``dims``, have numbers)."""
    for field in descriptor.fields:
        if field.name not in doc:
            continue
        value = doc[field.name]
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            inner = message.fields_by_name["value"]
            doc[field.name] = {k: _one(inner, v) for k, v in value.items()}
        elif isinstance(value, list):
            doc[field.name] = [_one(field, v) for v in value]
        else:
            doc[field.name] = _one(field, value)
    return doc


def _one(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and isinstance(value, dict):
        return _numbers(field.message_type, value)
    if field.type in _INT64 and isinstance(value, str):
        return int(value)
    return value


def shared_memory_get(service: InferenceService, path: list[str], peer: Peer) -> list[Any]:
    """``GET /v2/{system,cuda}sharedmemory[/region/NAME]/status``."""
    kind, name, action = _shared_memory_path(path)
    if action != "status":
        raise _no_path(path)
    if kind == "cudasharedmemory":
        if name:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, NO_CUDA_REGIONS)
        return []
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in service.regions.status(name, peer)
    ]


def shared_memory_post(
    service: InferenceService, path: list[str], doc: dict[str, Any], peer: Peer
) -> dict[str, Any]:
    """``POST .../register`` and ``.../unregister`` of either extension."""
    kind, name, action = _shared_memory_path(path)
    if action == "unregister":
        if kind == "systemsharedmemory":
            service.regions.unregister(name, peer)
        return {}  # no CUDA region is ever registered: nothing to unregister
    if action != "register" or not name:
        raise _no_path(path)
    if kind == "cudasharedmemory":
        raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, NO_CUDA_REGIONS)
    key = doc.get("key")
    offset, size = doc.get("offset", 0), doc.get("byte_size")
    if not isinstance(key, str):
        raise _bad(f"registering region {name[:64]!r}: give 'key', the shm_open name ('/name')")
    what = f"registering region {name[:64]!r}:"
    offset = json_count(offset, f"{what} offset")
    size = json_count(size, f"{what} byte_size")
    service.regions.register(name, key, offset, size, peer)
    return {}


def _shared_memory_path(path: list[str]) -> tuple[str, str, str]:
    """``KIND/ACTION`` or ``KIND/region/NAME/ACTION``: (kind, name or "", action)."""
    if len(path) == 2:
        return path[0], "", path[1]
    if len(path) == 4 and path[1] == "region" and path[2]:
        return path[0], path[2], path[3]
    raise _no_path(path)


def _no_path(path: list[str]) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, f"no such path: /v2/{'/'.join(path)}"[:200])
