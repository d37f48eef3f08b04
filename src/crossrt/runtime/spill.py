"""In-memory artifacts written to a file for a load, so that instances can share them.

An engine that maps weight files itself (ONNX Runtime, see ``ArtifactFile``) keeps one copy
of a ``.crm``'s weights for every session over it; weights handed to it in memory it copies
into each session. When several instances load an artifact that lies in memory (a model
compiled in this process), the runtime writes it once to an owner-only file in shared memory
(``/dev/shm``, else the temporary directory), lets the engine map it, and unlinks it when the
instances are loaded: the mappings keep the pages for as long as the sessions live.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..drivers.base import ArtifactFile

SHM = Path("/dev/shm")


@contextlib.contextmanager
def spilled(artifact: bytes | memoryview) -> Iterator[ArtifactFile | None]:
    """``artifact`` in a file for the duration of the block; ``None`` where none can be made.

    The file is created owner-only with an unguessable name and removed when the block ends.
    """
    folder = str(SHM) if SHM.is_dir() and os.access(SHM, os.W_OK) else None
    path = None
    try:
        with tempfile.NamedTemporaryFile(
            prefix="crossrt-artifact-", suffix=".bin", dir=folder, delete=False
        ) as handle:
            path = handle.name
            handle.write(artifact)
            handle.flush()  # the identity must include the size written
            identity = ArtifactFile.identity_of(os.fstat(handle.fileno()))
    except OSError:  # no room in shared memory: the engine takes the artifact from memory
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        yield None
        return
    try:
        yield ArtifactFile(path, 0, identity)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
