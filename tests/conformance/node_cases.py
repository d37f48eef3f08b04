"""The ONNX backend node test cases, generated from the installed onnx and cached on disk.

onnx wheels no longer ship the node test data (``onnx/backend/test/data/node``), but onnx
can regenerate it: ``onnx.backend.test.case.node.collect_testcases()`` builds every case's
model, inputs and expected outputs from the operators' documented examples.

Why a cache: generating takes about 7 s on a 2-core machine, reading the cache back about
0.5 s, and every test session needs the cases. The cache is written in the layout onnx used to
ship (``<case>/model.onnx``, ``<case>/test_data_set_<k>/{input,output}_<i>.pb``), so any ONNX
backend runner can read it too, and the values round-trip through the same protobufs
(TensorProto, SequenceProto, OptionalProto, MapProto) as the official files, which is also
what normalises them: TensorProto values become arrays, NumPy scalars 0-d arrays.

It lives in ``<repo>/.cache/onnx-node-tests/onnx-<version>/``: another onnx version gets a
fresh folder and the old one is removed. A cache is written into a temporary folder beside
it and renamed into place, and the loader reads only a folder holding the case list written
last, so an aborted or concurrent run never leaves, or reads, a half-written cache.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

CACHE_ROOT = Path(__file__).resolve().parents[2] / ".cache" / "onnx-node-tests"

_CASE_LIST = "cases.txt"  # written last: its presence marks a complete cache
_ABANDONED_AFTER_S = 3600  # a temporary folder this old belongs to an aborted run


@dataclass(frozen=True)
class NodeCase:
    """One node test: a model of one operator (or of its expanded function body) and its
    (inputs, expected outputs) data sets."""

    name: str
    model_path: Path
    data_sets: list[tuple[list[Any], list[Any]]]


def load_node_cases(root: Path = CACHE_ROOT) -> list[NodeCase]:
    """Every node test of the installed onnx, from the cache (generated when missing)."""
    return [read_case(name, root) for name in load_case_names(root)]


def load_case_names(root: Path = CACHE_ROOT) -> list[str]:
    """The names of the installed onnx's node tests (the cache is generated when missing):
    enough to collect the suite without reading every case."""
    folder = _folder(root)
    if (folder / _CASE_LIST).is_file():
        _remove_stale(root, keep=None)
    else:
        _generate(root, folder)
    return (folder / _CASE_LIST).read_text(encoding="utf-8").split()


def read_case(name: str, root: Path = CACHE_ROOT) -> NodeCase:
    """One case of the cache that :func:`load_case_names` made."""
    return _read_case(_folder(root) / name)


def _folder(root: Path) -> Path:
    return root / f"onnx-{onnx.__version__}"


# -- writing ----------------------------------------------------------------------------------


def _generate(root: Path, folder: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, keep=folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is not
    try:
        names = [_write_case(tmp, case) for case in _collect()]
        (tmp / _CASE_LIST).write_text("\n".join(names) + "\n", encoding="utf-8")
        if folder.exists() and not (folder / _CASE_LIST).is_file():
            shutil.rmtree(folder)  # incomplete (emptied by hand?): replace it
        try:
            tmp.rename(folder)  # atomic
        except OSError:
            if not (folder / _CASE_LIST).is_file():
                raise
            # a concurrent run renamed its complete cache into place first: use that one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale(root: Path, keep: Path | None) -> None:
    """Temporary folders of aborted runs and, unless ``keep`` is None, caches of other onnx
    versions."""
    for entry in root.iterdir() if root.is_dir() else ():
        other_version = keep is not None and entry.name.startswith("onnx-") and entry != keep
        abandoned = entry.name.startswith(".onnx-") and (
            time.time() - entry.stat().st_mtime > _ABANDONED_AFTER_S
        )
        if entry.is_dir() and (other_version or abandoned):
            shutil.rmtree(entry, ignore_errors=True)


def _collect() -> Iterable[Any]:
    # The generators cast out-of-range values and divide by zero on purpose.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        # imported here: only a run that (re)generates the cache needs it
        from onnx.backend.test.case.node import collect_testcases

        return list(collect_testcases())


def _write_case(root: Path, case: Any) -> str:
    folder = root / case.name
    folder.mkdir()
    graph = case.model.graph
    (folder / "model.onnx").write_bytes(case.model.SerializeToString())
    for k, (inputs, outputs) in enumerate(case.data_sets):
        data = folder / f"test_data_set_{k}"
        data.mkdir()
        for kind, values, infos in (
            ("input", inputs, graph.input),
            ("output", outputs, graph.output),
        ):
            for i, (value, info) in enumerate(zip(values, infos, strict=True)):
                (data / f"{kind}_{i}.pb").write_bytes(_to_proto(value, info).SerializeToString())
    return str(case.name)


def _to_proto(value: Any, info: onnx.ValueInfoProto) -> Any:
    """As ``onnx.backend.test.cmd_tools generate-data`` writes a value of this type."""
    kind = info.type.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list(value, info.name)
    if kind == "optional_type":
        return numpy_helper.from_optional(value, info.name)
    if kind == "map_type":
        return numpy_helper.from_dict(value, info.name)
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(np.asarray(value), info.name)


# -- reading ----------------------------------------------------------------------------------


def _read_case(folder: Path) -> NodeCase:
    model_path = folder / "model.onnx"
    graph = onnx.load_model(model_path, load_external_data=False).graph
    data_sets = []
    k = 0
    while (data := folder / f"test_data_set_{k}").is_dir():
        inputs = _read_values(data, "input", graph.input)
        outputs = _read_values(data, "output", graph.output)
        data_sets.append((inputs, outputs))
        k += 1
    return NodeCase(folder.name, model_path, data_sets)


def _read_values(folder: Path, kind: str, infos: Iterable[onnx.ValueInfoProto]) -> list[Any]:
    values = []
    for i, info in enumerate(infos):
        path = folder / f"{kind}_{i}.pb"
        if not path.is_file():
            break
        values.append(_from_proto(path.read_bytes(), info.type))
    return values


def _from_proto(data: bytes, type_: onnx.TypeProto) -> Any:
    """As the ONNX backend runner reads a ``.pb`` value (``Runner._load_proto``)."""
    kind = type_.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.to_list(onnx.SequenceProto.FromString(data))
    if kind == "optional_type":
        return numpy_helper.to_optional(onnx.OptionalProto.FromString(data))
    if kind == "map_type":
        return numpy_helper.to_dict(onnx.MapProto.FromString(data))
    return numpy_helper.to_array(onnx.TensorProto.FromString(data))
