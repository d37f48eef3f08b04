"""deploy/kserve/'s ClusterServingRuntime and InferenceService, read into KServe's own SDK
models (kserve_sdk.py says how), and the runtime's command line read by crossrt serve's own
parser: its ports, probes, model name and drain agree with what the manifests declare."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml", reason="PyYAML (the dev extra) reads the manifests")
pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")

import kserve_sdk
from kserve_sdk import plain, typed
from manifests import (
    DIGITS,
    container_args,
    containerfile,
    entrypoint,
    inference_service,
    mount,
    runtime,
)

from crossrt.server.settings import build, parse_endpoint
from crossrt.tools.serve import given, parser

try:
    kserve_sdk.sdk()
except ImportError as exc:  # pragma: no cover - make installs them
    pytest.skip(f"KServe's SDK is not installed ({exc}): make", allow_module_level=True)

STOP_SECONDS = 5
"""What the daemon may take after its drain to cut calls, unload and exit (1 to 3.3 s measured
here; test_container_contract.py holds it to this), within the grace period."""


def _kept(data: Any, back: Any, where: str = "") -> None:
    """Everything of ``data`` is in ``back`` unchanged (the SDK may add its defaults, as
    the model spec's container name '')."""
    if isinstance(data, dict):
        assert isinstance(back, dict), where
        for key, value in data.items():
            assert key in back, f"{where}.{key} was dropped"
            _kept(value, back[key], f"{where}.{key}")
    elif isinstance(data, list):
        assert isinstance(back, list) and len(back) == len(data), where
        for i, (a, b) in enumerate(zip(data, back, strict=True)):
            _kept(a, b, f"{where}[{i}]")
    else:
        assert back == data and type(back) is type(data), f"{where}: {data!r} became {back!r}"


def _runtime() -> Any:
    data = runtime()
    obj = typed(data, "V1alpha1ClusterServingRuntime")
    _kept(data, plain(obj))  # nothing dropped or changed on the way into the SDK's types
    return obj


def _service() -> Any:
    data = inference_service()
    obj = typed(data, "V1beta1InferenceService")
    _kept(data, plain(obj))
    return obj


def test_the_runtime_is_a_kserve_cluster_serving_runtime() -> None:
    r = _runtime()
    assert (r.api_version, r.kind) == ("serving.kserve.io/v1alpha1", "ClusterServingRuntime")
    spec = r.spec
    assert spec.protocol_versions == ["v2", "grpc-v2"]
    formats = {f.name: f for f in spec.supported_model_formats}
    assert {"onnx", "crossrt"} <= set(formats)
    assert all(f.auto_select for f in formats.values())
    (container,) = spec.containers
    assert container.name == "kserve-container"  # the name KServe merges a model's spec into
    ports = {p.name: p for p in container.ports}
    assert ports["http1"].container_port == 8080 and ports["http1"].protocol == "TCP"
    assert ports["h2c"].container_port == 8081  # gRPC: KServe routes grpc-v2 to the h2c port
    ready = container.readiness_probe.http_get
    assert (ready.path, ready.port) == ("/v2/health/ready", 8080)
    live = container.liveness_probe.http_get
    assert (live.path, live.port) == ("/v2/health/live", 8080)
    # Guaranteed QoS with whole CPUs: the static CPU manager gives the pod a cpuset.
    resources = container.resources
    assert resources.requests == resources.limits
    assert float(resources.limits["cpu"]).is_integer()
    assert container.security_context.run_as_non_root is True
    assert spec.annotations["prometheus.kserve.io/path"] == "/metrics"


def test_the_runtime_args_are_crossrt_serves_and_match_the_declared_ports(tmp_path: Path) -> None:
    r, service = _runtime(), _service()
    name = service.metadata.name
    args = container_args(name, mount(tmp_path, DIGITS))
    options = build(None, given(parser().parse_args(args)))
    (container,) = r.spec.containers
    ports = {p.name: p.container_port for p in container.ports}
    assert options.http == f"0.0.0.0:{ports['http1']}"  # every interface of the pod
    grpc = [e for e in options.endpoints() if e.kind == "tcp"]
    assert grpc == [parse_endpoint(f"0.0.0.0:{ports['h2c']}")]
    metrics = r.spec.annotations["prometheus.kserve.io/port"]
    assert options.metrics == f"0.0.0.0:{metrics}"
    assert [m.name for m in options.models] == [name]  # the InferenceService's name
    assert options.models[0].path == tmp_path / "mnt" / "models" / DIGITS.name
    # the InferenceService's own args: dynamic batching
    assert (options.models[0].options.max_batch_size, options.models[0].options.batch_delay) == (
        32, 0.001,
    )  # fmt: skip
    assert options.console  # a container's log is its stderr
    # The kubelet counts the grace period from the preStop hook: the pause, the drain and
    # the stop fit in it.
    (sleep, seconds) = container.lifecycle.pre_stop.var_exec.command
    assert sleep == "sleep"
    grace = service.spec.predictor.termination_grace_period_seconds
    assert int(seconds) + options.drain_seconds + STOP_SECONDS <= grace


def test_the_inference_service_uses_the_runtime() -> None:
    r, service = _runtime(), _service()
    assert (service.api_version, service.kind) == ("serving.kserve.io/v1beta1", "InferenceService")
    # KServe makes Kubernetes names of it: a DNS-1035 label.
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", service.metadata.name)
    model = service.spec.predictor.model
    assert model.runtime == r.metadata.name
    assert model.model_format.name in {f.name for f in r.spec.supported_model_formats}
    assert model.protocol_version in r.spec.protocol_versions
    assert model.storage_uri
    assert model.resources.requests == model.resources.limits
    assert service.metadata.annotations["serving.kserve.io/deploymentMode"] == "Standard"
    assert service.spec.predictor.termination_grace_period_seconds == 30  # Kubernetes' default


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("spec", "containers", 0, "readinesProbe"), {}, "readinesProbe"),
        (("spec", "containers", 0, "ports", 1, "containerPort"), "8081", "containerPort"),
        (("spec", "protocolVersions"), "v2", "expected a list"),
    ],
)
def test_a_misspelt_or_mistyped_field_is_refused(
    path: tuple[Any, ...], value: Any, expected: str
) -> None:
    """The check above can fail: what the SDK would drop or mistype is refused."""
    data = runtime()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=expected):
        typed(data, "V1alpha1ClusterServingRuntime")


def test_the_image_runs_crossrt_serve_as_a_user_of_its_own() -> None:
    """The Containerfile the runtime's image is built from: crossrt with its serve extra at
    the lock's versions, the args above going to its entrypoint, run as a numbered user
    (runAsNonRoot can check only a number)."""
    image = containerfile()
    last = {word: rest for word, rest in image}
    assert image[0] == ("FROM", "python:3.11-slim")
    assert any(
        word == "RUN" and '-c requirements/lock.txt ".[serve]"' in rest for word, rest in image
    )
    assert entrypoint() == ["crossrt", "serve"]
    assert last["USER"].isdigit() and last["USER"] != "0"
    assert set(last["EXPOSE"].split()) == {"8080", "8081", "8082"}
