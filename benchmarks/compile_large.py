"""Compile time of large models against one raw ONNX Runtime session, and the ``.crm``'s size
against the ``.onnx`` file's.

A 185 MB LightGBM export took 30-83 s to compile against 16 s for one ORT session (issue 23:
five sessions and eight serializations inside), and a 51.6 MiB model became a 99.8 MiB
``.crm``. Two models of that size, from ``models.py``:

- ``trees``: a tree ensemble of ~180 MB, all of it in node attributes (nothing the skeleton
  can leave out; ORT's session builds the trees).
- ``wide``: ~190 MB of float32 weights in six MatMuls (``--weights-mb`` to change), whose
  weights ORT pre-packs.

Each variant runs in a fresh Python process (imports not timed), once per round:

- ``raw``: ``onnxruntime.InferenceSession(path)``, default options, CPU provider.
- ``compile``: ``crossrt.compile(path, "cpu")``, the ``.crm`` saved after the clock stops.
- ``auto``: ``crossrt.compile(path, "auto", auto_seconds=0.5)``: every engine tried (OpenVINO's
  refusal of the trees included), checked against the oracle, timed for 0.5 s.
- ``load``: ``crossrt.load_executable(crm)`` then ``Runtime().load(exe)``.

The ratio is each variant's median against ``raw``'s of the same run.

    python benchmarks/compile_large.py                  # trees and wide, 1 round (~6 min)
    python benchmarks/compile_large.py --models trees --rounds 2

Writes ``results/compile_large.json`` and ``.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # benchmarks/ is not a package: found through sys.path

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("raw", "compile", "load", "auto")


def child(variant: str, path: str, crm: str) -> None:
    """One measurement, printed as one JSON line."""
    import onnxruntime as ort

    import crossrt

    clock = time.perf_counter
    started = clock()
    if variant == "raw":
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    elif variant in ("compile", "auto"):
        options: dict[str, Any] = {"auto_seconds": 0.5} if variant == "auto" else {}
        exe = crossrt.compile(path, variant if variant == "auto" else "cpu", **options)
    else:
        with crossrt.Runtime() as rt:
            rt.load(crossrt.load_executable(crm))
    took = clock() - started
    result: dict[str, Any] = {"variant": variant, "seconds": took}
    if variant == "compile":
        exe.save(crm)
        result["crm_bytes"] = Path(crm).stat().st_size
    if variant == "auto":
        assert exe.decision is not None
        result["chosen"] = exe.decision["chosen"]["driver"]
    print(json.dumps(result))


def wide(megabytes: int) -> Any:
    """Six MatMuls of float32 weights, ``megabytes`` MB in all: ``x [N, 2048] -> y``."""
    import numpy as np

    import crossrt

    rng = np.random.default_rng(0)
    hidden = max(1, int(megabytes * 2**20 / 4 / 6 / 2048))
    b = crossrt.GraphBuilder("wide")
    h = b.input("x", "float32", ["N", 2048])
    for i in range(6):
        shape = (2048, hidden) if i % 2 == 0 else (hidden, 2048)
        w = (rng.standard_normal(shape, dtype=np.float32) * 0.01).astype(np.float32)
        h = b.op("Relu", [b.op("MatMul", [h, b.constant(w)])])
    b.output(h)
    return b.finish()


def measure(name: str, path: Path, rounds: int, work: Path) -> dict[str, Any]:
    crm = work / f"{name}.crm"
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for round_ in range(rounds):
        order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
        if not crm.exists():  # load needs the .crm of a compile first
            order = ("compile", *(v for v in order if v != "compile"))
        for variant in order:
            done = subprocess.run(
                [sys.executable, __file__, "--child", variant, str(path), str(crm)],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{name} {variant} failed:\n{done.stderr[-3000:]}")
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {name} {variant}: {runs[variant][-1]['seconds']:.2f} s", flush=True)
    medians = {v: statistics.median(r["seconds"] for r in runs[v]) for v in VARIANTS}
    return {
        "model": name,
        "onnx_bytes": path.stat().st_size,
        "crm_bytes": runs["compile"][-1]["crm_bytes"],
        "seconds": medians,
        "ratio_to_raw": {v: medians[v] / medians["raw"] for v in VARIANTS},
        "auto_chose": runs["auto"][-1]["chosen"],
        "runs": runs,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | .onnx MiB | .crm MiB | raw ORT session s | compile s (x raw) | "
        "load .crm s (x raw) | auto s (x raw) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, x = r["seconds"], r["ratio_to_raw"]
        lines.append(
            f"| {r['model']} | {r['onnx_bytes'] / 2**20:.1f} | {r['crm_bytes'] / 2**20:.1f} | "
            f"{s['raw']:.2f} | {s['compile']:.2f} ({x['compile']:.2f}x) | "
            f"{s['load']:.2f} ({x['load']:.2f}x) | {s['auto']:.2f} ({x['auto']:.2f}x) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="trees,wide")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--weights-mb", type=int, default=190)
    p.add_argument("--out", type=Path, default=RESULTS / "compile_large.json")
    args = p.parse_args()
    import models

    rows = []
    with tempfile.TemporaryDirectory(prefix="crossrt-compile-large-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            if name == "wide":
                path = work / "wide.onnx"
                wide(args.weights_mb).save(path)
            else:
                path = models.get(name)
            rows.append(measure(name, path, args.rounds, work))
    doc = {
        "benchmark": "compile_large",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"cpu": platform.processor() or platform.machine(), "python": sys.version},
        "rounds": args.rounds,
        "results": rows,
    }
    reporting.save(args.out, doc, table(rows))


if __name__ == "__main__":
    main()
