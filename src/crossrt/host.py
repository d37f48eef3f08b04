"""Pure facts about the host CPU: usable cores (affinity, cgroup cpuset and quota), memory,
model name and vector extensions. The base layer: drivers, compiler, runtime and tools read
them from here; nothing here knows about devices or drivers.

The usable cores and memory come from about ten cgroup and ``/proc`` files. They are read once
per process and affinity mask and kept: every device lookup (``Tensor((4, 10))`` resolves its
device) asks for them, and reading the files cost 160 µs a call against 1 µs for the one
``sched_getaffinity`` call that tells whether the mask changed. A new mask (this thread's, as
``os.sched_getaffinity(0)`` reports it: a pinned worker has its own) reads the files again, so
a cgroup cpuset change, which moves the mask, is seen; a cgroup quota or memory limit changed
under a running process is seen after :func:`forget_host_facts`.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_KEPT_MASKS = 64  # distinct affinity masks kept per process (pinned workers have their own)


def usable_cores() -> list[int]:
    """The logical CPUs this process may run on: its affinity mask within the cgroup cpuset."""
    return list(host_cpus().cpus)


@dataclass(frozen=True)
class HostCpus:
    """The host CPUs this process may run on.

    Attributes:
        cpus: the affinity mask (``os.sched_getaffinity``) within the cgroup's
            ``cpuset.cpus.effective``, in order.
        limit: how many of them it can keep busy at once: ``len(cpus)``, lowered by a cgroup
            CPU quota (``cpu.max``, rounded up, at least 1).
    """

    cpus: tuple[int, ...]
    limit: int


@dataclass(frozen=True)
class _Facts:
    cpus: HostCpus
    memory: int


# (pid, affinity mask) -> the facts read under it; the pid because a forked child may be
# moved to another cgroup.
_facts: dict[tuple[int, frozenset[int] | None], _Facts] = {}


def _affinity() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux: no mask to follow
        return None


def _current() -> _Facts:
    key = (os.getpid(), _affinity())
    found = _facts.get(key)
    if found is None:
        found = _Facts(_read_host_cpus(key[1], CGROUP_ROOT, None), _read_usable_memory())
        if len(_facts) >= _KEPT_MASKS:
            _facts.clear()
        _facts[key] = found
    return found


def forget_host_facts() -> None:
    """Read the usable cores and memory again on the next call (after a cgroup limit changed)."""
    _facts.clear()


def host_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> HostCpus:
    """The host CPUs this process may use (affinity, cgroup cpuset and CPU quota).

    Kept per affinity mask (see the module docstring) when the arguments are the defaults.

    Args:
        cgroup_root: where the cgroup file system is mounted.
        proc_cgroup: the text of ``/proc/self/cgroup``; read when not given.
    """
    if cgroup_root == CGROUP_ROOT and proc_cgroup is None:
        return _current().cpus
    return _read_host_cpus(_affinity(), cgroup_root, proc_cgroup)


def _read_host_cpus(
    mask: frozenset[int] | None, cgroup_root: Path, proc_cgroup: str | None
) -> HostCpus:
    affinity = sorted(mask) if mask is not None else list(range(os.cpu_count() or 1))
    if proc_cgroup is None:
        proc_cgroup = read_text("/proc/self/cgroup") or ""
    cpuset, quota = cgroup_cpu_limits(cgroup_root, proc_cgroup)
    cpus = [c for c in affinity if cpuset is None or c in cpuset] or affinity
    limit = len(cpus) if quota is None else max(1, min(len(cpus), math.ceil(quota)))
    return HostCpus(tuple(cpus), limit)


def cgroup_cpu_limits(root: Path, proc_cgroup: str) -> tuple[frozenset[int] | None, float | None]:
    """``(cpuset, quota in CPUs)`` of the process's cgroup (v2, or v1); ``None``: no limit.

    The quota is the smallest ``quota / period`` of the cgroup and its ancestors, since a
    parent's limit caps its children.
    """
    cpuset: frozenset[int] | None = None
    quotas: list[float] = []
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        v2 = hierarchy == "0" and not controllers
        if not v2 and not {"cpu", "cpuset"} & set(controllers.split(",")):
            continue
        mount = root if v2 else root / controllers
        here = mount / path.strip("/")
        dirs = [d for d in (here, *here.parents) if d.is_relative_to(mount) and d.is_dir()]
        for d in dirs:
            text = (
                read_text(d / "cpu.max")
                if v2
                else f"{read_text(d / 'cpu.cfs_quota_us')} {read_text(d / 'cpu.cfs_period_us')}"
            )
            quota, _, period = (text or "").partition(" ")  # "max 100000", "-1 100000": none
            if quota.isdigit() and period.isdigit() and int(period) > 0:
                quotas.append(int(quota) / int(period))
        effective = "cpuset.cpus.effective" if v2 else "cpuset.effective_cpus"
        if cpuset is None and dirs and (text := read_text(dirs[0] / effective)):
            cpuset = parse_cpu_set(text)
    return cpuset, min(quotas, default=None)


def parse_cpu_set(text: str) -> frozenset[int]:
    """CPU numbers from the kernel's list format, ``"0-3,8,10-11"``."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        first, _, last = item.strip().partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def read_text(path: str | Path) -> str | None:
    """A small system file's text, stripped; ``None`` when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def format_cpus(cpus: Sequence[int]) -> str:
    """``"0-3,8"`` from ``[0, 1, 2, 3, 8]``."""
    parts: list[str] = []
    for cpu in sorted(cpus):
        if parts and cpu == int(parts[-1].rpartition("-")[2]) + 1:
            parts[-1] = f"{parts[-1].partition('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts) or "none"


def usable_memory() -> int:
    """Bytes of memory this process may use: the cgroup limit or the machine's total (kept
    as :func:`host_cpus` is)."""
    return _current().memory


def _read_usable_memory() -> int:
    total = 0
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = int(pages) * int(size)
    except (ValueError, OSError, AttributeError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or 1 << 62):
            return int(text)
    return total


@cache
def cpu_model() -> tuple[str, str]:
    """``(model name, vendor)`` of the host CPU."""
    name, vendor = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            if name and vendor and key.strip() == "model name":
                break
    except OSError:
        pass
    return name, vendor or "unknown"


# The instruction-set extensions compiled CPU code may depend on (kernels chosen, data layouts
# such as ONNX Runtime's NCHWc block size); other cpuinfo flags (hypervisor, power
# management) differ between identical CPUs and would split caches for nothing.
_SIMD = re.compile(
    r"^(sse\d?|ssse3|sse4_[12]|avx.*|fma\d?|f16c|amx.*|asimd.*|sve.*|sme(?!p).*|i8mm|bf16|fphp)$"
)


@cache
def cpu_features() -> tuple[str, ...]:
    """The host CPU's vector instruction-set extensions, sorted (``("avx", "avx2", "fma")``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):  # x86, Arm
                return tuple(sorted({f for f in value.split() if _SIMD.match(f)}))
    except OSError:
        pass
    return ()


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
"""Where the NVIDIA kernel driver lists the GPUs: one folder per GPU, named by its PCI bus."""


