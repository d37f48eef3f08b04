"""Loading a bmodel (a ``.crm``) the other ways: into device memory the caller allocated
(``bmrt_get_bmodel_info`` + ``bmrt_load_bmodel_with_mem``), encrypted
(``bmrt_load_bmodel_with_decrypt`` / ``_lib``), and the runtime's flags
(``bmrt_set_flags`` / ``bmrt_get_flags``).

crossrt keeps a network's program and weights with its driver, not in device memory a caller
could give, and needs none for activations or commands: what ``bmrt_get_bmodel_info`` asks
for is ``coeff_mem``, room for the bmodel itself. ``bmrt_load_bmodel_with_mem`` copies the
bmodel there and loads it from there, allocating no device memory of its own; the networks
refuse to launch once that memory is freed, as their weights would be gone on the chip.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from typing import Any

from ...errors import CrossrtError, InvalidArgumentError, InvalidModelError
from ...executables import list_networks
from ..bmlib import DeviceMemory
from . import envvars
from .contract import seed_call
from .runtime import Bmruntime
from .status import ERRORS, failed
from .types import BM_RUNTIME_CHECK_MEM, BM_RUNTIME_SHARE_MEM, mem_info_t, memory_t

__all__ = [
    "bmrt_get_bmodel_data_info",
    "bmrt_get_bmodel_info",
    "bmrt_get_flags",
    "bmrt_load_bmodel_data_with_mem",
    "bmrt_load_bmodel_with_decrypt",
    "bmrt_load_bmodel_with_decrypt_lib",
    "bmrt_load_bmodel_with_mem",
    "bmrt_set_flags",
]

log = logging.getLogger("crossrt.compat.bmruntime")

_ALIGN = 128  # bmruntime rounds each memory of a mem_info_t up to 128 bytes
_KNOWN_FLAGS = int(BM_RUNTIME_SHARE_MEM | BM_RUNTIME_CHECK_MEM)

# -- flags -----------------------------------------------------------------------------------


@seed_call
def bmrt_set_flags(p_bmrt: Bmruntime, flags: int) -> None:
    """Set the runtime's ``bm_runtime_flag_t`` bits. BM_RUNTIME_CHECK_MEM: later loads check
    every section's SHA-256 whatever ``CROSSRT_VALIDATE_HASH`` says. BM_RUNTIME_SHARE_MEM
    (networks share their activation memory) is kept and changes nothing: crossrt's engines
    hold no device memory per network to share."""
    if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags < 1 << 32:
        failed("bmrt_set_flags", InvalidArgumentError(f"flags={flags!r}: give a uint32_t"))
        return
    if flags & ~_KNOWN_FLAGS:
        log.warning(
            "bmrt_set_flags: bits 0x%x are no bm_runtime_flag_t; kept, with no effect",
            flags & ~_KNOWN_FLAGS,
        )
    if flags & BM_RUNTIME_SHARE_MEM:
        envvars.warn_once(
            "BM_RUNTIME_SHARE_MEM",
            "bmrt_set_flags: BM_RUNTIME_SHARE_MEM is kept and has no effect here: crossrt's "
            "engines hold no activation memory per network to share",
        )
    p_bmrt.flags = flags


@seed_call
def bmrt_get_flags(p_bmrt: Bmruntime) -> int:
    """The flags :func:`bmrt_set_flags` set (BM_RUNTIME_AUTO, 0, until then)."""
    return p_bmrt.flags


# -- device memory the caller gives ----------------------------------------------------------


@seed_call
def bmrt_get_bmodel_info(bmodel_path: str | os.PathLike[str], mem_info: mem_info_t) -> bool:
    """Fill ``mem_info`` with the device memory the bmodel file needs, without loading it:
    ``coeff_mem.size`` bytes for the bmodel, every other size 0, no ``addr`` yet. False
    (logged) when the file cannot be read or is no bmodel."""
    try:
        _fill(mem_info, _requirements(_read(bmodel_path)))
    except ERRORS as exc:
        failed("bmrt_get_bmodel_info", exc)
        return False
    return True


@seed_call
def bmrt_get_bmodel_data_info(bmodel_data: Any, size: int, mem_info: mem_info_t) -> bool:
    """:func:`bmrt_get_bmodel_info` of the first ``size`` bytes of a buffer."""
    try:
        _fill(mem_info, _requirements(_data(bmodel_data, size)))
    except ERRORS as exc:
        failed("bmrt_get_bmodel_data_info", exc)
        return False
    return True


@seed_call
def bmrt_load_bmodel_with_mem(
    p_bmrt: Bmruntime, bmodel_path: str | os.PathLike[str], mem_info: mem_info_t
) -> bool:
    """Load every network of a bmodel file into the device memory of ``mem_info``: each
    memory :func:`bmrt_get_bmodel_info` sized, allocated by the caller on the runtime's
    first device (``addr``). The runtime allocates none; keep the memory until
    :func:`~crossrt.compat.bmruntime.bmrt_destroy` (a launch after it is freed is refused)."""
    try:
        _load_with_mem(p_bmrt, _read(bmodel_path), mem_info)
    except ERRORS as exc:
        failed("bmrt_load_bmodel_with_mem", exc)
        return False
    return True


@seed_call
def bmrt_load_bmodel_data_with_mem(
    p_bmrt: Bmruntime, bmodel_data: Any, size: int, mem_info: mem_info_t
) -> bool:
    """:func:`bmrt_load_bmodel_with_mem` of the first ``size`` bytes of a buffer."""
    try:
        _load_with_mem(p_bmrt, _data(bmodel_data, size), mem_info)
    except ERRORS as exc:
        failed("bmrt_load_bmodel_data_with_mem", exc)
        return False
    return True


def _requirements(data: bytes) -> mem_info_t:
    list_networks(data)  # a bmodel at all: its layout and header, before sizing memory for it
    return mem_info_t(coeff_mem=memory_t(size=-(-len(data) // _ALIGN) * _ALIGN))


def _fill(mem_info: mem_info_t, needs: mem_info_t) -> None:
    if not isinstance(mem_info, mem_info_t):
        raise InvalidArgumentError(f"mem_info: expected a mem_info_t, got {type(mem_info)}")
    for name, need in needs.memories().items():
        setattr(mem_info, name, memory_t(None, need.size, need.type, need.number))


def _load_with_mem(p_bmrt: Bmruntime, data: bytes, mem_info: mem_info_t) -> None:
    if not isinstance(mem_info, mem_info_t):
        raise InvalidArgumentError(f"mem_info: expected a mem_info_t, got {type(mem_info)}")
    device = p_bmrt.handle.check()
    given: dict[str, DeviceMemory] = {}
    for name, need in _requirements(data).memories().items():
        if not need.size:
            continue
        mine = getattr(mem_info, name)
        mem = mine.addr if isinstance(mine, memory_t) else None
        if not isinstance(mem, DeviceMemory) or mine.size < need.size:
            raise InvalidArgumentError(
                f"mem_info.{name} needs {need.size} bytes of device memory; call "
                "bmrt_get_bmodel_info, allocate each size with bm_malloc_device_byte and set "
                "its addr",
                details={"memory": name, "needed": need.size},
            )
        device.check_range(mem, 0, need.size, f"mem_info.{name}")
        given[name] = mem
    coeff = given["coeff_mem"]
    device.memcpy_s2d(coeff, data)
    # Loaded from what lies in the caller's memory, as the chip would run it from there.
    placed = bytearray(len(data))
    device.memcpy_d2s(placed, coeff, len(data))
    p_bmrt.load(bytes(placed), memory=list(given.values()))


# -- encrypted bmodels -----------------------------------------------------------------------


@seed_call
def bmrt_load_bmodel_with_decrypt(
    p_bmrt: Bmruntime,
    bmodel_path: str | os.PathLike[str],
    decrypt_func: Callable[[bytes], Any],
) -> bool:
    """Load an encrypted bmodel file: ``decrypt_func(file_bytes)`` returns the bmodel's
    bytes (any buffer). False (logged) when it raises, returns None (C's NULL) or returns
    bytes that are no bmodel."""
    try:
        if not callable(decrypt_func):
            raise InvalidArgumentError(
                f"decrypt_func={decrypt_func!r} is not callable; give a function of the "
                "file's bytes that returns the bmodel's"
            )
        data = _read(bmodel_path)
        try:
            plain = decrypt_func(data)
        except Exception as exc:  # the caller's code: any failure is the load's
            raise CrossrtError(
                f"the decrypt function raised {type(exc).__name__}: {exc}; check the key and "
                "that the file is the encrypted bmodel"
            ) from exc
        p_bmrt.load(_decrypted(plain, "the decrypt function"))
    except ERRORS as exc:
        failed("bmrt_load_bmodel_with_decrypt", exc)
        return False
    return True


@seed_call
def bmrt_load_bmodel_with_decrypt_lib(
    p_bmrt: Bmruntime, bmodel_path: str | os.PathLike[str], decrypt_lib: str | os.PathLike[str]
) -> bool:
    """Load an encrypted bmodel file with the ``decrypt`` function of the shared library
    ``decrypt_lib`` (as ``model_tool --encrypt -lib`` uses): C ``uint8_t *decrypt(const
    uint8_t *in, uint64_t size, uint64_t *out_size)`` returning a ``malloc``-ed buffer,
    which is freed once copied."""
    try:
        data = _read(bmodel_path)
        p_bmrt.load(_decrypted(_call_library(decrypt_lib, data), f"decrypt of {decrypt_lib}"))
    except ERRORS as exc:
        failed("bmrt_load_bmodel_with_decrypt_lib", exc)
        return False
    return True


def _call_library(decrypt_lib: str | os.PathLike[str], data: bytes) -> bytes | None:
    try:
        function = ctypes.CDLL(os.fspath(decrypt_lib)).decrypt
    except (OSError, AttributeError, TypeError) as exc:
        raise InvalidArgumentError(
            f"decrypt_lib {decrypt_lib!r}: {exc}; give the path of a shared library that "
            "exports uint8_t *decrypt(const uint8_t *, uint64_t, uint64_t *)"
        ) from exc
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
    out_size = ctypes.c_uint64(0)
    address = function(data, len(data), ctypes.byref(out_size))
    if not address:
        return None
    try:
        return ctypes.string_at(address, out_size.value)
    finally:
        _free(address)


def _free(address: int) -> None:
    free = ctypes.CDLL(None).free
    free.argtypes, free.restype = [ctypes.c_void_p], None
    free(address)


def _decrypted(plain: Any, what: str) -> bytes:
    if plain is None:
        raise InvalidModelError(f"{what} returned nothing (NULL); the bmodel was not decrypted")
    try:
        return bytes(memoryview(plain).cast("B"))
    except TypeError as exc:
        raise InvalidModelError(
            f"{what} returned a {type(plain).__name__}, not the bmodel's bytes: {exc}"
        ) from exc


# -- reading ---------------------------------------------------------------------------------


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        with open(os.fspath(path), "rb") as file:
            return file.read()
    except (OSError, TypeError) as exc:
        raise InvalidArgumentError(
            f"cannot read the bmodel {path!r}: {exc}; give the path of a .crm file"
        ) from exc


def _data(bmodel_data: Any, size: int) -> bytes:
    data = bytes(memoryview(bmodel_data).cast("B")[:size])
    if len(data) != size:
        raise InvalidArgumentError(f"size {size} is more than the buffer's {len(data)} bytes")
    return data
