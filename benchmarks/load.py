"""Time to a loaded model: cold compile, cache hit, a ``.crm`` file, and raw ONNX Runtime.

For each model, every measurement runs in a fresh Python process (imports are not timed), so
no in-process state — crossrt's, ONNX Runtime's or NumPy's — flatters a later variant. The
variants, all ending with a model ready to run on the CPU:

- ``cold``: ``crossrt.compile(path, "cpu")`` without a cache, then ``Runtime().load(exe)``.
- ``hit``: ``crossrt.compile(path, "cpu", cache_dir=warm)``, a cache hit, then the load.
- ``crm``: ``crossrt.load_executable("model.crm")``, then the load.
- ``raw``: ``onnxruntime.InferenceSession(path)``, ONNX Runtime's own session creation from
  the ONNX file (default options, CPU provider).
- ``crm_unhashed`` (diagnostic): ``load_executable("model.crm", validate_hash=False)`` (as
  ``CROSSRT_VALIDATE_HASH=0``), then the load: what the section hashes cost.
- ``hash`` (diagnostic): read the ONNX file and SHA-256 it, what a hit pays to recognise a
  file whose status changed.
- ``zero_copy`` (diagnostic: the engine's floor): the ``.crm`` node's onnxruntime artifact
  alone in a file, and an ORT session made from its small graph whose weight stubs point
  into that file (ORT maps them), optimized no further when the artifact was optimized for
  this CPU, as the driver does, without crossrt's container checks, hashing, registry or
  runtime.

The variants run in rounds (one of each per round, order rotated) so that a slow moment of
the machine falls on all of them; medians are compared. Every process also runs the model
once after the clock stops and reports a checksum of the outputs, which must agree across
variants. The OS page cache is warm for every variant alike (the files are read once before).

    python benchmarks/load.py                    # resnet50 and bert, 3 rounds (~4 min)
    python benchmarks/load.py --models resnet50 --rounds 5
    python benchmarks/load.py --profile          # also cProfile one hit and one .crm load

Writes ``results/load.json`` and ``results/load.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # benchmarks/ is not a package: found through sys.path

from crossrt.compiler.cache import cache_stats

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("cold", "hit", "crm", "raw", "crm_unhashed", "hash", "zero_copy")
TARGET_SPEEDUP = 2.0  # a hit or a .crm load at least this much faster than a cold compile


# -- the child: one measurement in a fresh process ----------------------------------------------


def child(variant: str, name: str, path: str, cache_dir: str, crm: str, profile: bool) -> None:
    """Measure one variant and print one JSON line: seconds per phase and a checksum."""
    import cProfile
    import hashlib
    import io
    import pstats

    import numpy as np
    import onnxruntime as ort

    import crossrt

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    profiler = cProfile.Profile() if profile else None
    clock = time.perf_counter
    result: dict[str, Any] = {"variant": variant}
    if profiler:
        profiler.enable()
    t0 = clock()
    runner: Any = None
    if variant == "raw":
        runner = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        t1 = t2 = clock()
    elif variant == "hash":
        hashlib.sha256(Path(path).read_bytes()).hexdigest()
        t1 = t2 = clock()
    elif variant == "zero_copy":
        runner = zero_copy_session(Path(crm).with_suffix(".ortart"))
        t1 = t2 = clock()
    else:
        if variant == "cold":
            exe = crossrt.compile(path, "cpu")
        elif variant == "hit":
            exe = crossrt.compile(path, "cpu", cache_dir=cache_dir)
            result["cache"] = cache_stats().to_dict()
        else:
            exe = crossrt.load_executable(crm, validate_hash=variant == "crm")
        t1 = clock()
        rt = crossrt.Runtime()
        runner = rt.load(exe)
        t2 = clock()
    if profiler:
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(25)
        result["profile"] = text.getvalue()
        result["breakdown"] = breakdown(stats)
    result.update(prepare_s=t1 - t0, load_s=t2 - t1, total_s=t2 - t0)
    if runner is not None:
        feed = models.example_input(name)
        raw_api = variant in ("raw", "zero_copy")
        outs = runner.run(None, feed) if raw_api else list(runner.run(feed).values())
        result["checksum"] = [float(np.asarray(o, dtype=np.float64).sum()) for o in outs]
    print(json.dumps(result))


# (label, file suffix, function name, "tt" own time or "ct" cumulative time)
_PARTS = [
    # Section digests run on a thread pool, which cProfile does not see: timed by their caller.
    ("SHA-256 of the container's sections (on every core)", "~", "section_digests", "ct"),
    ("SHA-256 in this thread (the model file, when its status changed)", "~", "sha", "tt"),
    ("driver registry (imports and creates drivers)", "registry.py", "_load", "ct"),
    (
        "onnxruntime driver: artifact index and weight views",
        "onnxruntime/artifact.py",
        "unpack",
        "ct",
    ),
    (
        "onnxruntime driver: the graph's weight stubs pointed at the file",
        "~",
        "graph_reading",
        "ct",
    ),
    ("ORT: read the model bytes (protobuf)", "_collection.py", "_create_inference_session", "tt"),
    ("ORT: initialize_session (optimize, kernels)", "~", "initialize_session", "tt"),
]


def breakdown(stats: Any) -> dict[str, float]:
    """Seconds in the parts of a load that matter, from a ``pstats.Stats``."""
    found = dict.fromkeys([label for label, *_ in _PARTS], 0.0)
    for (file, _, func), (_, _, tt, ct, _) in stats.stats.items():
        for label, suffix, name, which in _PARTS:
            hit = ("sha256" in func or "_hashlib.HASH" in func) if name == "sha" else name in func
            if hit and (file.endswith(suffix) or suffix == "~"):
                value = tt if which == "tt" else ct
                found[label] = max(found[label], value) if which == "ct" else found[label] + value
    return found


def zero_copy_session(path: Path) -> Any:
    """An ORT session over an onnxruntime artifact in ``path``, its weights mapped by ORT."""
    import mmap

    import onnxruntime as ort

    from crossrt.drivers.onnxruntime import artifact as ort_artifact

    with open(path, "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    unpacked = ort_artifact.unpack(view)
    so = ort.SessionOptions()
    if unpacked.level == "all":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    folder = "session.model_external_initializers_file_folder_path"
    so.add_session_config_entry(folder, str(path.resolve().parent))
    graph = ort_artifact.graph_reading(unpacked, path.name, 0)
    return ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])


# -- the parent ---------------------------------------------------------------------------------


def run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args[:2]} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_model(name: str, rounds: int, profile: bool, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    import crossrt

    path = models.get(name)
    cache_dir = work / f"cache-{name}"
    crm = work / f"{name}.crm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSRT_")}
    started = time.perf_counter()
    # Warm the cache and write the .crm once, in this process (not timed).
    exe = crossrt.compile(path, "cpu", cache_dir=cache_dir)
    exe.save(crm)
    crm.with_suffix(".ortart").write_bytes(exe.nodes[0].artifact)
    setup_s = time.perf_counter() - started
    common = [name, str(path), str(cache_dir), str(crm)]
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            got = run_child([variant, *common], env)
            samples[variant].append(got)
            print(f"  {name} round {r + 1}/{rounds} {variant}: {got['total_s']:.3f} s", flush=True)
    for got in samples["hit"]:
        if got["cache"]["hits"] != 1 or got["cache"]["misses"] != 0:
            raise RuntimeError(f"a 'hit' measurement was not a cache hit: {got['cache']}")
    rows = {v: summarize(s) for v, s in samples.items()}
    checksums = {v: s[0]["checksum"] for v, s in samples.items() if "checksum" in s[0]}
    reference = checksums["raw"]
    agree = all(
        len(c) == len(reference)
        and all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(c, reference, strict=True))
        for c in checksums.values()
    )
    cold, raw = rows["cold"]["total_s"], rows["raw"]["total_s"]
    result: dict[str, Any] = {
        "model_file": str(path),
        "model_bytes": path.stat().st_size,
        "crm_bytes": crm.stat().st_size,
        "setup_s": setup_s,
        "rounds": rounds,
        "rows": rows,
        "speedup_vs_cold": {v: cold / rows[v]["total_s"] for v in ("hit", "crm")},
        "ratio_vs_raw": {v: rows[v]["total_s"] / raw for v in ("cold", "hit", "crm")},
        "checksums": checksums,
        "outputs_agree": agree,
    }
    result["targets"] = {
        f"{v}_2x_faster_than_cold": result["speedup_vs_cold"][v] >= TARGET_SPEEDUP
        for v in ("hit", "crm")
    } | {f"{v}_not_slower_than_raw": result["ratio_vs_raw"][v] <= 1.0 for v in ("hit", "crm")}
    if profile:
        profiled = {v: run_child([v, *common, "--profile"], env) for v in ("hit", "crm")}
        result["profiles"] = {v: p["profile"] for v, p in profiled.items()}
        result["breakdown"] = {
            v: p["breakdown"] | {"total of the profiled run": p["total_s"]}
            for v, p in profiled.items()
        }
    return result


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: statistics.median(s[key] for s in samples)
        for key in ("prepare_s", "load_s", "total_s")
    } | {"all_total_s": [s["total_s"] for s in samples]}


def machine_info() -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    import crossrt
    from crossrt.host import cpu_model, usable_cores

    return {
        "cpu": cpu_model()[0],
        "usable_cores": len(usable_cores()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "crossrt": crossrt.__version__,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Time to a loaded model: cold compile, cache hit, .crm file, raw ONNX Runtime",
        "",
        f"{m['date']} on {m['cpu']} ({m['usable_cores']} usable cores), {m['platform']}; "
        f"Python {m['python']}, crossrt {m['crossrt']}, onnxruntime {m['onnxruntime']}, "
        f"onnx {m['onnx']}.",
        "",
        f"Command: `{report['command']}`. Each number is the median over rounds of a fresh "
        "process (imports not timed); *prepare* is compile / cache lookup / container read, "
        "*load* is `Runtime.load` (the engine's session creation).",
        "",
        "| model | variant | prepare | load | total | vs cold | vs raw ORT |",
        "|---|---|---|---|---|---|---|",
    ]
    labels = {
        "cold": "cold compile + load",
        "hit": "cache hit + load",
        "crm": "load_executable(.crm) + load",
        "crm_unhashed": "(load_executable(.crm), hashes off, + load)",
        "raw": "raw `ort.InferenceSession(path)`",
        "hash": "(read + SHA-256 of the .onnx)",
        "zero_copy": "(floor: ORT session from the artifact alone, weights mapped)",
    }
    for name, r in report["models"].items():
        cold, raw = r["rows"]["cold"]["total_s"], r["rows"]["raw"]["total_s"]
        for v in VARIANTS:
            row = r["rows"][v]
            lines.append(
                f"| {name} | {labels[v]} | {row['prepare_s']:.3f} s | {row['load_s']:.3f} s "
                f"| {row['total_s']:.3f} s | {cold / row['total_s']:.2f}x faster "
                f"| {row['total_s'] / raw:.2f} |"
            )
    lines += ["", "| model | target | met |", "|---|---|---|"]
    for name, r in report["models"].items():
        for target, ok in r["targets"].items():
            lines.append(f"| {name} | {target} | {'yes' if ok else 'NO'} |")
    if any("breakdown" in r for r in report["models"].values()):
        lines += [
            "",
            "Where the time of a hit and of a `.crm` load goes (one run under cProfile, "
            "seconds; profiling slows it a little):",
            "",
            "| model | variant | part | seconds |",
            "|---|---|---|---|",
        ]
        for name, r in report["models"].items():
            for v, parts in r.get("breakdown", {}).items():
                lines += [f"| {name} | {v} | {part} | {t:.3f} |" for part, t in parts.items()]
    lines += [
        "",
        "Model files: "
        + "; ".join(
            f"{n} {r['model_bytes'] / 1e6:.0f} MB (.crm {r['crm_bytes'] / 1e6:.0f} MB), "
            f"outputs agree: {r['outputs_agree']}"
            for n, r in report["models"].items()
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--child"]:
        variant, name, path, cache_dir, crm, *rest = args_in[1:]
        child(variant, name, path, cache_dir, crm, profile="--profile" in rest)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,bert", help="comma-separated models")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per variant")
    parser.add_argument("--profile", action="store_true", help="cProfile one hit and one .crm")
    parser.add_argument("--out", type=Path, default=RESULTS / "load.json", help="JSON to write")
    args = parser.parse_args(args_in)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "command": "python benchmarks/load.py " + " ".join(args_in),
        "models": {},
    }
    work = Path(tempfile.mkdtemp(prefix="crossrt-load-"))
    try:
        for name in [n.strip() for n in args.models.split(",") if n.strip()]:
            print(f"{name}:", flush=True)
            report["models"][name] = bench_model(name, args.rounds, args.profile, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = markdown(report)
    reporting.save(args.out, report, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
