"""``crossrt compile``: compile a model for a device into a ``.crm`` file, through the cache.

A compile that takes more than a second shows a spinner with the elapsed time on stderr when
stderr is a terminal, and one line when it is done otherwise; the summary goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import onnx
from onnx import external_data_helper

from ..choice import compile
from ..choice.probe import spelled_as
from ..compiler import Executable
from ..compiler.cache import cache_stats
from ..errors import CrossrtError, InvalidArgumentError
from . import flags
from .common import AUTO_FLAGS, decision_lines, fail, human_bytes, parse_shapes, printable, say

_QUIET_S = 1.0  # compiles shorter than this show no progress at all
_FRAMES = "|/-\\"


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt compile",
        description="Compile an ONNX model for a device and write the compiled model to one "
        ".crm file, which `crossrt run`, Runtime.load and crossrt.load_executable load without "
        "compiling again. With a cache directory, a model compiled before for the same target "
        "and options comes from the cache. --device auto compiles for every engine that can "
        "run the model, measures each and keeps the fastest whose outputs match the reference. "
        "--shape here fixes the shape the model is compiled for (crossrt.compile(shapes=)).",
        epilog="examples:\n"
        "  crossrt compile model.onnx -d cpu -o model.crm\n"
        "  crossrt compile model.onnx --shape x=1x2048 -o model.crm   # concrete shapes\n"
        "  crossrt compile model.onnx -d cuda --fallback cpu --fp16 -o model.crm\n"
        "  crossrt compile model.onnx -d auto -o model.crm   # measure every engine, keep the "
        "fastest\n"
        "  crossrt compile model.onnx -o model.crm --cache-dir ~/.cache/crossrt --cache-version 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an ONNX model file")
    flags.add(p, "--device")
    p.add_argument(
        "--output",
        "-o",
        default=None,
        metavar="FILE",
        help="the .crm file to write (default: the model file's name with .crm, here)",
    )
    flags.add(p, "--driver", "--fallback")
    # Added group by group, in the order --help lists them.
    _add_precision(p)
    _add_auto(p)
    _add_code(p)
    _add_cache(p)
    return p


def _add_precision(p: argparse.ArgumentParser) -> None:
    """The numeric precision compiled for, and int8's calibration samples."""
    p.add_argument("--fp16", action="store_true", help="the same as --precision fp16")
    flags.add(p, "--precision")
    p.add_argument(
        "--calibration",
        default=None,
        metavar="DIR",
        help="with --precision int8: calibration samples, one .npz per sample (its arrays "
        "named as the inputs) or one NAME.npy per input (first axis: the samples); the last "
        "fifth is held back to measure the error against fp32",
    )


def _add_auto(p: argparse.ArgumentParser) -> None:
    """How ``--device auto`` measures its candidates."""
    p.add_argument(
        "--auto-seconds",
        type=float,
        default=None,
        metavar="S",
        help="with --device auto: how long to time the candidates (default 2)",
    )
    p.add_argument(
        "--probe-shape",
        action="append",
        default=[],
        metavar="NAME=DxD...",
        help="with --device auto: measure with this shape of input NAME (1x3x48x320) where "
        "its dynamic dimensions would otherwise be 1; repeat for several inputs",
    )


def _add_code(p: argparse.ArgumentParser) -> None:
    """What the compiled code is made for: static shapes, any CPU, performance, priority."""
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=DxD...",
        help="compile with this static shape of input NAME (1x2048), as a NEFF or a bmodel "
        "stage has: the .crm's inputs and outputs are concrete and a run takes that shape "
        "only; repeat for several inputs (the others must be static already)",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="compile for any CPU of this architecture, not only this one (slower loads)",
    )
    p.add_argument(
        "--perf",
        default=None,
        metavar="MODE",
        help="performance mode: NONE, LOW, MEDIUM, HIGH or EXTREME",
    )
    p.add_argument("--priority", default=None, help="priority: NONE, LOW, MEDIUM or HIGH")


