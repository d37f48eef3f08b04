"""The official ONNX backend node conformance suite, run through crossrt against each driver."""
