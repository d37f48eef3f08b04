"""The daemon's own copy of a repository file, loaded instead of the file.

A ``.crm`` is loaded by mapping it (and ONNX Runtime maps its weights from the file itself),
so ``cp new.crm repo/model.crm``, which truncates the file in place, used to kill the daemon
with SIGBUS at its next request. The repository copies each ``.crm`` it loads into a file of
its own in shared memory (``/dev/shm``; the temporary directory where that is missing or
full), read-only, owner-only, under an unguessable name, loads from that, and unlinks it once
loaded: the operator's file can then be written, truncated or deleted at any time without
reaching a mapping, and SIGHUP loads the new version. The copy's pages are shared by every
mapping of it, so the instances of a model still hold one copy of its weights.

The copy needs a name while the model loads (ONNX Runtime resolves the path of a weight file
and refuses ``/proc/self/fd/N`` of a memfd), so a daemon killed during a load leaves it: the
name holds the owner's PID, and the next snapshot removes those whose owner is gone.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import InvalidArgumentError
from ..host import owned_name, remove_orphans

SHM = Path("/dev/shm")
PREFIX = "crossrt-snapshot-"


def stamp_of(st: os.stat_result) -> tuple[int, ...]:
    """What tells one version of a file from another: an in-place write changes its size or
    times, a rename (``mv new.crm model.crm``, ``cp -p``) its inode and ctime."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def snapshot(path: Path) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Copy ``path`` (in the kernel: ``sendfile``) to a read-only file of this process's;
    yields its path and the source's :func:`stamp_of` when copied, removes it after the block
    (mappings of it keep its pages).

    Raises:
        InvalidArgumentError: the file cannot be read, changed size while being copied, or
            there is no room for the copy.
    """
    try:
        source = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(source)
        copy = _copy(source, st.st_size, path)
    finally:
        os.close(source)
    try:
        yield copy, stamp_of(st)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(copy)


def _copy(source: int, size: int, path: Path) -> str:
    folders = [str(SHM)] if SHM.is_dir() and os.access(SHM, os.W_OK) else []
    remove_orphans(PREFIX, [*folders, tempfile.gettempdir()])
    why = "no room"
    for folder in (*folders, None):  # None: the temporary directory
        fd, copy = tempfile.mkstemp(prefix=owned_name(PREFIX), suffix=".crm", dir=folder)
        try:
            done = 0
            while done < size:
                sent = os.sendfile(fd, source, done, size - done)
                if sent <= 0:
                    break
                done += sent
            if done != size or os.fstat(source).st_size != size:
                raise InvalidArgumentError(
                    f"{path} changed size while the daemon read it (a copy under way?); write "
                    "the new version beside it, rename it into place (mv), then send SIGHUP"
                )
            os.fchmod(fd, 0o400)
            return copy
        except OSError as exc:  # no room there (a container's 64 MB /dev/shm, say)
            why = exc.strerror or str(exc)
            os.unlink(copy)
        except BaseException:
            os.unlink(copy)
            raise
        finally:
            os.close(fd)
    raise InvalidArgumentError(
        f"cannot copy {path} to load it ({why}); free space in {SHM} or the temporary "
        "directory (TMPDIR)"
    )
