"""TensorRT backend: ATen graph, lowering passes, partitioning, ONNX -> engine, runtime."""
