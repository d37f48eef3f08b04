"""Checks of a KServe JSON request's parts (:mod:`.rest`, :mod:`.rest_extensions`): each
wrong type or number is INVALID_ARGUMENT (HTTP 400) with a message that says what to send,
never an exception from deeper down (a 500)."""

from __future__ import annotations

from typing import Any

import grpc

from .status import ServiceError


def _bad(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object, ``{}`` when absent."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{what} is a JSON object ({{name: value}}), not {type(value).__name__}")
    return value


def json_shape(name: str, shape: Any) -> list[int]:
    """An input's JSON shape, checked: a list of dimensions, each 0 <= d < 2**63."""
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in shape
    ):
        raise _bad(
            f"input {name[:64]!r}: shape {str(shape)[:64]} is not a list of dimensions "
            "(whole numbers, 0 to 2**63-1): 'shape': [4, 8]"
        )
    return shape


def json_count(value: Any, what: str) -> int:
    """A non-negative whole number the request gives (a size, an offset, a timeout)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _bad(f"{what} {str(value)[:64]!r}: give a whole number >= 0")
    return value


def json_shared_memory(tensor: Any, params: dict[str, Any], what: str) -> bool:
    """Copy an input's or output's shared-memory parameters into its protobuf ``tensor``;
    whether it names a region."""
    if "shared_memory_region" not in params:
        return False
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise _bad(f"{what}: shared_memory_region is a region's name")
    tensor.parameters["shared_memory_region"].string_param = region
    for key in ("shared_memory_byte_size", "shared_memory_offset"):
        if key in params:
            tensor.parameters[key].int64_param = json_count(params[key], f"{what}: {key}")
    return True
