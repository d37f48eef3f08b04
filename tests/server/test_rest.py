"""KServe v2 over HTTP/REST (``crossrt serve --http``), driven as curl or any HTTP client
drives it: health, metadata, JSON inference, the binary data extension, and errors as
``{"error": ...}`` with the status for their code."""

from __future__ import annotations

import json
import os
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
from serving import EXPLICIT, Daemon, free_port, make_repository, start_daemon
from test_malformed import W

from crossrt.server.rest import HEADER_LENGTH

TOKEN = "s3cret"


OPERATOR = "operator-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    folder = tmp_path_factory.mktemp("rest")
    port = free_port()
    tokens = folder / "tokens.toml"
    tokens.write_text(f'[[tokens]]\ntoken = "{OPERATOR}"\nuser = "ops"\nrole = "operator"\n')
    tokens.chmod(0o600)
    args = ["--http", f"127.0.0.1:{port}", "--tokens", str(tokens), *EXPLICIT]
    daemon = start_daemon(folder, make_repository(folder / "models"), args)
    yield daemon, f"http://127.0.0.1:{port}/v2"
    assert daemon.stop() == 0, "".join(daemon.log)


def call(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def infer(base: str, model: str, doc: dict[str, Any]) -> tuple[int, Any]:
    status, body, _ = call(f"{base}/models/{model}/infer", json.dumps(doc).encode())
    return status, json.loads(body)


def test_health_and_metadata(rest: tuple[Daemon, str]) -> None:
    _, base = rest
    assert call(f"{base}/health/live")[0] == 200
    assert call(f"{base}/health/ready")[0] == 200
    status, body, _ = call(base)
    assert status == 200 and json.loads(body)["name"] == "crossrt"
    status, body, _ = call(f"{base}/models/tiny")
    meta = json.loads(body)
    assert status == 200
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [4, 8]}]
    assert call(f"{base}/models/tiny/ready")[0] == 200
    assert call(f"{base}/models/relu/versions/2/ready")[0] == 200
    assert call(f"{base}/models/nothing/ready")[0] == 400


def test_json_inference_gives_the_grpc_answer(rest: tuple[Daemon, str]) -> None:
    daemon, base = rest
    x = np.random.default_rng(2).random((4, 8), dtype=np.float32)
    status, doc = infer(
        base,
        "tiny",
        {
            "id": "q1",
            "inputs": [{"name": "x", "shape": [4, 8], "datatype": "FP32", "data": x.tolist()}],
        },
    )
    assert status == 200, doc
    assert doc["id"] == "q1" and doc["model_name"] == "tiny"
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", "FP32", [4, 8])
    y = np.asarray(out["data"], np.float32).reshape(4, 8)
    np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)
    import tritonclient.grpc as tc

    i = tc.InferInput("x", [4, 8], "FP32")
    i.set_data_from_numpy(x)
    np.testing.assert_array_equal(daemon.client().infer("tiny", [i]).as_numpy("y"), y)


def test_strings_in_json(rest: tuple[Daemon, str]) -> None:
    _, base = rest
    status, doc = infer(
        base,
        "text",
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["héllo", "b"]}]},
    )
    assert status == 200, doc
    outputs = {o["name"]: o["data"] for o in doc["outputs"]}
    assert outputs == {"same": ["héllo", "b"], "first": ["héllo"]}


def test_the_binary_data_extension(rest: tuple[Daemon, str]) -> None:
    _, base = rest
    x = np.random.default_rng(3).random((4, 8), dtype=np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [4, 8],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    status, body, headers = call(
        f"{base}/models/tiny/infer", head + x.tobytes(), {HEADER_LENGTH: str(len(head))}
    )
    assert status == 200, body
    length = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:length])
    (out,) = doc["outputs"]
    assert out["parameters"] == {"binary_data_size": 128} and "data" not in out
    y = np.frombuffer(body[length:], np.float32).reshape(4, 8)
    np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)
    assert struct.calcsize("<f") * 32 == len(body) - length


def _x(datatype: str = "FP32", **fields: Any) -> dict[str, Any]:
    """A request with one input ``x`` of shape [4, 8]."""
    return {"inputs": [{"name": "x", "shape": [4, 8], "datatype": datatype, **fields}]}


