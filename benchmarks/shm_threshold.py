"""Where shared memory beats the message: the default ``connect(shm_threshold=)``.

``crossrt serve`` on a Unix socket serves ``y = x + 1`` on float32 ``[n]``; one client sends
its tensors inside the messages (``shm_threshold=None``), another through shared memory
(``shm_threshold=0``: a sealed memfd on the direct lane, mapped by the daemon; with
``--grpc``, a named segment over gRPC). For each size, after a warm-up, the two run in
alternating blocks of 10 calls, 15 rounds: p50 latency of each, and their ratio.

    python benchmarks/shm_threshold.py            # ~1 min on 2 cores
    python benchmarks/shm_threshold.py --grpc

Writes ``results/shm_threshold.json`` (``--out``) and a Markdown table next to it. The
client's default, ``client.SHM_THRESHOLD``, is the smallest size measured where shared memory
was faster.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import crossrt
from crossrt.host import cpu_model, usable_cores
from crossrt.server.client import SHM_THRESHOLD, connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting
from serve import start_daemon  # benchmarks/ is not a package: found through sys.path

RESULTS = Path(__file__).resolve().parent / "results"
SIZES_KIB = (4, 16, 32, 64, 128, 256, 512, 1024, 4096)


def adder() -> crossrt.Model:
    b = crossrt.GraphBuilder("adder")
    x = b.input("x", "float32", ["n"])
    b.output(b.op("Add", [x, b.constant(np.float32(1))], outputs=["y"]))
    return b.finish()


def p50_us(calls: list[float]) -> float:
    return statistics.median(calls) * 1e6


def run(lane: bool) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="crossrt-bench-shm-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        crossrt.compile(adder(), "cpu").save(folder / "models" / "adder.crm")
        daemon = start_daemon(folder)
        try:
            sock = f"unix:{folder}/d.sock"
            with (
                connect(sock, shm_threshold=None, lane=lane) as inline,
                connect(sock, shm_threshold=0, lane=lane) as shared,
            ):
                variants = {"message": inline.load("adder"), "shm": shared.load("adder")}
                for kib in SIZES_KIB:
                    x = np.random.default_rng(kib).random(kib * 256, dtype=np.float32)
                    for model in variants.values():
                        for _ in range(5):  # warm-up; the segment registered
                            np.testing.assert_array_equal(model.run(x)["y"], x + 1)
                    times: dict[str, list[float]] = {k: [] for k in variants}
                    for _ in range(15):
                        for key, model in variants.items():
                            for _ in range(10):
                                started = time.perf_counter()
                                model.run(x)
                                times[key].append(time.perf_counter() - started)
                    message, shm = p50_us(times["message"]), p50_us(times["shm"])
                    rows.append(
                        {
                            "kib": kib,
                            "message_p50_us": round(message, 1),
                            "shm_p50_us": round(shm, 1),
                            "shm_vs_message": round(shm / message, 3),
                        }
                    )
                    print(f"{kib} KiB: message {message:.0f} us, shm {shm:.0f} us", flush=True)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Shared memory against the message ({report['transport']}, {report['date']}, "
        f"{report['machine']})",
        "",
        "| tensor | message p50 us | shm p50 us | shm / message |",
        "| --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['kib']} KiB | {r['message_p50_us']:.0f} | {r['shm_p50_us']:.0f} | "
            f"{r['shm_vs_message']:.2f} |"
        )
    lines += ["", f"client.SHM_THRESHOLD: {report['default_threshold_kib']} KiB", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--grpc", action="store_true", help="over gRPC instead of the direct lane")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    transport = "gRPC" if args.grpc else "direct lane"
    report = {
        "transport": transport,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{' '.join(cpu_model()).strip()}, {len(usable_cores())} CPUs",
        "default_threshold_kib": SHM_THRESHOLD // 1024,
        "rows": run(lane=not args.grpc),
    }
    out = args.out or RESULTS / ("shm_threshold-grpc.json" if args.grpc else "shm_threshold.json")
    table = markdown(report)
    reporting.save(out, report, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
