"""deploy/kserve/'s manifests, read as the tests need them, and the command line their
ClusterServingRuntime gives the container."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kserve"
DIGITS = ROOT / "examples" / "digits" / "digits.onnx"
MOUNT = "/mnt/models"
"""Where KServe's storage initializer leaves the InferenceService's storageUri."""


def runtime() -> dict[str, Any]:
    """clusterservingruntime.yaml."""
    return yaml.safe_load((DEPLOY / "clusterservingruntime.yaml").read_text())  # type: ignore[no-any-return]


def inference_service() -> dict[str, Any]:
    """inferenceservice.yaml."""
    return yaml.safe_load((DEPLOY / "inferenceservice.yaml").read_text())  # type: ignore[no-any-return]


def containerfile() -> list[tuple[str, str]]:
    """The Containerfile's instructions in order, (``FROM``, ``python:3.11-slim``)...,
    continuation lines joined."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT (exec form)."""
    (last,) = [rest for word, rest in containerfile() if word == "ENTRYPOINT"][-1:]
    return json.loads(last)  # type: ignore[no-any-return]


def container_args(name: str, models: Path) -> list[str]:
    """The container's args as KServe hands them to ``crossrt serve`` for the
    InferenceService ``name`` (``{{.Name}}``), with ``models`` standing for /mnt/models: the
    runtime's, then the InferenceService model's own (KServe appends them)."""
    (container,) = runtime()["spec"]["containers"]
    args = [*container["args"], *inference_service()["spec"]["predictor"]["model"]["args"]]
    return [str(a).replace("{{.Name}}", name).replace(MOUNT, str(models)) for a in args]


def mount(folder: Path, model: Path) -> Path:
    """A /mnt/models-like folder in ``folder`` holding ``model``, as the storage initializer
    leaves a storageUri naming a folder with that file."""
    models = folder / "mnt" / "models"
    models.mkdir(parents=True)
    shutil.copy(model, models / model.name)
    return models
