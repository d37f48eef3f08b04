"""The ``onnxruntime`` driver: ONNX Runtime's CPU execution provider.

- ``supported_nodes`` decides as an ORT session would (``support``): ORT's own schemas and
  kernel registry, its version matching and fallbacks, and the newest IR version and opsets
  this build accepts.
- ``compile`` runs ORT's graph optimizations and returns the optimized ONNX model, its large
  weights stored beside the graph (``artifact``), as the artifact: all of them (level
  ALL, layouts for this CPU's vector extensions), or with ``portable=True`` those that hold
  on any CPU (level EXTENDED). A model whose constants ORT's folding would expand far beyond
  its own size (weights generated in the graph) is compiled at EXTENDED without folding.
- ``load`` creates a session with as many intra-op threads as cores it is given, from the
  small graph: a level-ALL artifact without optimizing again (on a CPU with the features it
  was compiled for), a portable one optimized the rest of the way. ORT maps the weights from
  the ``.crm`` file itself when the artifact lies in one (shared between sessions and
  processes); from memory it takes (and copies) them as external initializers.
- ``run`` calls the session's C++ ``run`` directly: it is the cheapest path from NumPy inputs
  (cheaper than ``InferenceSession.run``, which re-validates inputs the runtime already
  checked, and than building an IOBinding per call); preallocated outputs go through
  IOBinding so results land in the caller's buffers.
"""

from .driver import OnnxRuntimeDriver
from .program import OrtProgram

__all__ = ["OnnxRuntimeDriver", "OrtProgram"]
