"""The model layer: the model image (ONNX in memory), its description, and the builder."""

from .builder import DEFAULT_OPSET, GraphBuilder
from .model import Model, load_model
from .spec import Dim, TensorSpec

__all__ = ["DEFAULT_OPSET", "Dim", "GraphBuilder", "Model", "TensorSpec", "load_model"]
