"""TensorRT backend: ATen graph, lowering passes, partitioning, ONNX -> engine, runtime.

Importing registers the "tensorrt" backend; tensorrt itself is imported only when used.
"""

from backends.tensorrt.availability import available
from backends.tensorrt.backend import tensorrt_backend
from backends.tensorrt.runtime import graphs as _graphs  # noqa: F401  (its CUDA graphs variant)

__all__ = ["available", "tensorrt_backend"]
