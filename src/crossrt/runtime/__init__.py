"""The runtime layer: Runtime, loaded models and their inputs."""

from .loaded import LoadedModel, TensorInfo
from .profiler import Profile
from .runtime import Runtime

__all__ = ["LoadedModel", "Profile", "Runtime", "TensorInfo"]
