"""Per-call overhead of crossrt over raw ONNX Runtime, on tiny, ResNet-50 and BERT-base.

Compares ``crossrt.LoadedModel.run(feed)`` with ``onnxruntime.InferenceSession.run(None,
feed)`` (default session options, CPU provider) in one process, at the same thread count.
After a warm-up, the variants run in alternating blocks (the order rotated every round, so
drift in a noisy machine falls on all of them alike); the medians per call are compared.

    python benchmarks/overhead.py                      # full run (~1.5 min on 2 cores, <5 busy)
    python benchmarks/overhead.py --quick --models tiny
    python benchmarks/overhead.py --against ../base  # tiny run(), paired against a checkout

Writes a JSON file (``--out``) and a Markdown table next to it, and prints the table. See
``benchmarks/README.md`` for what each column means.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import crossrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import against  # benchmarks/ is not a package: found through sys.path
import models
import reporting

RESULTS = Path(__file__).resolve().parent / "results"

TARGETS = {"tiny": 1.5, "resnet50": 1.02}
"""Highest acceptable crossrt/raw ratio of the median per call (from the issue)."""


@dataclass(frozen=True)
class Plan:
    """How long to measure one model."""

    calls: int  # calls per block
    blocks: int  # blocks per variant
    warmup: int  # calls per variant before measuring
    per_call: bool  # time every call (long calls) or only whole blocks (short calls)
    budget_s: float = 1e9  # stop adding blocks past this many seconds (after 3 blocks)


# A full run takes about 1.5 minutes on 2 cores (models built); budgets cap it on a busy machine.
PLANS = {
    "tiny": Plan(calls=2000, blocks=30, warmup=2000, per_call=False),
    "resnet50": Plan(calls=5, blocks=60, warmup=3, per_call=True, budget_s=100),
    "bert": Plan(calls=2, blocks=25, warmup=2, per_call=True, budget_s=90),
}
QUICK = {
    "tiny": Plan(calls=500, blocks=5, warmup=500, per_call=False),
    "resnet50": Plan(calls=3, blocks=3, warmup=1, per_call=True),
    "bert": Plan(calls=1, blocks=3, warmup=1, per_call=True),
}
MIN_BLOCKS = 3


@dataclass
class Variant:
    """One way of running the model: a callable, its arguments, and its timings."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    samples: list[float]  # seconds per call: one per call, or one per block (block mean)
    blocks: list[float]  # mean seconds per call of each block


def time_block(
    fn: Callable[..., Any], args: tuple[Any, ...], calls: int, per_call: bool
) -> list[float]:
    """Run ``fn(*args)`` ``calls`` times; seconds per call (each, or the block's mean)."""
    clock = time.perf_counter
    if per_call:
        out = []
        for _ in range(calls):
            t0 = clock()
            fn(*args)
            out.append(clock() - t0)
        return out
    t0 = clock()
    for _ in range(calls):
        fn(*args)
    return [(clock() - t0) / calls]


def measure(variants: Sequence[Variant], plan: Plan) -> None:
    """Warm up every variant, then time them in rotated round-robin blocks."""
    for v in variants:
        for _ in range(plan.warmup):
            v.fn(*v.args)
    n = len(variants)
    started = time.perf_counter()
    for block in range(plan.blocks):
        if block >= MIN_BLOCKS and time.perf_counter() - started > plan.budget_s:
            break
        order = variants[block % n :] + variants[: block % n]
        if block % 2:
            order = order[::-1]
        for v in order:
            got = time_block(v.fn, v.args, plan.calls, plan.per_call)
            v.samples.extend(got)
            v.blocks.append(sum(got) / len(got))


def summary(v: Variant) -> dict[str, Any]:
    s = sorted(v.samples)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return {
        "median_us": round(statistics.median(s) * 1e6, 3),
        "p90_us": round(p90 * 1e6, 3),
        "mean_us": round(statistics.fmean(s) * 1e6, 3),
        "min_us": round(s[0] * 1e6, 3),
        "samples": len(s),
    }


