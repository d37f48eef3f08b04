"""The bytes of a ``.crm`` file: prelude, JSON header, section table and sections.

Layout (docs/container.md has every field and rule)::

    magic "CROSSRTM" | format version u32 | flags u32 | header length u64 | SHA-256(header)
    | zero padding to 64 | JSON header | zero padding | sections, each at a page (4096)

This module knows the file, not what its networks mean: it writes a header's ``networks``
given to it and reads them back as JSON (header.py), checked within the limits, with every
offset and length checked against the file. Turning networks into Executables and back is
executable.py's and networks.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import secrets
import struct
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from stat import S_ISCHR, S_ISDIR, S_ISFIFO, S_ISREG, S_ISSOCK
from typing import Any

from ..drivers.base import ArtifactFile
from ..errors import (
    InvalidArgumentError,
    ModelNotFoundError,
    StatusCode,
    UnsupportedError,
)
from ..host import host_cpus
from .header import (
    bad_field,
    corrupt,
    decode_header,
    encode_header,
    field,
    is_count,
    is_dict,
    is_int,
    is_nonempty_list,
    is_sha,
    is_str,
    size_breach,
)

MAGIC = b"CROSSRTM"
FORMAT_VERSION = 3
"""The one version this crossrt writes and reads (docs/container.md, Versioning)."""
PRELUDE_SIZE = 64
PAGE = 4096
"""Every section starts at a multiple of this (see :func:`page`)."""
CHUNK = 16 << 20
"""A section's digest is the digest of its chunks' digests, chunks of this many bytes."""

# magic, format version, flags, header length, SHA-256 of the header, 8 reserved zero bytes.
_PRELUDE = struct.Struct("<8sIIQ32s8x")
_FLAGS = 0  # no flag is defined yet; a reader refuses bits it does not know

Source = str | os.PathLike[str] | bytes | bytearray | memoryview
FileIdentity = tuple[str, tuple[int, int, int, int]]
"""A mapped file's absolute path and identity (:meth:`ArtifactFile.identity_of`)."""


def crossrt_version() -> str:
    """The installed crossrt's version: the container's ``producer.version``."""
    try:
        return version("crossrt")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0+source"


def page(offset: int) -> int:
    """``offset`` rounded up to a page: sections start there so that the alignment an artifact
    gives its parts holds in the file too (ONNX Runtime maps a pre-packed weight only at a
    file offset that is a multiple of 256, and copies it into every session otherwise)."""
    return -(-offset // PAGE) * PAGE


def section_digests(sections: Sequence[bytes | memoryview]) -> list[bytes]:
    """Each section's digest, its ``sha256`` in the section table: the SHA-256 of the
    concatenated SHA-256 digests of its :data:`CHUNK`-byte chunks, in order (the last one
    shorter; an empty section has no chunk), so that a large section is hashed on every
    usable core at once: hashlib lets go of the GIL."""
    views = [memoryview(data).cast("B") for data in sections]
    chunks = [
        (i, view[at : at + CHUNK])
        for i, view in enumerate(views)
        for at in range(0, len(view), CHUNK)
    ]
    workers = min(len(chunks), host_cpus().limit)
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="crossrt-sha256") as pool:
            found = list(pool.map(lambda chunk: hashlib.sha256(chunk[1]).digest(), chunks))
    else:
        found = [hashlib.sha256(chunk).digest() for _, chunk in chunks]
    parts: list[list[bytes]] = [[] for _ in views]
    for (i, _), digest in zip(chunks, found, strict=True):
        parts[i].append(digest)
    return [hashlib.sha256(b"".join(p)).digest() for p in parts]


