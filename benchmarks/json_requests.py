"""What reading a KServe JSON request, and writing a JSON answer, costs the daemon.

Requests, read to the tensor: ``json.loads`` (what ``crossrt serve --http`` used first),
python-rapidjson, orjson (alone, which gives no array, then with NumPy's conversion of its
lists), pysimdjson (the whole document, then the array's buffer) and ``server/rest_json.py``
(what it uses now: orjson whole for bodies under 64 KiB; above, long arrays of numbers kept
as text and parsed by simdjson a chunk at a time straight into the tensor), from a small
input (4 Ki FP32, ~80 KiB), a ResNet input (3x224x224 random FP32, ~2.9 MiB) and two bodies
of 4 Mi FP32 values. Answers, 4 Mi values from the engine's bytes to the JSON body:
``orjson.dumps(array, OPT_SERIALIZE_NUMPY)`` (the bar) and ``server/rest.py``'s answer
(``tensors.encode_outputs`` as the service answers the HTTP front, the output array kept out
of the message, then ``_response``; and through the message's raw contents, as gRPC's answer
is made) in FP32, FP16 and INT64.

Each row runs in a process of its own (peak RSS is per process): the body is read from a
file, then parsed, and the row reports the seconds taken (the least of 20 tries for bodies
under 1 MiB, of 3 under 8 MiB and for answers, one try above) and the peak RSS added
(``VmHWM``), as a multiple of the body's size, and against the first row (``json.loads``, or
``orjson.dumps`` for answers) and ``orjson.loads`` alone in the same run.

    python benchmarks/json_requests.py           # ~60 s
    python benchmarks/json_requests.py --out /tmp/json_requests.json

Writes a JSON file (``--out``, default ``results/json_requests.json``) and a Markdown table
next to it, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
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
import json, os, sys, time
import numpy as np
def hwm():  # VmHWM: this process's peak RSS (ru_maxrss keeps the parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
which, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
import orjson
import rapidjson  # imported before the measure: crossrt.server's imports alone take 30 MiB
import simdjson
from tritonclient.grpc import service_pb2 as pb
from crossrt import dtypes
from crossrt.model import TensorSpec
from crossrt.server import rest, rest_json, tensors
body = open(path, "rb").read()
if which.startswith("answer"):  # body: the raw output, its KServe datatype in the name
    datatype = path.rsplit(".", 1)[1]
    x = np.frombuffer(body, dtypes.from_kserve(datatype).numpy)
    spec = TensorSpec("y", dtypes.from_kserve(datatype), (count,))
    del body
def answer(kept):  # as the service answers the HTTP front (kept) or gRPC (None), then rest.py
    response = pb.ModelInferResponse(model_name="m", id="1")
    tensors.encode_outputs(response, {"y": x}, [(spec, None)], None, (), kept)
    return rest._response(response, {}, kept or {})[0]
def parse():
    if which == "json.loads":
        doc = json.loads(body)
        return np.asarray(doc["inputs"][0]["data"], np.float32)
    if which == "rapidjson.loads":
        doc = rapidjson.loads(body)
        return np.asarray(doc["inputs"][0]["data"], np.float32)
    if which == "orjson.loads alone":
        return orjson.loads(body)
    if which == "orjson.loads + NumPy":
        doc = orjson.loads(body)
        return np.asarray(doc["inputs"][0]["data"], np.float32)
    if which == "simdjson whole + buffer":
        data = simdjson.Parser().parse(body)["inputs"][0]["data"]
        return np.frombuffer(data.as_buffer(of_type="d"), np.float64).astype(np.float32)
    if which == "rest_json.loads":
        data = rest_json.loads(memoryview(body))["inputs"][0]["data"]
        if isinstance(data, rest_json.Numbers):  # checked against the shape as rest.py does
            return data.array(np.dtype(np.float32), count)
        return rest_json.tensor(data, np.dtype(np.float32))
    if which == "answer: orjson.dumps(array)":
        return orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)
    if which == "answer: rest.py":
        return answer({})
    if which == "answer: rest.py through the message":
        return answer(None)
    raise SystemExit(f"no such row: {which}")
size = os.path.getsize(path)
tries = 20 if size < 1 << 20 else 3 if size < 8 << 20 or which.startswith("answer") else 1
before = hwm()
seconds = float("inf")
for _ in range(tries):
    start = time.perf_counter()
    x_or_doc = parse()
    seconds = min(seconds, time.perf_counter() - start)
    if which.startswith("answer"):  # the array alone, or rest.py's whole answer
        assert x_or_doc.endswith((b"]", b"]}]}")), x_or_doc[-20:]
    elif which != "orjson.loads alone":
        assert x_or_doc.shape == (count,), x_or_doc.shape
    del x_or_doc
grew = hwm() - before
print(json.dumps({"seconds": seconds, "peak_kib": grew}))
"""