def nvidia_gpus(root: Path = NVIDIA_GPUS, smi: str = "nvidia-smi") -> list[str]:
    """The model names of the GPUs CUDA shows this process, in PCI bus order: from the kernel
    driver's ``information`` files under ``root``, else (a sandbox without them, gVisor's)
    from ``nvidia-smi``; then only those ``CUDA_VISIBLE_DEVICES`` names, in its order. None
    without the driver."""
    names = _gpus_from_proc(root) or _gpus_from_smi(smi)
    return _visible(names, "NVIDIA GPU")


def nvidia_gpu_memory(smi: str = "nvidia-smi") -> list[int]:
    """The memory of each GPU CUDA shows this process, in bytes, in :func:`nvidia_gpus`'s
    order (from ``nvidia-smi``: the kernel driver's files do not say it); 0 for a GPU whose
    memory is not known (one named by UUID in ``CUDA_VISIBLE_DEVICES``). None without
    ``nvidia-smi``."""
    return _visible([mib << 20 for mib in _gpu_memory_from_smi(smi)], 0)


def _visible(items: list[_T], unknown: _T) -> list[_T]:
    """``items`` (one per GPU, PCI bus order) of the GPUs ``CUDA_VISIBLE_DEVICES`` shows, in
    its order; ``unknown`` for one it names other than by index."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not items:  # no GPU at all: a UUID there names none either
        return items
    # CUDA numbers the devices it is shown 0, 1, ... in the order given, and stops at the
    # first entry that names none. An entry other than an index (a UUID, MIG-...) is a GPU
    # whose model is not looked up here.
    shown = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            if int(entry) >= len(items):
                break
            shown.append(items[int(entry)])
        elif entry:
            shown.append(unknown)
        else:
            break
    return shown


def _gpus_from_proc(root: Path) -> list[str]:
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    names = []
    for folder in folders:
        model = "NVIDIA GPU"
        for line in (read_text(folder / "information") or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                model = value.strip()
        names.append(model)
    return names


def _gpus_from_smi(smi: str) -> list[str]:
    """The names ``nvidia-smi`` lists (PCI bus order), none where it is absent or fails."""
    return list(_smi_column(smi, "name"))


def _gpu_memory_from_smi(smi: str) -> list[int]:
    """MiB of each GPU ``nvidia-smi`` lists (PCI bus order), none where it is absent or fails."""
    try:
        return [int(value) for value in _smi_column(smi, "memory.total")]
    except ValueError:
        return []


@cache  # a GPU does not come or go under a running process; nvidia-smi takes 0.1 s or more
def _smi_column(smi: str, field: str) -> tuple[str, ...]:
    """``field`` of each GPU ``nvidia-smi`` lists (PCI bus order), none where it is absent or
    fails."""
    path = shutil.which(smi)
    if path is None:
        return ()
    try:
        done = subprocess.run(
            [path, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip())


def pid_namespace() -> int:
    """This process's PID namespace (its inode), 0 where unknown: a PID means something only
    inside its namespace, so a file named by its owner's PID is judged only in the same one."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def resident_bytes() -> int:
    """This process's resident memory (RSS) now, in bytes; 0 where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def give_back_memory() -> bool:
    """Return the free memory of glibc's heaps to the system (``malloc_trim``); whether some
    was. A large buffer freed stays in the heap of the thread's arena that held it: a
    daemon's RSS crept from 128 to 602 MiB over 16 MiB requests. Mapping every large buffer
    on its own instead (a fixed ``M_MMAP_THRESHOLD``) costs a page fault per 4 KiB each time
    (6.6 ms against 0.25 ms to take and fill 16 MiB here). False where the C library is not
    glibc."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this one, or another user's, counts) and has not
    ended: what a leftover named by its owner's PID is judged by before it is removed. A
    zombie (ended, not yet reaped by its parent: ``kill(pid, 0)`` still finds it) is not
    alive: a daemon kept the regions of 38 dead clients mapped that way."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, another user's
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:  # gone meanwhile; without /proc (not Linux), kill's answer
        return not os.path.isdir("/proc")
    except OSError:
        return True
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def owned_name(prefix: str) -> str:
    """``prefix`` followed by this process's PID namespace and PID: the start of the name of a
    temporary file, folder or shared-memory segment that :func:`remove_orphans` may judge by
    its owner."""
    return f"{prefix}{pid_namespace()}-{os.getpid()}-"


def remove_orphans(prefix: str, folders: Iterable[str]) -> list[str]:
    """Remove, in ``folders``, the files and folders this user named :func:`owned_name` with
    ``prefix`` in this PID namespace whose owner is gone (a process killed while it held
    them). A PID reused since by a living process keeps the file (never the other way round).

    Returns:
        The paths removed.
    """
    namespace = pid_namespace()
    if not namespace:
        return []  # PIDs cannot be told apart from another namespace's
    pattern = re.compile(re.escape(prefix) + r"(\d+)-(\d+)-")
    removed = []
    for folder in dict.fromkeys(folders):
        try:
            names = os.listdir(folder)
        except OSError:  # no such folder (no /dev/shm off Linux)
            continue
        for name in names:
            owner = pattern.match(name)
            if owner is None or int(owner[1]) != namespace or process_alive(int(owner[2])):
                continue
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                if os.lstat(path).st_uid != os.geteuid():
                    continue
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(path)
    return removed
