"""Fixtures: one daemon shared by the folder's tests (serving.py starts it). Nothing of the
serve extra is imported here: without it, each test module skips itself with the reason."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import tritonclient.grpc as tc
    from serving import Daemon


@pytest.fixture(scope="session")
def served_folder() -> Iterator[Path]:
    """A folder others may enter (0711): the socket of the shared daemon lives here, so a
    test can connect as another user."""
    folder = Path(tempfile.mkdtemp(prefix="crossrt-serve-test-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(served_folder: Path) -> Iterator[Daemon]:
    """One daemon for the folder, with metrics on a loopback port."""
    from serving import EXPLICIT, free_port, make_repository, start_daemon

    repository = make_repository(served_folder / "models")
    port = free_port()
    d = start_daemon(served_folder, repository, ["--metrics", f"127.0.0.1:{port}", *EXPLICIT])
    d.metrics = f"http://127.0.0.1:{port}/metrics"
    yield d
    assert d.stop() == 0, "".join(d.log)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[tc.InferenceServerClient]:
    c = daemon.client()
    yield c
    c.close()
