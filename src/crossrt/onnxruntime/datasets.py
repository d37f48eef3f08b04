"""``get_example``: the small models ONNX Runtime's documentation uses, from the onnxruntime
wheel (``onnxruntime.datasets``), so that its examples run with one import changed."""

from __future__ import annotations

from ..errors import ModelNotFoundError


def get_example(name: str) -> str:
    """The path of an example model shipped with onnxruntime (``sigmoid.onnx``,
    ``logreg_iris.onnx``...).

    Raises:
        ModelNotFoundError: onnxruntime is not installed, or ships no such file.
    """
    try:
        from onnxruntime.datasets import get_example as ort_example
    except ImportError as e:
        raise ModelNotFoundError(
            f"example {name!r} comes with onnxruntime, which is not installed: "
            f"pip install onnxruntime ({e})"
        ) from None
    try:
        return str(ort_example(name))
    except FileNotFoundError as e:
        raise ModelNotFoundError(f"onnxruntime ships no example {name!r} ({e})") from None
