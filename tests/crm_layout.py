"""Writes the `.crm` layout independently of crossrt's writer (docs/container.md), so tests
can build and edit containers byte by byte. Shared by the container, fuzz and stage tests."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from typing import Any


def align(n: int) -> int:
    """``n`` rounded up to a page: where a section may start."""
    return -(-n // 4096) * 4096


CHUNK = 16 << 20


def section_sha256(blob: bytes) -> bytes:
    """The SHA-256 of the SHA-256 digests of the section's 16 MiB chunks."""
    chunks = [blob[at : at + CHUNK] for at in range(0, len(blob), CHUNK)]
    return hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in chunks)).digest()


def sections_sha256(blobs: list[bytes]) -> str:
    """The SHA-256 of the sections' digests."""
    return hashlib.sha256(b"".join(section_sha256(b) for b in blobs)).hexdigest()


def prelude(text: bytes, version: int = 3) -> bytes:
    """The 64-byte prelude of a container whose header is ``text``."""
    digest = hashlib.sha256(text).digest()
    return struct.pack("<8sIIQ32s8x", b"CROSSRTM", version, 0, len(text), digest)


def split(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """The header and each section's bytes."""
    (length,) = struct.unpack_from("<Q", data, 16)
    header = json.loads(data[64 : 64 + length])
    blobs = [data[s["offset"] : s["offset"] + s["length"]] for s in header["sections"]]
    return header, blobs


def build(header: dict[str, Any], blobs: list[bytes]) -> bytes:
    """A container with a canonical layout: offsets and hashes recomputed for ``blobs``."""
    header["sections"] = [
        {"offset": 0, "length": len(b), "sha256": section_sha256(b).hex()} for b in blobs
    ]
    header["sections_sha256"] = sections_sha256(blobs)
    start = 0
    while True:
        offset = start
        for entry in header["sections"]:
            entry["offset"] = offset
            offset = align(offset + entry["length"])
        text = json.dumps(header).encode()
        if align(64 + len(text)) <= start:
            break
        start = align(64 + len(text))
    out = bytearray(prelude(text) + text)
    for entry, blob in zip(header["sections"], blobs, strict=True):
        out += bytes(entry["offset"] - len(out)) + blob
    return bytes(out)


def edit(data: bytes, change: Callable[[dict[str, Any]], Any]) -> bytes:
    """Apply ``change`` to the header and rebuild with a valid layout and valid hashes."""
    header, blobs = split(data)
    change(header)
    return build(header, blobs)


def patch_header(data: bytes, change: Callable[[dict[str, Any]], Any]) -> bytes:
    """Change the header in place (sections stay where they are), with its hash recomputed."""
    (length,) = struct.unpack_from("<Q", data, 16)
    header = json.loads(data[64 : 64 + length])
    change(header)
    room = min(s["offset"] for s in split(data)[0]["sections"]) - 64
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= room, "the edited header does not fit before the first section"
    text += b" " * (room - len(text))  # JSON allows trailing whitespace
    out = bytearray(data)
    out[16:24] = struct.pack("<Q", len(text))
    out[24:56] = hashlib.sha256(text).digest()
    out[64 : 64 + len(text)] = text
    return bytes(out)
