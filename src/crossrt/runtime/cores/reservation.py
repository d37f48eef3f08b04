"""Host CPU cores: which ones a process may use, and exclusive reservation across processes.

A process asks for cores the way a Neuron process does, with ``CROSSRT_VISIBLE_CORES`` /
``CROSSRT_NUM_CORES`` or ``Runtime(visible_cores=..., num_cores=...)``; the cores it gets are
then its own until it closes its runtimes or dies. Ownership is an ``flock`` on one lock file
per host CPU in the runtime directory: the kernel drops it when the process dies, so a stale
PID written in a file never blocks anyone. A process that asks for nothing shares every core
it may use, takes no lock and blocks no one (docs/cores.md says why).

Lock files stay (removing one safely would need every taker to check the file it locked is
still the one named), so they must not lock out the next user: in a directory its group may
write (a group's shared runtime directory), a lock file is made group-writable and given the
directory's group, as a setgid directory gives it; and ``flock`` needs only read access, so a
lock file this user cannot write (another user's, from before) is locked read-only, its owner
line left as it is (``/proc/locks`` names the holder).

Reservation belongs to the process: runtimes of one process that ask for the same core share
it (counted), and the lock goes when the last of them lets it go.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import numbers
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import contiguous_cores, parse_core_list, settings
from ...errors import InvalidArgumentError, InvalidOptionError, OutOfResourcesError, StatusCode
from ...host import HostCpus, format_cpus, host_cpus
from ...host import read_text as _read

log = logging.getLogger("crossrt")

_LOCK_NAME = re.compile(r"cpu([0-9]+)\.lock")
_BOTH_VARIABLES = "CROSSRT_VISIBLE_CORES and CROSSRT_NUM_CORES"


# -- which host CPUs this process may use -----------------------------------------------------


# -- who owns a core ------------------------------------------------------------------------


@dataclass(frozen=True)
class CoreOwner:
    """The process holding a core's lock.

    Attributes:
        pid: its process id (0 when the lock file does not say yet).
        name: its short name (``/proc/PID/comm``).
        cmdline: its command line, shortened.
        started: when it started, in seconds since the epoch; ``None`` when unknown.
    """

    pid: int
    name: str = ""
    cmdline: str = ""
    started: float | None = None

    def describe(self) -> str:
        """``process 12345 (python serve.py)``."""
        what = self.cmdline or self.name or "command line unknown"
        return f"process {self.pid} ({what})" if self.pid else f"another process ({what})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (also what the lock file holds)."""
        return {
            "pid": self.pid,
            "name": self.name,
            "cmdline": self.cmdline,
            "started": self.started,
        }


def process_info(pid: int | str = "self") -> CoreOwner:
    """What ``/proc`` says about a process (``"self"``: this one)."""
    proc = Path("/proc") / str(pid)
    cmdline = " ".join((_read(proc / "cmdline") or "").replace("\0", " ").split())
    if not cmdline and pid == "self":  # no /proc
        cmdline = " ".join([sys.executable, *sys.argv])
    if len(cmdline) > 80:
        cmdline = cmdline[:77] + "..."
    started = None
    status, boot = _read(proc / "stat"), _read("/proc/stat")
    if status and boot and (btime := re.search(r"^btime (\d+)", boot, re.MULTILINE)):
        ticks = int(status.rpartition(")")[2].split()[19])  # field 22, starttime
        started = int(btime[1]) + ticks / os.sysconf("SC_CLK_TCK")
    number = os.getpid() if pid == "self" else int(pid)
    return CoreOwner(number, _read(proc / "comm") or "", cmdline, started)


def core_owners(directory: Path | str | None = None) -> dict[int, CoreOwner]:
    """The host CPUs whose lock is held, and by whom, probed without taking any lock.

    ``/proc/locks`` says which lock files are locked and by which PID; the file adds the
    command line. Only a file that names an owner while ``/proc/locks`` shows no lock on it
    (a killed owner, or one in another PID namespace) is tried with a shared lock.

    Args:
        directory: the runtime directory; default the one ``CROSSRT_RUNTIME_DIR`` selects.
    """
    folder = Path(directory if directory is not None else settings().runtime_dir)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    locks = _proc_locks()
    owners = {
        int(match[1]): _owner(folder / name, locks)
        for name in names
        if (match := _LOCK_NAME.fullmatch(name))
    }
    return {cpu: owner for cpu, owner in owners.items() if owner is not None}


