"""Export of a graph the mixed regions won (issue 49): each region exported by the backend
that serves it (ONNX Runtime parts, an inductor package where signed), PyTorch where that
backend has no exporter, declines the region or served eager; the regions called in
order, as the chain ran them.

Each region is handed to its backend's exporter as a graph of its own (`ExportRequest`,
status "not_tried": exported again from the region's graph, not from the compiled
callable), with the inputs it receives on the export's example run through the regions
in PyTorch. Every part is verified as any exported part is; the program is then traced
whole by torch.export and checked against the model (chain.deploy.exporter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from backends.common.parts import ExportedParts, ExportRequest, Part
from backends.errors import Unsupported
from backends.registry import registry
from chain.deploy.stitch import stitch
from chain.judge.speed import EAGER
from chain.report.records import GraphRecord
from chain.select.regions.cut import Call, record_inputs


def mixed_parts(
    compiled: Any,
    flat: tuple[Any, ...],
    record: GraphRecord,
    verify: Callable[[Part], str | None],
    verified: Callable[[Part], None],
    dynamic_dims: dict[int, tuple[int, ...]],
) -> tuple[ExportedParts, list[dict[str, Any]]]:
    """The split graph with each region exported by its backend (`verified` raises for a
    part that does not reproduce its outputs), and each part's summary with its region."""
    regions: dict[str, tuple[fx.GraphModule, bool]] | None = getattr(
        compiled, "chain_regions", None
    )
    if regions is None or not isinstance(compiled, fx.GraphModule):
        raise Unsupported("the mixed regions' callable keeps no regions to export")
    if dynamic_dims:
        raise Unsupported("dynamic shapes: regions are cut and compiled on static graphs")
    won = record.winning_attempt
    parts = won.details.get("parts", ()) if won is not None else ()
    served = {str(p["name"]): str(p["backend"]) for p in parts}
    in_pytorch = fx.GraphModule(compiled, compiled.graph)
    for name, (graph, single) in regions.items():
        setattr(in_pytorch, name, Call(graph, single))
    seen = record_inputs(in_pytorch, flat)
    program = fx.GraphModule(compiled, compiled.graph)
    summaries: list[dict[str, Any]] = []
    said: list[str] = []
    for name, (graph, single) in regions.items():
        backend = served.get(name, EAGER)
        exported = _region(graph, seen[name], backend, verify, said, name)
        fn: Any = graph
        if exported is not None:
            for part in exported.parts.values():
                verified(part)
                summaries.append({**part.summary(), "region": name})
            fn = stitch(exported.gm, exported.parts)
        setattr(program, name, Call(fn, single))
    backends = [served.get(name, EAGER).split(" ")[0] for name in regions]
    note = (
        f"export: mixed regions, {len(regions)} parts ({', '.join(backends)}), "
        f"{len(summaries)} compiled payload(s)"
    )
    note += f" ({'; '.join(said)})" if said else ""
    return ExportedParts(program, {}, note), summaries


def _region(
    graph: fx.GraphModule,
    inputs: tuple[Any, ...],
    backend: str,
    verify: Callable[[Part], str | None],
    said: list[str],
    name: str,
) -> ExportedParts | None:
    """The region exported by `backend`'s exporter; None (why, in `said`) for PyTorch."""
    if backend == EAGER or backend.startswith(f"{EAGER} "):
        return None  # eager served it (or its backend failed there: the reason is recorded)
    hook = registry.lookup(backend).exporter if backend in registry else None
    if hook is None:
        said.append(f"{name}: {backend} has no exporter, PyTorch")
        return None
    request = ExportRequest(graph, tuple(inputs), None, "not_tried", verify)
    try:
        exported = hook(request)
    except Unsupported as why:
        said.append(f"{name}: {backend} not exported ({why.reason}), PyTorch")
        return None
    if exported is None or not exported.parts:
        said.append(f"{name}: {backend} exported nothing, PyTorch")
        return None
    return exported
