"""ONNX Runtime's precompile hooks: a runner offers its export (the artefact the chain's
memory stores), its output specs and the weights baked in (`revival`); `revive` runs that
artefact in another process without the graph: a session at the first call, no export.

Refused (`Unsupported`, one line) when the artefact would not answer as the runner does:
its session took updated weights by initializer overrides (the artefact holds the old
ones), a baked weight changed since its last call, or it inlines a value that is not a
tensor. Without the graph there is nothing to export again: a later weight change is
served by initializer overrides where the export kept the weights by name, else refused
(`FrozenWeightChanged`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from backends.errors import Unsupported
from backends.onnxruntime.artefact import from_artefact
from backends.registry import Revival

if TYPE_CHECKING:
    from backends.common.onnx_export import OnnxGraph
    from backends.onnxruntime.runtime import OrtRunner, OutputSpec


def revival(runner: OrtRunner) -> Revival:
    """The runner's export, output specs and baked weights, for torch's precompile."""
    compiled = runner._compiled
    if compiled.kept:
        raise Unsupported(
            "its session runs updated weights as initializer overrides, and its export holds "
            "the old ones: compile again after the update to save it"
        )
    frozen = runner._frozen
    if frozen.changed(frozen.tensors) is not None:
        raise Unsupported("a weight baked into its export changed since: call it once, then save")
    artefact = runner.chain_artefact
    weights = dict(zip(frozen.positions, frozen.tensors, strict=True))
    if missing := [i for i in artefact.reads if i not in weights]:
        raise Unsupported(f"its export inlines input(s) {missing[:3]} that are not tensors")
    facts = {
        "single": runner._single,
        "outputs": [
            {
                "shape": None if o.shape is None else [int(d) for d in o.shape],
                "dtype": None if o.dtype is None else str(o.dtype).removeprefix("torch."),
                "channels_last": o.channels_last,
            }
            for o in runner._outputs
        ],
    }
    return Revival(artefact, facts, {i: weights[i] for i in artefact.reads})


def _specs(facts: Mapping[str, Any]) -> tuple[list[OutputSpec], bool]:
    """The output specs and single flag `revival` wrote; Unsupported when malformed."""
    from backends.onnxruntime.runtime import OutputSpec

    outputs, single = facts.get("outputs"), facts.get("single")
    if not isinstance(outputs, list) or type(single) is not bool:
        raise Unsupported("onnxruntime revival facts: outputs or single missing")
    specs = []
    for o in outputs:
        shape, dtype = (o.get("shape"), o.get("dtype")) if isinstance(o, dict) else (0, 0)
        ok_shape = shape is None or (
            isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
        )
        ok_dtype = dtype is None or isinstance(getattr(torch, str(dtype), None), torch.dtype)
        if not (ok_shape and ok_dtype and type(o.get("channels_last")) is bool):
            raise Unsupported(f"onnxruntime revival facts: output spec {str(o)[:80]} malformed")
        specs.append(
            OutputSpec(
                None if shape is None else tuple(shape),
                None if dtype is None else getattr(torch, dtype),
                o["channels_last"],
            )
        )
    return specs, single


class Revived:
    """A stored export run without its graph: the session is built at the first call (the
    weights it snapshots are the caller's), then every call is the backend's runner."""

    def __init__(self, graph: OnnxGraph, facts: Mapping[str, Any], options: dict[str, Any]):
        self._graph = graph
        self._specs, self._single = _specs(facts)
        self._options = options
        self._runner: OrtRunner | None = None
        self._lock = threading.Lock()
        self.chain_details: dict[str, Any] = {"revived": True}

    def _build(self, args: Sequence[Any]) -> OrtRunner:
        from backends.onnxruntime import build_runner

        with self._lock:
            if self._runner is None:
                runner = build_runner(
                    args, self._graph, self._specs, self._single, _no_export, **self._options
                )
                self.chain_details = runner.chain_details
                self._runner = runner
            return self._runner

    def __call__(self, *args: Any) -> Any:
        runner = self._runner
        if runner is None:
            runner = self._build(args)
        return runner(*args)


def _no_export(inputs: Sequence[object]) -> OnnxGraph:
    raise Unsupported(
        "a precompiled onnxruntime graph has no graph to export again after a weight change "
        "the export did not keep by name: compile it again"
    )


def revive(*, artefact: bytes, facts: Mapping[str, Any], **options: Any) -> Revived:
    """The backend's `revive` hook: the artefact's export, run without the graph."""
    return Revived(from_artefact(artefact), facts, dict(options))
