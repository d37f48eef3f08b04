# ruff: noqa
# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DevicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DevicesResponse(_message.Message):
    __slots__ = ("devices_json", "core_owners", "daemon_cores")
    class CoreOwnersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...

    DEVICES_JSON_FIELD_NUMBER: _ClassVar[int]
    CORE_OWNERS_FIELD_NUMBER: _ClassVar[int]
    DAEMON_CORES_FIELD_NUMBER: _ClassVar[int]
    devices_json: _containers.RepeatedScalarFieldContainer[str]
    core_owners: _containers.ScalarMap[int, str]
    daemon_cores: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        devices_json: _Optional[_Iterable[str]] = ...,
        core_owners: _Optional[_Mapping[int, str]] = ...,
        daemon_cores: _Optional[_Iterable[int]] = ...,
    ) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("name", "model", "parameters", "core_group")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CORE_GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: bytes
    parameters: _containers.ScalarMap[str, str]
    core_group: int
    def __init__(
        self,
        name: _Optional[str] = ...,
        model: _Optional[bytes] = ...,
        parameters: _Optional[_Mapping[str, str]] = ...,
        core_group: _Optional[int] = ...,
    ) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("name", "version", "mode", "profile")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    mode: str
    profile: str
    def __init__(
        self,
        name: _Optional[str] = ...,
        version: _Optional[str] = ...,
        mode: _Optional[str] = ...,
        profile: _Optional[str] = ...,
    ) -> None: ...

class ModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class StatisticsResponse(_message.Message):
    __slots__ = ("statistics_json",)
    STATISTICS_JSON_FIELD_NUMBER: _ClassVar[int]
    statistics_json: str
    def __init__(self, statistics_json: _Optional[str] = ...) -> None: ...

class CreateCoreGroupRequest(_message.Message):
    __slots__ = ("cores", "indices")
    CORES_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    cores: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self, cores: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ...
    ) -> None: ...

class CoreGroup(_message.Message):
    __slots__ = ("id", "indices")
    ID_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    id: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self, id: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ...
    ) -> None: ...

class InferPostRequest(_message.Message):
    __slots__ = ("model_infer_request",)
    MODEL_INFER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    model_infer_request: bytes
    def __init__(self, model_infer_request: _Optional[bytes] = ...) -> None: ...

class InferPostResponse(_message.Message):
    __slots__ = ("cookie",)
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    cookie: int
    def __init__(self, cookie: _Optional[int] = ...) -> None: ...

class InferWaitRequest(_message.Message):
    __slots__ = ("cookie", "timeout")
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    cookie: int
    timeout: float
    def __init__(self, cookie: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class InferWaitResponse(_message.Message):
    __slots__ = ("done", "model_infer_response")
    DONE_FIELD_NUMBER: _ClassVar[int]
    MODEL_INFER_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    done: bool
    model_infer_response: bytes
    def __init__(
        self, done: _Optional[bool] = ..., model_infer_response: _Optional[bytes] = ...
    ) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("cookie",)
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    cookie: int
    def __init__(self, cookie: _Optional[int] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...