def max_abs_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise AssertionError(f"output shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def bench_model(name: str, plan: Plan) -> dict[str, Any]:
    """Build (or reuse), compile and load one model, then time crossrt against raw ORT."""
    setup: dict[str, float] = {}
    t0 = time.perf_counter()
    path = models.get(name)
    setup["get_s"] = time.perf_counter() - t0
    feed = models.example_input(name)

    t0 = time.perf_counter()
    exe = crossrt.compile(path, device="cpu")
    setup["crossrt_compile_s"] = time.perf_counter() - t0
    rt = crossrt.Runtime()
    t0 = time.perf_counter()
    lm = rt.load(exe)
    setup["crossrt_load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    setup["raw_session_s"] = time.perf_counter() - t0

    out_names = [o.name for o in sess.get_outputs()]
    variants = [
        Variant("crossrt", lm.run, (feed,), [], []),
        Variant("raw", sess.run, (None, feed), [], []),
    ]
    check: dict[str, float] = {}
    crossrt_out = lm.run(feed)
    raw_out = sess.run(None, feed)
    check["crossrt_vs_raw"] = max(
        max_abs_diff(crossrt_out[n], r) for n, r in zip(out_names, raw_out, strict=True)
    )
    if name == "tiny":
        # Reference rows: the floors under InferenceSession.run, and crossrt's other path.
        binding = sess.io_binding()
        for key, value in feed.items():
            binding.bind_cpu_input(key, value)
        bound = {n: np.empty_like(r) for n, r in zip(out_names, raw_out, strict=True)}
        for n, buf in bound.items():
            binding.bind_output(n, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        sess.run_with_iobinding(binding)
        check["raw_iobinding_vs_raw"] = max_abs_diff(bound[out_names[0]], raw_out[0])
        preallocated = {n: np.empty_like(r) for n, r in zip(out_names, raw_out, strict=True)}
        lm.run(feed, preallocated)
        check["crossrt_outputs_vs_raw"] = max_abs_diff(preallocated[out_names[0]], raw_out[0])
        # The same outputs through a request bound once (ORT's IOBinding, OpenVINO's
        # InferRequest): run(feed, outputs) is checked on every call, a request once.
        into = {n: np.empty_like(r) for n, r in zip(out_names, raw_out, strict=True)}
        request = lm.request(feed, into)
        request.run()
        check["crossrt_request_vs_raw"] = max_abs_diff(into[out_names[0]], raw_out[0])
        variants += [
            Variant("raw_iobinding", sess.run_with_iobinding, (binding,), [], []),
            Variant("raw_sess_run", sess._sess.run, (out_names, feed, None), [], []),
            Variant("crossrt_outputs", lm.run, (feed, preallocated), [], []),
            Variant("crossrt_request", request.run, (), [], []),
        ]

    t0 = time.perf_counter()
    measure(variants, plan)
    wall = time.perf_counter() - t0

    rows = {v.name: summary(v) for v in variants}
    by_name = {v.name: v for v in variants}
    ratio = rows["crossrt"]["median_us"] / rows["raw"]["median_us"]
    pairs = [c / r for c, r in zip(by_name["crossrt"].blocks, by_name["raw"].blocks, strict=True)]
    target = TARGETS.get(name)
    result = {
        "file": str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path),
        "size_mb": round(path.stat().st_size / 1e6, 3),
        "inputs": {k: f"{v.dtype}{list(v.shape)}" for k, v in feed.items()},
        "threads": {"crossrt": len(lm.cores), "raw": _raw_threads(sess)},
        "plan": {
            "calls_per_block": plan.calls,
            "blocks": len(by_name["raw"].blocks),
            "blocks_planned": plan.blocks,
            "warmup_calls": plan.warmup,
            "timing": "per call" if plan.per_call else "per block (mean of the block)",
        },
        "setup": {k: round(v, 3) for k, v in setup.items()},
        "measure_s": round(wall, 1),
        "rows": rows,
        "ratio": round(ratio, 4),
        "paired_ratio": round(statistics.median(pairs), 4),
        "target": target,
        "meets_target": None if target is None else ratio <= target,
        "max_abs_diff": check,
    }
    rt.close()
    del lm, exe, sess, variants, by_name
    gc.collect()
    return result


def _raw_threads(sess: ort.InferenceSession) -> str:
    n = sess.get_session_options().intra_op_num_threads
    return str(n) if n else f"default ({_physical_cores()} physical cores)"


def _physical_cores() -> int:
    cores = set()
    phys = core = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    for line in [*text.splitlines(), ""]:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not line.strip() and core:
            cores.add((phys, core))
            core = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    return min(len(cores) or os.cpu_count() or 1, usable or 1 << 30)


def machine_info() -> dict[str, Any]:
    from crossrt.host import cpu_model, usable_cores

    return {
        "cpu": cpu_model()[0],
        "logical_cpus": os.cpu_count(),
        "usable_cores": len(usable_cores()),
        "physical_cores": _physical_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "crossrt": crossrt.__version__,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# -- reporting -----------------------------------------------------------------------------


def fmt_time(us: float) -> str:
    if us < 1000:
        return f"{us:.2f} µs"
    if us < 1e6:
        return f"{us / 1000:.2f} ms"
    return f"{us / 1e6:.3f} s"


def table(report: dict[str, Any]) -> str:
    head = (
        "| model | raw median | raw p90 | crossrt median | crossrt p90 | ratio | paired ratio "
        "| target | max abs diff | calls x blocks |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    extras = []
    for name, r in report["models"].items():
        raw, cr = r["rows"]["raw"], r["rows"]["crossrt"]
        target = "-" if r["target"] is None else f"<= {r['target']}"
        if r["meets_target"] is not None:
            target += " ok" if r["meets_target"] else " MISSED"
        lines.append(
            f"| {name} | {fmt_time(raw['median_us'])} | {fmt_time(raw['p90_us'])} "
            f"| {fmt_time(cr['median_us'])} | {fmt_time(cr['p90_us'])} | {r['ratio']:.3f} "
            f"| {r['paired_ratio']:.3f} | {target} | {r['max_abs_diff']['crossrt_vs_raw']:.2e} "
            f"| {r['plan']['calls_per_block']} x {r['plan']['blocks']} |"
        )
        for row, s in r["rows"].items():
            if row not in ("raw", "crossrt"):
                extras.append(
                    f"| {name} | {row} | {fmt_time(s['median_us'])} | {fmt_time(s['p90_us'])} "
                    f"| {s['median_us'] / raw['median_us']:.3f} |"
                )
    if extras:
        lines += [
            "",
            "| model | reference row | median | p90 | vs raw |",
            "|---|---|---|---|---|",
            *extras,
        ]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    mode = "quick" if report["quick"] else "full"
    threads = ", ".join(
        f"{name}: crossrt {r['threads']['crossrt']}, raw {r['threads']['raw']}"
        for name, r in report["models"].items()
    )
    return (
        f"# crossrt overhead over raw ONNX Runtime ({mode} run)\n\n"
        f"{m['date']} on {m['cpu']} ({m['usable_cores']} usable cores), {m['platform']}; "
        f"Python {m['python']}, crossrt {m['crossrt']}, onnxruntime {m['onnxruntime']}, "
        f"onnx {m['onnx']}, numpy {m['numpy']}.\n\n"
        f"Command: `{report['command']}`  \n"
        f"Threads: {threads}.\n\n"
        f"{table(report)}\n\n"
        "Columns are explained in [../README.md](../README.md). A change of the run path is "
        "measured paired against the commit before it with `--against`: "
        "[overhead-against.md](overhead-against.md).\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="tiny,resnet50,bert",
        help="comma-separated models from: " + ", ".join(models.BUILDERS),
    )
    parser.add_argument("--quick", action="store_true", help="few iterations (a smoke run)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write (default benchmarks/results/overhead.json, or overhead-quick.json "
        "with --quick); the Markdown table goes next to it with a .md suffix",
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="instead: the tiny model's run() per call of this checkout against CHECKOUT (another "
        "checkout of crossrt, with its own .venv), in alternating blocks in one run; writes "
        "overhead-against.json (or --out) and its table",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="with --against: rounds, each with a fresh worker process per checkout",
    )
    parser.add_argument(
        "--variant",
        choices=sorted(against.VARIANTS),
        default="run",
        help="with --against: what is timed: "
        + "; ".join(f"{k}: {v}" for k, v in against.VARIANTS.items()),
    )
    parser.add_argument(
        "--pairs", type=int, default=10, help="with --against: alternating pairs of blocks a round"
    )
    args = parser.parse_args(argv)
    if args.against is not None:
        return _against(args, argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in models.BUILDERS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(models.BUILDERS)}")
    out: Path = args.out or RESULTS / ("overhead-quick.json" if args.quick else "overhead.json")
    plans = QUICK if args.quick else PLANS

    report: dict[str, Any] = {
        "machine": machine_info(),
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/overhead.py", *(argv or sys.argv[1:])]),
        "models": {},
    }
    started = time.perf_counter()
    for name in names:
        print(f"[{name}] building/compiling/loading, then timing ...", file=sys.stderr, flush=True)
        report["models"][name] = r = bench_model(name, plans[name])
        print(
            f"[{name}] ratio {r['ratio']:.3f} (paired {r['paired_ratio']:.3f}), "
            f"max abs diff crossrt vs raw {r['max_abs_diff']['crossrt_vs_raw']:.2e}, "
            f"setup {r['setup']}, timing {r['measure_s']} s",
            file=sys.stderr,
            flush=True,
        )
    report["total_s"] = round(time.perf_counter() - started, 1)

    reporting.save(out, report, markdown(report), printed=table(report))
    for name, r in report["models"].items():
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in r["max_abs_diff"].items())
        print(f"{name}: max abs diff {diffs}")
    print(f"wrote {out} and {out.with_suffix('.md')} ({report['total_s']} s)")
    missed = [n for n, r in report["models"].items() if r["meets_target"] is False]
    if missed:
        print(f"targets missed: {', '.join(missed)}", file=sys.stderr)
    return 0


def _against(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--against CHECKOUT``: this checkout's tiny ``run()`` paired against another's."""
    if not (args.against / "src" / "crossrt").is_dir():
        print(
            f"--against {args.against}: not a checkout of crossrt (no src/crossrt)", file=sys.stderr
        )
        return 2
    plan = QUICK["tiny"] if args.quick else PLANS["tiny"]
    rounds, pairs = (2, 3) if args.quick else (args.rounds, args.pairs)
    this = Path(__file__).resolve().parent.parent
    doc = against.paired(
        this, args.against.resolve(), rounds, pairs, 250, plan.warmup, variant=args.variant
    )
    command = " ".join(["python", "benchmarks/overhead.py", *(argv or sys.argv[1:])])
    doc["command"] = command
    suffix = "" if args.variant == "run" else f"-{args.variant}"
    out: Path = args.out or RESULTS / f"overhead-against{suffix}.json"
    reporting.save(out, doc, against.markdown(doc, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
