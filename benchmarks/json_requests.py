"""What reading a KServe JSON request costs the daemon: ``json.loads`` (what ``crossrt serve
--http`` used), python-rapidjson, orjson (whole, then NumPy) and ``server/rest_json.py`` (what
it uses now: orjson whole for bodies under 4 MiB; above, long arrays of numbers kept as text
and parsed by orjson a chunk at a time straight into the tensor), from a ResNet input
(3x224x224 random FP32, ~1.6 MiB) and two bodies of 4 Mi FP32 values, to the tensor.

Each row runs in a process of its own (peak RSS is per process): the body is read from a
file, then parsed, and the row reports the seconds taken and the peak RSS added
(``VmHWM``), as a multiple of the body's size, and against ``json.loads`` in the same run.

    python benchmarks/json_requests.py           # ~30 s
    python benchmarks/json_requests.py --out /tmp/json_requests.json

Writes a JSON file (``--out``, default ``results/json_requests.json``) and a Markdown table
next to it, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # benchmarks/ is not a package: found through sys.path

RESULTS = Path(__file__).resolve().parent / "results"
COUNT = 4 * 2**20

ROW = """
import json, sys, time
import numpy as np
def hwm():  # VmHWM: this process's peak RSS (ru_maxrss keeps the parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
which, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
import orjson
import rapidjson  # imported before the measure: crossrt.server's imports alone take 30 MiB
from crossrt.server import rest_json
body = open(path, "rb").read()
before = hwm()
start = time.perf_counter()
if which == "json.loads":
    doc = json.loads(body)
    x = np.asarray(doc["inputs"][0]["data"], np.float32)
elif which == "rapidjson.loads":
    doc = rapidjson.loads(body)
    x = np.asarray(doc["inputs"][0]["data"], np.float32)
elif which == "orjson.loads":
    doc = orjson.loads(body)
    x = np.asarray(doc["inputs"][0]["data"], np.float32)
else:
    doc = rest_json.loads(memoryview(body))
    data = doc["inputs"][0]["data"]
    if isinstance(data, rest_json.Numbers):
        x = data.array(np.dtype(np.float32))
    else:
        x = rest_json.tensor(data, np.dtype(np.float32))
seconds = time.perf_counter() - start
grew = hwm() - before
assert x.shape == (count,), x.shape
print(json.dumps({"seconds": seconds, "peak_kib": grew}))
"""

PARSERS = ("json.loads", "rapidjson.loads", "orjson.loads", "rest_json.loads")
RESNET = 3 * 224 * 224


def bodies(folder: Path) -> dict[str, tuple[Path, int]]:
    """A ResNet input, and two bodies of COUNT values: one short number each, and random
    float32s."""
    out = {}
    for label, count, random in (
        ("ResNet input", RESNET, True),
        ("0.5 each", COUNT, False),
        ("random float32", COUNT, True),
    ):
        path = folder / f"{count}-{random}.json"
        head = f'{{"inputs": [{{"name": "x", "shape": [{count}], "datatype": "FP32", "data": ['
        if random:
            values = np.random.default_rng(0).random(count, dtype=np.float32)
            path.write_text(head + ", ".join(map(str, values.tolist())) + "]}]}")
        else:
            path.write_text(head + "0.5, " * (count - 1) + "0.5]}]}")
        out[label] = (path, count)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "json_requests.json")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for body, (path, count) in bodies(Path(folder)).items():
            size = path.stat().st_size
            for which in PARSERS:
                done = subprocess.run(
                    [sys.executable, "-c", ROW, which, str(path), str(count)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                measured = json.loads(done.stdout)
                rows.append(
                    {
                        "body": body,
                        "body_mib": size / 2**20,
                        "parser": which,
                        "seconds": measured["seconds"],
                        "peak_mib": measured["peak_kib"] / 1024,
                    }
                )
    for row in rows:
        base = next(r for r in rows if r["body"] == row["body"] and r["parser"] == PARSERS[0])
        row["peak_x_body"] = row["peak_mib"] / row["body_mib"]
        row["peak_vs_json"] = row["peak_mib"] / base["peak_mib"]
        row["time_vs_json"] = row["seconds"] / base["seconds"]
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "values": COUNT,
        "rows": rows,
    }
    lines = [
        "| body | parser | seconds | peak RSS added | x body | vs json.loads (RSS, time) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['body']} ({r['body_mib']:.1f} MiB) | {r['parser']} | {r['seconds']:.3f} | "
            f"{r['peak_mib']:.0f} MiB | {r['peak_x_body']:.1f} | "
            f"{r['peak_vs_json']:.2f}, {r['time_vs_json']:.2f} |"
        )
    reporting.save(args.out, doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
