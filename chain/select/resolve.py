"""Turn what the user names (a string, a callable, a Backend, another chain) into Backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.errors import InvalidBackend
from backends.registry import Backend, registry

BackendSpec = str | Backend | Callable[..., Any]


def resolve(spec: BackendSpec) -> Backend:
    """One spec -> Backend; names resolve in our registry, then dynamo's."""
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, str):
        return registry.lookup(spec)
    if callable(spec):
        name = getattr(spec, "name", None) or getattr(spec, "__name__", None) or repr(spec)
        available = getattr(spec, "available", None)
        return Backend(
            name=str(name),
            compiler=spec,
            available=available if callable(available) else (lambda: None),
            options=None,
        )
    raise InvalidBackend(
        f"{spec!r} ({type(spec).__name__}) is not a backend: pass a registered name "
        f"({', '.join(registry.names())}), a callable (gm, example_inputs) -> callable, "
        "or another chain"
    )
