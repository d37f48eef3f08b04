"""The openvino driver (``pip install crossrt[openvino]``): OpenVINO's CPU plugin, and its
GPU and NPU plugins where the machine has them. See ``driver.py``."""

from .driver import OpenVinoDriver

__all__ = ["OpenVinoDriver"]
