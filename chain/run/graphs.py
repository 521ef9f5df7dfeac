"""The `cuda_graphs` stage: each compiled candidate also tried as its CUDA graphs variant.

A backend that declares a `graphed` hook in the contract (inductor: reduce-overhead
machinery; onnxruntime: `enable_cuda_graph` + IOBinding; tensorrt: engines captured on
torch's stream; eager: the `cudagraphs` backend) gets a second attempt, named
`<backend>+graphs` and marked `cuda_graphs=True`, whenever the graph meets the CUDA
graph preconditions. `"fastest"` times both variants and the faster wins; `"first"`
uses the graphed variant when it passes and is not slower than the plain one.

`cuda_graphs="auto"` (default) tries variants where they apply and otherwise says why in
one note (once per chain when the machine has no CUDA at all: CPU runs pay nothing);
`True` also records a refusal attempt with the reason for every compiled candidate whose
variant cannot run; `False` turns the stage off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from backends.common.cudagraph_preconditions import check_preconditions
from backends.cudagraphs import cudagraphs_available
from backends.registry import Backend
from chain.report.records import Attempt, Status

VALUES: tuple[str | bool, ...] = ("auto", True, False)
SUFFIX = "+graphs"


def check_cuda_graphs(value: object) -> str | bool:
    """The `cuda_graphs` option as given, or ValueError listing the valid values."""
    if value is True or value is False or value == "auto":
        return value  # type: ignore[return-value]
    raise ValueError(f"cuda_graphs={value!r}; valid: 'auto', True, False")


def variant_name(name: str) -> str:
    """The attempt name of a backend's CUDA graphs variant: `inductor+graphs`."""
    return name + SUFFIX


def base_name(name: str) -> str:
    """The backend an attempt name belongs to: `inductor` for `inductor+graphs`."""
    return name.removesuffix(SUFFIX)


def mark(attempt: Attempt) -> Attempt:
    """Set `cuda_graphs` on a variant's attempt, or one whose callable says it runs graphed.

    By name too: an attempt rebuilt after a failure while timed keeps the flag.
    """
    graphed = attempt.details.get("cuda_graphs") or attempt.backend.endswith(SUFFIX)
    if graphed and not attempt.cuda_graphs:
        return dataclasses.replace(attempt, cuda_graphs=True)
    return attempt


def prefer_graphed(plain: Attempt, graphed: Attempt) -> tuple[Attempt, Attempt]:
    """`first` mode: the graphed variant wins when it passed and is not slower than plain."""
    if graphed.status is not Status.WON:
        return plain, graphed
    if plain.status is not Status.WON:
        return plain, graphed
    if plain.latency_ms is None or graphed.latency_ms is None:
        reason = "not timed (measure=False): the graphed variant is preferred"
        return dataclasses.replace(plain, status=Status.SLOWER, reason=reason), graphed
    if graphed.latency_ms <= plain.latency_ms:
        reason = f"{plain.latency_ms:.3f} ms vs {graphed.latency_ms:.3f} ms for {graphed.backend}"
        return dataclasses.replace(plain, status=Status.SLOWER, reason=reason), graphed
    reason = f"{graphed.latency_ms:.3f} ms vs {plain.latency_ms:.3f} ms for {plain.backend}"
    return plain, dataclasses.replace(graphed, status=Status.SLOWER, reason=reason)


@dataclass
class GraphsStage:
    """The chain's `cuda_graphs` setting and what it decided so far (one note per chain)."""

    setting: str | bool
    backends: Sequence[Backend]
    noted: bool = False
    _compilers: set[Any] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.setting = check_cuda_graphs(self.setting)
        self._compilers = {b.compiler for b in self.backends}

    def why_not(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[Status, str] | None:
        """Why no variant can run on this graph (machine first, then the graph), or None.

        None too when the stage is off: then no variant exists to refuse.
        """
        if self.setting is False:
            return None
        if machine := cudagraphs_available():
            return Status.UNAVAILABLE, f"CUDA graphs do not apply: {machine}"
        if graph := check_preconditions(gm, inputs):
            return Status.UNSUPPORTED, f"CUDA graphs do not apply: {graph}"
        return None

    def note(self, why: tuple[Status, str] | None) -> str | None:
        """The record's note under "auto": per graph on CUDA, once per chain without CUDA."""
        if self.setting != "auto" or why is None:
            return None
        if not any(self.variant(b) for b in self.backends):
            return None  # no backend of this chain has a variant: nothing to say
        status, text = why
        if status is Status.UNAVAILABLE:
            if self.noted:
                return None
            self.noted = True
            return f"cuda_graphs='auto': {text} (no variant tried on any graph of this chain)"
        return f"cuda_graphs='auto': {text}"

    def variant(self, backend: Backend) -> Backend | None:
        """The backend's CUDA graphs variant as a candidate, or None (none, or a duplicate)."""
        if self.setting is False or backend.graphed is None:
            return None
        if backend.graphed in self._compilers:  # e.g. eager's variant is `cudagraphs`, chained
            return None
        return dataclasses.replace(
            backend, name=variant_name(backend.name), compiler=backend.graphed
        )

    def refusal(self, variant: Backend, why: tuple[Status, str] | None) -> Attempt | None:
        """Under `cuda_graphs=True`, the attempt that records why the variant cannot run."""
        if why is None or self.setting is not True:
            return None
        status, text = why
        return Attempt(variant.name, status, text, cuda_graphs=True)

    def tried(
        self, attempt: Attempt, fn: Callable[..., Any] | None
    ) -> tuple[Attempt, Callable[..., Any] | None]:
        """A variant's attempt, marked as running under CUDA graphs."""
        return dataclasses.replace(attempt, cuda_graphs=True), fn
