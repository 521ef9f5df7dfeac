"""Conversion: block -> ONNX -> TensorRT engine, with engine and timing caches."""