def _proc_locks() -> dict[tuple[int, int], int]:
    """``{(st_dev, st_ino): pid}`` of every flock held, from ``/proc/locks``."""
    held: dict[tuple[int, int], int] = {}
    for line in (_read("/proc/locks") or "").splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" marks a waiter, not a holder
            continue
        major, minor, inode = fields[5].split(":")
        held[(os.makedev(int(major, 16), int(minor, 16)), int(inode))] = int(fields[4])
    return held


def _owner(path: Path, locks: dict[tuple[int, int], int], locked: bool = False) -> CoreOwner | None:
    """Who holds ``path``'s lock (``None``: nobody); ``locked``: we know somebody does."""
    try:
        st = os.lstat(path)
        pid = locks.get((st.st_dev, st.st_ino), 0)
    except OSError:
        pid = 0
    try:
        raw = json.loads(_read(path) or "null")
        written = CoreOwner(int(raw["pid"]), raw["name"], raw["cmdline"], raw["started"])
    except (ValueError, TypeError, KeyError):
        written = None  # empty: never owned, let go, or its owner is writing it right now
    if not (pid or locked or (written is not None and _locked(path))):
        return None  # the lock, not the file, decides
    if written is not None and pid in (0, written.pid):
        return written
    return process_info(pid) if pid else CoreOwner(0)


def _locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock


# -- reservation -----------------------------------------------------------------------------


@dataclass
class _Held:
    fd: int
    users: int
    writable: bool = True  # False: another user's lock file, locked through a read-only fd


_state = threading.Lock()
_held: dict[tuple[str, int], _Held] = {}  # (runtime directory, host CPU) -> its locked file
_generation = 0  # bumped in a forked child, whose inherited reservations are not its own


def _forget_after_fork() -> None:
    global _state, _generation
    _state, _generation = threading.Lock(), _generation + 1
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)  # the parent keeps the lock: it still has the file open
    _held.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class CoreReservation:
    """The host CPUs a runtime runs on; exclusive ones stay locked until :meth:`release`.

    Attributes:
        host_cpus: the host CPUs, in order; core index ``i`` of a load is ``host_cpus[i]``.
        exclusive: whether they are reserved for this process alone.
        directory: the runtime directory holding the locks (``None`` when not exclusive).
    """

    def __init__(self, host_cpus: tuple[int, ...], directory: Path | None = None) -> None:
        self.host_cpus = host_cpus
        self.exclusive = directory is not None
        self.directory = directory
        self._generation = _generation
        self._released = False

    def release(self) -> None:
        """Give the cores back (the lock goes with the process's last user). Safe twice."""
        with _state:
            if self._released or self.directory is None or self._generation != _generation:
                self._released = True
                return
            self._released = True
            for cpu in self.host_cpus:
                _give_back(self.directory, cpu)

    def __repr__(self) -> str:
        mode = "exclusive" if self.exclusive else "shared"
        return f"CoreReservation(host CPUs {format_cpus(self.host_cpus)}, {mode})"


