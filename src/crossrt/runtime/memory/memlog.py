"""The allocation log: a bounded ring of memory events, dumped as CSV when an allocation fails.

Like Neuron's ``NEURON_RT_DEBUG_MEMLOG_MAX_SIZE`` log, it answers "who held the memory when
it ran out". The ring keeps the last ``CROSSRT_MEMLOG_MAX_SIZE`` events (0 turns logging
off; a failure still writes its own row). Dumps go to the runtime directory
(``CROSSRT_RUNTIME_DIR``), or the temporary directory when that cannot be created, as
``memlog-<pid>-<random>.csv`` readable by the owner only.
"""

from __future__ import annotations

import csv
import itertools
import os
import tempfile
import threading
import time
from collections import deque
from typing import NamedTuple

from ...config import settings

COLUMNS = (
    "seq",
    "time",
    "event",
    "device",
    "owner",
    "name",
    "bytes",
    "device_in_use",
    "owner_in_use",
    "note",
)
"""The CSV header, one column per :class:`MemoryEvent` field."""


class MemoryEvent(NamedTuple):
    """One row of the log (a named tuple: every allocation and free of every tensor adds one,
    and a frozen dataclass cost three times as much to make).

    Attributes:
        seq: position in the process's sequence of events (gaps show dropped rows).
        time: seconds since the epoch.
        event: ``alloc``, ``adopt`` (memory an engine made, now accounted), ``free`` or
            ``fail``.
        device: the allocator's device (``"cpu:0"``, ``"host"``).
        owner: who the bytes are charged to (a loaded model's owner key, or ``""``).
        name: the tensor or buffer name given at allocation.
        bytes: the size of the allocation.
        device_in_use: bytes in use on the device after the event.
        owner_in_use: bytes charged to the owner after the event.
        note: why a ``fail`` failed.
    """

    seq: int
    time: float
    event: str
    device: str
    owner: str
    name: str
    bytes: int
    device_in_use: int
    owner_in_use: int
    note: str = ""


_new_row = tuple.__new__


class MemoryLog:
    """A thread-safe ring of the last ``max_entries`` :class:`MemoryEvent` rows.

    Args:
        max_entries: how many rows to keep; 0 keeps none.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._rows: deque[MemoryEvent] = deque(maxlen=max_entries)
        # No lock: every tensor's allocation and free records a row, and CPython's
        # itertools.count, deque.append and deque.copy are each atomic.
        self._seq = itertools.count(1)

    def record(
        self,
        event: str,
        device: str,
        owner: str,
        name: str,
        nbytes: int,
        device_in_use: int,
        owner_in_use: int,
        note: str = "",
    ) -> MemoryEvent:
        """Append one event (dropping the oldest past ``max_entries``) and return it."""
        # tuple.__new__ skips the named tuple's Python-level __new__: half the cost.
        row: MemoryEvent = _new_row(
            MemoryEvent,
            (
                next(self._seq),
                time.time(),
                event,
                device,
                owner,
                name,
                nbytes,
                device_in_use,
                owner_in_use,
                note,
            ),
        )
        if self.max_entries:
            self._rows.append(row)
        return row

    def rows(self) -> list[MemoryEvent]:
        """The rows kept, oldest first (by ``seq``: threads may append out of order)."""
        return sorted(self._rows.copy())

    def dump(self, failing: MemoryEvent | None = None) -> str:
        """Write the rows (and ``failing``, when the ring did not keep it) as CSV.

        Returns:
            The path of the file written.
        """
        rows = self.rows()
        if failing is not None and (not rows or rows[-1] is not failing):
            rows.append(failing)
        directory = _dump_dir()
        # mkstemp: an unguessable name, created 0600, never following a planted link.
        fd, path = tempfile.mkstemp(prefix=f"memlog-{os.getpid()}-", suffix=".csv", dir=directory)
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        return path


def _dump_dir() -> str:
    wanted = settings().runtime_dir
    try:
        os.makedirs(wanted, mode=0o700, exist_ok=True)
    except OSError:
        return tempfile.gettempdir()
    return wanted if os.access(wanted, os.W_OK) else tempfile.gettempdir()


_log: MemoryLog | None = None
_log_lock = threading.Lock()


def memory_log() -> MemoryLog:
    """The process's log, sized by ``CROSSRT_MEMLOG_MAX_SIZE`` when first used."""
    global _log
    found = _log
    if found is not None:
        return found
    with _log_lock:
        if _log is None:
            _log = MemoryLog(settings().memlog_max_entries)
        return _log


def reset_memory_log(max_entries: int | None = None) -> MemoryLog:
    """Start a new, empty log (sized by the setting unless ``max_entries`` is given)."""
    global _log
    with _log_lock:
        size = settings().memlog_max_entries if max_entries is None else max_entries
        _log = MemoryLog(size)
        return _log
