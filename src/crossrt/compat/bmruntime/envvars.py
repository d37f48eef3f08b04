"""BMRuntime's environment variables, read when they matter:

- ``BMRT_SAVE_IO_TENSORS`` (set, not ``0``): each launch writes its inputs' bytes, in input
  order, to ``input_ref_data.dat.bmrt`` and its outputs' to ``output_ref_data.dat.bmrt`` in
  the working directory (the last launch's; ``bmrt_test`` compares against such files);
- ``BMRUNTIME_ENABLE_PROFILE`` (set, not ``0``): each ``bmrt_load_bmodel`` starts a crossrt
  profile of the networks it loaded; ``bmrt_destroy`` writes it as a Chrome trace
  ``bmprofile_data-<n>.json`` (n counts from 0 in the process) in the working directory
  (docs/observability.md), in place of Sophgo's binary ``bmprofile_data-<n>`` folder;
- ``BMRT_LOG_VERSION`` (set): ``bmrt_create`` logs crossrt's version (INFO), as the
  runtime logs its version at create.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

from .status import log

SAVE_IO = "BMRT_SAVE_IO_TENSORS"
PROFILE = "BMRUNTIME_ENABLE_PROFILE"
LOG_VERSION = "BMRT_LOG_VERSION"

READ = frozenset({SAVE_IO, PROFILE, LOG_VERSION})
"""The Sophgo variables this layer reads."""
PREFIXES = ("BMRT_", "BMRUNTIME_", "BMLIB_")
"""The prefixes of Sophgo's runtime and bmlib variables."""

_profiles = itertools.count()
_warned: set[str] = set()


def warn_unread(environ: dict[str, str] | None = None) -> list[str]:
    """Warn once per process, by name, of each Sophgo variable set that this layer does not
    read (``BMRUNTIME_USING_FAST_ALLREDUCE``, ``BMRUNTIME_NEURON_HEAP_MASK``, the profile
    buffer sizes...: they tune Sophgo's hardware and firmware). Returns the names warned of."""
    env = os.environ if environ is None else environ
    warned = []
    unread = [n for n in sorted(env) if n.startswith(PREFIXES) and n not in READ]
    for name in unread:
        if warn_once(name, f"{name} is set but has no effect here: crossrt does not read it"):
            warned.append(name)
    return warned


def warn_once(name: str, message: str) -> bool:
    """Log ``message`` (WARNING) the first time ``name`` is warned of in this process;
    whether it was logged now."""
    if name in _warned:
        return False
    log.warning("%s", message)
    _warned.add(name)
    return True


def enabled(name: str) -> bool:
    """Whether the variable ``name`` is set to something other than empty or ``0``."""
    return os.environ.get(name, "") not in ("", "0")


def save_io(which: str, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``<which>_ref_data.dat.bmrt`` (``which``: input or output); a
    failure to write is logged, never fails the launch."""
    path = Path.cwd() / f"{which}_ref_data.dat.bmrt"
    try:
        with open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except OSError as exc:
        log.warning("%s: could not write %s: %s", SAVE_IO, path, exc)


def profile_path() -> Path:
    """Where the next profile goes: ``bmprofile_data-<n>.json`` in the working directory."""
    return Path.cwd() / f"bmprofile_data-{next(_profiles)}.json"
