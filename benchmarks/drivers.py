"""Every driver, ``device="auto"`` and each reduced precision, beside the raw engines.

Models: ``tiny``, ``resnet50`` (ResNet-50-like), ``bert`` (BERT-like) from ``models.py``, and
the real models in PyPI wheels: rapidocr's text detector (``det``, 1x3x320x320) and recognizer
(``rec``, 1x3x48x320), and ``silero`` (silero-vad, one 512-sample window at 16 kHz).

Per model, in one process and on the same input, these variants run in alternating blocks (a
new random order every round, after a short pause, so that a noisy machine and the previous
engine's spinning threads slow them alike):

- ``raw onnxruntime`` (``InferenceSession.run``) and ``raw openvino`` (``compile_model`` with
  crossrt's settings: f32 hint, one stream of one thread per core, latency hint, no pinning;
  an infer request reused, input tensors over the caller's arrays, outputs copied out); ``raw
  openvino bf16`` where the CPU has bfloat16 arithmetic;
- ``onnxruntime`` and ``openvino``: ``crossrt.compile(model, "cpu", driver=...)`` (with
  ``fallback="cpu"`` where the driver cannot run every node: marked ``+fallback``);
- ``auto``: ``crossrt.compile(model, device="auto", fallback="cpu")``;
- ``<driver> <precision>`` and ``auto <precision>`` for each reduced precision a driver
  accepts (bf16, fp16, int8-dynamic; a driver that refuses one is left out);
- ``<driver> int8``: ``precision="int8"``, static quantization from 12 calibration samples
  (random inputs of the model's shapes and range, other seeds than the measured input),
  quantized once and compiled for each driver (the quantization's own hold-out error is in
  the JSON, ``int8``).

Reported per variant: median ms per call; ``vs raw``: crossrt / the raw engine at the same
precision; ``vs best raw``: the variant / the fastest raw engine at fp32 (under 1: faster);
``paired``: the same against the fastest raw engine, but as the median over rounds of the
ratio of the two blocks of one round (steadier on a machine whose speed drifts); ``max abs
err``: the largest difference of any output from raw onnxruntime fp32. Per model:
what ``auto`` chose and why.

    python benchmarks/drivers.py              # ~6 min on 2 cores
    python benchmarks/drivers.py --quick --models tiny,resnet50
    python benchmarks/drivers.py --models resnet50,bert --out $INT8 --variants "$VARIANTS"

The last (~10 min) writes ``results/drivers_int8``, with ``INT8`` that path's ``.json`` and
``VARIANTS`` ``raw onnxruntime,raw openvino,raw openvino bf16,openvino bf16,onnxruntime
int8,openvino int8``.

``--variants`` runs only the variants named, by their labels in the table (``raw
onnxruntime``, the reference of the errors, always runs). Each ``int8`` row is also compared,
paired, with ``raw onnxruntime`` (fp32) and with the bf16 variants: the int8 table.

Writes ``results/drivers.json`` (``--out``) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import openvino as ov

import crossrt
from crossrt import host
from crossrt.drivers import get_driver

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/ is not a package: found through sys.path
import reporting

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("tiny", "resnet50", "bert", "det", "rec", "silero")
PRECISIONS = ("bf16", "fp16", "int8-dynamic")
BLOCK_S = 0.05  # a block of calls lasts at least this long
ROUNDS, QUICK_ROUNDS = 12, 3
_WHEEL_MODELS = {
    "det": ("rapidocr-onnxruntime", "ch_PP-OCRv4_det_infer.onnx"),
    "rec": ("rapidocr-onnxruntime", "ch_PP-OCRv4_rec_infer.onnx"),
    "silero": ("silero-vad", "silero_vad.onnx"),
}


def model_and_input(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The model file and a fixed input of realistic shape and range."""
    if name in models.BUILDERS:
        return models.get(name), models.example_input(name)
    dist_name, file_name = _WHEEL_MODELS[name]
    dist = importlib.metadata.distribution(dist_name)
    path = next(Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == file_name)
    rng = np.random.default_rng(1)
    if name == "silero":
        feed = {
            "input": rng.uniform(-1, 1, (1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
    else:
        shape = (1, 3, 320, 320) if name == "det" else (1, 3, 48, 320)
        feed = {"x": rng.uniform(-1, 1, shape).astype(np.float32)}
    return path, feed


def raw_onnxruntime(path: Path, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feed)


def raw_openvino(
    path: Path, feed: dict[str, np.ndarray], threads: int, precision: str = "f32"
) -> Callable[[], Any]:
    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        # as crossrt's driver: pinned to cores that other work shares, raw OpenVINO took
        # 1.1-2.5x crossrt's time on this project's loaded 2-core machine
        "ENABLE_CPU_PINNING": False,
    }
    request = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    names = [p.any_name for p in request.model_inputs]
    ordered = [feed[n] for n in names]
    outputs = len(request.model_outputs)

    def call() -> list[np.ndarray]:
        # OpenVINO's fastest path from Python: tensors over the caller's memory, results
        # copied out as crossrt returns them.
        for i, x in enumerate(ordered):
            request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(x), shared_memory=True))
        request.infer()
        return [request.get_output_tensor(i).data.copy() for i in range(outputs)]

    return call


