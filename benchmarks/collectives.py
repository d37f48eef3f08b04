"""All-reduce bandwidth through crossrt's collectives API beside the backend used raw.

Two ranks of one ``mpiexec -n 2`` job on this host (loopback; MPICH moves the bytes through
shared memory). Per size (float32 arrays of 4 KiB .. 64 MiB), on the same communicator and
buffers, alternating blocks of:

- ``raw mpi4py``: ``comm.Allreduce(send, recv)`` (MPI's blocking all-reduce, SUM);
- ``crossrt``: ``Communicator.all_reduce(send, out=recv)``: argument checks, then
  ``Iallreduce`` waited for by crossrt's bounded wait (it polls the request, checks the
  deadline and the peers' watch, and yields the core).

Reported per size: median time per all-reduce (rank 0's clock, each block started after a
barrier), algorithm bandwidth (bytes / time) and bus bandwidth (x 2(n-1)/n, as nccl-tests
report it) of each, and ``ratio``: crossrt's median time / raw's (1.00: no cost).

    python benchmarks/collectives.py            # ~1 min on 2 cores
    python benchmarks/collectives.py --quick    # 3 sizes

Writes ``results/collectives.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK = [4 << 10, 1 << 20, 16 << 20]


def _iterations(nbytes: int) -> int:
    return max(4, min(400, (256 << 20) // (nbytes * 8)))


def worker(sizes: list[int], rounds: int) -> None:
    """One rank: time both variants; rank 0 prints the samples as JSON."""
    from mpi4py import MPI

    from crossrt.collectives import Communicator

    comm = Communicator.from_env(timeout=120)
    raw = MPI.COMM_WORLD.Dup()
    samples: dict[str, dict[str, list[float]]] = {}
    for nbytes in sizes:
        send = np.random.default_rng(comm.rank).random(nbytes // 4, dtype=np.float32)
        recv = np.empty_like(send)
        n = _iterations(nbytes)
        variants = {
            "raw mpi4py": lambda send=send, recv=recv: raw.Allreduce(send, recv),
            "crossrt": lambda send=send, recv=recv: comm.all_reduce(send, out=recv),
        }
        for call in variants.values():  # warm up: buffers registered, pages touched
            call()
        times: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                raw.Barrier()
                start = time.perf_counter()
                for _ in range(n):
                    variants[name]()
                times[name].append((time.perf_counter() - start) / n)
        expected = sum(np.random.default_rng(k).random(nbytes // 4, dtype=np.float32)
                       for k in range(comm.size))  # fmt: skip
        comm.all_reduce(send, out=recv)
        assert np.allclose(recv, expected), "crossrt's all-reduce gave a wrong sum"
        samples[str(nbytes)] = times
    if comm.rank == 0:
        import mpi4py

        versions = {"mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().split("\n")[0]}
        doc = {"size": comm.size, "versions": versions, "samples": samples}
        print("SAMPLES " + json.dumps(doc), flush=True)
    comm.close()
    raw.Free()


def _fmt_bytes(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three sizes, fewer rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "collectives.json"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker([int(s) for s in args.sizes.split(",")], args.rounds)
        return 0

    from reporting import save

    from crossrt.collectives import mpiexec

    sizes = QUICK if args.quick else SIZES
    rounds = 3 if args.quick else args.rounds
    command = [mpiexec(), "-n", "2", sys.executable, __file__, "--worker",
               "--rounds", str(rounds), "--sizes", ",".join(map(str, sizes))]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SAMPLES ")), None)
    if done.returncode or line is None:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return 1
    data = json.loads(line[len("SAMPLES ") :])
    ranks = data["size"]
    rows = []
    for nbytes in sizes:
        times = data["samples"][str(nbytes)]
        row: dict = {"bytes": nbytes, "iterations": _iterations(nbytes), "rounds": rounds}
        for name, values in times.items():
            median = statistics.median(values)
            row[name] = {
                "median_s": median,
                "samples_s": values,
                "algbw_GBps": nbytes / median / 1e9,
                "busbw_GBps": nbytes / median / 1e9 * 2 * (ranks - 1) / ranks,
            }
        row["ratio"] = row["crossrt"]["median_s"] / row["raw mpi4py"]["median_s"]
        rows.append(row)
    doc = {
        "benchmark": "collectives",
        "ranks": ranks,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
        "versions": data["versions"],
        "rows": rows,
    }
    lines = [
        f"All-reduce (SUM, float32), {ranks} ranks on one host, crossrt vs raw mpi4py "
        f"({' '.join(doc['versions']['mpi'].split())}, mpi4py {doc['versions']['mpi4py']})",
        "",
        "| size | raw median | raw busbw | crossrt median | crossrt busbw | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        raw, ours = row["raw mpi4py"], row["crossrt"]
        lines.append(
            f"| {_fmt_bytes(row['bytes'])} | {raw['median_s'] * 1e6:.1f} us | "
            f"{raw['busbw_GBps']:.2f} GB/s | {ours['median_s'] * 1e6:.1f} us | "
            f"{ours['busbw_GBps']:.2f} GB/s | {row['ratio']:.2f} |"
        )
    save(args.out, doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
