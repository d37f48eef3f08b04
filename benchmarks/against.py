"""The tiny model's ``run()`` per call of this checkout against another checkout of crossrt
(the commit before a change to the run path), paired and alternating in one run.

Two worker processes, one per checkout, each with its own interpreter (``.venv/bin/python``
of that checkout, else this one) and its own ``crossrt`` (imported from the checkout's
``src``), load the same tiny model and wait. The parent then asks each in turn for one
block of calls, the order swapped every pair (ABBA), so that drift on a busy machine falls
on both alike; only one worker runs at a time. A block is the best of a few short stretches
of calls; the ratio is the median of the per-pair ratios (this / other), over several
rounds of fresh workers. Used by ``overhead.py --against DIR``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# What each worker runs, in its own checkout: the tiny model loaded as overhead.py loads it,
# then one block per line read: ``repeats`` runs of ``n`` calls, the least mean seconds per
# call written back (the least: on a busy machine a stretch of calls that another process
# preempted says nothing of crossrt). The call is one of VARIANTS. Only names every checkout
# has (crossrt.compile, Runtime.load, run, request) are used.
WORKER = r"""
import sys, time
sys.path.insert(0, "benchmarks")
import numpy as np
import crossrt, models
feed = models.example_input("tiny")
lm = crossrt.Runtime().load(crossrt.compile(models.get("tiny"), device="cpu"))
into = {name: np.empty_like(v) for name, v in lm.run(feed).items()}
variant = sys.argv[1]
if variant == "run":
    call, args = lm.run, (feed,)
elif variant == "outputs":
    call, args = lm.run, (feed, into)
elif variant == "lane":  # the same model served by this checkout's daemon, over the lane
    import atexit, os, subprocess, tempfile
    folder = tempfile.mkdtemp(prefix="crossrt-against-")
    os.mkdir(os.path.join(folder, "models"))
    lm.executable.save(os.path.join(folder, "models", "tiny.crm"))
    sock = os.path.join(folder, "d.sock")
    env = dict(os.environ, PYTHONPATH=os.path.abspath("src"), CROSSRT_RUNTIME_DIR=folder)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "crossrt", "serve", "-x", "-l", "warning", "-g", "unix:" + sock,
         "--model-repository", os.path.join(folder, "models")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    atexit.register(daemon.wait, 30)
    atexit.register(daemon.terminate)
    for _ in range(600):
        if os.path.exists(sock):
            try:
                remote = crossrt.connect("unix:" + sock)
                break
            except crossrt.CrossrtError:
                pass
        time.sleep(0.05)
    for _ in range(600):  # the socket answers before the repository's models are ready
        try:
            served = remote.load("tiny")
            break
        except crossrt.CrossrtError:
            time.sleep(0.05)
    call, args = served.run, (feed,)
else:
    call, args = lm.request(feed, into).run, ()
for _ in range(WARMUP):
    call(*args)
print(crossrt.__file__, flush=True)
clock = time.perf_counter
for line in sys.stdin:
    n, repeats = map(int, line.split())
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            call(*args)
        best = min(best, (clock() - t0) / n)
    print(best, flush=True)
