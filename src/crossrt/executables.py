"""Compiled executables as layers built over the runtime see them (``crossrt.executables``).

The supported names for reading ``.crm`` files and what an executable declares, for code
that presents executables in another system's terms (a NEFF, a bmodel, an NNRt compilation):

- files: :class:`Executable`, :func:`load_executable`, :func:`list_networks` (the networks
  of a container, docs/container.md);
- what the compiled model declares in its metadata: :func:`read_io_quantization` (scales and
  zero points of quantized inputs and outputs), :func:`declared_ranges` (the ranges each
  dynamic input dimension may take, ``crossrt.dim_ranges``) over :func:`default_ranges`,
  :data:`DimRange`;
- the compile cache: :class:`CompileCache` (a directory of compiled models, docs/cache.md).

docs/runtime-api.md lists the public modules.
"""

from __future__ import annotations

from .compiler import Executable, list_networks, load_executable
from .compiler.cache import CompileCache
from .compiler.io_quant import read_io_quantization
from .runtime.shapes import DimRange, declared_ranges, default_ranges

__all__ = [
    "CompileCache",
    "DimRange",
    "Executable",
    "declared_ranges",
    "default_ranges",
    "list_networks",
    "load_executable",
    "read_io_quantization",
]
