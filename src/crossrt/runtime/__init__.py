"""The runtime layer: Runtime, loaded models and their inputs."""

from .loaded import LoadedModel, TensorInfo
from .runtime import Runtime

__all__ = ["LoadedModel", "Runtime", "TensorInfo"]
