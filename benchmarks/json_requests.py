"""What reading a KServe JSON request costs the daemon: ``json.loads`` (what ``crossrt serve
--http`` used), python-rapidjson (in the lock) and ``server/rest_json.py`` (what it uses now:
long arrays of numbers parsed by NumPy straight into the tensor), each from a body of 4 Mi
FP32 values to the tensor.

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
which, path = sys.argv[1], sys.argv[2]
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
else:
    doc = rest_json.loads(memoryview(body))
    x = doc["inputs"][0]["data"].array(np.dtype(np.float32))
seconds = time.perf_counter() - start
grew = hwm() - before
assert x.shape == (COUNT,), x.shape
print(json.dumps({"seconds": seconds, "peak_kib": grew}))
""".replace("COUNT", str(COUNT))

PARSERS = ("json.loads", "rapidjson.loads", "rest_json.loads")


def bodies(folder: Path) -> dict[str, Path]:
    """Two bodies of COUNT values: one short number each, and random float32s."""
    short = folder / "short.json"
    head = f'{{"inputs": [{{"name": "x", "shape": [{COUNT}], "datatype": "FP32", "data": ['
    short.write_text(head + "0.5, " * (COUNT - 1) + "0.5]}]}")
    random = folder / "random.json"
    values = np.random.default_rng(0).random(COUNT, dtype=np.float32)
    random.write_text(head + ", ".join(map(str, values.tolist())) + "]}]}")
    return {"0.5 each": short, "random float32": random}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "json_requests.json")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for body, path in bodies(Path(folder)).items():
            size = path.stat().st_size
            for which in PARSERS:
                done = subprocess.run(
                    [sys.executable, "-c", ROW, which, str(path)],
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
            f"| {r['body']} ({r['body_mib']:.0f} MiB) | {r['parser']} | {r['seconds']:.2f} | "
            f"{r['peak_mib']:.0f} MiB | {r['peak_x_body']:.1f} | "
            f"{r['peak_vs_json']:.2f}, {r['time_vs_json']:.2f} |"
        )
    reporting.save(args.out, doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
