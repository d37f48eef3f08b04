"""Fixtures of the daemon's security tests (test_daemon_*.py): real users, and a folder they
may enter. Nothing here runs unless a test asks for it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_user import User, users


@pytest.fixture(scope="module")
def people() -> Iterator[list[User]]:
    """Two new local users (useradd), removed after the module."""
    with users(2) as made:
        yield made


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """A folder others may enter (0711), for the sockets other users connect to."""
    path = Path(tempfile.mkdtemp(prefix="crossrt-daemon-security-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)
