"""The profiles ``crossrt serve`` writes for loads with ``enable_tracing`` (neuron-rtd's
``model_params``, docs/daemon.md): each is its loading user's file, mode 0600, in a folder
that lists nothing (0711). A real daemon, real users (useradd)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed: pip install crossrt[serve]")
pytest.importorskip("tritonclient.grpc", reason="the serve extra is not installed")

import numpy as np
from as_user import User, needs_root, once

import crossrt
from concurrency_models import tiny
from server.serving import start_daemon

pytestmark = needs_root


def load_run_unload(url: str, data: bytes) -> list[object]:
    """As the user: a traced load, one run, the unload; the profile's path and size."""
    with crossrt.connect(url) as rt:
        model = rt.load(data, name="traced", enable_tracing=True)
        model.run({"x": np.ones((4, 8), np.float32)})
        model.unload()  # the profile is written now
        assert model.profile is not None
        return [model.profile, len(Path(model.profile).read_bytes())]


def read(path: str) -> str:
    try:
        Path(path).read_bytes()
    except PermissionError:
        return "denied"
    return "read"


def test_a_profile_is_the_loading_users_alone(folder: Path, people: list[User]) -> None:
    base = folder / "profiles-daemon"
    base.mkdir()
    base.chmod(0o711)
    (base / "empty").mkdir()
    profiles = base / "profiles"
    config = base / "serve.toml"
    config.write_text(f'socket_mode = "0666"\nprofile_dir = "{profiles}"\n')
    args = ["-c", str(config), "--model-control", "explicit", "--semantics", "neuron-rtd"]
    daemon = start_daemon(base, base / "empty", args)
    try:
        path, size = once(people[0], load_run_unload, daemon.url, tiny().to_bytes())
        assert Path(path).parent == profiles and size > 0
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (people[0].uid, 0o600)
        assert stat.S_IMODE(os.stat(profiles).st_mode) == 0o711
        assert once(people[1], read, path) == "denied"
    finally:
        assert daemon.stop() == 0, "".join(daemon.log)


def test_no_profile_goes_to_a_folder_others_may_write(folder: Path) -> None:
    base = folder / "open-profiles-daemon"
    base.mkdir()
    (base / "empty").mkdir()
    profiles = base / "profiles"
    profiles.mkdir()
    profiles.chmod(0o1777)  # as /tmp: a user could plant a link at the next file's name
    config = base / "serve.toml"
    config.write_text(f'profile_dir = "{profiles}"\n')
    daemon = start_daemon(base, base / "empty", ["-c", str(config), "--model-control", "explicit"])
    try:
        with crossrt.connect(daemon.url) as rt, pytest.raises(crossrt.CrossrtError) as info:
            rt.load(tiny().to_bytes(), name="traced", enable_node_profiling=True)
        assert info.value.code is crossrt.StatusCode.RESOURCE
        assert "writable by others" in str(info.value)
        assert not list(profiles.iterdir())
        with crossrt.connect(daemon.url) as rt:  # nothing was left loaded: the name is free
            rt.load(tiny().to_bytes(), name="traced").unload()
    finally:
        assert daemon.stop() == 0, "".join(daemon.log)