def crossrt_variants(
    rt: crossrt.Runtime,
    path: Path,
    feed: dict[str, np.ndarray],
    seconds: float,
    wanted: Callable[[str], bool] = lambda label: True,
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The crossrt variants of one model (those ``wanted``), and what ``auto`` decided at
    each precision."""
    found: dict[str, Callable[[], Any]] = {}
    decisions: dict[str, Any] = {}
    for precision in (None, *PRECISIONS):
        suffix = "" if precision is None else f" {precision}"
        for driver in ("onnxruntime", "openvino"):
            if not wanted(f"{driver}{suffix}"):
                continue
            exe, fell_back = _compile(path, driver, precision)
            if exe is not None:
                label = f"{driver}{suffix}" + (" +fallback" if fell_back else "")
                found[label] = _runner(rt, exe, feed)
        if not wanted(f"auto{suffix}"):
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # auto's progress lines
                exe = crossrt.compile(
                    path,
                    device="auto",
                    fallback="cpu",  # the best placement for drivers that cannot run it all
                    precision=precision,
                    probe=feed,
                    auto_seconds=seconds,
                )
        except crossrt.CrossrtError as exc:
            decisions[precision or "fp32"] = {"error": exc.message[:300]}
            continue
        decisions[precision or "fp32"] = exe.decision
        found[f"auto{suffix}"] = _runner(rt, exe, feed)
    return found, decisions


def _compile(
    path: Any, driver: str, precision: str | None
) -> tuple[crossrt.Executable | None, bool]:
    try:
        return crossrt.compile(path, "cpu", driver=driver, precision=precision), False
    except crossrt.InvalidOptionError:
        return None, False  # the driver does not compute in that precision
    except crossrt.UnsupportedError:
        pass
    try:
        return crossrt.compile(
            path, "cpu", driver=driver, precision=precision, fallback="cpu"
        ), True
    except crossrt.CrossrtError:
        return None, False


def _runner(rt: crossrt.Runtime, exe: crossrt.Executable, feed: dict[str, np.ndarray]) -> Any:
    loaded = rt.load(exe)
    return lambda: loaded.run(feed)


def measure(
    calls: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median milliseconds per call of each variant over alternating blocks, and each
    variant's block means round by round (for ratios within a round: :func:`paired`)."""
    per_block = {}
    for key, call in calls.items():
        call()  # warm-up, and the time one call takes
        start = time.perf_counter()
        call()
        once = time.perf_counter() - start
        per_block[key] = max(1, min(2000, int(BLOCK_S / max(once, 1e-7))))
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = random.Random(0)
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for key in names:
            time.sleep(0.02)  # let the previous engine's threads go idle
            start = time.perf_counter()
            for _ in range(per_block[key]):
                calls[key]()
            samples[key].append((time.perf_counter() - start) / per_block[key] * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}, samples


def paired(samples: dict[str, list[float]], label: str, against: str) -> float:
    """The median over rounds of ``label``'s block / ``against``'s block of the same round:
    a machine whose speed drifts (this project's shared VMs) slows both blocks of a round
    alike, so this ratio is steadier than the ratio of the medians."""
    return statistics.median(a / b for a, b in zip(samples[label], samples[against], strict=True))


def max_abs_error(call: Callable[[], Any], reference: list[np.ndarray]) -> float:
    got = call()
    values = list(got.values()) if isinstance(got, dict) else list(got)
    return max(
        (
            float(np.max(np.abs(np.asarray(a, np.float64) - b)))
            for a, b in zip(values, reference, strict=True)
            if b.size
        ),
        default=0.0,
    )


def bench_model(
    name: str,
    threads: int,
    rounds: int,
    seconds: float,
    wanted: Callable[[str], bool] = lambda label: True,
) -> dict[str, Any]:
    path, feed = model_and_input(name)
    calls: dict[str, Callable[[], Any]] = {"raw onnxruntime": raw_onnxruntime(path, feed)}
    raw_errors = {}
    for label, precision in (("raw openvino", "f32"), ("raw openvino bf16", "bf16")):
        if (precision == "bf16" and not _bf16_capable()) or not wanted(label):
            continue
        try:
            calls[label] = raw_openvino(path, feed, threads, precision)
        except Exception as exc:  # OpenVINO alone cannot run it (silero-vad)
            raw_errors[label] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    reference = [np.asarray(v, np.float64) for v in calls["raw onnxruntime"]()]
    rt = crossrt.Runtime()
    found, decisions = crossrt_variants(rt, path, feed, seconds, wanted)
    calls.update(found)
    int8_report: dict[str, Any] = {}
    if any(wanted(f"{d} int8") for d in ("onnxruntime", "openvino")):
        int8, int8_report = int8_variants(rt, name, path, feed, wanted)
        calls.update(int8)
    median, samples = measure(calls, rounds)
    raws = [k for k in ("raw onnxruntime", "raw openvino") if k in median]
    best_label = min(raws, key=lambda k: median[k])
    best_raw = median[best_label]
    rows = []
    for label, ms in median.items():
        raw = _raw_for(label, median)
        rows.append(
            {
                "variant": label,
                "median_ms": round(ms, 4),
                "vs_raw": round(ms / median[raw], 3) if raw else None,
                "vs_best_raw_fp32": round(ms / best_raw, 3),
                "paired_vs_best_raw_fp32": round(paired(samples, label, best_label), 3),
                "max_abs_error": max_abs_error(calls[label], reference),
            }
        )
    rt.close()
    if "method" in int8_report:  # quantized (a refusal has only "error")
        int8_report["paired"] = {
            label: {
                against: round(paired(samples, label, against), 3)
                for against in ("raw onnxruntime", "raw openvino bf16", "openvino bf16")
                if against in samples
            }
            for label in samples
            if label.split(" +")[0].endswith(" int8")
        }
    return {
        "model": name,
        "input": {k: list(v.shape) for k, v in feed.items()},
        "rows": rows,
        "raw_errors": raw_errors,
        "auto": decisions,
        "int8": int8_report,
    }


CALIBRATION_SAMPLES = 12


def calibration(name: str, feed: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Calibration samples like ``feed``: other seeds of the same generator."""
    if name in models.BUILDERS:
        return [models.example_input(name, seed=s) for s in range(2, 2 + CALIBRATION_SAMPLES)]
    out = []
    for s in range(2, 2 + CALIBRATION_SAMPLES):
        rng = np.random.default_rng(s)
        out.append(
            {
                k: v
                if v.dtype.kind != "f" or v.ndim == 0 or not v.any()
                else rng.uniform(-1, 1, v.shape).astype(v.dtype)
                for k, v in feed.items()
            }
        )
    return out


def int8_variants(
    rt: crossrt.Runtime,
    name: str,
    path: Path,
    feed: dict[str, np.ndarray],
    wanted: Callable[[str], bool] = lambda label: True,
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """``precision="int8"`` on each driver: the model quantized once, then compiled."""
    from crossrt.compiler.calibrate import quantize
    from crossrt.model import load_model

    started = time.perf_counter()
    try:
        quantized = quantize(load_model(path), calibration(name, feed))
    except crossrt.CrossrtError as exc:
        return {}, {"error": exc.message[:300]}
    report = {**quantized.report, "quantize_s": round(time.perf_counter() - started, 1)}
    found = {}
    for driver in ("onnxruntime", "openvino"):
        if not wanted(f"{driver} int8"):
            continue
        exe, fell_back = _compile(quantized.model, driver, None)
        if exe is not None:
            found[f"{driver} int8" + (" +fallback" if fell_back else "")] = _runner(rt, exe, feed)
    return found, report


_SAME_ENGINE = {
    "onnxruntime": "raw onnxruntime",
    "openvino": "raw openvino",
    "openvino bf16": "raw openvino bf16",
}


def _raw_for(label: str, median: dict[str, float]) -> str | None:
    """The raw engine a crossrt variant is compared with: the same engine and precision."""
    raw = _SAME_ENGINE.get(label)
    return raw if raw in median else None


def _bf16_capable() -> bool:
    device = next(d for d in get_driver("openvino").devices() if d.id == "cpu:0")
    return bool(device.capabilities.bf16)


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"Drivers, auto and reduced precision beside the raw engines, {doc['machine']['threads']} "
        f"threads, {doc['machine']['cpu']} ({doc['date']}; load average after the run "
        f"{doc['machine'].get('load_average', '-')})",
        "",
        "| model | variant | median ms | vs raw | vs best raw fp32 | paired | max abs err |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in doc["models"]:
        for r in m["rows"]:
            lines.append(
                f"| {m['model']} | {r['variant']} | {r['median_ms']:.3f} | "
                f"{_cell(r['vs_raw'], '.3f')} | {r['vs_best_raw_fp32']:.3f} | "
                f"{_cell(r.get('paired_vs_best_raw_fp32'), '.3f')} | {r['max_abs_error']:.1e} |"
            )
    lines += ["", "| model | precision | auto chose | why |", "|---|---|---|---|"]
    for m in doc["models"]:
        for precision, d in m["auto"].items():
            chosen = d.get("chosen") or {}
            who = f"{chosen.get('driver', '-')} {chosen.get('precision') or 'own precision'}"
            why = str(d.get("why") or d.get("error", ""))[:160]
            lines.append(f"| {m['model']} | {precision} | {who} | {why} |")
        for label, why in m["raw_errors"].items():
            lines.append(f"| {m['model']} | - | ({label} cannot run it) | {why[:160]} |")
    lines += [
        "",
        "| model | int8 quantization | hold-out error (tolerance) | max abs | relative "
        "2-norm | top-1 | quantize s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in doc["models"]:
        q = m.get("int8") or {}
        if "error" in q and "method" not in q:
            lines.append(f"| {m['model']} | refused: {str(q['error'])[:120]} | - | - | - | - | - |")
        elif q:
            top1 = q.get("top1_agreement")
            lines.append(
                f"| {m['model']} | {q['calibration_samples']} calibration samples, "
                f"{q['holdout_samples']} held back | {q['error']:.3g} ({q['tolerance']}) | "
                f"{_cell(q.get('max_abs_error'), '.3g')} | {_cell(q.get('relative_error'), '.3g')}"
                f" | {_cell(top1, '.0%')} | {q['quantize_s']} |"
            )
    against = ("raw onnxruntime", "raw openvino bf16", "openvino bf16")
    lines += ["", "int8, paired (median over rounds of the ratio of times; under 1: int8 faster)"]
    lines += ["", "| model | variant | " + " | ".join(f"vs {a}" for a in against) + " |"]
    lines += ["|---|---|" + "---:|" * len(against)]
    for m in doc["models"]:
        for label, ratios in ((m.get("int8") or {}).get("paired") or {}).items():
            cells = " | ".join(_cell(ratios.get(a), ".3f") for a in against)
            lines.append(f"| {m['model']} | {label} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--variants", help="only these variants, comma-separated labels (default: all)")
    args = p.parse_args(argv)
    only = None if args.variants is None else {v.strip() for v in args.variants.split(",")}
    wanted = (lambda label: True) if only is None else (lambda label: label in only)
    threads = len(os.sched_getaffinity(0))
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    seconds = 0.5 if args.quick else 2.0
    results = []
    for name in args.models.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(bench_model(name, threads, rounds, seconds, wanted))
    doc = {
        "benchmark": "drivers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "cpu": " ".join(host.cpu_model()).strip() or platform.machine(),
            "features": [f for f in host.cpu_features() if "avx512" in f or "amx" in f],
            "threads": threads,
            "openvino": ov.__version__,
            "onnxruntime": ort.__version__,
            "crossrt": crossrt.__version__,
            "load_average": [round(x, 1) for x in os.getloadavg()],
        },
        "models": results,
    }
    out = args.out or RESULTS / ("drivers-quick.json" if args.quick else "drivers.json")
    text = table(doc)
    reporting.save(out, doc, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
