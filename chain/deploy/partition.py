"""ONNX Runtime parts of a graph ORT cannot take whole: partition, export, verify per part.

The partitioning is the TensorRT branch's (torch.fx's CapabilityBasedPartitioner with
reasons per op) with another predicate: an op goes to ONNX Runtime when the ONNX exporter
has a translation for it (torchlib's registry) or a decomposition it applies first. Each
part is exported with the project's one exporter (`export_onnx`) and checked against
PyTorch on the example inputs; a part that fails either stays in PyTorch, with the reason.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.errors import Unsupported
from backends.tensorrt.aten import op_histogram, op_name
from backends.tensorrt.partitioning import PartitionOptions, PartitionResult, partition
from backends.tensorrt.partitioning.partitioner import ReasonedSupport, is_excluded
from chain.deploy.payload import Header
from chain.deploy.stitch import CompiledPart, output_specs, record_calls
from chain.verify import compare

NO_TRANSLATION = "no ONNX translation (torch.onnx / onnxscript torchlib)"
EXCLUDED = "excluded by torch_executed_ops"


@functools.cache
def _onnx_ops() -> tuple[Any, frozenset[Any]]:
    """The exporter's registry of translated ops and the decompositions it applies first."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from backends.common.onnx_export import quiet

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


def ort_parts(
    gm: fx.GraphModule,
    flat_inputs: Sequence[Any],
    *,
    torch_executed_ops: Sequence[str] = (),
    min_block_size: int = 1,
) -> tuple[fx.GraphModule, dict[str, CompiledPart], PartitionResult]:
    """Partition a copy of `gm`; export and verify each ORT part; say why the rest stayed."""
    options = PartitionOptions(
        min_block_size=min_block_size, torch_executed_ops=frozenset(torch_executed_ops)
    )
    split, result = partition(
        copy.deepcopy(gm), options, support=ort_support(options.torch_executed_ops)
    )
    calls = record_calls(split, flat_inputs, set(result.engines))
    parts: dict[str, CompiledPart] = {}
    for name in list(result.engines):
        args, out = calls[name]
        block = getattr(split, name)
        try:
            parts[name] = compile_part(name, block, args, out)
        except Unsupported as error:
            _leave_to_pytorch(result, name, block, f"onnxruntime: {error.reason}")
    return split, parts, result


def _leave_to_pytorch(result: PartitionResult, name: str, block: fx.GraphModule, why: str) -> None:
    for op, count in op_histogram(block).items():
        result.add_fallback(op, why, count)
        result.ops_tensorrt -= count
    result.engines.remove(name)


def compile_part(name: str, block: fx.GraphModule, args: tuple[Any, ...], out: Any) -> CompiledPart:
    """Export one block to ONNX and check ORT's outputs against PyTorch's on `args`."""
    from backends.onnxruntime import export_onnx
    from chain.deploy import ops

    outputs, returns_tuple = output_specs(out)
    graph = export_onnx(block, args, freeze=(), dynamic_dims={})
    if graph.derived or graph.scalars:
        raise Unsupported("part reads sizes or module scalars from its inputs")
    device = args[graph.input_positions[0]].device if graph.input_positions else outputs[0].device
    header = Header.for_onnx(graph, outputs, device.type)
    runner = ops.preload(header, graph.model, device)
    actual = runner([args[i] for i in graph.input_positions])
    verdict = compare(tuple(outputs), tuple(actual))
    if verdict.reason is not None:
        raise Unsupported(f"mismatch against PyTorch: {verdict.reason}")
    return CompiledPart(
        name=name,
        header=header,
        body=graph.model,
        input_positions=graph.input_positions,
        returns_tuple=returns_tuple,
        ops=sum(op_histogram(block).values()),
    )
