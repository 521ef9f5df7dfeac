"""`torch.compile(model, backend="chain")`: the default chain, registered through the
`torch_dynamo_backends` entry point; `options={"backends": [...], "mode": ...}` picks it,
and so does torch.compile's own `mode=` ("fastest", "max-autotune": chain.select.torch_modes)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from backends.errors import InvalidOption
from backends.registry import registry
from chain.select import torch_modes
from chain.select.core import Chain

DEFAULT_CHAIN = ("tensorrt", "cudagraphs", "onnxruntime", "eager")

_chains: dict[str, Chain] = {}
_last: list[Chain] = []


def default_backends() -> tuple[str, ...]:
    """The mission's chain, less the backends not registered in this install."""
    return tuple(name for name in DEFAULT_CHAIN if name in registry)


def chain_for(options: dict[str, Any] | None = None) -> Chain:
    """The chain that `options` describe, built once and reused for every graph."""
    options = dict(options or {})
    names = tuple(options.pop("backends", None) or default_backends())
    accepted = set(inspect.signature(Chain.__init__).parameters) - {"self", "backends"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise InvalidOption(
            f"unknown chain option(s) {', '.join(unknown)}; valid: backends, "
            f"{', '.join(sorted(accepted))}"
        )
    key = repr((names, sorted(options.items(), key=lambda kv: kv[0])))
    if key not in _chains:
        _chains[key] = Chain(*names, **options)
    return _chains[key]


def last_chain() -> Chain | None:
    """The chain that compiled the most recent graph through `backend="chain"`."""
    return _last[-1] if _last else None


def chain_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """Dynamo's entry for the name "chain". torch.compile's `mode` picks chain options
    ("first", "fastest", "max-autotune" as "fastest", "reduce-overhead" as CUDA graphs on);
    any other mode is an InvalidOption naming the valid ones (chain.select.torch_modes)."""
    selected = chain_for(torch_modes.merged(mode, options))
    _last[:] = [selected]
    return selected(gm, example_inputs)