"""
VARIANTS = {
    "run": "run(feed)",
    "outputs": "run(feed, outputs) into arrays given",
    "request": "a bound request's run() (model.request(feed, outputs))",
    "lane": "run(feed) of a client of the checkout's own daemon over the direct lane",
}


class Worker:
    """One checkout's worker process (see the module docstring)."""

    def __init__(self, checkout: Path, warmup: int, variant: str = "run") -> None:
        python = checkout / ".venv" / "bin" / "python"
        self.checkout = checkout
        interpreter = str(python) if python.is_file() else sys.executable
        self.proc = subprocess.Popen(
            [interpreter, "-c", WORKER.replace("WARMUP", str(warmup)), variant],
            cwd=checkout,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(checkout / "src")},
        )
        imported = Path(self._line())  # the crossrt it imported: proof of which checkout runs
        if not imported.is_relative_to(checkout):
            raise RuntimeError(f"the worker in {checkout} imported crossrt from {imported}")
        self.module = imported.relative_to(checkout).as_posix()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker in {self.checkout} exited (rc {self.proc.wait()})")
        return line.strip()

    def block(self, calls: int, repeats: int) -> float:
        """The least mean seconds per call of ``repeats`` stretches of ``calls`` runs."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{calls} {repeats}\n")
        self.proc.stdin.flush()
        return float(self._line())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def paired(
    this: Path,
    other: Path,
    rounds: int,
    pairs: int,
    calls: int,
    warmup: int,
    repeats: int = 8,
    variant: str = "run",
) -> dict[str, Any]:
    """Time ``run()`` of the tiny model in ``this`` and ``other`` checkout: ``rounds`` rounds,
    each with a fresh worker per checkout (two processes of the same code differ by a few
    per cent: memory layout, the core they land on) timing ``pairs`` pairs of blocks (each
    the best of ``repeats`` stretches of ``calls`` calls), alternating; the JSON document
    overhead.py writes. The ratio is the median over every pair of every round."""
    load_before = os.getloadavg()
    means: list[list[float]] = [[], []]
    per_round: list[float] = []
    modules = ["", ""]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)  # who starts first, swapped every round
        workers: list[Worker | None] = [None, None]
        try:
            for w in order:
                workers[w] = Worker((this, other)[w], warmup, variant)
            ratios = []
            for i in range(pairs):
                got = [0.0, 0.0]
                for w in order if i % 2 == 0 else order[::-1]:
                    got[w] = workers[w].block(calls, repeats)  # type: ignore[union-attr]
                    means[w].append(got[w])
                ratios.append(got[0] / got[1])
            per_round.append(statistics.median(ratios))
            modules = [w.module for w in workers if w is not None]
        finally:
            for worker in workers:
                if worker is not None:
                    worker.close()
    ratios = [a / b for a, b in zip(means[0], means[1], strict=True)]
    return {
        "this": {"commit": _commit(this), "crossrt": modules[0]},
        "other": {"commit": _commit(other), "crossrt": modules[1]},
        "variant": VARIANTS[variant],
        "rounds": rounds,
        "pairs_per_round": pairs,
        "calls_per_block": calls,
        "repeats_per_block": repeats,
        "warmup_calls": warmup,
        "this_median_us": round(statistics.median(means[0]) * 1e6, 3),
        "other_median_us": round(statistics.median(means[1]) * 1e6, 3),
        "paired_ratio": round(statistics.median(ratios), 4),
        "ratio_quartiles": [round(q, 4) for q in statistics.quantiles(ratios, n=4)],
        "round_ratios": [round(x, 4) for x in per_round],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _commit(checkout: Path) -> str:
    """The commit a checkout stands on, ``+changes`` when its tracked files differ from it."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "src"], capture_output=True)
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.returncode else "")


def markdown(doc: dict[str, Any], command: str) -> str:
    """The Markdown table of :func:`paired`'s document."""
    return (
        f"# crossrt tiny model, {doc['variant']} per call, this checkout against another "
        "(paired)\n\n"
        f"{doc['date']}. Command: `{command}`  \n"
        f"This: {doc['this']['commit']} (`{doc['this']['crossrt']}`); other: "
        f"{doc['other']['commit']} (`{doc['other']['crossrt']}`).  \n"
        f"Load average (1, 5, 15 min) before {doc['loadavg_before']}, after "
        f"{doc['loadavg_after']}.\n\n"
        "| this median | other median | paired ratio (this / other) | ratio quartiles "
        "| per round | rounds x pairs x best of x calls |\n|---|---|---|---|---|---|\n"
        f"| {doc['this_median_us']:.3f} µs | {doc['other_median_us']:.3f} µs "
        f"| {doc['paired_ratio']:.4f} | {doc['ratio_quartiles'][0]:.4f} - "
        f"{doc['ratio_quartiles'][2]:.4f} | {', '.join(f'{x:.3f}' for x in doc['round_ratios'])} "
        f"| {doc['rounds']} x {doc['pairs_per_round']} x {doc['repeats_per_block']} x "
        f"{doc['calls_per_block']} |\n"
    )
