"""The flags several ``crossrt`` tools take, defined once.

A flag two tools share means one thing, so it is spelled, takes its value and reads in
``--help`` the same in both: ``add(parser, "--device", "--driver")`` adds them from
:data:`SHARED`. The choices made once for every tool (docs/cli.md, "Flags every tool spells
the same"):

- a flag given several values is repeated: ``--fallback cuda --fallback cpu``,
  ``--input a=a.npy --input b=b.npy`` (never ``--fallback A B``, which would swallow MODEL
  after it);
- ``--json`` prints one JSON document on stdout instead of the text, and takes no value; a
  file to write is ``--output FILE`` / ``-o FILE``;
- a short form means the same long flag in every tool (``-d`` ``--device``, ``-n``
  ``--network``, ``-i`` ``--input``, ``-o`` ``--output``).

``tests/e2e/test_cli_flags.py`` walks every subcommand's parser and fails when a tool defines
one of these otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..compiler.options import PRECISIONS

SHARED: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "--device": (
        ("--device", "-d"),
        {
            "default": None,
            "metavar": "DEVICE",
            "help": "the device, as `crossrt ls` lists it: cpu, cuda:0, sim:0... (default: cpu)",
        },
    ),
    "--driver": (
        ("--driver",),
        {
            "default": None,
            "metavar": "NAME",
            "help": "only this driver (default: the device's drivers, the preferred first)",
        },
    ),
    "--fallback": (
        ("--fallback",),
        {
            "action": "append",
            "default": None,
            "metavar": "DEVICE",
            "help": "place the nodes the device (or --driver) cannot run on this device; "
            "repeat for several, in priority order (default: none, strict placement)",
        },
    ),
    "--precision": (
        ("--precision",),
        {
            "default": None,
            "choices": PRECISIONS,
            "help": "compute in this reduced precision where a driver supports it (default: "
            "the model's own)",
        },
    ),
    "--network": (
        ("--network", "-n"),
        {
            "default": None,
            "metavar": "NAME",
            "help": "for a .crm holding several networks: that network",
        },
    ),
    "--input": (
        ("--input", "-i"),
        {
            "action": "append",
            "default": [],
            "metavar": "NAME=FILE",
            "help": "input NAME from a .npy file, or a raw .bin file read with the input's "
            "dtype and static shape; repeat for each input",
        },
    ),
    "--shape": (
        ("--shape",),
        {
            "action": "append",
            "default": [],
            "metavar": "NAME=DxD...",
            "help": "the shape of input NAME's random values (1x3x224x224; its dynamic "
            "dimensions are 1 otherwise); repeat for each input",
        },
    ),
    "--seconds": (
        ("--seconds",),
        {
            "type": float,
            "default": 3.0,
            "metavar": "S",
            "help": "how long to run MODEL, in seconds (default 3)",
        },
    ),
    "--clients": (
        ("--clients",),
        {
            "type": int,
            "default": 1,
            "metavar": "N",
            "help": "threads calling MODEL at once (default 1)",
        },
    ),
    "--cache-dir": (
        ("--cache-dir",),
        {
            "default": None,
            "metavar": "DIR",
            "help": "the compiled-model cache directory (default: $CROSSRT_CACHE_DIR)",
        },
    ),
    "--json": (
        ("--json",),
        {"action": "store_true", "help": "print one JSON document on stdout instead of text"},
    ),
}
"""Long flag -> (every spelling, ``add_argument``'s keywords)."""


def add(parser: argparse.ArgumentParser | Any, *flags: str) -> None:
    """Add each of ``flags`` (long names, keys of :data:`SHARED`) to ``parser`` (or an
    argument group) as every tool spells it."""
    for flag in flags:
        names, options = SHARED[flag]
        parser.add_argument(*names, **options)
