"""Backends for the chain: each module or subpackage here registers itself when imported.

The folder is the registry's list (`registry.import_submodules`, as dynamo's own
`torch._dynamo.backends` does): importing this package imports every submodule, in name
order, and a new backend is a new file or folder, with no list to edit.
"""

from backends.errors import InvalidBackend, InvalidOption, Transient, Unsupported
from backends.registry import (
    Backend,
    BackendRegistry,
    CompiledFn,
    CompilerFn,
    import_submodules,
    lookup_backend,
    register_backend,
    registry,
)

import_submodules(__name__)

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
