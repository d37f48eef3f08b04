"""In-memory ONNX Runtime artifacts written to a file for a load, so that instances share them.

ONNX Runtime maps weight files itself (see ``ArtifactFile``) and keeps one copy of a
``.crm``'s weights for every session over it; weights handed to it in memory it copies into
each session. When several instances load an artifact that lies in memory (a model compiled
in this process), the driver (``OnnxRuntimeDriver.sharing``) writes it once to an owner-only
file in shared memory (``/dev/shm``; the temporary directory where that is missing or too
small, as a container's 64 MB often is), lets the engine map it, and unlinks it when the
instances are loaded: the mappings keep the pages for as long as the sessions live.

The file must have a name while the engine opens it (ONNX Runtime resolves the path of a
weight file and refuses ``/proc/self/fd/N`` of an unnamed one), so a process killed during a
load leaves it: the name holds the owner's PID namespace and PID, and the first spill of every
process removes the files of owners that are gone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ...host import owned_name, remove_orphans
from ..base import ArtifactFile

SHM = Path("/dev/shm")
PREFIX = "crossrt-artifact-"


@contextlib.contextmanager
def spilled(artifact: bytes | memoryview) -> Iterator[ArtifactFile | None]:
    """``artifact`` in a file for the duration of the block; ``None`` where none can be made.

    The file is created owner-only with an unguessable name and removed when the block ends.
    """
    folders = [str(SHM)] if SHM.is_dir() and os.access(SHM, os.W_OK) else []
    sweep(PREFIX, tuple(folders))
    file = None
    for folder in (*folders, None):  # None: the temporary directory
        file = _write(artifact, folder)
        if file is not None:
            break
    if file is None:  # nowhere to write: the engine takes the artifact from memory
        yield None
        return
    try:
        yield file
    finally:
        with contextlib.suppress(OSError):
            os.unlink(file.path)


def _write(artifact: bytes | memoryview, folder: str | None) -> ArtifactFile | None:
    path = None
    try:
        with tempfile.NamedTemporaryFile(
            prefix=owned(PREFIX),
            suffix=".bin",
            dir=folder,
            delete=False,
        ) as handle:
            path = handle.name
            handle.write(artifact)
            handle.flush()  # the identity must include the size written
            return ArtifactFile(path, 0, ArtifactFile.identity_of(os.fstat(handle.fileno())))
    except OSError:  # no room there
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return None


def owned(prefix: str) -> str:
    """``prefix`` followed by this process's PID namespace and PID (``host.owned_name``)."""
    return owned_name(prefix)


@functools.cache
def sweep(prefix: str, folders: tuple[str, ...] = ()) -> list[str]:
    """Remove, once per process, the files and folders named ``owned(prefix)`` by an owner
    that is gone, in ``folders`` and the temporary directory (``host.remove_orphans``);
    returns their paths."""
    return remove_orphans(prefix, (*folders, tempfile.gettempdir()))
