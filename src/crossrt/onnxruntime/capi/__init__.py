"""``crossrt.onnxruntime.capi``: where ONNX Runtime's programs import its exception classes
from (``from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument``)."""