def sections_digest(digests: list[bytes]) -> str:
    """``sections_sha256``: the SHA-256 of the sections' digests, in table order, so that no
    section byte is hashed twice."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


# -- writing -----------------------------------------------------------------------------------


class SectionTable:
    """The sections of a container being written; identical artifacts are stored once."""

    def __init__(self) -> None:
        self.sections: list[bytes | memoryview] = []
        self.digests: list[bytes] = []
        self._index: dict[tuple[bytes, int], int] = {}

    def add(self, artifact: bytes | memoryview) -> int:
        """The index of the section holding ``artifact``, added unless an identical one is."""
        data = artifact if isinstance(artifact, bytes) else memoryview(artifact).cast("B")
        (sha,) = section_digests([data])
        key = (sha, len(data))
        if key not in self._index:
            self._index[key] = len(self.sections)
            self.sections.append(data)
            self.digests.append(sha)
        return self._index[key]


def container_chunks(
    networks: list[dict[str, Any]], table: SectionTable
) -> list[bytes | memoryview]:
    """The container's bytes, in pieces (the sections are not copied), for the header's
    ``networks`` whose nodes name sections of ``table``.

    Raises:
        InvalidArgumentError: the header would hold a value JSON cannot, or break a limit.
    """
    entries: list[dict[str, Any]] = [
        {"offset": 0, "length": len(data), "sha256": sha.hex()}
        for data, sha in zip(table.sections, table.digests, strict=True)
    ]
    header: dict[str, Any] = {
        "producer": {"name": "crossrt", "version": crossrt_version()},
        "format_version": FORMAT_VERSION,
        "networks": networks,
        "sections": entries,
        "sections_sha256": sections_digest(table.digests),
    }
    # Offsets are absolute, so they depend on the header's length, which depends on them:
    # grow the data start until the header fits before it (it only grows, so this ends).
    start = 0
    while True:
        offset = start
        for entry in entries:
            entry["offset"] = offset
            offset = page(offset + entry["length"])
        text = encode_header(header)
        if page(PRELUDE_SIZE + len(text)) <= start:
            break
        start = page(PRELUDE_SIZE + len(text))
    digest = hashlib.sha256(text).digest()
    chunks: list[bytes | memoryview] = [
        _PRELUDE.pack(MAGIC, FORMAT_VERSION, _FLAGS, len(text), digest),
        text,
    ]
    end = PRELUDE_SIZE + len(text)
    for entry, data in zip(entries, table.sections, strict=True):
        chunks += [bytes(entry["offset"] - end), data]
        end = entry["offset"] + entry["length"]
    return chunks


def write_file(chunks: list[bytes | memoryview], path: str | os.PathLike[str]) -> None:
    """Write ``chunks`` to ``path`` atomically: a temporary file in the same directory,
    fsynced and renamed over ``path``.

    Raises:
        InvalidArgumentError: the file cannot be written.
    """
    target = Path(os.fspath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 lets the umask decide the mode, as for any file the user writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the parent may be a file: nothing to clean then
            tmp.unlink(missing_ok=True)
        raise InvalidArgumentError(
            f"cannot write the container {str(target)!r}: {exc.strerror or exc}; check that the "
            "directory exists, is writable and has space",
            details={"path": str(target)},
        ) from None


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A container whose prelude, header (as JSON, within the limits) and section table are
    checked; its networks and section hashes are not yet.

    Attributes:
        header: the JSON header; its ``producer``, ``sections`` and ``sections_sha256``
            checked, its ``networks`` not.
        sections: each section's bytes, a view into the file or buffer.
        size: the container's size in bytes.
        file: the mapped file's absolute path and identity; ``None`` for a buffer.
    """

    header: dict[str, Any]
    sections: tuple[memoryview, ...]
    size: int
    file: FileIdentity | None


def read_layout(source: Source) -> Layout:
    """Open ``source`` and check everything but the networks and the section hashes.

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidArgumentError: the path or buffer cannot be read.
        InvalidContainerError: the container is truncated, corrupt, malformed or over a limit.
        UnsupportedError: (UNSUPPORTED_NEFF_VERSION) it is in another format version.
    """
    view, file = _open(source)
    text = _header_bytes(view)
    header = decode_header(text)
    if field(header, "format_version", "", "an integer", is_int) != FORMAT_VERSION:
        raise corrupt(
            f"header field format_version is {header['format_version']}, the prelude "
            f"{FORMAT_VERSION}"
        )
    producer = field(header, "producer", "", "an object", is_dict)
    for key in ("name", "version"):
        field(producer, key, "producer", "a string", is_str)
    entries = field(header, "sections", "", "a non-empty list", is_nonempty_list)
    field(header, "sections_sha256", "", "a SHA-256 (64 lowercase hex digits)", is_sha)
    sections = _sections(entries, view, PRELUDE_SIZE + len(text))
    return Layout(header, sections, len(view), file)


def check_hashes(layout: Layout, users: Mapping[int, str]) -> None:
    """Check each section's SHA-256 and ``sections_sha256`` (each byte is hashed once).

    Args:
        layout: the container.
        users: who uses each section, for the message (``node 'x' of network 'y'``).

    Raises:
        InvalidContainerError: a section's bytes were modified, or the table's digest.
    """
    entries = layout.header["sections"]
    digests = section_digests(layout.sections)
    for i, (entry, data, found) in enumerate(zip(entries, layout.sections, digests, strict=True)):
        if found.hex() != entry["sha256"]:
            raise corrupt(
                f"section {i} ({users.get(i, 'unused')}, {len(data)} bytes at offset "
                f"{entry['offset']}) fails its SHA-256 check: its bytes were modified"
            )
    if sections_digest(digests) != layout.header["sections_sha256"]:
        raise corrupt("sections_sha256 does not match the sections")


def _header_bytes(view: memoryview) -> memoryview:
    """The header's bytes, the prelude checked (the header's size before anything reads it)."""
    if len(view) < PRELUDE_SIZE:
        raise corrupt(f"it is truncated: {len(view)} bytes, less than the 64-byte prelude")
    magic, fmt, flags, length, digest = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise corrupt(
            f"it does not start with {MAGIC!r} (found {bytes(magic)!r}), so it is not a crossrt "
            "container; an ONNX model is loaded with crossrt.compile or crossrt.load_model"
        )
    if fmt == 0:
        raise corrupt("its prelude is damaged: format version 0 (versions start at 1)")
    if fmt != FORMAT_VERSION or flags & ~_FLAGS:
        raise _unsupported(fmt, flags)
    if any(view[56:64]):
        raise corrupt("its prelude is damaged: the reserved bytes 56 to 63 are not zero")
    too_big = size_breach(length)
    if too_big is not None:
        raise corrupt(too_big)
    if length > len(view) - PRELUDE_SIZE:
        raise corrupt(
            f"it is truncated: the header needs {length} bytes after the prelude, the "
            f"container has {len(view) - PRELUDE_SIZE}"
        )
    text = view[PRELUDE_SIZE : PRELUDE_SIZE + length]
    if hashlib.sha256(text).digest() != digest:
        raise corrupt("the header's SHA-256 does not match (the header bytes were modified)")
    return text


