"""neuron-rtd's meanings for crossrt.v1 (``crossrt serve --semantics neuron-rtd``, seed 003),
and neuron-rtd's per-load ``model_params`` under either semantics.

Under neuron-rtd semantics (docs/daemon.md, "neuron-rtd semantics"):

- a Load without a core group makes an **implicit** group of cores no other group holds
  (explicit, or another model's implicit one), as many as the model's nodes need together
  (``cores`` to ask for more), in normal mode; none free: LOAD_NOT_ENOUGH_NC (9). The group
  is gone with its model, and no other model can be loaded onto it.
- on an explicit group, a model whose nodes' cores all fit loads in **normal** mode (each
  node on cores of its own, requests pipelined); one that fits only its largest node loads
  in **shared NC** mode (runtime mode ``serial``: the nodes take turns on the group's cores,
  one request at a time, no pipelining); less: LOAD_NOT_ENOUGH_NC.
- starting a model, or posting to one, while another model runs on its group:
  EXEC_NC_BUSY (1005).

Under both, a Load takes ``ninfer`` (the most requests in flight: ``queue_depth``; more get
QUEUE_FULL), ``enable_tracing`` and ``enable_node_profiling``: a profile of the model from
load to unload, written as a Chrome trace (the runtime's profiler, docs/observability.md) to
a file of the loading user's in the daemon's ``profile_dir``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compiler import Executable
from ..errors import (
    CrossrtError,
    InvalidArgumentError,
    OperationForbiddenError,
    OutOfResourcesError,
    StatusCode,
)
from ..profiling import Profile, save_trace
from ..runtime import LoadedModel, Runtime
from ..runtime.cores.groups import CoreGroup

log = logging.getLogger("crossrt.serve")

NEURON_RTD = "neuron-rtd"

MODEL_PARAMS = ("ninfer", "enable_tracing", "enable_node_profiling")
"""neuron-rtd's ``model_params`` a Load takes beside crossrt's load parameters."""

_serial = itertools.count(1)


@dataclass(frozen=True)
class ModelParams:
    """neuron-rtd's ``model_params`` of one Load."""

    ninfer: int | None = None
    tracing: bool = False
    node_profiling: bool = False

    @property
    def profiled(self) -> bool:
        return self.tracing or self.node_profiling


def split_parameters(parameters: Mapping[str, str]) -> tuple[dict[str, str], ModelParams]:
    """A Load's parameters: crossrt's (for ``LoadOptions``), and neuron-rtd's model_params
    with ``ninfer`` given as crossrt's ``queue_depth``.

    Raises:
        InvalidArgumentError: a value is not a whole number or a boolean, or both ``ninfer``
            and ``queue_depth`` are given.
    """
    ours = {k: v for k, v in parameters.items() if k not in MODEL_PARAMS}
    flags = {}
    for key in ("enable_tracing", "enable_node_profiling"):
        text = str(parameters.get(key, "false")).strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise InvalidArgumentError(f"load parameter {key}={text!r}: give true or false")
        flags[key] = text in ("true", "1")
    ninfer = None
    if "ninfer" in parameters:
        text = str(parameters["ninfer"]).strip()
        if not text.isdigit() or int(text) < 1:
            raise InvalidArgumentError(
                f"load parameter ninfer={text!r}: give the most requests the model may have "
                "in flight, a whole number of 1 or more"
            )
        if "queue_depth" in ours:
            raise InvalidArgumentError(
                "give ninfer or queue_depth, not both: ninfer is neuron-rtd's name for "
                "queue_depth (the most requests in flight)"
            )
        ninfer = int(text)
        ours["queue_depth"] = text
    return ours, ModelParams(ninfer, flags["enable_tracing"], flags["enable_node_profiling"])


def needs(exe: Executable) -> tuple[int, int]:
    """The cores one instance of ``exe`` needs in normal mode (its device's nodes' together)
    and in shared NC mode (its largest node's), as a NEFF header says."""
    cores = [n.cores for n in exe.nodes if n.device_kind == exe.device_kind] or [1]
    return sum(cores), max(cores)


def not_enough(message: str, **details: Any) -> OutOfResourcesError:
    return OutOfResourcesError(message, code=StatusCode.LOAD_NOT_ENOUGH_NC, details=details)


def mode_on_group(exe: Executable, name: str, group: CoreGroup, instances: int) -> str:
    """``normal`` when every node of every instance fits ``group`` on cores of its own,
    ``serial`` (shared NC) when the largest one does; else LOAD_NOT_ENOUGH_NC."""
    total, largest = needs(exe)
    have = len(group.indices)
    if have >= total * instances:
        return "normal"
    if have >= largest * instances:
        return "serial"
    raise not_enough(
        f"model {name!r} needs {largest * instances} cores at least ({instances} instance(s) "
        f"x its largest node's {largest}; {total * instances} for normal mode) but core group "
        f"{list(group.indices)} has {have}; load it onto a larger group",
        needed=largest * instances,
        available=have,
    )


