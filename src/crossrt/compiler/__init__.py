"""The compiler layer: placement, options and the Executable."""

from .compile import compile
from .executable import Executable, ExecutableNode
from .options import KNOWN_OPTIONS, parse_options

__all__ = ["KNOWN_OPTIONS", "Executable", "ExecutableNode", "compile", "parse_options"]