def _unsupported(fmt: int, flags: int) -> UnsupportedError:
    this = f"this crossrt ({crossrt_version()}) reads format version {FORMAT_VERSION} only"
    if fmt < FORMAT_VERSION:
        # Until 1.0 there is one format: older files are compiled again, not read by old code.
        why = (
            f"the container uses format version {fmt}, written by an older crossrt; {this}; "
            "compile the model again with this crossrt (`crossrt compile`, or "
            "crossrt.compile(...).save(path))"
        )
    else:
        what = f"format version {fmt}" if fmt > FORMAT_VERSION else f"flags {flags:#x}"
        why = f"the container uses {what}; {this}, with no flags; upgrade crossrt to load it"
    return UnsupportedError(
        why,
        code=StatusCode.UNSUPPORTED_NEFF_VERSION,
        details={"format_version": fmt, "supported": FORMAT_VERSION, "flags": flags},
    )


def _sections(entries: list[Any], view: memoryview, header_end: int) -> tuple[memoryview, ...]:
    size = len(view)
    end = header_end  # where what precedes the next section ends
    found = []
    for i, entry in enumerate(entries):
        where = f"sections[{i}]"
        if not isinstance(entry, dict):
            raise bad_field(where, "an object", entry)
        offset = field(entry, "offset", where, "an integer >= 0", is_count)
        length = field(entry, "length", where, "an integer >= 0", is_count)
        field(entry, "sha256", where, "a SHA-256 (64 lowercase hex digits)", is_sha)
        if offset % PAGE:
            raise corrupt(f"{where}.offset {offset} is not a multiple of {PAGE}")
        if offset < end:
            what = "the header" if i == 0 else f"section {i - 1}"
            raise corrupt(f"{where} at offset {offset} overlaps {what}, which ends at {end}")
        if offset + length > size:
            raise corrupt(
                f"it is truncated: {where} ends at byte {offset + length}, the container has "
                f"{size} bytes"
            )
        # Padding must be zero, so that every byte of the file is checked by something.
        if offset > end and view[end:offset] != bytes(offset - end):
            raise corrupt(f"the padding before {where} (bytes {end} to {offset}) is not zero")
        found.append(view[offset : offset + length])
        end = offset + length
    if end != size:
        raise corrupt(f"{size - end} bytes follow the last section, which ends at byte {end}")
    return tuple(found)


def _open(source: Source) -> tuple[memoryview, FileIdentity | None]:
    """The container's bytes, and for a file its absolute path and identity when mapped."""
    if isinstance(source, bytes | bytearray | memoryview):
        try:
            view = memoryview(source)
            if not view.c_contiguous:
                raise TypeError("it is not C-contiguous")
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
        except (TypeError, ValueError) as exc:  # also a released memoryview
            raise InvalidArgumentError(
                f"cannot read a container from this buffer ({exc}); pass bytes, a bytearray "
                "or a contiguous memoryview"
            ) from None
        return view, None
    if not isinstance(source, str | os.PathLike):
        raise InvalidArgumentError(
            f"cannot read a container from a {type(source).__name__}; give a path, bytes, "
            "bytearray or memoryview"
        )
    path = os.fspath(source)
    try:
        # Opened without blocking, and refused unless a regular file: opening a FIFO for
        # reading waits for a writer forever, a device or socket is no container.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb", closefd=True) as f:
            stat = os.fstat(f.fileno())
            if not S_ISREG(stat.st_mode):
                raise InvalidArgumentError(
                    f"cannot read the container {path!r}: it is not a regular file (a "
                    f"{_file_kind(stat.st_mode)}); give a .crm file",
                    details={"path": path},
                )
            if stat.st_size == 0:
                return memoryview(b""), None  # mmap refuses empty files; the caller reports it
            # The view keeps the mapping alive; the mapping keeps its own descriptor.
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            return view, (os.path.abspath(path), ArtifactFile.identity_of(stat))
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"no container at {path!r}; check the path (write one with crossrt compile "
            "--output or Executable.save)",
            details={"path": path},
        ) from None
    except (OSError, ValueError) as exc:  # a directory, no permission, a path with a NUL
        raise InvalidArgumentError(
            f"cannot read the container {path!r}: {getattr(exc, 'strerror', None) or exc}; "
            "give a readable .crm file",
            details={"path": path},
        ) from None


def _file_kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    kinds = ((S_ISDIR, "directory"), (S_ISFIFO, "FIFO"), (S_ISSOCK, "socket"), (S_ISCHR, "device"))
    return next((name for test, name in kinds if test(mode)), "special file")