@pytest.mark.parametrize(
    ("model", "doc", "status", "says"),
    [
        ("tiny", _x("FP64", data=[0] * 32), 400, "FP32"),
        ("tiny", _x(data=[0] * 3), 400, "x"),
        ("tiny", _x(data=[1e39] * 32), 400, "out of range of float32"),  # not inf
        ("tiny", _x("INT32", data=[[1.5]] + [[0]] * 31), 400, "not a whole number: 1.5"),
        ("tiny", {"inputs": []}, 400, "inputs"),
        ("nothing", _x(data=[0] * 32), 404, "nothing"),
        ("tiny", _x(parameters={"shared_memory_region": "r"}), 400, "shared_memory_byte_size"),
    ],
)
def test_errors_have_a_status_and_a_message(
    rest: tuple[Daemon, str], model: str, doc: dict[str, Any], status: int, says: str
) -> None:
    _, base = rest
    got, answer = infer(base, model, doc)
    assert got == status, answer
    assert says in answer["error"]
    assert call(f"{base}/health/ready")[0] == 200  # the daemon serves on


def test_malformed_bodies_are_refused(rest: tuple[Daemon, str]) -> None:
    _, base = rest
    status, body, _ = call(f"{base}/models/tiny/infer", b"{not json")
    assert status == 400 and "not JSON" in json.loads(body)["error"]
    status, body, _ = call(f"{base}/models/tiny/infer", b"{}", {HEADER_LENGTH: "999"})
    assert status == 400 and HEADER_LENGTH in json.loads(body)["error"]
    assert call(f"{base}/nowhere")[0] == 404


def test_a_token_is_asked_for(tmp_path: Any) -> None:
    port = free_port()
    daemon = start_daemon(
        tmp_path,
        make_repository(tmp_path / "models"),
        ["--http", f"127.0.0.1:{port}", "--token", TOKEN],
    )
    try:
        base = f"http://127.0.0.1:{port}/v2"
        assert call(f"{base}/health/live")[0] == 200  # health needs none, as on gRPC
        assert call(f"{base}/models/tiny")[0] == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert call(f"{base}/models/tiny", headers=good)[0] == 200
        # Refused before its body was read, on a connection kept alive: the next request on
        # it must not be read from that body.
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps(_x(data=[0] * 32)).encode()
        connection.request("POST", "/v2/models/tiny/infer", body)
        refused = connection.getresponse()
        assert refused.status == 401
        refused.read()
        connection.request("GET", "/v2/models/tiny", headers=good)
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        assert daemon.stop() == 0


def test_statistics_and_the_repository_over_http(rest: tuple[Daemon, str]) -> None:
    _, base = rest
    infer(base, "tiny", _x(data=[1] * 32))
    status, body, _ = call(f"{base}/models/tiny/stats")
    assert status == 200
    (stats,) = json.loads(body)["model_stats"]
    assert stats["name"] == "tiny" and stats["inference_stats"]["success"]["count"] >= 1
    assert isinstance(stats["execution_count"], int)  # numbers, as Triton's HTTP gives them
    status, body, _ = call(f"{base}/models/stats")
    assert {s["name"] for s in json.loads(body)["model_stats"]} >= {"tiny", "relu"}
    status, body, _ = call(f"{base}/repository/index", b"{}")
    assert status == 200
    assert {m["name"]: m["state"] for m in json.loads(body)}["adder"] == "READY"
    # the repository is the operator's: an HTTP client is anonymous without its token
    assert call(f"{base}/repository/models/adder/unload", b"")[0] == 401
    operator = {"Authorization": f"Bearer {OPERATOR}"}
    assert call(f"{base}/repository/models/adder/unload", b"", operator)[0] == 200
    assert call(f"{base}/models/adder/ready")[0] == 400
    load = json.dumps({"parameters": {"instances": 1}}).encode()
    assert call(f"{base}/repository/models/adder/load", load, operator)[0] == 200
    assert call(f"{base}/models/adder/ready")[0] == 200
    status, body, _ = call(
        f"{base}/repository/models/adder/load",
        json.dumps({"parameters": {"instances": "zero"}}).encode(),
        operator,
    )
    assert status == 400 and "whole number" in json.loads(body)["error"]
