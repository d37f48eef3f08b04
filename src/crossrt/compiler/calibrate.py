"""``compile(precision="int8", calibration=...)``: static post-training quantization.

The model is smoothed (``smooth.py``: activation channels' ranges moved into the weights,
SmoothQuant), then rewritten, before any driver sees it, into ONNX's QDQ form by ONNX
Runtime's ``quantize_static``: the operators int8 kernels speed up (:data:`QUANTIZED`: Conv, MatMul,
Gemm, where one factor is a constant weight) get QuantizeLinear/DequantizeLinear around
them, weights quantized per channel to symmetric int8 and activations to uint8 with ranges
observed on the calibration samples (MinMax): U8S8, the form both engines run as int8
kernels on x86 (ONNX Runtime's QLinearConv/QLinearMatMul, OpenVINO's int8 FullyConnected and
Convolution; VNNI, AMX-INT8 where the CPU has them). The rest (additions, softmax,
normalization, attention's products of two activations) stays in float: quantizing them
too took a BERT-like encoder's error on held-back samples from 0.067 to 0.1 and saves little
time. So the quantized model compiles on any driver at its own precision (OpenVINO computes
its float part in bf16 where the CPU has it: ``drivers/openvino/driver.py``).

The last fifth of the samples (at least one) is held back: the quantized model and the
original are both run on them (ONNX Runtime, CPU) and the largest error, relative to
``max(1, max |fp32|)`` of each output as ``crossrt verify`` and ``auto`` measure it, must be
within the tolerance (the model's ``crossrt.tolerance`` metadata, else
:data:`INT8_TOLERANCE`), or the compile is refused with every measure named: that one, the
largest absolute error, the relative error in the 2-norm, and for ``[batch, classes]``
outputs the share of rows whose top class is unchanged. What was done and measured is kept
in the executable's metadata ``crossrt.quantization`` (JSON), shown by ``inspect`` and
``placement``.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..errors import CompileError, InvalidArgumentError, InvalidOptionError
from ..model import Model
from .smooth import smooth

INT8_TOLERANCE = 0.1
"""The error allowed on the hold-out, relative to ``max(1, max |fp32|)`` of each output (the
same as ``int8-dynamic``'s in ``crossrt verify``); a model's ``crossrt.tolerance`` overrides."""
METADATA_KEY = "crossrt.quantization"
"""The executable's metadata that records the quantization (JSON)."""
QUANTIZED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
"""The operator types quantized (MatMul and Gemm only by a constant weight): where int8
arithmetic (VNNI, AMX-INT8) pays."""
HOLD_OUT = 0.2
"""The share of the calibration samples held back to measure the error."""
METHOD = (
    "int8 static (SmoothQuant, then QDQ of Conv/MatMul/Gemm with a constant weight: weights "
    "int8 symmetric per channel, activations uint8 MinMax)"
)

Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class Quantized:
    """A model rewritten to int8 QDQ, and what was measured.

    Attributes:
        model: the QDQ model, its metadata holding :data:`METADATA_KEY`.
        report: ``{"method", "calibration_samples", "holdout_samples", "error",
            "max_abs_error", "relative_error", "top1_agreement", "tolerance",
            "quantized_nodes"}`` (the measures: :func:`describe`).
    """

    model: Model
    report: dict[str, Any]


def prepare(model: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``compile``'s first step: for ``precision="int8"``, the model quantized from
    ``options["calibration"]`` and the options it then compiles with (its own precision: the
    QDQ graph is int8); anything else as given.

    Raises:
        InvalidOptionError: ``calibration`` without ``precision="int8"`` or the reverse.
        InvalidArgumentError, CompileError: as :func:`quantize`.
    """
    if options.get("precision") != "int8" and "calibration" not in options:
        return model, options
    rest = dict(options)
    calibration = rest.pop("calibration", None)
    if rest.pop("precision", None) != "int8":
        raise InvalidOptionError(
            "calibration= is for precision='int8' (static quantization); give both",
            details={"option": "calibration"},
        )
    if calibration is None:
        raise InvalidOptionError(
            "precision='int8' quantizes from calibration data: give calibration= (a list of "
            "{input: array} samples, or a folder) or --calibration DIR; or use "
            "precision='int8-dynamic', which needs none",
            details={"option": "calibration"},
        )
    from ..model import load_model

    return quantize(load_model(model), calibration).model, rest


def quantize(model: Model, calibration: Any) -> Quantized:
    """``model`` quantized to int8 from ``calibration`` (see :func:`samples`).

    Raises:
        InvalidArgumentError: calibration data that does not fit the model's inputs, or
            fewer than two samples.
        CompileError: the quantizer failed, or the hold-out error is over the tolerance.
    """
    data = samples(calibration, model)
    if len(data) < 2:
        raise InvalidArgumentError(
            f"precision='int8' needs at least 2 calibration samples ({len(data)} given): the "
            "last fifth is held back to measure the error against fp32",
            details={"samples": len(data)},
        )
    held = max(1, int(len(data) * HOLD_OUT))
    fit, holdout = data[:-held], data[-held:]
    proto = _quantize_static(model, fit)
    declared = declared_tolerance(model)
    allowed = INT8_TOLERANCE if declared is None else declared
    measured = _holdout_error(model.proto, proto, holdout)
    report = {
        "method": METHOD,
        "calibration_samples": len(fit),
        "holdout_samples": len(holdout),
        **measured,
        "tolerance": allowed,
        "quantized_nodes": sum(n.op_type == "QuantizeLinear" for n in proto.graph.node),
    }
    if not measured["error"] <= allowed:
        raise CompileError(
            f"int8 quantization of {model.name!r} is off by {describe(report)}, over the "
            f"tolerance {allowed:g}: give more representative calibration data, compile at "
            "bf16 or fp32, or raise the model's crossrt.tolerance metadata",
            details={k: report[k] for k in (*measured, "tolerance")},
        )
    del proto.metadata_props[:]
    for prop in model.proto.metadata_props:
        proto.metadata_props.add(key=prop.key, value=prop.value)
    proto.metadata_props.add(key=METADATA_KEY, value=json.dumps(report))
    return Quantized(Model(proto, validate=False), report)


def describe(report: Mapping[str, Any]) -> str:
    """The measured error of a :func:`quantize` report in words, each measure named."""
    top1 = report.get("top1_agreement")
    nan = float("nan")
    return (
        f"{report.get('error', nan):.3g} relative to max(1, max |fp32|) (max abs "
        f"{report.get('max_abs_error', nan):.3g}, relative 2-norm "
        f"{report.get('relative_error', nan):.3g}"
        + ("" if top1 is None else f", top-1 agreement {top1:.0%}")
        + f") on {report.get('holdout_samples')} held-back calibration samples"
    )


def samples(calibration: Any, model: Model) -> list[Sample]:
    """Calibration samples as ``{input: array}`` each, checked against the model's inputs.

    ``calibration`` is a sequence of such dicts; a dict of arrays whose first axis counts the
    samples; or a folder holding one ``.npz`` per sample (read in name order) or one
    ``NAME.npy`` per input, its first axis counting the samples. Never unpickled.

    Raises:
        InvalidArgumentError: anything else, or samples that miss an input or do not fit it.
    """
    if isinstance(calibration, str | Path):
        found = _from_folder(Path(calibration), model)
    elif isinstance(calibration, Mapping):
        found = _split(calibration, model)
    elif isinstance(calibration, Sequence) and all(isinstance(s, Mapping) for s in calibration):
        found = [{k: np.asarray(v) for k, v in s.items()} for s in calibration]
    else:
        raise InvalidArgumentError(
            "calibration= takes a list of {input: array} samples, a dict of arrays whose "
            "first axis counts the samples, or a folder of .npz (one per sample) or NAME.npy "
            f"files; got {type(calibration).__name__}"
        )
    names = {s.name: s for s in model.inputs}
    for i, sample in enumerate(found):
        if set(sample) != set(names):
            raise InvalidArgumentError(
                f"calibration sample {i} has inputs {sorted(sample)}; the model takes "
                f"{sorted(names)}"
            )
        for name, value in sample.items():
            spec = names[name]
            if spec.dtype is not None and value.dtype != spec.dtype.numpy:
                raise InvalidArgumentError(
                    f"calibration sample {i}: input {name!r} is {value.dtype}, the model "
                    f"takes {spec.dtype.numpy}"
                )
            if spec.shape is not None and not _fits(value.shape, spec.shape):
                raise InvalidArgumentError(
                    f"calibration sample {i}: input {name!r} has shape {list(value.shape)}, "
                    f"the model takes {list(spec.shape)}"
                )
    return found


def _fits(shape: tuple[int, ...], declared: Sequence[Any]) -> bool:
    return len(shape) == len(declared) and all(
        not isinstance(d, int) or d < 0 or d == s for s, d in zip(shape, declared, strict=True)
    )


def _from_folder(folder: Path, model: Model) -> list[Sample]:
    if not folder.is_dir():
        raise InvalidArgumentError(f"calibration folder {str(folder)!r} does not exist")
    archives = sorted(folder.glob("*.npz"))
    if archives:
        out = []
        for path in archives:
            with np.load(path, allow_pickle=False) as npz:
                out.append({k: npz[k] for k in npz.files})
        return out
    arrays = {p.stem: np.load(p, allow_pickle=False) for p in sorted(folder.glob("*.npy"))}
    if not arrays:
        raise InvalidArgumentError(
            f"calibration folder {str(folder)!r} holds no .npz or .npy files: write one .npz "
            "per sample (np.savez(path, **inputs)) or one NAME.npy per input"
        )
    return _split(arrays, model)


def _split(arrays: Mapping[str, Any], model: Model) -> list[Sample]:
    """A dict of arrays whose first axis counts the samples, as one dict per sample: an array
    of the input's rank keeps that axis (a batch of one), one of a rank more loses it."""
    values = {k: np.asarray(v) for k, v in arrays.items()}
    ranks = {s.name: len(s.shape) for s in model.inputs if s.shape is not None}
    counts = {len(v) for v in values.values() if v.ndim}
    if len(counts) != 1 or any(v.ndim == 0 for v in values.values()):
        raise InvalidArgumentError(
            "calibration arrays must share their first axis, the sample count; got shapes "
            + ", ".join(f"{k} {list(v.shape)}" for k, v in values.items())
        )
    (count,) = counts
    return [
        {k: v[i] if v.ndim == ranks.get(k, -1) + 1 else v[i : i + 1] for k, v in values.items()}
        for i in range(count)
    ]


def _quantize_static(model: Model, fit: list[Sample]) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it: Iterator[Sample] = iter(fit)

        def get_next(self) -> Sample | None:
            return next(self._it, None)

    with tempfile.TemporaryDirectory(prefix="crossrt-int8-") as tmp:
        source, out = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        # A path, not the proto: quantize_static saves a proto it is given with its weights
        # moved out to files, rewriting the caller's proto in place.
        onnx.save(smooth(model.proto, fit), source)
        root = logging.getLogger()  # the quantizer warns through the root logger
        level = root.level
        root.setLevel(max(level, logging.ERROR))
        try:
            quantize_static(
                source,
                out,
                Reader(),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(QUANTIZED),
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=_products_of_activations(model.proto),
                # Symmetric int8 weights and uint8 activations: U8S8, the form both engines
                # run as int8 kernels on x86 (VNNI's vpdpbusd). With int8 activations (ORT's
                # default) ORT ran 8 of a 2-layer BERT's 12 projections as float MatMuls over
                # weights dequantized at every call, slower than fp32; symmetric int8 ones
                # too (10 of 12). A MatMul's output keeps its Q/DQ: without it ORT makes the
                # projection a float Gemm over dequantized weights.
                extra_options={"WeightSymmetric": True},
                calibration_providers=["CPUExecutionProvider"],
            )
            return onnx.load(str(out))
        except Exception as exc:
            raise CompileError(
                f"onnxruntime's quantize_static failed on {model.name!r}: "
                f"{type(exc).__name__}: {str(exc)[:300]}; compile it at fp32 or bf16",
                details={"precision": "int8"},
            ) from None
        finally:
            root.setLevel(level)


def _products_of_activations(proto: onnx.ModelProto) -> list[str]:
    """The names (``Model`` names every node) of the MatMul and Gemm nodes whose both factors
    are computed at run time: attention's Q x K and scores x V. Those stay in float: OpenVINO
    ran 23 of a BERT-like encoder's 24 as ``MatMul:f32`` between their Q/DQ anyway (its
    execution graph), and without the Q/DQ it fuses attention. They hold few of the
    operations (2 x 128 x 128 x 64 per head and layer at sequence 128, against
    12 x 128 x 768 x 768 in the layer's projections and FFN)."""
    constant = {t.name for t in proto.graph.initializer}
    constant.update(o for n in proto.graph.node if n.op_type == "Constant" for o in n.output)
    return [
        n.name
        for n in proto.graph.node
        if n.op_type in ("MatMul", "Gemm") and not constant.intersection(n.input[:2])
    ]


def _holdout_error(
    fp32: onnx.ModelProto, int8: onnx.ModelProto, holdout: list[Sample]
) -> dict[str, Any]:
    """How far ``int8`` is from ``fp32`` on ``holdout``, the worst output of the worst sample
    by each measure: ``error``, the one checked, the largest difference relative to
    ``max(1, max |fp32|)`` (``crossrt verify``'s and ``auto``'s measure, so a tolerance means
    the same everywhere); ``max_abs_error``; ``relative_error``, ``|int8 - fp32|`` over
    ``|fp32|`` in the 2-norm (what a hidden state or an embedding loses, not one outlier);
    ``top1_agreement``, the share of rows of ``[batch, classes]`` outputs whose argmax is
    unchanged (``None`` without such an output)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = [
        ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for m in (fp32, int8)
    ]
    worst = {"error": 0.0, "max_abs_error": 0.0, "relative_error": 0.0}
    same, rows = 0, 0
    for sample in holdout:
        want, got = (s.run(None, sample) for s in sessions)
        for a, b in zip(want, got, strict=True):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a.shape != b.shape:
                return {**worst, "error": float("inf"), "top1_agreement": None}
            if not a.size:
                continue
            diff = np.abs(a - b)
            norm = float(np.linalg.norm(a))
            measured = {
                "error": float(diff.max()) / max(1.0, float(np.abs(a).max())),
                "max_abs_error": float(diff.max()),
                # an all-zero output: its absolute 2-norm
                "relative_error": float(np.linalg.norm(diff)) / (norm or 1.0),
            }
            worst = {k: max(v, measured[k]) for k, v in worst.items()}
            if a.ndim == 2 and a.shape[1] > 1:  # [batch, classes]: a classifier's scores
                same += int(np.sum(a.argmax(axis=1) == b.argmax(axis=1)))
                rows += a.shape[0]
    return {**worst, "top1_agreement": same / rows if rows else None}


def declared_tolerance(model: Model) -> float | None:
    """The model's own tolerance, its metadata ``crossrt.tolerance`` (``None`` when it
    declares none): what ``verify``, ``auto`` and the int8 hold-out allow it.

    Raises:
        InvalidOptionError: a ``crossrt.tolerance`` that is not a number >= 0.
    """
    given = {p.key: p.value for p in model.proto.metadata_props}.get("crossrt.tolerance")
    if given is None:
        return None
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise InvalidOptionError(
            f"model {model.name!r} metadata crossrt.tolerance={given!r}: give a number >= 0"
        )
    return value
