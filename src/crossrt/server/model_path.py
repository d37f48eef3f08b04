"""``crossrt serve --model NAME=PATH``: the model file a path names.

PATH is a ``.crm`` or ``.onnx`` file, or a folder as KServe's storage initializer leaves one
in ``/mnt/models``: the files of the ``storageUri`` (``model.onnx``, ``resnet.crm``), a
Triton model folder (``1/model.onnx``, the highest numbered version served) or a Triton
repository holding the folder ``NAME/``. What is not one of these is refused at start with
what was found, so a pod fails with the reason in its log instead of serving nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import InvalidOptionError
from .repository import LOAD_PARAMETERS, SUFFIXES, Entry, LoadOptions


def parse_model(text: str, parameters: Sequence[str] = ()) -> Entry:
    """The model of one ``--model NAME=PATH``, served under NAME, loaded with the load
    ``parameters`` (``KEY=VALUE``: ``instances=2``, ``max_batch_size=8``...).

    Raises:
        InvalidOptionError: no ``=``, an empty name, or no model file at PATH.
        InvalidArgumentError: a load parameter unknown or not valid.
    """
    name, path = model_name(text), str(text).partition("=")[2]
    if not name or not path.strip():
        raise InvalidOptionError(
            f"--model {text!r}: give NAME=PATH (the name clients call, as KServe's "
            "InferenceService name; PATH a .crm or .onnx file, or a folder such as "
            "/mnt/models)"
        )
    version, file = model_file(Path(path.strip()), name)
    return Entry(name, version, file, LoadOptions().with_values(load_parameters(parameters)))


def model_name(text: str) -> str:
    """The NAME of ``--model NAME=PATH`` (``''`` when there is no ``=``)."""
    name, sep, _ = str(text).partition("=")
    return name.strip() if sep else ""


def load_parameters(given: Sequence[str]) -> dict[str, str]:
    """``--load-parameter KEY=VALUE`` options as a mapping (checked by
    :meth:`LoadOptions.with_values`).

    Raises:
        InvalidOptionError: one without ``=``.
    """
    values = {}
    for text in given:
        key, sep, value = str(text).partition("=")
        if not sep or not key.strip():
            raise InvalidOptionError(
                f"--load-parameter {text!r}: give KEY=VALUE, KEY one of "
                f"{', '.join(LOAD_PARAMETERS)} (instances=2, max_batch_size=8)"
            )
        values[key.strip()] = value.strip()
    return values


def model_file(path: Path, name: str) -> tuple[str, Path]:
    """(version, file) of the model at ``path`` (a file, or a folder as KServe leaves it).

    Raises:
        InvalidOptionError: no such file or folder, or no single model in the folder.
    """
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise InvalidOptionError(
                f"--model {name}={path}: a model is a .crm or .onnx file; compile other "
                "formats to .onnx first"
            )
        version = path.parent.name if path.parent.name.isdigit() else "1"
        return version, path
    if not path.is_dir():
        raise InvalidOptionError(
            f"--model {name}={path}: no such file or folder (under KServe, the model is "
            "downloaded to /mnt/models: check the InferenceService's storageUri)"
        )
    found = _in_folder(path, name)
    if found is not None:
        return found
    inner = path / name  # a Triton repository: /mnt/models/NAME/1/model.onnx
    if inner.is_dir():
        found = _in_folder(inner, name)
        if found is not None:
            return found
    listed = sorted(p.name for p in path.iterdir())[:20]
    raise InvalidOptionError(
        f"--model {name}={path}: no model in this folder (found {listed or 'nothing'}); "
        f"expected one .crm or .onnx file, VERSION/model.crm or .onnx, or {name}/ holding "
        "them"
    )


def _in_folder(folder: Path, name: str) -> tuple[str, Path] | None:
    """The one model file directly in ``folder``, else its highest numbered version's
    ``model.{crm,onnx}``; ``None`` when there is neither."""
    files = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if files:
        stems = {p.stem for p in files}
        if len(stems) > 1:
            # Several models: the one named for the model, else model.*, else refused.
            wanted = name if name in stems else "model" if "model" in stems else None
            if wanted is None:
                raise InvalidOptionError(
                    f"--model {name}={folder}: several models here "
                    f"({', '.join(p.name for p in files)}); name the file, or keep one"
                )
            files = [p for p in files if p.stem == wanted]
        # A .crm wins over the .onnx it was compiled from, as in the repository.
        return "1", min(files, key=lambda p: SUFFIXES.index(p.suffix))
    versions = sorted((int(v.name), v) for v in folder.iterdir() if v.is_dir() and v.name.isdigit())
    for number, version in reversed(versions):
        for suffix in SUFFIXES:
            if (version / f"model{suffix}").is_file():
                return str(number), version / f"model{suffix}"
    return None
