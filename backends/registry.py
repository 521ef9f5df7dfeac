"""The backend registry: a decorator to register, lookup by name, and a snapshot for tests.

A backend is what dynamo calls a backend, `(gm, example_inputs, **options) -> callable`,
plus `available() -> str | None` (None when it can run here, else a short reason).
A backend that cannot take a graph raises `backends.errors.Unsupported(reason)`; any other
exception is a real failure. A backend never mutates the `gm` it is given. A backend may
declare a `graphed` hook, the same compiler with its result run under CUDA graphs, which
the chain's `cuda_graphs` stage tries as a variant (`<name>+graphs`).

A compiled callable may carry `chain_details: dict` (JSON-able facts for the report:
partition counts, fallback reasons, cache hits, providers), which the chain copies into
the attempt's `details` (its `summary`, one line, shows in the report's reason column),
and `chain_payload` (bytes: an ONNX model, a TensorRT engine), which export reads from
the winning callable and the report never holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from backends.errors import InvalidBackend, InvalidOption

CompiledFn = Callable[..., Any]
CompilerFn = Callable[..., CompiledFn]  # (gm, example_inputs, **options) -> CompiledFn


def always_available() -> str | None:
    """The `available()` of backends that need nothing: no reason not to run."""
    return None


@dataclass(frozen=True)
class Backend:
    """A named compiler with a cheap availability check and the options it accepts.

    `options=None` means options pass through unchecked (to a compiler with its own
    vocabulary, such as inductor); otherwise unknown option names are rejected early.
    """

    name: str
    compiler: CompilerFn
    available: Callable[[], str | None] = always_available
    options: frozenset[str] | None = frozenset()
    doc: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    graphed: CompilerFn | None = None  # the same compiler with its output under CUDA graphs

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], **options: Any
    ) -> CompiledFn:
        return self.compiler(gm, list(example_inputs), **options)

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise InvalidOption naming the accepted options if any key is unknown."""
        if self.options is None:
            return
        unknown = sorted(set(options) - self.options)
        if unknown:
            valid = ", ".join(sorted(self.options)) or "none"
            raise InvalidOption(
                f"backend {self.name!r} does not accept option(s) {', '.join(unknown)}; "
                f"valid: {valid}"
            )


class BackendRegistry:
    """Name -> Backend. Use `register` as a decorator; `snapshot()` restores it after tests."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}

    def register(
        self,
        name: str,
        *,
        available: Callable[[], str | None] = always_available,
        options: Sequence[str] | None = (),
        tags: Sequence[str] = (),
        replace: bool = False,
        graphed: CompilerFn | None = None,
    ) -> Callable[[CompilerFn], Backend]:
        """Decorator: register `fn(gm, example_inputs, **options)` under `name`.

        `graphed(gm, example_inputs, **options)`, when given, compiles the same way and runs
        the result under CUDA graphs (the chain's `cuda_graphs` stage tries it as a variant).
        """

        def decorate(fn: CompilerFn) -> Backend:
            if name in self._backends and not replace:
                raise ValueError(f"backend {name!r} is already registered")
            backend = Backend(
                name=name,
                compiler=fn,
                available=functools.cache(available),
                options=None if options is None else frozenset(options),
                doc=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
                tags=tuple(tags),
                graphed=graphed,
            )
            self._backends[name] = backend
            return backend

        return decorate

    def graphed_variant(self, name: str) -> Callable[[CompilerFn], CompilerFn]:
        """Decorator: `fn` is the CUDA graphs variant of the registered backend `name`.

        For a backend whose package registers it elsewhere: its graphs module adds the hook.
        """

        def decorate(fn: CompilerFn) -> CompilerFn:
            if name not in self._backends:
                raise ValueError(f"no backend {name!r} to give a CUDA graphs variant")
            self._backends[name] = dataclasses.replace(self._backends[name], graphed=fn)
            return fn

        return decorate

    def lookup(self, name: str) -> Backend:
        """Our registry first, then dynamo's; raise InvalidBackend listing both."""
        if name in self._backends:
            return self._backends[name]
        from torch._dynamo import list_backends, lookup_backend

        dynamo_names = list_backends(exclude_tags=())
        if name in dynamo_names:
            fn = lookup_backend(name)
            return Backend(name=name, compiler=fn, options=None, tags=("dynamo",))
        raise InvalidBackend(
            f"unknown backend {name!r}; ours: {', '.join(self.names())}; "
            f"dynamo's: {', '.join(n for n in dynamo_names if n not in self._backends)}"
        )

    def names(self) -> list[str]:
        return sorted(self._backends)

    def __contains__(self, name: object) -> bool:
        return name in self._backends

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[BackendRegistry]:
        """Within the block, registrations are temporary: the registry is restored after."""
        saved = dict(self._backends)
        try:
            yield self
        finally:
            self._backends = saved


registry = BackendRegistry()
register_backend = registry.register
lookup_backend = registry.lookup
