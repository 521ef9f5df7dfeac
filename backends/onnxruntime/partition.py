"""ONNX Runtime parts of a graph ORT cannot take whole: partition, export, verify per part.

The partitioner is the shared one (`backends.common.partitioner`: torch.fx's
CapabilityBasedPartitioner with reasons per op) with ONNX's predicate: an op goes to ONNX
Runtime when the ONNX exporter has a translation for it (torchlib's registry) or a
decomposition it applies first. Each part is exported with the project's one exporter
(`export_onnx`) and checked by the chain against PyTorch on the example inputs; a part that
fails either stays in PyTorch, with the reason.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.common.fx_utils import calls_of, op_counts, op_name, record_calls
from backends.common.onnx_export import export_onnx, quiet
from backends.common.partitioner import (
    EXCLUDED,
    PartitionOptions,
    PartitionResult,
    ReasonedSupport,
    is_excluded,
    partition,
)
from backends.common.parts import Part, flat_outputs
from backends.common.payload import Header
from backends.errors import Unsupported

NO_TRANSLATION = "no ONNX translation (torch.onnx / onnxscript torchlib)"


@functools.cache
def _onnx_ops() -> tuple[Any, frozenset[Any]]:
    """The exporter's registry of translated ops and the decompositions it applies first."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    with quiet():
        registry = ONNXRegistry.from_torchlib()
    return registry, frozenset(torch.export.default_decompositions())


def ort_reason(node: fx.Node, excluded: frozenset[str] = frozenset()) -> str | None:
    """None when the ONNX exporter can translate `node`, else why it stays in PyTorch."""
    if node.target is operator.getitem:
        return None
    if is_excluded(node, excluded):
        return EXCLUDED
    if not isinstance(node.target, torch._ops.OpOverload):
        return f"not an ATen op ({op_name(node)})"
    registry, decomposed = _onnx_ops()
    if registry.is_registered(node.target) or node.target in decomposed:
        return None
    return NO_TRANSLATION


def ort_support(excluded: frozenset[str]) -> ReasonedSupport:
    """The ONNX exporter's op coverage as a partitioner predicate."""
    return ReasonedSupport(lambda node: ort_reason(node, excluded))


HeaderFn = Callable[[Any, list[torch.Tensor], str], Header]  # (OnnxGraph, outputs, device)


def ort_parts(
    gm: fx.GraphModule,
    flat_inputs: tuple[Any, ...],
    options: PartitionOptions,
    header: HeaderFn,
    verify: Callable[[Part], str | None],
) -> tuple[fx.GraphModule, dict[str, Part], PartitionResult]:
    """Partition a copy of `gm`; export and verify each ORT part; say why the rest stayed."""
    split, result = partition(
        copy.deepcopy(gm), options, support=ort_support(options.torch_executed_ops)
    )
    calls = record_calls(split, flat_inputs, calls_of(set(result.blocks)))
    parts: dict[str, Part] = {}
    for name in list(result.blocks):
        args, out = calls[name]
        block = getattr(split, name)
        try:
            part = export_part(name, block, args, out, header)
            reason = verify(part)
            if reason is not None:
                raise Unsupported(f"mismatch against PyTorch: {reason}")
        except Unsupported as error:
            result.leave_to_pytorch(name, op_counts(block), f"onnxruntime: {error.reason}")
            continue
        parts[name] = part
    return split, parts, result


def export_part(
    name: str, block: fx.GraphModule, args: tuple[Any, ...], out: Any, header: HeaderFn
) -> Part:
    """Export one block to ONNX, with PyTorch's outputs on `args` as what it must reproduce."""
    outputs, returns_tuple = flat_outputs(out)
    graph = export_onnx(block, args, freeze=(), dynamic_dims={})
    if graph.derived or graph.scalars:
        raise Unsupported("part reads sizes or module scalars from its inputs")
    device = args[graph.input_positions[0]].device if graph.input_positions else outputs[0].device
    return Part(
        name=name,
        header=header(graph, outputs, device.type),
        body=graph.model,
        input_positions=graph.input_positions,
        returns_tuple=returns_tuple,
        ops=sum(op_counts(block).values()),
        example_inputs=args,
        expected=tuple(outputs),
        graph=block,
    )
