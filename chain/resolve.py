"""Turn what the user names (a string, a callable, a Backend, another chain) into Backends."""

from __future__ import annotations

import inspect
import os
import sys
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
            compiler=_findable(spec),
            available=available if callable(available) else (lambda: None),
            options=None,
        )
    raise InvalidBackend(
        f"{spec!r} ({type(spec).__name__}) is not a backend: pass a registered name "
        f"({', '.join(registry.names())}), a callable (gm, example_inputs) -> callable, "
        "or another chain"
    )


class ScriptBackend:
    """A backend function defined in the user's script (`__main__`), which a fresh process
    cannot import by module name. It carries the script's absolute path as its
    `__module__`, so the record of where the backend lives (`GraphRecord.sources`, taken
    by chain.look.capture as "module:name") reads "/path/script.py:name", and a repro loads
    the function from that file. Calls go straight to the function."""

    def __init__(self, fn: Callable[..., Any], file: str) -> None:
        self.__wrapped__ = fn
        self.__module__ = file
        self.__qualname__ = fn.__qualname__
        self.__name__ = fn.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)


def _findable(spec: Callable[..., Any]) -> Callable[..., Any]:
    """`spec`, or a ScriptBackend naming its file when it is a function of a script run as
    `python script.py` (not a lambda, a local function or an interactive session)."""
    if not inspect.isfunction(spec) or spec.__module__ != "__main__" or "<" in spec.__qualname__:
        return spec
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return spec
    return ScriptBackend(spec, os.path.abspath(file))
