"""Rewrite exclusions.toml from what fails now: ``make exclusions``.

Runs every ONNX node case on every configuration of the suite (``suite.configurations()``:
each registered driver alone, and onnxruntime with fallback) twice, on every core, and writes
one entry per failing case with a reason derived from its error, grouped by cause. A case
whose outcome differs between the runs goes to the ``[<config>.flaky]`` table; flaky entries
already there are kept while the case exists, since their reasons (random operators, a locale
or a package some machines lack) are the person's who wrote them: those that passed every run
here are printed for review. Tables of configurations that cannot run here are kept as they
are.

    python -m tests.conformance.regenerate [--runs 2] [--jobs N] [--output PATH]
                                           [--dump RUNS.json | --replay RUNS.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import onnx

from . import reasons
from .node_cases import load_case_names, read_case
from .suite import EXCLUSIONS, Config, configurations, engine_version, failure, load_exclusions

_CHUNK = 40  # cases per task: small enough to share the work evenly, large enough to be cheap

Outcomes = dict[str, str | None]  # case -> None when it passed, else its error


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each case (default 2)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--output", type=Path, default=EXCLUSIONS, help="file to write")
    parser.add_argument("--dump", type=Path, help="also write every run's errors as JSON here")
    parser.add_argument(
        "--replay", type=Path, help="take the runs from a --dump file instead of running"
    )
    parser.add_argument(
        "--only",
        help="comma-separated configurations to run (the other tables are kept as they are)",
    )
    args = parser.parse_args(argv)

    names = load_case_names()
    configs = configurations()
    runnable = [c for c in configs if not c.unavailable]
    if args.only:
        wanted = set(args.only.split(","))
        runnable = [c for c in runnable if c.name in wanted]
    start = time.perf_counter()
    if args.replay:
        runs = json.loads(args.replay.read_text(encoding="utf-8"))
        runnable = [c for c in runnable if c.name in runs]
    else:
        runs = _run_all(runnable, names, args.runs, args.jobs)
    how = f"replayed {args.replay}" if args.replay else f"{time.perf_counter() - start:.0f} s"
    print(
        f"{len(names)} cases x {len(runnable)} configurations x {args.runs} runs: {how}",
        file=sys.stderr,
    )
    if args.dump:
        args.dump.write_text(json.dumps(runs, indent=1, sort_keys=True), encoding="utf-8")

    old = load_exclusions(args.output) if args.output.exists() else {}
    versions = {c.driver: engine_version(c) for c in configs if not c.unavailable}
    causes = reasons.flaky_causes(runs, old)
    tables = []
    for config in configs:
        if config.unavailable or config.name not in runs:
            skipped = not config.unavailable and not args.replay  # left out by --only
            why = config.unavailable or ("not run (--only)" if skipped else f"not in {args.replay}")
            if config.name in old:
                tables.append(
                    reasons.kept_table(
                        replace(config, unavailable=why), old[config.name], measured=skipped
                    )
                )
                print(f"[{config.name}] kept as it was: {why}", file=sys.stderr)
            continue
        table = reasons.measured_table(
            config, runs[config.name], old.get(config.name), names, causes
        )
        tables.append(table)
        print(table.summary(len(names)), file=sys.stderr)
        for case in table.review:
            print(f"  review: [{config.name}.flaky] {case} passed every run here", file=sys.stderr)
    known = {c.name for c in configs}
    for name, rules in old.items():
        if name not in known:
            tables.append(reasons.kept_table(Config(name, name, None, "not registered"), rules))
            print(f"[{name}] kept as it was: no such configuration is registered", file=sys.stderr)
    header = reasons.header(onnx.__version__, len(names), versions)
    args.output.write_text(reasons.render(header, tables), encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _run_all(
    configs: list[Config], names: list[str], runs: int, jobs: int
) -> dict[str, list[Outcomes]]:
    """Configuration name -> one outcome table per run."""
    results: dict[str, list[Outcomes]] = {c.name: [{} for _ in range(runs)] for c in configs}
    tasks = [
        (c, run, names[i : i + _CHUNK])
        for run in range(runs)
        for c in configs
        for i in range(0, len(names), _CHUNK)
    ]
    # spawn, not fork: the parent has ORT's thread pools (the drivers probed it)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        futures = [
            (c.name, run, pool.submit(_run_chunk, c.device, c.driver, c.fallback, chunk))
            for c, run, chunk in tasks
        ]
        for name, run, future in futures:
            results[name][run].update(future.result())
    return results


def _run_chunk(device: str, driver: str, fallback: str | None, names: list[str]) -> Outcomes:
    config = Config(driver, driver, fallback, device=device)
    return {name: failure(read_case(name), config) for name in names}


if __name__ == "__main__":
    sys.exit(main())