def implicit_group(
    runtime: Runtime, exe: Executable, name: str, cores: Any, instances: int
) -> CoreGroup:
    """A group of its own for a load without one: the ``cores`` asked for (a count or core
    indices), else as many as the model's nodes need, none held by another group.

    Raises:
        OutOfResourcesError: (LOAD_NOT_ENOUGH_NC) fewer free cores than that, or fewer asked
            for than normal mode needs.
    """
    total = needs(exe)[0] * instances
    count = total if cores is None else cores if isinstance(cores, int) else len(cores)
    if count < total:
        raise not_enough(
            f"model {name!r} needs {total} cores in normal mode (a load without a core group "
            f"always is), but cores={cores!r} gives {count}; ask for {total} or more, or load "
            "it onto a core group",
            needed=total,
            available=count,
        )
    if cores is None or isinstance(cores, int):
        return runtime.create_core_group(count)
    try:
        return runtime.create_core_group(indices=list(cores))
    except OperationForbiddenError as exc:  # another group holds one of them
        raise not_enough(
            f"{exc.message}; under neuron-rtd semantics a load without a core group takes cores "
            "no other model holds",
            cores=list(cores),
        ) from None


def place(
    runtime: Runtime,
    exe: Executable,
    name: str,
    group: CoreGroup | None,
    cores: Any,
    instances: int,
) -> tuple[CoreGroup, str, CoreGroup | None]:
    """Where and how a load goes under neuron-rtd semantics: the group (``group``, or an
    implicit one made now), the runtime's mode, and the group made (the caller destroys it
    if the load fails)."""
    if group is not None:
        if cores is not None:
            raise InvalidArgumentError(
                "give the load parameter cores or a core group, not both: a model loaded onto "
                "a group uses its cores"
            )
        return group, mode_on_group(exe, name, group, instances), None
    made = implicit_group(runtime, exe, name, cores, instances)
    return made, "normal", made


def nc_busy(model: LoadedModel, doing: str) -> CrossrtError | None:
    """EXEC_NC_BUSY when another model runs on ``model``'s group (``None`` when not)."""
    running = model.instances.group.running
    if running is None or running is model:
        return None
    return CrossrtError(
        f"cannot {doing} model {model.name!r}: model {running.name!r} is running on its core "
        f"group {list(model.instances.group.indices)}; stop it first",
        code=StatusCode.EXEC_NC_BUSY,
        details={"running": running.name, "model": model.name},
    )


class Profiles:
    """The profiles of models loaded with ``enable_tracing`` / ``enable_node_profiling``,
    each written when its model is unloaded, however that happens (Unload,
    RepositoryModelUnload, its client's death, the daemon's stop)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def check(self) -> None:
        """Raise unless the folder is there (made if missing) and safe to write into.

        Raises:
            OutOfResourcesError: it cannot be made, or it is a link, another user's, or
                writable by others.
        """
        try:
            if not self.folder.is_dir():
                self.folder.mkdir(parents=True, exist_ok=True)
                os.chmod(self.folder, 0o711)  # its files are their users' (0600), unlisted
            st = os.lstat(self.folder)
        except OSError as exc:
            raise OutOfResourcesError(
                f"the daemon cannot make its profile folder {self.folder} ({exc.strerror}); "
                "load without enable_tracing and enable_node_profiling, or ask the operator "
                "to set profile_dir"
            ) from None
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            # Another user could plant a link where the daemon (root) is about to write.
            raise OutOfResourcesError(
                f"the profile folder {self.folder} is a link, another user's, or writable by "
                "others, so the daemon writes no profile there; load without enable_tracing "
                "and enable_node_profiling, or ask the operator to set profile_dir to a folder "
                "of the daemon's own"
            )

    def start(self, model: LoadedModel, params: ModelParams, uid: int | None) -> str:
        """Record ``model`` from now on; the file its trace will be written to (the folder
        :meth:`check`-ed first)."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", model.name)[:100]
        path = self.folder / f"{safe}-{time.strftime('%Y%m%dT%H%M%S')}-{next(_serial)}.json"
        profile = Profile(model).start()
        group = model.instances.group

        def unloaded(member: object) -> None:
            if member is model:
                group.on_remove.remove(unloaded)
                write(profile, path, params, uid)

        group.on_remove.append(unloaded)
        return str(path)


def write(profile: Profile, path: Path, params: ModelParams, uid: int | None) -> None:
    """Stop ``profile`` and write its trace, the user's file (``uid``), readable by them only."""
    try:
        trace = profile.stop()
        if not params.node_profiling:
            trace = without_nodes(trace)
        save_trace(trace, path)
        os.chmod(path, 0o600)
        if uid is not None and os.geteuid() == 0:
            os.chown(path, uid, -1)
    except Exception:  # called as the model is unloaded: that must go on
        log.exception("cannot write the profile of a model to %s", path)


def without_nodes(trace: dict[str, Any]) -> dict[str, Any]:
    """A trace without its node runs and their tracks (enable_tracing without
    enable_node_profiling)."""
    events = trace["traceEvents"]
    nodes = {e["tid"] for e in events if e.get("cat") == "node"}
    nodes |= {
        e["tid"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and " node " in e["args"]["name"]
    }
    kept = [e for e in events if e.get("cat") != "node" and e.get("tid") not in nodes]
    return {**trace, "traceEvents": kept}
