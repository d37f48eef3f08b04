"""Memory of several instances of one model: crossrt vs raw ONNX Runtime sessions.

Each variant runs in a fresh process, which loads the model K times (K instances of one
crossrt model, or K raw sessions), runs each once, and reports its private (anonymous) memory
and resident set before and after. Private memory is what each further instance really costs:
file pages that several sessions map (the weights of a ``.crm``) are shared through the page
cache and counted once for the whole machine, however many sessions and processes read them.

Variants:

- **raw ORT**: K ``InferenceSession(path)`` with default options (ORT optimizes each session on
  its own, and each holds its own weights, reordered for this CPU).
- **crossrt .crm**: ``rt.load(load_executable(path), instances=K)``: the artifact was
  optimized at compile for this CPU, and ORT maps the weights from the ``.crm`` file.
- **crossrt .crm, portable**: the same from a ``compile(..., portable=True)`` container, which
  ORT optimizes for this CPU at load: each session builds its own reordered weights.
- **crossrt from memory**: ``load_executable(bytes)``: one instance has ORT copy the weights;
  several share one copy spilled to ``/dev/shm`` (the "shared memory" column).

    python benchmarks/memory.py                  # resnet50 and bert, K = 2
    python benchmarks/memory.py --models resnet50 --instances 2

Writes ``results/memory.json`` and ``results/memory.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import onnxruntime as ort

import crossrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("raw", "crm", "crm_portable", "memory")
LABELS = {
    "raw": "raw ORT, K sessions",
    "crm": "crossrt .crm, K instances",
    "crm_portable": "crossrt portable .crm, K instances",
    "memory": "crossrt from memory, K instances",
}
MIB = 2**20


def memory() -> dict[str, int]:
    """This process's anonymous (private) memory, resident set and resident shared memory
    (``/dev/shm`` pages it maps, such as an artifact spilled for several instances), in bytes."""
    found: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Anonymous"):
                found[key.lower()] = int(value.split()[0]) * 1024
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "RssShmem":
                found["shmem"] = int(value.split()[0]) * 1024
    return found


def child(variant: str, model: str, instances: int, crm: Path, portable: Path) -> dict[str, Any]:
    """Load ``instances`` copies in this process; memory after each step."""
    feed = models.example_input(model)
    steps: list[dict[str, Any]] = [{"step": "start", **memory()}]
    if variant == "raw":
        sessions = [
            ort.InferenceSession(str(models.get(model)), providers=["CPUExecutionProvider"])
            for _ in range(instances)
        ]
        steps.append({"step": "loaded", **memory()})
        for session in sessions:
            session.run(None, feed)
    else:
        source: Path | bytes = {"crm": crm, "crm_portable": portable}.get(variant, crm)
        if variant == "memory":
            source = crm.read_bytes()
        exe = crossrt.load_executable(source)
        rt = crossrt.Runtime()
        loaded = rt.load(exe, instances=instances, cores_per_instance=1)
        steps.append({"step": "loaded", **memory()})
        futures = [loaded.run_async(feed) for _ in range(instances * 2)]
        for future in futures:
            future.result()
    steps.append({"step": "ran", **memory()})
    return {"variant": variant, "model": model, "instances": instances, "steps": steps}


def measure(model: str, variant: str, instances: int, crm: Path, portable: Path) -> dict[str, Any]:
    """One variant in a fresh process, for 1 and for ``instances`` copies."""
    rows = {}
    for k in (1, instances):
        command = [sys.executable, __file__, "--child", variant, model, str(k), str(crm)]
        command.append(str(portable))
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows[k] = json.loads(out.strip().splitlines()[-1])
    one, many = rows[1]["steps"], rows[instances]["steps"]
    extra = max(1, instances - 1)
    return {
        "model": model,
        "variant": variant,
        "instances": instances,
        "private_1": one[-1]["anonymous"] - one[0]["anonymous"],
        "private_k": many[-1]["anonymous"] - many[0]["anonymous"],
        "rss_k": many[-1]["rss"] - many[0]["rss"],
        "shmem_k": many[-1]["shmem"] - many[0]["shmem"],
        "private_per_extra": (
            (many[-1]["anonymous"] - many[0]["anonymous"])
            - (one[-1]["anonymous"] - one[0]["anonymous"])
        )
        / extra,
        "raw_steps": rows,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | variant | private, 1 | private, K | per extra instance | vs raw | RSS, K "
        "| shared memory, K |",
        "|---|---|---|---|---|---|---|---|",
    ]
    raw = {r["model"]: r for r in rows if r["variant"] == "raw"}
    for r in rows:
        base = raw.get(r["model"])
        ratio = f"{r['private_k'] / base['private_k']:.2f}x" if base and base["private_k"] else "-"
        lines.append(
            f"| {r['model']} | {LABELS[r['variant']].replace('K', str(r['instances']))} "
            f"| {r['private_1'] / MIB:.0f} MiB | {r['private_k'] / MIB:.0f} MiB "
            f"| {r['private_per_extra'] / MIB:.0f} MiB | {ratio} | {r['rss_k'] / MIB:.0f} MiB "
            f"| {r['shmem_k'] / MIB:.0f} MiB |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,bert", help="comma-separated models")
    parser.add_argument("--instances", type=int, default=2, help="K (each gets one core)")
    parser.add_argument("--out", type=Path, default=RESULTS / "memory.json", help="JSON to write")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        variant, model, k, crm, portable = args.child
        print(json.dumps(child(variant, model, int(k), Path(crm), Path(portable))))
        return 0
    rows = []
    for model in args.models.split(","):
        crm = models.MODELS_DIR / f"{model}.crm"
        portable = models.MODELS_DIR / f"{model}-portable.crm"
        crossrt.compile(models.get(model), "cpu").save(crm)
        crossrt.compile(models.get(model), "cpu", portable=True).save(portable)
        for variant in VARIANTS:
            rows.append(measure(model, variant, args.instances, crm, portable))
            print(table(rows).splitlines()[-1], flush=True)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    meta = {
        "when": when,
        "machine": f"{platform.processor() or platform.machine()} ({len(os.sched_getaffinity(0))} "
        f"usable cores), {platform.platform()}",
        "versions": {"python": platform.python_version(), "onnxruntime": ort.__version__},
        "command": "python benchmarks/memory.py " + " ".join(argv or sys.argv[1:]),
    }
    text = (
        f"# Memory of {args.instances} instances: crossrt vs raw ONNX Runtime\n\n"
        f"{when} on {meta['machine']}; Python {meta['versions']['python']}, onnxruntime "
        f"{meta['versions']['onnxruntime']}.\n\nCommand: `{meta['command'].strip()}`. Private = "
        "anonymous memory the process gained (loaded, then one run per instance); file pages "
        "mapped by several sessions are shared and not in it. Shared memory = the /dev/shm "
        "pages the process maps (an in-memory artifact spilled for several instances: RAM "
        "too, once, however many sessions map it; counted once per mapping here).\n\n"
        + table(rows)
        + "\n"
    )
    reporting.save(args.out, {"meta": meta, "rows": rows}, text, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
