"""Backends for the chain, one module each; importing this package registers them all."""

from backends import (  # noqa: F401  (registration side effects)
    cudagraphs,
    eager,
    inductor,
    inductor_graphed,
    onnxruntime,
    tensorrt,
)
from backends.errors import InvalidBackend, InvalidOption, Transient, Unsupported
from backends.onnxruntime import graphs as _onnxruntime_graphs  # noqa: F401  (its variant)
from backends.registry import (
    Backend,
    BackendRegistry,
    CompiledFn,
    CompilerFn,
    lookup_backend,
    register_backend,
    registry,
)

__all__ = [
    "Backend",
    "BackendRegistry",
    "CompiledFn",
    "CompilerFn",
    "InvalidBackend",
    "InvalidOption",
    "Transient",
    "Unsupported",
    "lookup_backend",
    "register_backend",
    "registry",
]