def reserve_cores(
    visible_cores: str | int | Sequence[int] | None = None, num_cores: int | None = None
) -> CoreReservation:
    """Reserve host CPUs as the arguments, else ``CROSSRT_VISIBLE_CORES``/``_NUM_CORES``, ask.

    Args:
        visible_cores: exactly these host CPUs: ``3``, ``"3-6"``, ``"3,4,5"`` or ``[3, 4]``,
            one contiguous range. Wins over ``num_cores``.
        num_cores: this many free host CPUs, the lowest numbers first; 0: every free one.

    Returns:
        An exclusive reservation when the arguments or the environment ask for cores; else
        every usable host CPU, shared, with no lock taken.

    Raises:
        InvalidArgumentError: a bad ``visible_cores`` or ``num_cores``.
        OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) more cores than this process may use or
            than are free; (EXEC_NC_BUSY) a named core is owned by another process. Nothing
            stays reserved after a failure.
    """
    config = settings()
    explicit = visible_cores is not None or num_cores is not None
    if explicit:
        visible, count = _requested(visible_cores, num_cores), num_cores
    else:
        visible, count = config.visible_cores, config.num_cores
    if visible is not None and count is not None:
        log.warning(
            "%s are both set; the visible cores %s take precedence over the count %d, as with "
            "NEURON_RT_VISIBLE_CORES",
            "visible_cores and num_cores" if explicit else _BOTH_VARIABLES,
            format_cpus(visible),
            count,
        )
    host = host_cpus()
    if visible is None and count is None:
        return CoreReservation(host.cpus[: host.limit])
    directory = runtime_directory(Path(config.runtime_dir), config.runtime_dir_is_default)
    with _state:
        chosen = _reserve(visible, count or 0, host, directory)
    log.info("reserved host CPUs %s in %s", format_cpus(chosen), directory)
    return CoreReservation(chosen, directory)


def _requested(
    visible: str | int | Sequence[int] | None, count: int | None
) -> tuple[int, ...] | None:
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0
    ):
        raise InvalidArgumentError(
            f"num_cores={count!r}: give a whole number of cores to reserve (0: every free one)"
        )
    if visible is None:
        return None
    if isinstance(visible, numbers.Integral) and not isinstance(visible, bool):
        visible = [int(visible)]
    try:
        if isinstance(visible, str):
            return parse_core_list(visible, "visible_cores")
        items: list[Any] = list(visible) if isinstance(visible, Sequence) else []
        if items and all(_is_index(c) for c in items):
            return contiguous_cores([int(c) for c in items], "visible_cores")
    except InvalidOptionError as exc:
        raise InvalidArgumentError(exc.message, details=exc.details) from None
    raise InvalidArgumentError(
        f"visible_cores={visible!r}: give host CPU numbers as one core (3), a range ('3-6') or "
        "a list of contiguous cores ([3, 4, 5])"
    )


