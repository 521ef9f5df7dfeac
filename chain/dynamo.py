"""`torch.compile(model, backend="chain")`: the default chain, registered through the
`torch_dynamo_backends` entry point; `options={"backends": [...], "mode": ...}` picks it,
and so does torch.compile's own `mode=` ("fastest", "max-autotune": chain.select.torch_modes)."""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from backends.errors import InvalidOption
from backends.registry import registry
from chain.report.report import Report
from chain.select import torch_modes
from chain.select.core import Chain

DEFAULT_CHAIN = ("tensorrt", "cudagraphs", "onnxruntime", "eager")

_chains: dict[str, Chain] = {}
_per_call: dict[int, tuple[weakref.ref[Any], Chain]] = {}  # id(torch.compile call) -> chain
_last: list[Chain] = []


def default_backends() -> tuple[str, ...]:
    """The mission's chain, less the backends not registered in this install."""
    return tuple(name for name in DEFAULT_CHAIN if name in registry)


def _checked(options: dict[str, Any] | None) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The backends and the other options `options` name; InvalidOption for unknown ones."""
    options = dict(options or {})
    names = tuple(options.pop("backends", None) or default_backends())
    accepted = set(inspect.signature(Chain.__init__).parameters) - {"self", "backends"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise InvalidOption(
            f"unknown chain option(s) {', '.join(unknown)}; valid: backends, "
            f"{', '.join(sorted(accepted))}"
        )
    return names, options


def chain_for(options: dict[str, Any] | None = None) -> Chain:
    """The chain that `options` describe, built once and reused for every graph (the one
    `backend="chain"` uses when called outside a torch.compile call it can see)."""
    names, options = _checked(options)
    key = repr((names, sorted(options.items(), key=lambda kv: kv[0])))
    if key not in _chains:
        _chains[key] = Chain(*names, **options)
    return _chains[key]


def _chain_of_call(call: Any, options: dict[str, Any] | None) -> Chain:
    """The chain of one torch.compile call (one compiled model), built at its first graph."""
    held = _per_call.get(id(call))
    if held is not None and held[0]() is call:
        return held[1]
    names, options = _checked(options)
    made = Chain(*names, **options)
    _per_call[id(call)] = (weakref.ref(call), made)
    weakref.finalize(call, _per_call.pop, id(call), None)
    return made


def _compile_call() -> Any | None:
    """The torch.compile call dynamo compiles for (torch's `_TorchCompileWrapper`, which
    calls the backend): looked up the stack, as torch 2.13 calls it; None when not found."""
    wrapper = getattr(torch, "_TorchCompileWrapper", None)
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None or wrapper is None:
            return None
        if isinstance(owner := frame.f_locals.get("self"), wrapper):
            return owner
        frame = frame.f_back
    return None


def last_chain() -> Chain | None:
    """The chain that compiled the most recent graph through `backend="chain"`: the chain
    of the torch.compile call that graph came from (one per compiled model)."""
    return _last[-1] if _last else None


def report_for(compiled: Any) -> Report:
    """The report of a model or function compiled by `torch.compile(..., backend="chain")`
    (or with a chain object): its graphs only, not those of other compiled models. Dynamo
    serves a model the graphs it compiled for another one of the same code when their
    torch.compile calls are equal (same backend, options, dynamic): then both share them,
    and this report."""
    wrapper = getattr(torch, "_TorchCompileWrapper", None)
    call: Any = None  # torch's _TorchCompileWrapper: what the compiled model's dynamo calls
    contexts = [getattr(compiled, "dynamo_ctx", None)]  # a module; a function: its closure
    contexts += [c.cell_contents for c in getattr(compiled, "__closure__", None) or ()]
    for ctx in contexts:
        call = getattr(ctx, "callback", None)
        while call is not None and wrapper is not None and not isinstance(call, wrapper):
            call = getattr(call, "_torchdynamo_orig_backend", None)
        if call is not None:
            break
    if isinstance(getattr(call, "compiler_fn", None), Chain):
        return call.compiler_fn.report  # type: ignore[union-attr]
    held = _per_call.get(id(call)) if call is not None else None
    if held is not None and held[0]() is call:
        return held[1].report
    for ref, made in list(_per_call.values()) if call is not None else ():
        if (other := ref()) is not None and other == call:  # torch's rule: an equal backend
            return made.report  # dynamo served this model the graphs compiled for that one
    raise ValueError(
        f"report_for: {type(compiled).__name__} was not compiled by torch.compile(..., "
        "backend='chain' or a chain object), or has not been called yet"
    )


def chain_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """Dynamo's entry for the name "chain". torch.compile's `mode` picks chain options
    ("first", "fastest", "max-autotune" as "fastest", "reduce-overhead" as CUDA graphs on);
    any other mode is an InvalidOption naming the valid ones (chain.select.torch_modes)."""
    options = torch_modes.merged(mode, options)
    call = _compile_call()  # one chain per torch.compile call: models' graphs stay apart
    selected = chain_for(options) if call is None else _chain_of_call(call, options)
    _last[:] = [selected]
    return selected(gm, example_inputs)
