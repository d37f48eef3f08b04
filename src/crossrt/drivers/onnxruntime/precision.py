"""``compile(precision=...)`` on ONNX Runtime's CPU provider: the model rewritten, before ORT
optimizes it, to compute in the reduced precision asked for.

- ``"fp16"``: ``onnxconverter_common.float16`` (Microsoft's converter, as ORT's own
  documentation uses) turns float32 tensors and weights to float16, keeping the model's inputs
  and outputs float32 (callers pass and get what the model declares) and the operators ORT's
  CPU provider has no float16 kernel for in float32, with casts around them. Offered only
  where this build has float16 MatMul and Conv (:func:`has_float16_arithmetic`): ORT's x86
  CPU provider has none, and a float16 model would compute in float32 between casts.
- ``"int8-dynamic"``: ``onnxruntime.quantization.quantize_dynamic``: weights of MatMul, Gemm,
  Attention, LSTM and GRU as int8, activations quantized at run time.

``bf16`` is not offered: the CPU provider has almost no bfloat16 kernels.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path

import onnx

from ...errors import CompileError
from ...model import Model
from . import support

PRECISIONS = ("fp16", "int8-dynamic")
"""The reduced precisions this driver computes in."""

# Dynamic quantization of Conv (ConvInteger) is slower than float32 on ORT's CPU provider:
# only the operators it speeds up are quantized.
_QUANTIZED = ["MatMul", "Gemm", "Attention", "LSTM", "GRU"]


def convert(model: Model, precision: str | None, known: support.OrtRegistry | None) -> Model:
    """``model`` rewritten for ``precision``; itself for ``None`` and ``"fp32"``. ``known``:
    the CPU provider's kernels, to keep in float32 the operators it has no float16 kernel
    for; ``None`` for a GPU, whose provider has them.

    Raises:
        CompileError: the converter failed on this model.
    """
    if precision in (None, "fp32"):
        return model
    try:
        if precision == "fp16":
            proto = _to_float16(model, known)
        elif precision == "int8-dynamic":
            proto = _quantized(model)
        else:
            raise ValueError(f"no conversion to {precision}")
    except Exception as exc:
        raise CompileError(
            f"onnxruntime could not convert {model.name!r} to {precision}: "
            f"{type(exc).__name__}: {str(exc)[:300]}; compile it in its own precision",
            details={"driver": "onnxruntime", "precision": precision},
        ) from None
    return Model(proto, validate=False)


def has_float16_arithmetic(known: support.OrtRegistry) -> bool:
    """Whether this ORT build's CPU provider computes MatMul and Conv in float16."""
    return not _no_float16_kernel(("MatMul", "Conv"), known)


def _to_float16(model: Model, known: support.OrtRegistry | None) -> onnx.ModelProto:
    from onnxconverter_common import float16

    ops = {n.op_type for n in model.nodes if n.domain in ("", "ai.onnx")}
    kept = set() if known is None else _no_float16_kernel(ops, known)
    blocked = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | kept)
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    with warnings.catch_warnings():  # one warning per weight value below float16's range
        warnings.simplefilter("ignore", UserWarning)
        converted: onnx.ModelProto = float16.convert_float_to_float16(
            proto, keep_io_types=True, op_block_list=blocked, disable_shape_infer=False
        )
    return converted


def _no_float16_kernel(op_types: Iterable[str], known: support.OrtRegistry) -> set[str]:
    """The ONNX operator types among ``op_types`` ORT's CPU provider has no float16 kernel
    for: kept in float32 (ORT would run them in float32 anyway, between casts it inserts).
    All of them where its kernels are unknown."""
    if known.kernels is None:
        return set(op_types)
    kernels = known.kernels
    return {
        op
        for op in op_types
        if not any(
            "tensor(float16)" in allowed
            for _, _, constraints in kernels.get(("", op), [])
            for allowed in constraints.values()
        )
    }


def _quantized(model: Model) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = _Advice()
    logging.root.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="crossrt-quantize-") as folder:
            source, target = Path(folder) / "model.onnx", Path(folder) / "int8.onnx"
            onnx.save(model.proto, source)
            quantize_dynamic(
                source, target, op_types_to_quantize=_QUANTIZED, weight_type=QuantType.QInt8
            )
            return onnx.load(target)
    finally:
        logging.root.removeFilter(quiet)


class _Advice(logging.Filter):
    """Drops the quantizer's advice, logged on the root logger at each call, to pre-process
    the model with its shape-inference script (for static quantization's calibration)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()
