"""Every tensor a model holds, wherever it lies, and reading the files some of them name.

ONNX lets any tensor keep its bytes in a file (``data_location = EXTERNAL``, the file named by
its ``external_data`` entry ``location``): dense and sparse initializers, the tensors of node
attributes (``Constant(value=...)``, ``Constant(sparse_value=...)``), in the main graph, in
subgraphs (``If``, ``Loop``, ``Scan`` bodies) and in the bodies of model-local functions. An
engine handed such a graph as bytes reads that file relative to its working directory. So
crossrt reads a model's files itself, only inside the model's folder (:func:`read_external`),
and checks with :func:`walk` that nothing it hands an engine still names one. onnx's own walk
(``external_data_helper._get_all_tensors``) misses sparse tensors and the initializers of
subgraphs inside functions.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import onnx

from ..errors import InvalidModelError

_EXTERNAL = onnx.TensorProto.EXTERNAL
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted as the file: open, then refused


@dataclass(frozen=True)
class Found:
    """A tensor of a model, and where it lies.

    Attributes:
        tensor: the tensor (the proto's own message: changing it changes the model).
        where: where it lies, for messages: ``"initializer 'W'"``, ``"attribute 'value' of
            node 'Constant_3' in the then_branch of node 'If_0'"``...
        main_initializer: whether it is a dense initializer of the main graph.
    """

    tensor: onnx.TensorProto
    where: str
    main_initializer: bool = False


def walk(proto: onnx.ModelProto) -> Iterator[Found]:
    """Every tensor of ``proto``: the initializers and sparse initializers (values and indices)
    of its graph, the tensors of every node attribute (``t``, ``tensors``, ``sparse_tensor``,
    ``sparse_tensors``), and all of these in every subgraph, in the bodies of the model's
    functions, and in its training graphs."""
    yield from _graph(proto.graph, "", main=True)
    for function in proto.functions:
        yield from _nodes(function.node, f" in function '{function.domain}.{function.name}'")
    for index, info in enumerate(proto.training_info):
        for name in ("initialization", "algorithm"):
            if info.HasField(name):
                yield from _graph(getattr(info, name), f" in training_info[{index}].{name}")


def names_a_file(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` keeps its bytes in a file (ONNX external data)."""
    return tensor.data_location == _EXTERNAL


def location(tensor: onnx.TensorProto) -> str:
    """The file ``tensor`` names for its bytes (``""`` when it names none)."""
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def files_named(proto: onnx.ModelProto) -> Iterator[Found]:
    """The tensors of ``proto`` that keep their bytes in a file."""
    return (found for found in walk(proto) if names_a_file(found.tensor))


def _graph(graph: onnx.GraphProto, suffix: str, main: bool = False) -> Iterator[Found]:
    for init in graph.initializer:
        yield Found(init, f"initializer {init.name!r}{suffix}", main)
    for sparse in graph.sparse_initializer:
        yield from _sparse(sparse, f"sparse initializer {sparse.values.name!r}{suffix}")
    yield from _nodes(graph.node, suffix)


def _nodes(nodes: Iterable[onnx.NodeProto], suffix: str) -> Iterator[Found]:
    for node in nodes:
        for attr in node.attribute:
            where = f"attribute {attr.name!r} of node {node.name or node.op_type!r}{suffix}"
            if attr.HasField("t"):
                yield Found(attr.t, where)
            for tensor in attr.tensors:
                yield Found(tensor, where)
            if attr.HasField("sparse_tensor"):
                yield from _sparse(attr.sparse_tensor, where)
            for sparse in attr.sparse_tensors:
                yield from _sparse(sparse, where)
            inner = f" in the {attr.name} of node {node.name or node.op_type!r}{suffix}"
            if attr.HasField("g"):
                yield from _graph(attr.g, inner)
            for sub in attr.graphs:
                yield from _graph(sub, inner)


def _sparse(sparse: onnx.SparseTensorProto, where: str) -> Iterator[Found]:
    yield Found(sparse.values, f"{where} (its values)")
    yield Found(sparse.indices, f"{where} (its indices)")


# -- reading a model's files --------------------------------------------------------------------


def read_external(proto: onnx.ModelProto, folder: str | os.PathLike[str], source: str) -> None:
    """Read every file ``proto``'s tensors name into the tensors, from inside ``folder`` only.

    A location is a relative path below ``folder``: an absolute path, a ``..`` step, or a
    symbolic link that leads out of the folder is refused, as is anything but a regular file
    (a FIFO would block, a device never end).

    Args:
        proto: the model, changed in place: each such tensor then holds its bytes.
        folder: the model's folder.
        source: the model, as messages name it.

    Raises:
        InvalidModelError: a location outside ``folder``, a file that is missing or cannot be
            read, or an offset or a length outside the file.
    """
    root = os.path.realpath(folder)
    for found in list(files_named(proto)):
        tensor = found.tensor
        fields = {entry.key: entry.value for entry in tensor.external_data}
        path = _inside(root, fields.get("location", ""), found, source)
        tensor.raw_data = _read(path, fields, found, source)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _inside(root: str, location: str, found: Found, source: str) -> str:
    """The real path of ``location`` below ``root``; refused when it leads elsewhere."""
    steps = location.replace("\\", "/").split("/")
    if not location or "\0" in location or os.path.isabs(location) or ".." in steps:
        raise _refused(found, location, source, "is not a relative path inside the model's folder")
    if ":" in steps[0]:  # a Windows drive ("C:secret") is not below the folder either
        raise _refused(found, location, source, "is not a relative path inside the model's folder")
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:  # a symbolic link on the way leads out
        raise _refused(found, location, source, "leads out of the model's folder")
    return path


def _read(path: str, fields: dict[str, str], found: Found, source: str) -> bytes:
    location = fields.get("location", "")
    try:
        offset = int(fields.get("offset", "0"))
        length = int(fields["length"]) if "length" in fields else None
    except ValueError:
        raise _refused(found, location, source, "has an offset or a length not a number") from None
    if offset < 0 or (length is not None and length < 0):
        raise _refused(found, location, source, "has a negative offset or length")
    try:
        # Not following a link: the real path has none left, unless one was planted since.
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except OSError as exc:
        raise _refused(found, location, source, f"cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        size = info.st_size
        if not stat.S_ISREG(info.st_mode):
            raise _refused(found, location, source, "is not a regular file")
        if length is None:
            length = max(size - offset, 0)
        if offset + length > size:
            raise _refused(
                found,
                location,
                source,
                f"holds {size} bytes; the tensor's lie at {offset}..{offset + length}",
            )
        file.seek(offset)
        data = file.read(length)
    if len(data) != length:
        raise _refused(found, location, source, "became shorter while it was read")
    return data


def _refused(found: Found, location: str, source: str, why: str) -> InvalidModelError:
    return InvalidModelError(
        f"model {source}: the {found.where} keeps its bytes in the file {location[:100]!r}, "
        f"which {why}; keep external data files in the model's folder, as onnx.save writes them",
        details={"source": source, "location": location[:100]},
    )
