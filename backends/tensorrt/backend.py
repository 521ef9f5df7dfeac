"""The registered "tensorrt" backend: ATen graph -> lowering -> partitions -> engines -> runtime.

A graph with symbolic sizes is taken when every size symbol has a finite range: its blocks
export with dynamic axes and each engine gets one optimization profile per range
(conversion.graph_profiles); otherwise it is Unsupported with the reason.

Parts TensorRT cannot take stay in PyTorch, each with its reason in `chain_details`.
A graph with no engine at all is Unsupported (a "win" that runs everything in PyTorch
would be a fake win), and so is a training graph.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

from backends.common.fx_utils import op_counts, symbolic_inputs
from backends.common.partitioner import summarize
from backends.errors import Unsupported
from backends.registry import register_backend
from backends.tensorrt.availability import available, check_devices, check_inference_graph
from backends.tensorrt.conversion.graph_profiles import profile_refusal
from backends.tensorrt.deploy import export_parts, load_payload
from backends.tensorrt.pipeline import Plan, plan
from backends.tensorrt.settings import OPTIONS, Settings

logger = logging.getLogger(__name__)


@register_backend(
    "tensorrt",
    available=available,
    options=OPTIONS,
    tags=("gpu",),
    exporter=export_parts,
    loader=load_payload,
    # symbolic sizes: engines with optimization profiles, or a decline saying why not
    dynamic=True,
)
def tensorrt_backend(gm: fx.GraphModule, example_inputs: list[torch.Tensor], **options: Any) -> Any:
    """TensorRT engines for the parts of the graph it supports; the rest runs in PyTorch."""
    settings = Settings.from_options(options)
    check_inference_graph(example_inputs)
    reason = available()
    if reason is not None:
        raise Unsupported(reason)
    symbolic = symbolic_inputs(gm, example_inputs)
    if symbolic:
        refusal = profile_refusal(gm)
        if refusal is not None:
            raise Unsupported(
                f"dynamic shapes: no TensorRT optimization profile: {refusal}",
                detail="; ".join(symbolic),
            )
    check_devices(example_inputs)
    the_plan = plan(gm, example_inputs, settings.partition_options(), dynamic=bool(symbolic))
    if not the_plan.result.blocks:
        raise Unsupported(
            f"no block for TensorRT: {summarize(the_plan.result.fallback)}",
            detail=str(the_plan.result.details("tensorrt")),
        )
    compiled = build(the_plan, example_inputs, settings, dynamic=bool(symbolic))
    compiled.rebuild = lambda args: tensorrt_backend(gm, args, **options)  # new weights
    return compiled


def build(
    the_plan: Plan, example_inputs: list[Any], settings: Settings, dynamic: bool = False
) -> Any:
    """Turn every engine block of the plan into a TensorRT engine module (GPU only)."""
    from backends.tensorrt.conversion.cache import EngineCache
    from backends.tensorrt.conversion.convert import convert_block
    from backends.tensorrt.conversion.engine import ParseFailed
    from backends.tensorrt.runtime.compiled import CompiledGraph

    result = the_plan.result
    cache = EngineCache(settings.cache_dir)
    timing = cache.read_timing_cache() if settings.timing_cache else None
    builds, rejected = [], []
    for name in list(result.blocks):
        block = the_plan.block(name)
        try:
            module, record, timing = convert_block(
                name, block, the_plan.engine_inputs[name], settings, cache, timing, dynamic
            )
        except ParseFailed as e:
            if settings.require_full_compilation:
                raise
            rejected.append({"block": name, "reason": e.reason, "detail": e.detail})
            _parser_fallback(the_plan, name, e)
            continue
        setattr(the_plan.gm, name, module)
        builds.append(record.details())
    if timing is not None and builds:
        cache.write_timing_cache(timing)
    if not builds:
        raise Unsupported(
            f"TensorRT rejected every block: {rejected[0]['reason']}",
            detail="\n".join(str(r["detail"]) for r in rejected),
        )
    summary = f"{result.ops_compiled}/{result.ops_total} ops to TensorRT in {len(builds)} engine(s)"
    if result.fallback:
        summary += f"; left to PyTorch: {summarize(result.fallback)}"
    details = {
        **result.details("tensorrt"),
        "summary": summary,
        "engines": len(builds),
        "builds": builds,
        "cache_hits": sum(1 for b in builds if b["cache_hit"]),
        "profiles": sum(b["profiles"] for b in builds),
        "parser_rejected": rejected,
        "settings": {**settings.details(), "tensorrt": _version()},
    }
    return CompiledGraph(the_plan.gm, the_plan.frozen_inputs, example_inputs, details)


def _parser_fallback(the_plan: Plan, name: str, error: Any) -> None:
    """A block the parser refused stays a PyTorch submodule; its ops get the parser's reason."""

    the_plan.result.leave_to_pytorch(
        name, op_counts(the_plan.block(name)), f"TensorRT parser: {error.reason}"
    )


def _version() -> str:
    from backends.tensorrt.conversion.engine import tensorrt_version

    return tensorrt_version()
