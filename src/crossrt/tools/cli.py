"""The ``crossrt`` command: dispatches to one module per subcommand."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

# name -> (module, one-line summary). Each module has main(argv) -> int.
COMMANDS = {
    "ls": ("crossrt.tools.ls", "list drivers (PASS/FAIL and why), devices, cores and memory"),
    "run": ("crossrt.tools.run", "run a model once on files of inputs and save the outputs"),
    "compile": ("crossrt.tools.compile", "compile a model for a device into a .crm file"),
    "cache": ("crossrt.tools.cache", "list, verify and prune a compiled-model cache"),
    "verify": (
        "crossrt.tools.verify",
        "check a model's outputs on each engine against the reference driver",
    ),
    "bench": ("crossrt.tools.bench", "time a model on random inputs: throughput, latency"),
    "profile": ("crossrt.tools.profile", "record a Chrome trace of a model, or of a process"),
    "monitor": ("crossrt.tools.monitor", "print crossrt processes' metrics as JSON lines"),
    "top": ("crossrt.tools.top", "a live view of every crossrt process on this machine"),
    "serve": ("crossrt.tools.serve", "serve models over gRPC (KServe v2) to other processes"),
    "socket": (
        "crossrt.tools.private_socket",
        "run a command with a gRPC socket of its own on the daemon (no relay)",
    ),
    "deploy": ("crossrt.tools.deploy", "serve models on a Ray Serve fleet (crossrt[ray])"),
    "inspect": (
        "crossrt.tools.inspect",
        "show a .crm container, or an ONNX model and its placement",
    ),
    "container": (
        "crossrt.tools.container",
        "combine, extract, dump .crm files and list their weights (model_tool)",
    ),
}


def usage() -> str:
    """The top-level help text."""
    lines = [
        "usage: crossrt COMMAND [ARGS...]",
        "",
        "crossrt: a cross-hardware neural-network runtime.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<8} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `crossrt COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``crossrt`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:  # a missing command is a usage error, as argparse treats one
        names = ", ".join(COMMANDS)
        print(f"{usage()}\n\ncrossrt: error: a command is required ({names})", file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        from crossrt import __version__

        print(f"crossrt {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"crossrt: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        code: int = module.main(rest)
    except BrokenPipeError:  # `crossrt inspect x.crm | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    raise SystemExit(main())