def _is_index(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return False
    return int(value) >= 0


def _reserve(
    visible: tuple[int, ...] | None, count: int, host: HostCpus, directory: Path
) -> tuple[int, ...]:
    """Lock the cores asked for: all of them, or none."""
    if visible is not None:
        missing = [c for c in visible if c not in host.cpus]
        if missing:
            why = f"host CPU {format_cpus(missing)} is not usable by this process"
            raise _not_enough(
                f"asked for cores {format_cpus(visible)} but {why}", len(visible), host
            )
        candidates, wanted, needed = list(visible), len(visible), len(visible)
    else:  # this process's cores first, so its runtimes share them
        mine = [c for c in host.cpus if (str(directory), c) in _held]
        candidates = mine + [c for c in host.cpus if c not in mine]
        wanted = count or host.limit
        needed = count or 1
    if wanted > host.limit:
        raise _not_enough(f"asked for {wanted} cores", wanted, host)
    taken: list[int] = []
    owners: dict[int, CoreOwner] = {}
    try:
        for cpu in candidates:
            if len(taken) == wanted:
                break
            owner = _take(directory, cpu)
            if owner is None:
                taken.append(cpu)
            elif visible is not None:
                raise OutOfResourcesError(
                    f"core {cpu} is owned by {owner.describe()}; choose other cores with "
                    "CROSSRT_VISIBLE_CORES (or Runtime(visible_cores=...)) or stop that process",
                    code=StatusCode.EXEC_NC_BUSY,
                    details={"core": cpu, "owner": owner.to_dict(), "runtime_dir": str(directory)},
                )
            else:
                owners[cpu] = owner
        if len(taken) < needed:
            busy = "; ".join(f"core {c} is owned by {o.describe()}" for c, o in owners.items())
            what = (
                f"asked for {count} cores but {len(taken)} are free"
                if count
                else ("asked for every free core but none is free")
            )
            raise _not_enough(f"{what} ({busy})", count, host)
    except BaseException:
        for cpu in taken:
            _give_back(directory, cpu)
        raise
    return tuple(sorted(taken))


def _not_enough(what: str, requested: int, host: HostCpus) -> OutOfResourcesError:
    return OutOfResourcesError(
        f"{what}; this process may use host CPUs {format_cpus(host.cpus)}, {host.limit} at once "
        "(affinity mask and cgroup limits); ask for fewer cores, or stop processes that own some",
        code=StatusCode.LOAD_NOT_ENOUGH_NC,
        details={"requested": requested, "usable": list(host.cpus), "limit": host.limit},
    )


def _take(directory: Path, cpu: int) -> CoreOwner | None:
    """Lock ``cpu`` for this process, or count one more user; the owner if another has it."""
    held = _held.get((str(directory), cpu))
    if held is not None:
        held.users += 1
        return None
    path = directory / f"cpu{cpu}.lock"
    try:
        fd, writable = _open_lock(directory, path)
    except OSError as exc:
        raise OutOfResourcesError(
            f"cannot open the lock file of core {cpu}, {path}: {exc.strerror}; make "
            f"{directory} a directory this user can write, or set CROSSRT_RUNTIME_DIR",
            details={"core": cpu, "path": str(path)},
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return _owner(path, _proc_locks(), locked=True)
    if writable:
        me = {**process_info().to_dict(), "host_cpu": cpu, "reserved_at": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    _held[(str(directory), cpu)] = _Held(fd, 1, writable)
    return None


_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


def _open_lock(directory: Path, path: Path) -> tuple[int, bool]:
    """A core's lock file, opened (made if missing) for ``flock``; whether it is writable."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN, 0o644)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | _OPEN)
        except PermissionError:  # another user's, not writable by this one: flock reads
            return os.open(path, os.O_RDONLY | _OPEN), False
        if os.fstat(fd).st_uid != os.geteuid():
            return fd, True
    try:
        _share(fd, os.stat(directory))
    except BaseException:
        os.close(fd)
        raise
    return fd, True


def _share(fd: int, folder: os.stat_result) -> None:
    """Let the group of a group-writable directory write a lock file made by this user: mode
    0664 whatever the umask, and the directory's group (a setgid directory gives it; else it
    is set when this user is in that group)."""
    if not folder.st_mode & stat.S_IWGRP:
        return  # a directory of one user (0700, the default): nobody else takes cores there
    st = os.fstat(fd)
    if st.st_gid != folder.st_gid:
        with contextlib.suppress(PermissionError):  # not a member: the group stays ours
            os.fchown(fd, -1, folder.st_gid)
    if stat.S_IMODE(st.st_mode) & 0o060 != 0o060:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o060)


def _give_back(directory: Path, cpu: int) -> None:
    held = _held.get((str(directory), cpu))
    if held is None:
        return
    held.users -= 1
    if held.users == 0:
        del _held[(str(directory), cpu)]
        if held.writable:
            os.ftruncate(held.fd, 0)  # a living process that let go is no longer named as owner
        # Unlock before closing: a child forked a moment ago may still share this open file,
        # and closing alone would leave the lock held until it closes its copy too.
        fcntl.flock(held.fd, fcntl.LOCK_UN)
        os.close(held.fd)


def runtime_directory(path: Path, is_default: bool = False) -> Path:
    """Create the runtime directory (mode 0700) if missing; refuse an unsafe default one.

    Raises:
        OutOfResourcesError: it cannot be created, or a default one (not named by
            ``CROSSRT_RUNTIME_DIR``) is a symlink, someone else's, or writable by others.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        except FileExistsError:
            pass
        st = os.lstat(path)
    except OSError as exc:
        raise OutOfResourcesError(
            f"cannot create the runtime directory {path} for core lock files: {exc.strerror}; "
            "set CROSSRT_RUNTIME_DIR to a directory this user can write",
            details={"runtime_dir": str(path)},
        ) from None
    unsafe = stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
    if is_default and unsafe:
        raise OutOfResourcesError(
            f"the runtime directory {path} is a symlink, user {st.st_uid}'s, or writable by "
            f"others (mode {stat.S_IMODE(st.st_mode):04o}), so its core locks cannot be "
            "trusted; remove it (root may, if another user made it), or set "
            "CROSSRT_RUNTIME_DIR to a directory of your own",
            details={"runtime_dir": str(path)},
        )
    return path