PARSERS = (
    "json.loads",
    "rapidjson.loads",
    "orjson.loads alone",
    "orjson.loads + NumPy",
    "simdjson whole + buffer",
    "rest_json.loads",
)
WRITERS = ("answer: orjson.dumps(array)", "answer: rest.py", "answer: rest.py through the message")
RESNET = 3 * 224 * 224
SMALL = 4096


def bodies(folder: Path) -> dict[str, tuple[Path, int]]:
    """A small input, a ResNet input, and two bodies of COUNT values: one short number
    each, and random float32s."""
    out = {}
    for label, count, random in (
        ("small input", SMALL, True),
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


def outputs(folder: Path) -> dict[str, tuple[Path, int]]:
    """COUNT random values of FP32, FP16 and INT64, as the engine's raw bytes."""
    rng = np.random.default_rng(1)
    out = {}
    for datatype, values in (
        ("FP32", rng.random(COUNT, dtype=np.float32)),
        ("FP16", rng.random(COUNT, dtype=np.float32).astype(np.float16)),
        ("INT64", rng.integers(-(2**40), 2**40, COUNT)),
    ):
        path = folder / f"output.{datatype}"
        path.write_bytes(values.tobytes())
        out[f"{datatype} answer"] = (path, COUNT)
    return out


def _run(which: str, path: Path, count: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", ROW, which, str(path), str(count)],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{which} on {path.name} failed:\n{done.stderr}")
    measured: dict[str, float] = json.loads(done.stdout)
    return measured


def measure() -> list[dict[str, Any]]:
    """Every row: each parser on each body, each writer on each output."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for group, names in ((bodies(folder), PARSERS), (outputs(folder), WRITERS)):
            for body, (path, count) in group.items():
                for which in names:
                    measured = _run(which, path, count)
                    rows.append(
                        {
                            "body": body,
                            "body_mib": path.stat().st_size / 2**20,
                            "parser": which,
                            "seconds": measured["seconds"],
                            "peak_mib": measured["peak_kib"] / 1024,
                        }
                    )
    for row in rows:
        same = [r for r in rows if r["body"] == row["body"]]
        base = same[0]  # json.loads, or orjson.dumps for an answer
        bar = next((r for r in same if r["parser"] == "orjson.loads alone"), base)
        row["peak_x_body"] = row["peak_mib"] / row["body_mib"]
        row["peak_vs_first"] = row["peak_mib"] / max(base["peak_mib"], 1 / 1024)
        row["time_vs_first"] = row["seconds"] / base["seconds"]
        row["time_vs_orjson"] = row["seconds"] / bar["seconds"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "json_requests.json")
    args = parser.parse_args(argv)
    rows = measure()
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "python": platform.python_version(),
        "values": COUNT,
        "rows": rows,
    }
    reporting.save(args.out, doc, table(rows))
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (seconds to 3 significant digits: 80 KiB takes 0.1 ms)."""
    lines = [
        "| body | parser | seconds | peak RSS added | x body | vs first row (RSS, time) "
        "| time vs orjson |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['body']} ({r['body_mib']:.2f} MiB) | {r['parser']} | {r['seconds']:.3g} | "
            f"{r['peak_mib']:.0f} MiB | {r['peak_x_body']:.1f} | "
            f"{r['peak_vs_first']:.2f}, {r['time_vs_first']:.2f} | {r['time_vs_orjson']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
