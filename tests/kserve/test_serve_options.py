"""``crossrt serve --model NAME=PATH`` and ``--kserve``: what PATH may be (a file, or a
folder as KServe's storage initializer leaves /mnt/models), the preset's values and what
overrides them, and a model that cannot be loaded stopping the daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")

from crossrt import InvalidArgumentError, InvalidOptionError
from crossrt.server.model_path import model_file, parse_model
from crossrt.server.settings import KSERVE, ServeOptions, build
from crossrt.tools.serve import given, parser


def _options(*argv: str, config: Path | None = None) -> ServeOptions:
    return build(str(config) if config else None, given(parser().parse_args(list(argv))))


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_a_model_file_or_the_folder_kserve_downloads(tmp_path: Path) -> None:
    onnx = _touch(tmp_path / "file" / "resnet.onnx")
    assert model_file(onnx, "r") == ("1", onnx)
    # storageUri of a folder with one model: its files land in /mnt/models
    assert model_file(onnx.parent, "r") == ("1", onnx)
    # the .crm compiled from it wins, as in the repository
    crm = _touch(tmp_path / "file" / "resnet.crm")
    assert model_file(onnx.parent, "r") == ("1", crm)
    # a Triton model folder: the highest numbered version
    _touch(tmp_path / "triton" / "1" / "model.onnx")
    newest = _touch(tmp_path / "triton" / "3" / "model.onnx")
    assert model_file(tmp_path / "triton", "r") == ("3", newest)
    # a Triton repository holding the model's folder
    inner = _touch(tmp_path / "repo" / "r" / "2" / "model.crm")
    _touch(tmp_path / "repo" / "other" / "1" / "model.crm")
    assert model_file(tmp_path / "repo", "r") == ("2", inner)
    # several models: the one named for the model, else model.*
    named = _touch(tmp_path / "many" / "r.onnx")
    _touch(tmp_path / "many" / "s.onnx")
    assert model_file(tmp_path / "many", "r") == ("1", named)
    entry = parse_model(f" digits = {onnx.parent}")
    assert (entry.name, entry.path) == ("digits", crm)


@pytest.mark.parametrize(
    ("layout", "given_text", "expected"),
    [
        ((), "r={root}/absent", "no such file or folder.*storageUri"),
        (("empty/.keep",), "r={root}/empty", r"no model in this folder \(found \['.keep'\]\)"),
        (("two/a.onnx", "two/b.onnx"), "r={root}/two", "several models here"),
        (("x/model.pkl",), "r={root}/x/model.pkl", "a .crm or .onnx file"),
        ((), "{root}/m.onnx", "give NAME=PATH"),
        ((), "=/mnt/models", "give NAME=PATH"),
    ],
)
def test_a_path_without_one_model_is_refused_with_what_was_found(
    tmp_path: Path, layout: tuple[str, ...], given_text: str, expected: str
) -> None:
    for name in layout:
        _touch(tmp_path / name)
    with pytest.raises(InvalidOptionError, match=expected):
        parse_model(given_text.format(root=tmp_path))


def test_the_kserve_preset_and_what_overrides_it(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.onnx")
    options = _options("--kserve", "--model", f"m={model}")
    assert (options.http, options.endpoint, options.metrics) == (
        KSERVE["http"], KSERVE["endpoint"], KSERVE["metrics"],
    )  # fmt: skip
    assert options.console and options.drain_seconds == 20
    assert [(m.name, m.path) for m in options.models] == [("m", model)]
    assert options.model == (f"m={model}",)
    # The command line, then the config file, win over the preset.
    config = tmp_path / "serve.toml"
    config.write_text('http = "127.0.0.1:9000"\ndrain_seconds = 5\n')
    options = _options("--kserve", "--drain-seconds", "12", "-g", "9001", config=config)
    assert (options.http, options.endpoint, options.drain_seconds) == (
        "127.0.0.1:9000", ("9001",), 12.0,
    )  # fmt: skip
    assert options.metrics == KSERVE["metrics"]
    # Without --kserve nothing changes: the Unix socket alone, syslog, a 30 s drain.
    options = _options()
    assert (options.http, options.endpoint, options.metrics) == (None, (), None)
    assert not options.console and options.drain_seconds == 30


def test_load_parameters_of_the_models_given(tmp_path: Path) -> None:
    """Under KServe, the InferenceService's args (appended to the runtime's) keep crossrt's
    instances, batching and response cache."""
    model = _touch(tmp_path / "m.onnx")
    options = _options(
        "--model", f"m={model}", "--load-parameter", "instances=2",
        "--load-parameter", "max_batch_size=8", "--load-parameter", "batch_delay=0.002",
    )  # fmt: skip
    (entry,) = options.models
    assert (entry.options.instances, entry.options.max_batch_size) == (2, 8)
    assert entry.options.batch_delay == 0.002
    with pytest.raises(InvalidArgumentError, match="unknown load parameter 'instance'"):
        _options("--model", f"m={model}", "--load-parameter", "instance=2")
    with pytest.raises(
        InvalidArgumentError, match="instances='0' is not valid; give a whole number >= 1"
    ):
        _options("--model", f"m={model}", "--load-parameter", "instances=0")
    with pytest.raises(InvalidOptionError, match="give KEY=VALUE"):
        _options("--model", f"m={model}", "--load-parameter", "instances")
    with pytest.raises(InvalidOptionError, match="applies to the --model models"):
        _options("--load-parameter", "instances=2")


def test_a_model_name_given_twice_is_refused(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.onnx")
    config = tmp_path / "serve.toml"
    config.write_text(f'[[models]]\nname = "m"\npath = "{model}"\n')
    with pytest.raises(InvalidOptionError, match=r"\['m'\] given more than once"):
        _options("--model", f"m={model}", config=config)


def test_a_model_that_cannot_be_loaded_stops_the_daemon(tmp_path: Path) -> None:
    """Under KServe the pod restarts and its log says why (Triton's --exit-on-error)."""
    broken = tmp_path / "models" / "model.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"not an onnx model")
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(tmp_path / "run"))
    done = subprocess.run(
        [sys.executable, "-m", "crossrt", "serve", "-x", "--model", f"broken={broken.parent}"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "crossrt serve: error [INVALID_MODEL" in done.stderr
    assert "ready" not in done.stderr.replace("already", "")


def test_ready_only_while_every_model_given_is_loaded(tmp_path: Path) -> None:
    """ServerReady (and HTTP /v2/health/ready) follow the --model models: unloaded, the
    daemon is not ready (a KServe pod leaves its Service); loaded again, it is."""
    tc = pytest.importorskip("tritonclient.grpc")
    from concurrency_models import tiny

    tiny().save(tmp_path / "tiny.onnx")
    sock = tmp_path / "d.sock"
    env = dict(os.environ, CROSSRT_RUNTIME_DIR=str(tmp_path / "run"))
    command = [sys.executable, "-m", "crossrt", "serve", "-x", "-g", f"unix:{sock}",
               "--model-control", "explicit", "--model", f"m={tmp_path / 'tiny.onnx'}"]  # fmt: skip
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        log = []
        for line in proc.stderr:  # until it says it is ready, or ends
            log.append(line)
            if line.rstrip().endswith(" INFO ready"):
                break
        client = tc.InferenceServerClient(f"unix://{sock}")
        assert client.is_server_ready(), "".join(log)
        client.unload_model("m")
        assert not client.is_server_ready()
        client.load_model("m")
        assert client.is_server_ready()
        client.close()
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
