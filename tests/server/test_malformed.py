"""Malformed requests: each is answered with a gRPC status that says what to do, the daemon
goes on serving, and the next request succeeds. Requests are built as protobuf messages
directly, since tritonclient refuses some of them before sending."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import grpc
import numpy as np
import tritonclient.utils.shared_memory as shm
from serving import Daemon
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

X = np.arange(32, dtype=np.float32).reshape(4, 8)
W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[pbg.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def region(stub: pbg.GRPCInferenceServiceStub) -> Iterator[str]:
    """A 256-byte registered region 'small' holding X's first 64 floats' worth of room."""
    key = f"/crossrt-malformed-{os.getpid()}"
    handle = shm.create_shared_memory_region("small", key, 256)
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="small", key=key, byte_size=256)
    )
    yield "small"
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="small"))
    shm.destroy_shared_memory_region(handle)


def request(
    model: str = "tiny",
    datatype: str = "FP32",
    shape: tuple[int, ...] = (4, 8),
    raw: bytes | None = None,
    name: str = "x",
) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name=name, datatype=datatype, shape=list(shape))
    r.raw_input_contents.append(X.tobytes() if raw is None else raw)
    return r


def shared(offset: int, size: int) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="tiny")
    t = r.inputs.add(name="x", datatype="FP32", shape=[4, 8])
    t.parameters["shared_memory_region"].string_param = "small"
    t.parameters["shared_memory_offset"].int64_param = offset
    t.parameters["shared_memory_byte_size"].int64_param = size
    return r


def typed(count: int, shape: tuple[int, ...]) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="adder")
    t = r.inputs.add(name="x", datatype="FP32", shape=list(shape))
    t.contents.fp32_contents.extend([1.0] * count)
    return r


def two_raw() -> pb.ModelInferRequest:
    r = request()
    r.raw_input_contents.append(b"extra")
    return r


def versioned(version: str) -> pb.ModelInferRequest:
    r = request()
    r.model_version = version
    return r


CASES: dict[str, tuple[Callable[[], pb.ModelInferRequest], grpc.StatusCode, str]] = {
    "wrong datatype": (lambda: request(datatype="FP64"), grpc.StatusCode.INVALID_ARGUMENT,
                       "expected datatype FP32"),
    "unknown datatype": (lambda: request(datatype="FLOAT"), grpc.StatusCode.INVALID_ARGUMENT,
                         "expected datatype FP32"),
    "BYTES for a tensor": (lambda: request(datatype="BYTES"), grpc.StatusCode.INVALID_ARGUMENT,
                           "expected datatype FP32"),
    "shape mismatch": (lambda: request(shape=(4, 9)), grpc.StatusCode.INVALID_ARGUMENT,
                       "expected shape [4,8]"),
    "rank mismatch": (lambda: request(shape=(32,)), grpc.StatusCode.INVALID_ARGUMENT,
                      "expected shape [4,8]"),
    "negative dimension": (lambda: request(shape=(4, -8)), grpc.StatusCode.INVALID_ARGUMENT,
                           "negative dimension"),
    "raw contents too short": (lambda: request(raw=X.tobytes()[:-1]),
                               grpc.StatusCode.INVALID_ARGUMENT, "holds 127 bytes"),
    "raw contents too long": (lambda: request(raw=X.tobytes() + b"\0"),
                              grpc.StatusCode.INVALID_ARGUMENT, "holds 129 bytes"),
    "raw contents for no input": (two_raw, grpc.StatusCode.INVALID_ARGUMENT,
                                  "2 raw_input_contents for 1 inputs"),
    "typed contents count": (lambda: typed(3, (4,)), grpc.StatusCode.INVALID_ARGUMENT,
                             "3 values in contents"),
    "unknown input": (lambda: request(name="z"), grpc.StatusCode.INVALID_ARGUMENT,
                      "has no input 'z'"),
    "unknown model": (lambda: request(model="nope"), grpc.StatusCode.NOT_FOUND,
                      "loaded models:"),
    "unknown version": (lambda: versioned("7"), grpc.StatusCode.NOT_FOUND,
                        "has no version '7'"),
    "huge raw shape": (lambda: request(model="adder", shape=(2**62,), raw=b"\0" * 4),
                       grpc.StatusCode.INVALID_ARGUMENT, "18446744073709551616 bytes"),
    "huge typed shape": (lambda: typed(1, (2**62,)), grpc.StatusCode.INVALID_ARGUMENT,
                         "1 values in contents"),
    "huge shape of a static input": (lambda: request(shape=(2**40, 2**40), raw=b""),
                                     grpc.StatusCode.INVALID_ARGUMENT, "expected shape"),
}  # fmt: skip

SHARED_CASES: dict[str, tuple[int, int, str]] = {
    "shm byte size not the tensor's": (0, 64, "shared_memory_byte_size 64 but"),
    "shm offset out of range": (200, 128, "past its end (256 bytes registered)"),
    "shm offset past the end": (2**40, 128, "past its end"),
}


def ok(stub: pbg.GRPCInferenceServiceStub) -> None:
    """A good request is served."""
    response = stub.ModelInfer(request())
    y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(4, 8)
    np.testing.assert_allclose(y, X @ W + 1, rtol=1e-6)


def refused(stub: pbg.GRPCInferenceServiceStub, message: pb.ModelInferRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    return info.value


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_request_is_refused_and_serving_goes_on(
    stub: pbg.GRPCInferenceServiceStub, case: str
) -> None:
    build, code, text = CASES[case]
    error = refused(stub, build())
    assert error.code() == code, error.details()
    assert text in error.details()
    ok(stub)


@pytest.mark.parametrize("case", list(SHARED_CASES))
def test_bad_shared_memory_slice_is_refused(
    stub: pbg.GRPCInferenceServiceStub, region: str, case: str
) -> None:
    offset, size, text = SHARED_CASES[case]
    error = refused(stub, shared(offset, size))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in error.details()
    ok(stub)


def test_unregistered_region_is_not_found(stub: pbg.GRPCInferenceServiceStub) -> None:
    message = shared(0, 128)
    message.inputs[0].parameters["shared_memory_region"].string_param = "never"
    error = refused(stub, message)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "register it first" in error.details()
    ok(stub)


def test_output_too_big_for_its_slice(stub: pbg.GRPCInferenceServiceStub, region: str) -> None:
    message = request()
    out = message.outputs.add(name="y")
    out.parameters["shared_memory_region"].string_param = "small"
    out.parameters["shared_memory_byte_size"].int64_param = 64
    error = refused(stub, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than shared_memory_byte_size 64" in error.details()
    ok(stub)


def test_stream_error_keeps_the_stream(stub: pbg.GRPCInferenceServiceStub) -> None:
    answers = list(stub.ModelStreamInfer(iter([request(datatype="INT8"), request()])))
    assert "INVALID_ARGUMENT" in answers[0].error_message
    assert not answers[1].error_message
    assert len(answers[1].infer_response.raw_output_contents[0]) == X.nbytes


def test_malformed_bytes_are_refused_and_serving_goes_on(
    stub: pbg.GRPCInferenceServiceStub,
) -> None:
    """BYTES elements whose lengths overrun the data, bytes left over, a huge declared count,
    and text that is not UTF-8: each INVALID_ARGUMENT, and the next request is served."""

    def send(raw: bytes, shape: list[int]) -> pb.ModelInferResponse:
        request = pb.ModelInferRequest(model_name="text")
        request.inputs.add(name="text", datatype="BYTES", shape=shape)
        request.raw_input_contents.append(raw)
        return stub.ModelInfer(request)

    cases = {
        "length overruns": ((5).to_bytes(4, "little") + b"abc", [1]),
        "bytes left over": ((1).to_bytes(4, "little") + b"ab", [1]),
        "huge count": (b"", [2**40]),
        "not UTF-8": ((2).to_bytes(4, "little") + b"\xff\xfe", [1]),
    }
    for why, (raw, shape) in cases.items():
        with pytest.raises(grpc.RpcError) as info:
            send(raw, shape)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, why
    answer = send((2).to_bytes(4, "little") + b"ok", [1])
    assert answer.raw_output_contents[0] == (2).to_bytes(4, "little") + b"ok"
