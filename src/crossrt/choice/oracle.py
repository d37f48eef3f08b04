"""The oracle that ``crossrt verify`` and ``device="auto"`` check engines against.

First choice: the ``reference`` driver (``onnx.reference``, NumPy), independent of every engine.
It does not hold on every real model: it keeps every intermediate value of a run until the run
ends (an EEG model wanted 15-29 GiB, and ``auto`` was once OOM-killed at 18 GB), and it has its
own bugs (a Squeeze on a file-type classifier) and gaps (ZipMap). So it is bounded and has a
stand-in:

1. **Estimate first**: a graph of more than :data:`GRAPH_BYTES` besides its weights (node
   attributes: a tree ensemble) is not run, as the evaluator walks it in Python. Nor is a
   model whose values would exceed the memory bound (``CROSSRT_REFERENCE_MEMORY``, default
   half of the host's usable memory): the bytes the evaluator would hold, from the model's
   value shapes after shape inference with the probe's shapes (every initializer, input and
   intermediate value whose shape is known: the evaluator frees none of them before the run
   ends).
2. **Run it in a child process, bounded**: its address space limited to what it holds once
   its modules are imported plus the bound (``RLIMIT_AS``: an allocation past it is a
   ``MemoryError`` there, not the OOM killer here), killed after :data:`REFERENCE_SECONDS`
   (one node can run for minutes: onnx.reference's tree ensembles are Python loops). A run
   that fails, or runs out of memory or time, is the oracle's failure, never the user's
   inputs'. Only arrays (``.npy``, no pickle) and JSON cross between the processes.
3. **Else ONNX Runtime at fp32** (the model's own precision, default options, the fallback
   given): another engine, said so in :attr:`Oracle.name`, with the reference's reason.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..compiler import compile_for_device
from ..config import settings
from ..drivers import CompileOptions, CoreSet, get_driver
from ..dtypes import TABLE
from ..errors import CrossrtError, DeadlineExceededError, ExecutionError
from ..host import usable_memory
from ..model import Model
from ..runtime import Runtime

REFERENCE_SECONDS = 60.0
"""How long one run of the reference may take before the stand-in answers instead."""

GRAPH_BYTES = 16 * 2**20
"""A graph larger than this without its weights is not evaluated by the reference: its bytes
are node attributes, which onnx.reference turns into Python objects and, for tree ensembles,
walks in Python loops (10 s for a 15 MB ensemble of 240 trees on one row here: minutes for the
160 MB of a large LightGBM export)."""

STAND_IN = "onnxruntime"
"""The engine that answers when the reference cannot: the default CPU engine, at fp32."""

_ITEMSIZE = {d.onnx: max(1, (d.bits or 8) // 8) for d in TABLE}


@dataclass(frozen=True)
class Oracle:
    """The expected outputs and who computed them.

    Attributes:
        outputs: output name -> array (or a sequence or map, as the model's output is).
        name: ``"reference"``, or the stand-in engine, device and precision.
        why: why the reference did not answer (``""`` when it did).
    """

    outputs: dict[str, Any]
    name: str
    why: str = ""

    @property
    def said(self) -> str:
        """The oracle in a sentence: ``reference``, or the stand-in and why."""
        return self.name if not self.why else f"{self.name} (the reference driver: {self.why})"


def expected_outputs(
    model: Model,
    inputs: Mapping[str, np.ndarray],
    fallback: str | Sequence[str] | None = None,
    seconds: float = REFERENCE_SECONDS,
) -> Oracle:
    """The outputs of ``model`` on ``inputs``, from the reference or, where it cannot answer
    within its bounds, from ONNX Runtime at fp32.

    Raises:
        CrossrtError: neither can run the model (the message says what each said), of the
            stand-in's class and status.
    """
    why = reference_refusal(model, inputs)
    if not why:
        try:
            return Oracle(_reference(model, inputs, seconds), "reference")
        except CrossrtError as exc:
            why = _short(exc.message)
    try:
        exe = compile_for_device(model, "cpu", driver=STAND_IN, fallback=fallback)
        with Runtime() as rt:
            got = rt.load(exe).run(dict(inputs))
    except CrossrtError as exc:  # with the stand-in's status: unsupported, or failed at run
        raise type(exc)(
            f"no oracle can check {model.name!r}: the reference driver: {why}; {STAND_IN} at "
            f"fp32: {_short(exc.message)}",
            exc.code,
            {**exc.details, "reference": why},
        ) from None
    return Oracle(dict(got), f"{STAND_IN} {exe.device} at fp32", why)


def _reference(model: Model, inputs: Mapping[str, np.ndarray], seconds: float) -> dict[str, Any]:
    """The reference's outputs, computed in a child process within the bounds."""
    exe = compile_for_device(model, "cpu", driver="reference")  # refuses what it lacks
    bound = _bound()
    with tempfile.TemporaryDirectory(prefix="crossrt-oracle-") as tmp:
        folder = Path(tmp)
        (folder / "model.onnx").write_bytes(exe.nodes[0].artifact)
        (folder / "inputs.json").write_text(json.dumps(_write(folder, "in", dict(inputs))))
        command = [sys.executable, "-m", __name__, str(folder), str(bound)]
        try:
            done = subprocess.run(command, timeout=seconds, capture_output=True, text=True)
        except subprocess.TimeoutExpired:  # run() kills the child
            raise DeadlineExceededError(f"it ran past {seconds:g} s and was stopped") from None
        answer_file = folder / "answer.json"
        if not answer_file.exists():
            tail = " ".join(done.stderr.split()[-30:])
            raise ExecutionError(f"its process ended with status {done.returncode}: {tail}")
        answer = json.loads(answer_file.read_text())
        if answer.get("error"):
            raise ExecutionError(str(answer["error"]))
        outputs: dict[str, Any] = _read(folder, answer["outputs"])
        return outputs


def _child(folder: Path, bound: int) -> None:
    """The child's work: the reference's outputs of ``folder``'s model and inputs, with its
    address space limited to what it holds once its modules are imported plus ``bound``."""
    import resource

    import onnx.reference.ops  # noqa: F401  (imported before the limit is set)

    drv = get_driver("reference")
    held = _address_space()
    if held is not None:
        resource.setrlimit(resource.RLIMIT_AS, (held + bound, held + bound))
    answer: dict[str, Any] = {}
    try:
        device = drv.devices()[0]
        artifact = (folder / "model.onnx").read_bytes()
        program = drv.load(artifact, device, CoreSet((0,)), CompileOptions())
        got = program.run(_read(folder, json.loads((folder / "inputs.json").read_text())))
        answer["outputs"] = _write(folder, "out", dict(got))
    except MemoryError:
        answer["error"] = f"it ran out of memory within the bound {_gib(bound)}"
    except CrossrtError as exc:  # the driver reports an evaluator's MemoryError as its own
        out_of_memory = "MemoryError" in exc.message
        said = f"it ran out of memory within the bound {_gib(bound)}: " if out_of_memory else ""
        answer["error"] = said + exc.message
    (folder / "answer.json").write_text(json.dumps(answer))


def _address_space() -> int | None:
    """This process's virtual memory size (``VmSize``), or ``None`` where /proc lacks it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _write(folder: Path, prefix: str, value: Any) -> Any:
    """``value`` as JSON, its arrays saved beside it as ``.npy`` files (no pickle): maps as
    ``{"map": [[key, value], ...]}``, sequences as ``{"seq": [...]}``."""
    if isinstance(value, Mapping):
        items = [[k, _write(folder, f"{prefix}_{i}", v)] for i, (k, v) in enumerate(value.items())]
        return {"map": items}
    if isinstance(value, list | tuple):
        return {"seq": [_write(folder, f"{prefix}_{i}", v) for i, v in enumerate(value)]}
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype == object:  # strings: as NumPy's own text type
        array = array.astype(str)
    np.save(folder / f"{prefix}.npy", array, allow_pickle=False)
    return {"npy": f"{prefix}.npy"}


def _read(folder: Path, value: Any) -> Any:
    if value is None:
        return None
    if "npy" in value:
        return np.load(folder / Path(str(value["npy"])).name, allow_pickle=False)
    if "seq" in value:
        return [_read(folder, v) for v in value["seq"]]
    return {k: _read(folder, v) for k, v in value["map"]}


def _bound() -> int:
    """The reference's memory bound: ``CROSSRT_REFERENCE_MEMORY``, else half of usable memory."""
    return settings().reference_memory or usable_memory() // 2


def reference_refusal(model: Model, inputs: Mapping[str, np.ndarray]) -> str:
    """Why the reference is not even tried on this model (``""``: try it)."""
    graph = model.skeleton.proto.ByteSize()  # the graph and attributes, not large weights
    if graph > GRAPH_BYTES:
        return (
            f"its graph holds {_gib(graph)} besides its weights (node attributes: a tree "
            "ensemble's trees), which onnx.reference turns into Python objects and walks in "
            f"Python; more than {_gib(GRAPH_BYTES)}"
        )
    bound = _bound()
    need = reference_footprint(model, inputs)
    if need is not None and bound and need > bound:
        return (
            f"it would hold about {_gib(need)} (onnx.reference keeps every intermediate value "
            f"until the run ends), over the bound {_gib(bound)} (CROSSRT_REFERENCE_MEMORY, "
            "default half of this host's memory)"
        )
    return ""


def reference_footprint(model: Model, inputs: Mapping[str, np.ndarray]) -> int | None:
    """Bytes the reference evaluator holds at the end of a run on ``inputs``: every
    initializer, input, and value whose shape shape inference finds with the inputs' shapes
    (a lower bound: operators' scratch and values of unknown shape are not counted). ``None``
    when shape inference fails."""
    light = onnx.ModelProto()
    light.CopyFrom(model.skeleton.proto)  # no weights' bytes: cheap to infer on
    for value in light.graph.input:
        given = inputs.get(value.name)
        if given is None or not value.type.HasField("tensor_type"):
            continue
        shape = value.type.tensor_type.shape
        shape.ClearField("dim")
        for size in np.shape(given):
            shape.dim.add().dim_value = int(size)
    try:
        # No data propagation: onnx computes elementwise values with it, whatever their size
        # (a chain of 64 MiB values took 23 GB, and the OOM killer ended crossrt verify).
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # onnx raises several kinds; an estimate is only a hint
        return None
    total = sum(np.asarray(v).nbytes for v in inputs.values())
    for init in model.proto.graph.initializer:
        total += math.prod(init.dims) * _ITEMSIZE.get(init.data_type, 8)
    graph = inferred.graph
    for value in [*graph.value_info, *graph.output]:
        total += _bytes(value.type)
    return total


def compare(got: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple[float, float]:
    """The largest absolute difference over the outputs, and the scale it is judged at:
    ``max(1, max |expected|)`` of the output where the difference relative to it is largest.
    ``inf`` when an output differs in structure, shape, NaNs or exact (integer, string)
    values. Sequences and maps (a ZipMap's list of {label: probability}) are compared element
    by element."""
    worst, scale = 0.0, 1.0
    for name, want in expected.items():
        if name not in got:
            return float("inf"), 1.0
        mine, theirs = list(_leaves(got[name])), list(_leaves(want))
        if [p for p, _ in mine] != [p for p, _ in theirs]:
            return float("inf"), 1.0
        for (_, a), (_, b) in zip(mine, theirs, strict=True):
            err, out_scale = _difference(a, b)
            if not math.isfinite(err):
                return float("inf"), 1.0
            if err / out_scale > worst / scale:
                worst, scale = err, out_scale
    return worst, scale


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The arrays in an output, each with where it is (indices of sequences, keys of maps)."""
    if isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            yield from _leaves(value[key], (*path, ("key", repr(key))))
    elif isinstance(value, list | tuple):
        yield (*path, ("length", len(value))), None
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, np.asarray(value)


def _difference(a: Any, b: Any) -> tuple[float, float]:
    if a is None or b is None:
        return (0.0, 1.0) if a is None and b is None else (float("inf"), 1.0)
    if a.shape != b.shape:
        return float("inf"), 1.0
    if a.size == 0:
        return 0.0, 1.0
    if b.dtype.kind not in "fc":
        return (0.0, 1.0) if np.array_equal(a, b) else (float("inf"), 1.0)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not (np.isnan(a64) == np.isnan(b64)).all():
        return float("inf"), 1.0
    finite = np.isfinite(b64)
    diff = np.abs(a64[finite] - b64[finite])
    if not diff.size:
        return 0.0, 1.0
    return float(diff.max()), max(1.0, float(np.abs(b64[finite]).max()))


def _bytes(t: onnx.TypeProto) -> int:
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return 0
    dims = t.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return 0
    return int(math.prod(d.dim_value for d in dims)) * _ITEMSIZE.get(t.tensor_type.elem_type, 8)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _short(message: str) -> str:
    return message if len(message) <= 300 else message[:297] + "..."


if __name__ == "__main__":  # the child process of _reference
    _child(Path(sys.argv[1]), int(sys.argv[2]))