def _add_cache(p: argparse.ArgumentParser) -> None:
    """The compile cache: where it is, and which version of its entries is current."""
    flags.add(p, "--cache-dir")
    p.add_argument(
        "--cache-version",
        type=int,
        default=0,
        metavar="N",
        help="cache version: an entry of an older version is rebuilt, a newer one is an error "
        "(default: 0)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt compile``."""
    args = parser().parse_args(argv)
    options: dict[str, Any] = {}
    if args.fp16:
        options["fp16"] = True
    if args.precision is not None:
        options["precision"] = args.precision
    if args.calibration is not None:
        options["calibration"] = args.calibration
    if args.portable:
        options["portable"] = True
    if args.auto_seconds is not None:
        options["auto_seconds"] = args.auto_seconds
    if args.probe_shape:
        try:
            options["probe_shapes"] = parse_shapes(args.probe_shape, "--probe-shape")
        except CrossrtError as exc:
            return fail("compile", exc)
    if args.shape:
        try:
            options["shapes"] = parse_shapes(args.shape, "--shape")
        except CrossrtError as exc:
            return fail("compile", exc)
    if args.perf is not None:
        options["performance_mode"] = args.perf
    if args.priority is not None:
        options["priority"] = args.priority
    fallback = args.fallback[0] if args.fallback and len(args.fallback) == 1 else args.fallback
    before = cache_stats()
    started = time.perf_counter()
    try:
        with Progress(f"compiling {Path(args.model).name}", sys.stderr), spelled_as(AUTO_FLAGS):
            exe = compile(
                args.model,
                args.device,
                driver=args.driver,
                fallback=fallback,
                cache_dir=args.cache_dir,
                cache_version=args.cache_version,
                **options,
            )
    except CrossrtError as exc:
        return fail("compile", exc)
    elapsed = time.perf_counter() - started
    output = Path(args.output or Path(args.model).with_suffix(".crm").name)
    try:
        exe.save(output)
    except CrossrtError as exc:
        return fail("compile", exc)
    except OSError as exc:  # the container writer names most causes; this is the rest
        why = exc.strerror or str(exc)
        return fail(
            "compile",
            InvalidArgumentError(f"cannot write {str(output)!r}: {why}; give a writable path"),
        )
    after = cache_stats()
    if after.hits > before.hits:
        cache = "hit"
    elif after.misses > before.misses:
        cache = "miss (stored)"
    else:
        cache = "off"
    say(*summary(exe, output, elapsed, cache, Path(args.model)).split("\n"))
    if exe.decision is not None:
        say("  device='auto' measured:", *decision_lines(exe.decision))
    return 0


def summary(
    exe: Executable, output: Path, seconds: float, cache: str, model: Path | None = None
) -> str:
    """What was compiled: nodes, drivers, sizes (the model's beside the .crm's), time, cache."""
    drivers = dict.fromkeys(f"{n.driver} {n.driver_version}" for n in exe.nodes)
    size = output.stat().st_size
    sizes = f"{output.name} {human_bytes(size)} ({size} bytes)"
    if model is not None:
        sizes = f"{model.name} {human_bytes(model_bytes(model))} -> {sizes}"
    lines = [
        f"compiled {exe.name!r} for {exe.device} -> {output}",
        f"  nodes:   {len(exe.nodes)}",
    ]
    for n in exe.nodes:
        tied = "".join(f"; {key} {value}" for key, value in n.target.items())
        lines.append(
            f"    {n.name}: {n.driver} on {n.device_kind}, {sum(n.op_types.values())} "
            f"operators{tied}"
        )
    lines += [
        f"  drivers: {', '.join(drivers)}",
        f"  size:    {sizes}",
        f"  time:    {seconds:.2f} s",
        f"  cache:   {cache}",
    ]
    return "\n".join(lines)


# A model file this large holds its weights itself: it is not parsed again to look for
# external data files (whose model files are small: the graph alone).
_EXTERNAL_LOOKUP_MAX = 16 << 20


def model_bytes(path: Path) -> int:
    """The bytes of a model on disk: its file and the external data files it names."""
    total = path.stat().st_size
    if total > _EXTERNAL_LOOKUP_MAX:
        return total
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # compile read it; a race with a writer is not worth an error here
        return total
    locations = {
        entry.value
        for tensor in external_data_helper._get_all_tensors(proto)
        if external_data_helper.uses_external_data(tensor)
        for entry in tensor.external_data
        if entry.key == "location"
    }
    for location in locations:
        with contextlib.suppress(OSError):
            total += (path.parent / location).stat().st_size
    return total


class Progress:
    """A spinner with the elapsed time on ``stream`` while a long step runs.

    On a terminal, a background thread redraws one line after the first second until the
    step ends, then clears it; elsewhere (a log, a pipe) it writes one line at the end, and
    only when the step took longer than a second.
    """

    def __init__(self, what: str, stream: TextIO, quiet_s: float = _QUIET_S) -> None:
        self.what = printable(what)  # a file name: it may hold anything but "/"
        self.stream = stream
        self.quiet_s = quiet_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._tty = bool(getattr(stream, "isatty", lambda: False)())

    def __enter__(self) -> Progress:
        self._started = time.perf_counter()
        if self._tty:
            self._thread = threading.Thread(target=self._spin, name="crossrt-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        elapsed = time.perf_counter() - self._started
        if not self._tty and exc is None and elapsed > self.quiet_s:
            print(f"crossrt: {self.what}: done in {elapsed:.1f} s", file=self.stream)

    def _spin(self) -> None:
        if self._done.wait(self.quiet_s):
            return
        drawn = 0
        for frame in itertools.cycle(_FRAMES):
            line = f"{frame} {self.what} ... {time.perf_counter() - self._started:.1f} s"
            self.stream.write("\r" + line.ljust(drawn))
            self.stream.flush()
            drawn = len(line)
            if self._done.wait(0.1):
                break
        self.stream.write("\r" + " " * drawn + "\r")
        self.stream.flush()
