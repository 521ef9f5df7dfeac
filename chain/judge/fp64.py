"""The graph run once in float64: the reference that candidates' and eager's errors are
measured against, as dynamo's accuracy harness does (`cast_to_fp64` and `same(...,
fp64_ref)` in torch/_dynamo).

A float64 copy of the graph module (its own parameters, buffers and every floating dtype
named in the graph: `.to(torch.float16)`, `dtype=torch.bfloat16`, `.half()`) runs on float64
copies of the floating inputs; parameters and buffers arrive from dynamo as inputs, so they
are converted with them. The copy runs on the inputs' device (CPU for CPU inputs); when that
fails (an op without a float64 kernel, out of memory) the error says why and the chain falls
back to dtype tolerances.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

# methods that cast to a fixed floating dtype: in the float64 copy they cast to float64
_CAST_METHODS = frozenset({"half", "float", "bfloat16", "double"})


class Fp64Unavailable(RuntimeError):
    """The graph cannot run in float64 here; the message says why."""


def _widen(value: Any) -> Any:
    """A floating dtype named in the graph becomes float64; anything else is kept."""
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    return value


def fp64_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A float64 copy of `gm` (the original is left as it was: the backends' contract)."""
    copied = copy.deepcopy(gm).to(torch.float64)
    for node in copied.graph.nodes:
        if node.op == "call_method" and node.target in _CAST_METHODS:
            node.target = "double"
        if node.op in ("call_function", "call_method"):
            node.args = fx.node.map_aggregate(node.args, _widen)
            node.kwargs = fx.node.map_aggregate(node.kwargs, _widen)
    copied.graph.lint()
    copied.recompile()
    return copied


def fp64_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Float64 copies of the floating tensors (parameters and buffers too); the rest as is."""
    return [
        x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in inputs
    ]


def run_fp64(gm: fx.GraphModule, inputs: Sequence[Any]) -> Any:
    """The graph's outputs computed in float64; Fp64Unavailable when it cannot run so."""
    try:
        with torch.no_grad():
            return fp64_graph(gm)(*fp64_inputs(inputs))
    except Exception as exc:  # every failure becomes the reason the chain records
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise Fp64Unavailable(f"{type(exc).__name__}: {first}") from exc


def fp64_reference(gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[Any, str | None]:
    """The float64 outputs, or None and the note that says why verification falls back."""
    try:
        return run_fp64(gm, inputs), None
    except Fp64Unavailable as exc:
        return None, f"no float64 reference ({exc}): verified with dtype tolerances"


class Later:
    """The float64 reference run on first need, once (under a lock: guards call from
    threads). A remembered winner's verification needs it only when the quick comparison
    with eager is not clearly within bounds (`chain.judge.accuracy.near_eager`)."""

    def __init__(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> None:
        self._gm, self._inputs = gm, list(inputs)
        self._lock = threading.Lock()
        self._done: tuple[Any, str | None] | None = None

    def get(self) -> tuple[Any, str | None]:
        """The float64 outputs (None when they cannot be had) and the note on why not."""
        with self._lock:
            if self._done is None:
                self._done = fp64_reference(self._gm, self._inputs)
                self._inputs = []  # the copies are not needed again
            return self._done
