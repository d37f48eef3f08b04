"""The compiler layer: placement, options, the Executable and its ``.crm`` container."""

from .compile import compile_for_device
from .container import (
    Container,
    executables_to_bytes,
    list_networks,
    load_executable,
    read_container,
    save_executables,
)
from .executable import Executable, ExecutableNode
from .options import KNOWN_OPTIONS, parse_options

__all__ = [
    "KNOWN_OPTIONS",
    "Container",
    "Executable",
    "ExecutableNode",
    "compile_for_device",
    "executables_to_bytes",
    "list_networks",
    "load_executable",
    "parse_options",
    "read_container",
    "save_executables",
]
